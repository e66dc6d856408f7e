// qkv/schedule.h: learning-rate schedules, as a function of the 1-based optimizer step.
#pragma once
#include <cstdint>
#include <string>

namespace qkv {

enum class ScheduleKind {
  Constant,     // lr, after an optional linear warmup
  InverseSqrt,  // linear warmup, then decay as 1 / sqrt(step) (the 2017 Transformer's schedule)
  WarmupCosine  // linear warmup, then half a cosine from lr down to min_lr at `total`, then min_lr
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::Constant;
  double lr = 1e-3;     // peak learning rate (Constant: the rate; WarmupCosine: the rate after warmup).
                        // InverseSqrt with d_model > 0: a factor on the 2017 formula (the paper's is 1)
  int64_t warmup = 0;   // warmup steps: linear from lr / warmup at step 1 to lr at step == warmup
  int64_t total = 0;    // WarmupCosine: the step at which the rate reaches min_lr (>= warmup, >= 1)
  double min_lr = 0.0;  // WarmupCosine floor (0 <= min_lr <= lr)
  int64_t d_model = 0;  // InverseSqrt: > 0 selects the 2017 formula
                        //   lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
};

// The rate for the 1-based step >= 1:
//   Constant:     lr * min(1, step / warmup)          (lr when warmup == 0)
//   InverseSqrt:  d_model > 0: lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
//                 else:        lr * min(step / warmup, sqrt(warmup / step))
//                 (both peak at step == warmup; the second peaks at exactly lr)
//   WarmupCosine: lr * step / warmup                  for step <= warmup
//                 min_lr + 0.5 (lr - min_lr) (1 + cos(pi (step - warmup) / (total - warmup)))
//                                                     for warmup < step < total
//                 min_lr                              for step >= total (and step > warmup)
// Throws qkv::Error if step < 1 or validate(s) would throw.
double learning_rate(const Schedule& s, int64_t step);

// Throws qkv::Error naming the offending field unless: lr and min_lr are finite and >= 0;
// warmup >= 0; d_model >= 0; InverseSqrt: warmup >= 1; WarmupCosine: total >= warmup,
// total >= 1 and min_lr <= lr.
void validate(const Schedule& s);

// "constant", "inverse-sqrt", "cosine"
const char* schedule_name(ScheduleKind k);
// The inverse of schedule_name. Throws qkv::Error listing the valid names.
ScheduleKind parse_schedule_kind(const std::string& name);

}  // namespace qkv
