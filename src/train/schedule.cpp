#include "qkv/schedule.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "qkv/error.h"

namespace qkv {
namespace {

constexpr double kPi = 3.14159265358979323846;

constexpr ScheduleKind kKinds[] = {ScheduleKind::Constant, ScheduleKind::InverseSqrt, ScheduleKind::WarmupCosine};

// lr * step / warmup: lr / warmup at step 1, exactly lr at step == warmup.
double warmup_rate(double lr, int64_t step, int64_t warmup) {
  return lr * (static_cast<double>(step) / static_cast<double>(warmup));
}

}  // namespace

void validate(const Schedule& s) {
  check(std::find(std::begin(kKinds), std::end(kKinds), s.kind) != std::end(kKinds), "schedule: kind = ",
        static_cast<int>(s.kind), " is not a ScheduleKind");
  const char* kind = schedule_name(s.kind);
  check(std::isfinite(s.lr) && s.lr >= 0, "schedule '", kind, "': lr = ", s.lr, ", expected a finite value >= 0");
  check(s.warmup >= 0, "schedule '", kind, "': warmup = ", s.warmup, ", expected >= 0");
  check(std::isfinite(s.min_lr) && s.min_lr >= 0, "schedule '", kind, "': min_lr = ", s.min_lr,
        ", expected a finite value >= 0");
  check(s.d_model >= 0, "schedule '", kind, "': d_model = ", s.d_model, ", expected >= 0 (0: no d_model scaling)");
  switch (s.kind) {
    case ScheduleKind::Constant:
      break;
    case ScheduleKind::InverseSqrt:
      check(s.warmup >= 1, "schedule '", kind, "': warmup = ", s.warmup, ", expected >= 1 (the decay is relative to it)");
      break;
    case ScheduleKind::WarmupCosine:
      check(s.total >= s.warmup && s.total >= 1, "schedule '", kind, "': total = ", s.total,
            ", expected >= warmup (", s.warmup, ") and >= 1");
      check(s.min_lr <= s.lr, "schedule '", kind, "': min_lr = ", s.min_lr, ", expected <= lr (", s.lr, ")");
      break;
  }
}

double learning_rate(const Schedule& s, int64_t step) {
  check(step >= 1, "learning_rate: step = ", step, ", expected a 1-based step >= 1");
  validate(s);
  const double st = static_cast<double>(step), w = static_cast<double>(s.warmup);
  switch (s.kind) {
    case ScheduleKind::Constant:
      return step < s.warmup ? warmup_rate(s.lr, step, s.warmup) : s.lr;
    case ScheduleKind::InverseSqrt:
      if (s.d_model > 0) {
        // lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
        return s.lr / std::sqrt(static_cast<double>(s.d_model)) * std::min(1.0 / std::sqrt(st), st / (w * std::sqrt(w)));
      }
      // lr * min(step / warmup, sqrt(warmup / step))
      return step <= s.warmup ? warmup_rate(s.lr, step, s.warmup) : s.lr * std::sqrt(w / st);
    case ScheduleKind::WarmupCosine: {
      if (step <= s.warmup) return warmup_rate(s.lr, step, s.warmup);
      if (step >= s.total) return s.min_lr;
      // min_lr + 0.5 (lr - min_lr) (1 + cos(pi * progress)),  progress = (step - warmup) / (total - warmup)
      const double progress = (st - w) / static_cast<double>(s.total - s.warmup);
      return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(kPi * progress));
    }
  }
  return s.lr;
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Constant:
      return "constant";
    case ScheduleKind::InverseSqrt:
      return "inverse-sqrt";
    case ScheduleKind::WarmupCosine:
      return "cosine";
  }
  return "unknown";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  std::string valid;
  for (ScheduleKind k : kKinds) {
    if (name == schedule_name(k)) return k;
    valid += valid.empty() ? "" : ", ";
    valid += schedule_name(k);
  }
  throw Error(detail::concat("unknown learning-rate schedule '", name, "': expected one of ", valid));
}

}  // namespace qkv
