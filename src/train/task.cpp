// Tasks, batching, evaluation and the training loop behind `qkv train`.
#include "qkv/task.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>
#include <set>

#include "io/json_strict.h"
#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/npy.h"
#include "qkv/safetensors.h"
#include "qkv/viz.h"

namespace qkv {

using json = nlohmann::json;

const char* task_name(Task t) {
  switch (t) {
    case Task::Translate: return "translate";
    case Task::LanguageModel: return "lm";
    case Task::Classify: return "classify";
  }
  return "?";
}

Task parse_task(const std::string& name) {
  if (name == "translate") return Task::Translate;
  if (name == "lm") return Task::LanguageModel;
  if (name == "classify") return Task::Classify;
  throw Error("unknown task '" + name + "' (expected translate, lm or classify)");
}

void TaskInfo::save(const std::string& dir) const {
  json j = {{"task", task_name(task)}, {"max_len", max_len}};
  if (task == Task::Classify) j["labels"] = labels;
  write_file_atomic(dir + "/task.json", j.dump(2) + "\n");
}

TaskInfo TaskInfo::load(const std::string& dir) {
  const std::string path = dir + "/task.json";
  check(::access(path.c_str(), F_OK) == 0, path, ": not found (is ", dir, " a model directory written by qkv train?)");
  const json j = detail::parse_json_object(read_file(path, "task.json"), path);
  check(j.contains("task") && j["task"].is_string(), path, ": expected an object with a \"task\" string");
  TaskInfo t;
  try {
    t.task = parse_task(j["task"].get<std::string>());
  } catch (const Error& e) {
    throw Error(path + ": \"task\": " + e.what());
  }
  if (j.contains("max_len")) {
    const json& m = j["max_len"];
    check(m.is_number_integer() && !m.is_number_float() && m.get<int64_t>() >= 0 && m.get<int64_t>() <= (1 << 24),
          path, ": \"max_len\" must be an integer in [0, 16777216], got ", m.dump());
    t.max_len = m.get<int64_t>();
  }
  if (t.task == Task::Classify) {
    check(j.contains("labels") && j["labels"].is_array() && j["labels"].size() >= 2, path,
          ": a classify model needs a \"labels\" array of at least 2 labels");
    std::set<std::string> seen;
    for (const auto& l : j["labels"]) {
      check(l.is_string(), path, ": \"labels\" must hold strings, got ", l.dump());
      check(seen.insert(l.get<std::string>()).second, path, ": label \"", l.get<std::string>(), "\" appears twice");
      t.labels.push_back(l.get<std::string>());
    }
  }
  return t;
}

int64_t example_length(Task task, const Example& e) {
  const int64_t s = static_cast<int64_t>(e.src.size()), t = static_cast<int64_t>(e.tgt.size());
  switch (task) {
    case Task::Translate: return std::max(s, t);
    case Task::LanguageModel: return s - 1;
    case Task::Classify: return s;
  }
  return s;
}

Batch make_batch(const ModelConfig& cfg, Task task, const std::vector<Example>& examples,
                 const std::vector<int64_t>& indices) {
  check(!indices.empty(), "make_batch: no examples");
  const int64_t B = static_cast<int64_t>(indices.size());
  const int64_t pad = cfg.pad_id >= 0 ? cfg.pad_id : 0;
  int64_t S = 0, T = 0;
  for (int64_t i : indices) {
    const Example& e = examples.at(static_cast<size_t>(i));
    S = std::max<int64_t>(S, task == Task::LanguageModel ? static_cast<int64_t>(e.src.size()) - 1
                                                         : static_cast<int64_t>(e.src.size()));
    T = std::max<int64_t>(T, static_cast<int64_t>(e.tgt.size()));
  }
  check(S >= 1, "make_batch: empty examples");
  Batch b;
  b.input = Tensor({B, S}, DType::I64);
  Tensor lengths({B}, DType::I64);
  int64_t* in = b.input.data<int64_t>();
  std::fill(in, in + B * S, pad);
  for (int64_t r = 0; r < B; ++r) {
    const Example& e = examples[static_cast<size_t>(indices[r])];
    const int64_t n = task == Task::LanguageModel ? static_cast<int64_t>(e.src.size()) - 1
                                                  : static_cast<int64_t>(e.src.size());
    std::copy(e.src.begin(), e.src.begin() + n, in + r * S);
    lengths.data<int64_t>()[r] = n;
  }
  b.input_lengths = lengths;
  switch (task) {
    case Task::LanguageModel: {
      // target <- window[1:]
      b.target = Tensor({B, S}, DType::I64);
      int64_t* tg = b.target.data<int64_t>();
      std::fill(tg, tg + B * S, cfg.pad_id >= 0 ? cfg.pad_id : -100);
      for (int64_t r = 0; r < B; ++r) {
        const Example& e = examples[static_cast<size_t>(indices[r])];
        std::copy(e.src.begin() + 1, e.src.end(), tg + r * S);
      }
      break;
    }
    case Task::Translate: {
      // decoder_input <- [bos, tgt[:-1]] ;  target <- tgt, padded with pad (ignored)
      check(cfg.bos_id >= 0 && cfg.pad_id >= 0, "make_batch: a translation model needs bos_id and pad_id");
      b.decoder_input = Tensor({B, T}, DType::I64);
      b.target = Tensor({B, T}, DType::I64);
      int64_t* di = b.decoder_input.data<int64_t>();
      int64_t* tg = b.target.data<int64_t>();
      std::fill(di, di + B * T, pad);
      std::fill(tg, tg + B * T, pad);
      for (int64_t r = 0; r < B; ++r) {
        const Example& e = examples[static_cast<size_t>(indices[r])];
        const int64_t n = static_cast<int64_t>(e.tgt.size());
        di[r * T] = cfg.bos_id;
        for (int64_t i = 1; i < n; ++i) di[r * T + i] = e.tgt[i - 1];
        std::copy(e.tgt.begin(), e.tgt.end(), tg + r * T);
      }
      break;
    }
    case Task::Classify: {
      b.target = Tensor({B}, DType::I64);
      for (int64_t r = 0; r < B; ++r) b.target.data<int64_t>()[r] = examples[static_cast<size_t>(indices[r])].label;
      break;
    }
  }
  return b;
}

namespace {

std::vector<int64_t> lengths_of(Task task, const std::vector<Example>& ex) {
  std::vector<int64_t> l;
  l.reserve(ex.size());
  for (const Example& e : ex) l.push_back(std::max<int64_t>(1, example_length(task, e)));
  return l;
}

int64_t counted_targets(const Batch& b, int64_t pad) {
  const int64_t* t = b.target.data<int64_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < b.target.numel(); ++i) n += t[i] != pad && t[i] != -100;
  return n;
}

}  // namespace

EvalResult evaluate(const Model& model, Task task, const std::vector<Example>& examples, int64_t max_tokens) {
  EvalResult r;
  if (examples.empty()) return r;
  const ModelConfig& cfg = model.config();
  const BatchPlan plan = batch_by_length(lengths_of(task, examples), max_tokens, 0, false);
  double total = 0, right = 0;
  int64_t count = 0;
  for (const auto& idx : plan.batches) {
    const Batch b = make_batch(cfg, task, examples, idx);
    Tape tape;
    tape.recording = false;
    const Var logits = model.logits(tape, b);
    int64_t n = 0;
    const double loss = model.loss(tape, logits, b, 0.0f, &n)->value.data<float>()[0];
    total += loss * static_cast<double>(n);
    count += n;
    // accuracy: argmax against the target (ignored targets skipped)
    const Tensor& z = logits->value;
    const int64_t V = z.size(-1), rows = z.numel() / V;
    const int64_t* t = b.target.data<int64_t>();
    const int64_t ignore = task == Task::Classify ? -100 : cfg.pad_id;
    for (int64_t i = 0; i < rows; ++i) {
      if (t[i] == ignore || t[i] == -100) continue;
      const float* zi = z.data<float>() + i * V;
      right += (std::max_element(zi, zi + V) - zi) == t[i];
    }
  }
  r.count = count;
  r.loss = count > 0 ? total / static_cast<double>(count) : 0;
  r.accuracy = count > 0 ? right / static_cast<double>(count) : 0;
  return r;
}

namespace {

struct Metric {
  int64_t step;
  double loss;       // NaN when not logged
  double valid_loss; // NaN when not evaluated
  std::string line;  // as read back from metrics.jsonl (resume), else empty
};

std::vector<Metric> read_metrics(const std::string& path) {
  std::vector<Metric> out;
  std::ifstream f(path);
  std::string line;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      continue;  // a torn last line cannot happen (atomic writes), but never trust a file
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    Metric m{j["step"].get<int64_t>(), nan, nan, line};
    if (j.contains("loss") && j["loss"].is_number()) m.loss = j["loss"].get<double>();
    if (j.contains("valid_loss") && j["valid_loss"].is_number()) m.valid_loss = j["valid_loss"].get<double>();
    out.push_back(m);
  }
  return out;
}

std::string metric_line(const Metric& m, const json& extra) {
  json j = extra;
  j["step"] = m.step;
  if (!std::isnan(m.loss)) j["loss"] = m.loss;
  if (!std::isnan(m.valid_loss)) j["valid_loss"] = m.valid_loss;
  return j.dump();
}

// loss.svg: the training loss of each logged step (pale), its trailing mean over a window of
// about 2% of the run (at least 1, at most 200 logged steps), and the validation loss, with a
// caption saying why the two losses differ.
void write_curve(const std::string& dir, const std::vector<Metric>& ms, Task task, float dropout,
                 float label_smoothing) {
  viz::Series tr{"train loss, each step", {}, {}, 0, true}, va{"validation loss", {}, {}, 1};
  for (const Metric& m : ms) {
    if (!std::isnan(m.loss)) tr.x.push_back(static_cast<double>(m.step)), tr.y.push_back(m.loss);
    if (!std::isnan(m.valid_loss)) va.x.push_back(static_cast<double>(m.step)), va.y.push_back(m.valid_loss);
  }
  if (tr.x.empty() && va.x.empty()) return;
  const size_t window = std::clamp<size_t>(tr.x.size() / 50, 1, 200);
  viz::Series mean{detail::concat("train loss, mean of ", window, window == 1 ? " step" : " steps"), {}, {}, 0};
  double sum = 0;  // of the last `window` finite losses
  std::vector<double> last;
  for (size_t i = 0; i < tr.x.size(); ++i) {
    if (!std::isfinite(tr.y[i])) continue;
    last.push_back(tr.y[i]);
    sum += tr.y[i];
    if (last.size() > window) sum -= last[last.size() - window - 1];
    if (last.size() >= window) mean.x.push_back(tr.x[i]), mean.y.push_back(sum / static_cast<double>(window));
  }
  std::vector<viz::Series> series = {tr, va};
  if (window > 1) series = {tr, mean, va};
  std::vector<std::string> caption;
  char line[256];
  std::snprintf(line, sizeof line, "train loss: on each batch as trained, with dropout %.2g%s", static_cast<double>(dropout),
                label_smoothing > 0 ? detail::concat(" and label smoothing ", static_cast<double>(label_smoothing),
                                                     " (the loss against the smoothed target)").c_str()
                                    : "");
  caption.emplace_back(line);
  caption.emplace_back("validation loss: plain cross-entropy on the validation split, no dropout" +
                       std::string(dropout > 0 || label_smoothing > 0 ? ": it can sit below the training loss" : ""));
  const std::string title = std::string("qkv train --task ") + task_name(task);
  viz::write_svg(dir + "/loss.svg",
                 viz::line_chart_svg(series, title, "step", "cross-entropy (nats)", true, caption));
}

// Examples as bytes, for rank 0 to send them to another rank: per example its source and target
// lengths (int32), its label (int64), then the ids.
std::string pack_examples(const std::vector<Example>& all, const std::vector<int64_t>& idx) {
  std::string out;
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  for (int64_t i : idx) {
    const Example& e = all[static_cast<size_t>(i)];
    const auto ns = static_cast<int32_t>(e.src.size()), nt = static_cast<int32_t>(e.tgt.size());
    put(&ns, 4);
    put(&nt, 4);
    put(&e.label, 8);
    put(e.src.data(), e.src.size() * 4);
    put(e.tgt.data(), e.tgt.size() * 4);
  }
  return out;
}

std::vector<Example> unpack_examples(const std::string& bytes, size_t count) {
  std::vector<Example> out(count);
  size_t at = 0;
  auto get = [&](void* p, size_t n) {
    check(n <= bytes.size() - at, "train: internal: rank 0 sent fewer example bytes than expected");
    std::memcpy(p, bytes.data() + at, n);
    at += n;
  };
  for (Example& e : out) {
    int32_t ns = 0, nt = 0;
    get(&ns, 4);
    get(&nt, 4);
    get(&e.label, 8);
    check(ns >= 0 && nt >= 0, "train: internal: a malformed example from rank 0");
    e.src.resize(static_cast<size_t>(ns));
    e.tgt.resize(static_cast<size_t>(nt));
    get(e.src.data(), e.src.size() * 4);
    get(e.tgt.data(), e.tgt.size() * 4);
  }
  check(at == bytes.size(), "train: internal: rank 0 sent more example bytes than expected");
  return out;
}

// Rank r's strided part of a global batch: its elements r, r + parts, r + 2 parts, ...
std::vector<int64_t> part_of(const std::vector<int64_t>& global, int64_t r, int64_t parts) {
  std::vector<int64_t> idx;
  for (size_t i = static_cast<size_t>(r); i < global.size(); i += static_cast<size_t>(parts)) idx.push_back(global[i]);
  return idx;
}

}  // namespace

namespace {

// Checkpoint averaging's files: out_dir/snapshots/step-NNNNNNNNN.safetensors, by step.
std::string snapshot_dir(const std::string& out_dir) { return out_dir + "/snapshots"; }
std::string snapshot_path(const std::string& out_dir, int64_t step) {
  char name[48];
  std::snprintf(name, sizeof name, "/step-%09lld.safetensors", static_cast<long long>(step));
  return snapshot_dir(out_dir) + name;
}
// The steps of the snapshots in out_dir, ascending (other files are left alone).
std::vector<int64_t> snapshot_steps(const std::string& out_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(snapshot_dir(out_dir), ec)) {
    const std::string n = e.path().filename().string();
    long long step = -1;
    int used = 0;
    if (n.size() == 26 && std::sscanf(n.c_str(), "step-%9lld.safetensors%n", &step, &used) == 1 &&
        used == static_cast<int>(n.size()) && step >= 0 && n == snapshot_path("", step).substr(11))
      steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

namespace {

// Where a run stands, what its checkpoint keeps besides the trainer's state: the data position
// (epoch e's batch order is a function of (seed, e) only, so (epoch, batch) is all it takes to
// continue with the same batches) and the validation losses so far.
struct LoopState {
  int64_t epoch = 0, batch = 0;
  double best = std::numeric_limits<double>::infinity();
  double last_valid = std::numeric_limits<double>::quiet_NaN();

  void save(const Trainer& trainer, const std::string& ckpt) const {
    const json state = {{"epoch", epoch}, {"batch", batch}, {"best", std::isfinite(best) ? json(best) : json()},
                        {"last_valid", std::isnan(last_valid) ? json() : json(last_valid)}};
    trainer.save_checkpoint(ckpt, state.dump());
  }

  // The trainer and this state from ckpt; with ranks, rank 0 reads the file and hands its
  // contents to the others (which need no file), and every rank checks they hold the same weights.
  static LoopState load(Trainer& trainer, const std::string& ckpt, const std::string& out_dir) {
    Communicator* comm = trainer.communicator();
    std::string text;
    if (!comm) {
      text = trainer.load_checkpoint(ckpt);
    } else {
      SafetensorsFile f;
      on_lead(*comm, [&] {
        f = read_safetensors(ckpt);
        text = trainer.load_checkpoint(f, ckpt);
      });
      broadcast_safetensors(*comm, f, 0);
      if (comm->rank() != 0) text = trainer.load_checkpoint(f, ckpt + " (from rank 0)");
      uint64_t h = fnv1a(nullptr, 0);
      for (const Parameter& p : trainer.model().parameters())
        h = fnv1a(p.var->value.data<float>(), static_cast<size_t>(p.var->value.numel()) * sizeof(float), h);
      check(same_on_every_rank(*comm, h), ckpt, ": the ranks loaded different weights (checksums differ): is ", out_dir,
            " the same directory on every machine?");
    }
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(ckpt + ": the data position is not valid JSON: " + e.what());
    }
    check(j.is_object() && j.contains("epoch") && j.contains("batch") && j["epoch"].is_number_integer() &&
              j["batch"].is_number_integer(),
          ckpt, ": the checkpoint has no data position (epoch, batch); was it written by qkv train?");
    LoopState st;
    st.epoch = j["epoch"].get<int64_t>();
    st.batch = j["batch"].get<int64_t>();
    check(st.epoch >= 0 && st.epoch <= (int64_t{1} << 40) && st.batch >= 0, ckpt, ": the data position (epoch ",
          st.epoch, ", batch ", st.batch, ") is out of range; expected non-negative integers");
    // A validation loss is a finite non-negative number, or null when there was none.
    auto loss_field = [&](const char* key, double& dst) {
      if (!j.contains(key) || j[key].is_null()) return;
      check(j[key].is_number() && std::isfinite(j[key].get<double>()) && j[key].get<double>() >= 0, ckpt,
            ": the data position's \"", key, "\" must be a finite loss >= 0 or null, got ", j[key].dump());
      dst = j[key].get<double>();
    };
    loss_field("best", st.best);
    loss_field("last_valid", st.last_valid);
    return st;
  }
};

// The training data as this rank sees it: the epochs' batch plans, each step's micro-batches
// and validation. One process holds every example. With ranks, rank 0 alone holds the data (it
// read and tokenised it): the others get every example's length (for the plans) and their share
// of the validation split when the source is made, and the examples of their parts of each
// epoch's remaining batches when the epoch begins. Each global batch (the plan's, as in one
// process) is split into `parts` strided parts; rank r trains on part r.
class DataSource {
 public:
  DataSource(Task task, const ModelConfig& cfg, const std::vector<Example>& train, const std::vector<Example>& valid,
             const LoopConfig& config, Communicator* comm)
      : task_(task), cfg_(cfg), given_(train), train_(&train), valid_(valid), config_(config), comm_(comm),
        lead_(!comm || comm->rank() == 0) {
    lengths_ = lead_ ? lengths_of(task, train) : std::vector<int64_t>{};
    n_valid_ = static_cast<int64_t>(valid.size());
    core_ = config.core;
    pool_per_epoch_ = config.pool_per_epoch;
    parts_ = comm ? comm->size() : std::max<int64_t>(1, config.parts);
    if (!comm) return;
    int64_t n[4] = {static_cast<int64_t>(lengths_.size()), n_valid_, core_, pool_per_epoch_};
    comm->broadcast(n, sizeof n, 0);
    lengths_.resize(static_cast<size_t>(n[0]));
    n_valid_ = n[1];
    core_ = n[2];
    pool_per_epoch_ = n[3];
    comm->broadcast(lengths_.data(), n[0] * static_cast<int64_t>(sizeof(int64_t)), 0);
    // validation: each rank scores every N-th example (sent once) and the sums are added
    if (n_valid_ == 0) return;
    const int64_t N = comm->size();
    auto share_of = [&](int64_t r) {
      std::vector<int64_t> idx;
      for (int64_t i = r; i < n_valid_; i += N) idx.push_back(i);
      return idx;
    };
    if (lead_) {
      for (int r = 1; r < N; ++r) comm->send_string(pack_examples(valid, share_of(r)), r);
      for (int64_t i : share_of(0)) valid_share_.push_back(valid[static_cast<size_t>(i)]);
    } else {
      valid_share_ = unpack_examples(comm->recv_string(0), share_of(comm->rank()).size());
    }
  }

  int64_t parts() const { return parts_; }
  bool has_validation() const { return n_valid_ > 0; }
  // Epoch `epoch`'s batches (with subword sampling, first its examples: LoopConfig::resample).
  BatchPlan plan(int64_t epoch) {
    if (config_.resample && sampled_epoch_ != epoch) {
      sampled_ = config_.resample(epoch, given_);
      check(sampled_.size() == given_.size(), "train: internal: resampling gave ", sampled_.size(), " examples for ",
            given_.size());
      train_ = &sampled_;
      lengths_ = lengths_of(task_, sampled_);
      sampled_epoch_ = epoch;
    }
    return plan_epoch(lengths_, config_.max_tokens, config_.seed, epoch, core_, pool_per_epoch_);
  }

  // This rank's micro-batches of batch `at` of `plan` (epoch `epoch`): the whole batch, or its parts.
  std::vector<Batch> micro_batches(const BatchPlan& plan, int64_t epoch, int64_t at) {
    if (comm_ && held_epoch_ != epoch) hand_out(plan, epoch, at);
    const std::vector<int64_t>& global = plan.batches[static_cast<size_t>(at)];
    std::vector<Batch> micro;
    if (parts_ == 1) {
      micro.push_back(make_batch(cfg_, task_, *train_, global));
      return micro;
    }
    for (int64_t part = 0; part < parts_; ++part) {
      if (comm_ && part != comm_->rank()) continue;
      const std::vector<int64_t> idx = part_of(global, part, parts_);
      if (!idx.empty()) micro.push_back(batch_of(idx));
    }
    return micro;
  }

  // The target tokens (a classifier's: its input tokens) of a global batch, every rank's counted.
  int64_t tokens(const std::vector<int64_t>& global, const std::vector<Batch>& micro, const StepReport& rep) const {
    int64_t n = 0;
    if (parts_ > 1) {
      if (task_ != Task::Classify) return rep.tokens;
      for (int64_t i : global) n += lengths_[static_cast<size_t>(i)];
    } else if (task_ == Task::Classify) {
      const Batch& b = micro[0];
      for (int64_t r = 0; r < b.input_lengths.numel(); ++r) n += b.input_lengths.data<int64_t>()[r];
    } else {
      n = counted_targets(micro[0], cfg_.pad_id);
    }
    return n;
  }

  // The validation split's loss (every rank: its share, summed in rank order).
  EvalResult validate(const Model& model) const {
    if (!comm_) return evaluate(model, task_, valid_, config_.max_tokens);
    const EvalResult e = valid_share_.empty() ? EvalResult{} : evaluate(model, task_, valid_share_, config_.max_tokens);
    const auto n = static_cast<double>(e.count);
    double sums[3] = {e.loss * n, n, e.accuracy * n};
    comm_->sum_doubles(sums, 3);
    EvalResult all;
    all.count = static_cast<int64_t>(sums[1]);
    all.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    all.accuracy = sums[1] > 0 ? sums[2] / sums[1] : 0.0;
    return all;
  }

 private:
  // Rank 0 sends every other rank the examples of its parts of this epoch's batches from `at` on.
  void hand_out(const BatchPlan& plan, int64_t epoch, int64_t at) {
    std::vector<std::vector<int64_t>> need(static_cast<size_t>(parts_));
    for (size_t b = static_cast<size_t>(at); b < plan.batches.size(); ++b) {
      const std::vector<int64_t>& global = plan.batches[b];
      for (size_t i = 0; i < global.size(); ++i) need[i % static_cast<size_t>(parts_)].push_back(global[i]);
    }
    for (auto& n : need) std::sort(n.begin(), n.end());
    if (lead_) {
      for (int r = 1; r < comm_->size(); ++r) comm_->send_string(pack_examples(*train_, need[static_cast<size_t>(r)]), r);
    } else {
      held_.clear();
      held_index_ = std::move(need[static_cast<size_t>(comm_->rank())]);
      held_ = unpack_examples(comm_->recv_string(0), held_index_.size());
    }
    held_epoch_ = epoch;
  }
  // A part's batch from the examples this rank holds.
  Batch batch_of(const std::vector<int64_t>& idx) const {
    if (lead_) return make_batch(cfg_, task_, *train_, idx);
    std::vector<int64_t> local;
    for (int64_t i : idx) {
      const auto at = std::lower_bound(held_index_.begin(), held_index_.end(), i);
      check(at != held_index_.end() && *at == i, "train: internal: example ", i, " was not sent to rank ",
            comm_->rank());
      local.push_back(at - held_index_.begin());
    }
    return make_batch(cfg_, task_, held_, local);
  }

  Task task_;
  const ModelConfig& cfg_;
  const std::vector<Example>& given_;
  const std::vector<Example>* train_;  // the examples given, or this epoch's resampled ones
  std::vector<Example> sampled_;
  int64_t sampled_epoch_ = -1;
  const std::vector<Example>& valid_;
  const LoopConfig& config_;
  Communicator* comm_;
  bool lead_;
  std::vector<int64_t> lengths_;
  int64_t n_valid_ = 0, core_ = -1, pool_per_epoch_ = 0, parts_ = 1;
  std::vector<Example> valid_share_;
  std::vector<int64_t> held_index_;  // (another rank) the examples it holds, by sorted global index
  std::vector<Example> held_;
  int64_t held_epoch_ = -1;
};

// What a run writes besides the checkpoint (rank 0 only): metrics.jsonl, loss.svg, the best
// weights, and the snapshots of checkpoint averaging.
class RunFiles {
 public:
  RunFiles(const std::string& out_dir, const LoopConfig& config, Task task, float dropout, float label_smoothing)
      : dir_(out_dir), metrics_path_(out_dir + "/metrics.jsonl"), average_(config.average), task_(task),
        dropout_(dropout), label_smoothing_(label_smoothing) {}

  // On resume: the metrics and snapshots up to the checkpoint's step (later ones belong to steps
  // that will be redone).
  void resume_at(int64_t step) {
    for (const Metric& m : read_metrics(metrics_path_))
      if (m.step <= step) metrics_.push_back(m), text_ += m.line + "\n";
  }
  void drop_snapshots_after(int64_t step) {
    if (average_ > 1)
      for (int64_t s : snapshot_steps(dir_))
        if (s > step) std::filesystem::remove(snapshot_path(dir_, s));
  }
  void add(const Metric& m, const json& extra) {
    metrics_.push_back(m);
    text_ += metric_line(m, extra) + "\n";
  }
  // metrics first: a kill between the two writes leaves lines past the checkpoint's step (the
  // resumed run drops and redoes them), never a checkpoint whose steps have no lines; so with the
  // snapshot
  void write_metrics() const { write_file_atomic(metrics_path_, text_); }
  void write_curve() const { qkv::write_curve(dir_, metrics_, task_, dropout_, label_smoothing_); }
  // The weights now as a snapshot; only the last `average` are kept.
  void snapshot(const Model& model, int64_t step) const {
    if (average_ <= 1) return;
    std::filesystem::create_directories(snapshot_dir(dir_));
    write_safetensors(snapshot_path(dir_, step), model.state_dict());
    std::vector<int64_t> steps = snapshot_steps(dir_);
    for (size_t i = 0; i + static_cast<size_t>(average_) < steps.size(); ++i)
      std::filesystem::remove(snapshot_path(dir_, steps[i]));
  }
  // Checkpoint averaging: the mean of the kept snapshots (summed in double), validated, becomes
  // the model directory's weights if it validates better than `best` (updated); the model keeps
  // its own weights either way. Fills res's averaging fields.
  void average(Model& model, const std::function<double()>& valid_loss, bool has_valid, double& best,
               LoopResult& res) const {
    const std::vector<int64_t> snaps = average_ > 1 ? snapshot_steps(dir_) : std::vector<int64_t>{};
    if (snaps.size() < 2) return;
    const std::vector<std::pair<std::string, Tensor>> now = model.state_dict();
    std::vector<std::vector<double>> sum(now.size());
    for (size_t k = 0; k < now.size(); ++k) sum[k].assign(static_cast<size_t>(now[k].second.numel()), 0.0);
    for (int64_t s : snaps) {
      const std::string path = snapshot_path(dir_, s);
      const SafetensorsFile f = read_safetensors(path);
      for (size_t k = 0; k < now.size(); ++k) {
        const Tensor* t = f.find(now[k].first);
        check(t && t->shape() == now[k].second.shape() && t->dtype() == DType::F32, path, ": ", now[k].first,
              t ? " has another shape or type than the model's" : " is missing", "; remove ", snapshot_dir(dir_),
              " (a snapshot of another run?)");
        const float* v = t->data<float>();
        for (size_t i = 0; i < sum[k].size(); ++i) sum[k][i] += v[i];
      }
    }
    std::vector<std::pair<std::string, Tensor>> mean;
    for (size_t k = 0; k < now.size(); ++k) {
      Tensor t(now[k].second.shape(), DType::F32);
      float* d = t.data<float>();
      for (size_t i = 0; i < sum[k].size(); ++i) d[i] = static_cast<float>(sum[k][i] / static_cast<double>(snaps.size()));
      mean.emplace_back(now[k].first, std::move(t));
    }
    model.load_state_dict(mean);
    res.averaged = static_cast<int64_t>(snaps.size());
    res.averaged_valid_loss = has_valid ? valid_loss() : std::numeric_limits<double>::quiet_NaN();
    if (has_valid && res.averaged_valid_loss < best) {
      best = res.averaged_valid_loss;
      res.averaged_kept = true;
      model.save(dir_);
    }
    model.load_state_dict(now);
  }

 private:
  std::string dir_, metrics_path_;
  int64_t average_;
  Task task_;
  float dropout_, label_smoothing_;
  std::vector<Metric> metrics_;
  std::string text_;
};

}  // namespace

LoopResult run_training(Trainer& trainer, Task task, const std::vector<Example>& train,
                        const std::vector<Example>& valid, const std::string& out_dir, const LoopConfig& config,
                        bool resume, const std::function<void(const LoopProgress&)>& on_progress) {
  Communicator* comm = trainer.communicator();
  const bool lead = !comm || comm->rank() == 0;  // validates, writes and reports
  check(!lead || !train.empty(), "train: the training set is empty");
  check(config.max_steps > 0 || config.max_epochs > 0 || config.max_minutes > 0 || config.stop,
        "train: give a limit: steps, epochs or minutes");
  check(config.max_tokens >= 1, "train: max_tokens must be >= 1");
  check(!comm || config.parts <= 1 || config.parts == comm->size(), "train: ", config.parts, " parts on ",
        comm ? comm->size() : 1, " ranks: with a communicator the parts are the ranks");
  check(comm || config.parts <= 1 || trainer.config().token_mean,
        "train: parts > 1 need token_mean (one process accumulating what N ranks compute)");
  check(!comm || !config.resample, "train: subword sampling runs in one process, not with ranks (mpirun)");
  Model& model = trainer.model();
  const std::string ckpt = out_dir + "/checkpoint.safetensors";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LoopState st = resume ? LoopState::load(trainer, ckpt, out_dir) : LoopState{};
  RunFiles files(out_dir, config, task, model.config().dropout, trainer.config().label_smoothing);
  if (lead && resume) files.resume_at(trainer.steps_done());
  if (lead) files.drop_snapshots_after(trainer.steps_done());
  DataSource data(task, model.config(), train, valid, config, comm);
  // Every epoch has its own plan, and plans under a token budget differ in length from epoch to
  // epoch: the batch count is always the current plan's.
  BatchPlan plan = data.plan(st.epoch);
  auto per_epoch = [&] { return static_cast<int64_t>(plan.batches.size()); };
  if (resume)
    check(st.batch <= per_epoch(), ckpt, ": the data position (epoch ", st.epoch, ", batch ", st.batch,
          ") lies beyond that epoch's ", per_epoch(), " batches: the checkpoint does not belong to this data and --max-tokens");

  LoopResult res;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const int64_t start_step = trainer.steps_done();
  int64_t tokens = 0, last_eval_step = -1;
  auto fraction = [&]() -> double {
    double f = -1;
    const int64_t done = trainer.steps_done();
    if (config.max_steps > 0) f = std::max(f, static_cast<double>(done) / static_cast<double>(config.max_steps));
    if (config.max_epochs > 0)
      f = std::max(f, (static_cast<double>(st.epoch) + static_cast<double>(st.batch) / static_cast<double>(per_epoch())) /
                          static_cast<double>(config.max_epochs));
    if (config.max_minutes > 0) f = std::max(f, elapsed() / (60.0 * config.max_minutes));
    return std::min(f, 1.0);
  };
  const double start_fraction = std::max(0.0, fraction());
  // Every decision that is not a function of the data (a limit, a signal, a validation by the
  // clock) is agreed by the ranks once per step.
  bool limit = false, stop_now = false, clock_eval = false;
  double next_clock_eval = config.eval_every_seconds;
  auto decide = [&] {
    double f[3] = {(config.max_steps > 0 && trainer.steps_done() >= config.max_steps) ||
                           (config.max_epochs > 0 && st.epoch >= config.max_epochs) ||
                           (config.max_minutes > 0 && elapsed() >= 60.0 * config.max_minutes)
                       ? 1.0
                       : 0.0,
                   config.stop && config.stop->load() ? 1.0 : 0.0,
                   config.eval_every <= 0 && config.eval_every_seconds > 0 && elapsed() >= next_clock_eval ? 1.0 : 0.0};
    if (comm) comm->sum_doubles(f, 3);
    limit = f[0] > 0, stop_now = f[1] > 0, clock_eval = f[2] > 0;
  };
  decide();
  // The weights validated now: the best so far become the model directory's.
  auto validated = [&](const EvalResult& ev) {
    st.last_valid = ev.loss;
    const bool better = ev.loss < st.best;
    if (better) st.best = ev.loss, model.save(out_dir);
    return better;
  };

  while (true) {
    // one process looks at the clock and the stop flag here, as it always did; ranks use what
    // they agreed on at the end of the last step
    if (!comm) decide();
    if (limit) break;
    if (stop_now) {
      res.interrupted = true;
      break;
    }
    if (st.batch >= per_epoch()) {
      ++st.epoch;
      st.batch = 0;
      plan = data.plan(st.epoch);
      if (comm) decide();
      continue;  // the epoch limit is checked first
    }
    const std::vector<Batch> micro = data.micro_batches(plan, st.epoch, st.batch);
    const std::vector<int64_t>& global = plan.batches[static_cast<size_t>(st.batch)];
    const auto step_t0 = std::chrono::steady_clock::now();
    const StepReport rep = trainer.step(micro);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
    res.step_seconds += step_s;
    res.comm_seconds += rep.comm_seconds;
    ++st.batch;
    const int64_t step_tokens = data.tokens(global, micro, rep);
    tokens += step_tokens;
    decide();  // (ranks: agreed here, once per step)
    // Validation: every --eval-every steps, or when the clock says so, or at each epoch's end,
    // and at the limit; never on a stop request (Ctrl-C should save and return at once).
    const bool eval_now = (config.eval_every > 0             ? rep.step % config.eval_every == 0
                           : config.eval_every_seconds > 0 ? clock_eval
                                                           : st.batch == per_epoch()) ||
                          limit;
    if (eval_now) last_eval_step = rep.step;
    if (clock_eval) next_clock_eval = elapsed() + config.eval_every_seconds;
    std::optional<EvalResult> ev;
    if (eval_now && data.has_validation()) ev = data.validate(model);  // (every rank: its share)
    if (!lead) continue;  // the other ranks go on to the next step (and wait there for rank 0)
    LoopProgress p;
    p.step = rep.step;
    p.epoch = st.epoch;
    p.loss = rep.loss;
    p.lr = rep.lr;
    p.elapsed_s = elapsed();
    p.start_fraction = start_fraction;
    p.valid_loss = st.last_valid;  // the latest known (from the checkpoint on resume), NaN when none
    p.tokens_per_s = p.elapsed_s > 0 ? static_cast<double>(tokens) / p.elapsed_s : 0;
    Metric m{rep.step, rep.skipped ? nan : rep.loss, nan, {}};
    json extra = {{"epoch", st.epoch},  {"lr", rep.lr},        {"grad_norm", rep.grad_norm},
                  {"tokens_per_s", p.tokens_per_s}, {"tokens", step_tokens}, {"step_seconds", step_s}};
    if (rep.skipped) extra["skipped"] = true;
    if (comm) {
      extra["comm_wait_fraction"] = step_s > 0 ? rep.comm_seconds / step_s : 0.0;
      extra["buckets"] = rep.buckets;
      extra["buckets_in_backward"] = rep.buckets_early;
      if (rep.resummed) extra["resummed"] = true;
    }
    if (ev) {
      m.valid_loss = ev->loss;
      extra["valid_accuracy"] = ev->accuracy;
      p.evaluated = true;
      p.valid_loss = ev->loss;
      p.best = validated(*ev);
    }
    if (eval_now && !data.has_validation()) model.save(out_dir);
    files.add(m, extra);
    if (eval_now) {
      files.write_metrics();
      files.snapshot(model, trainer.steps_done());
      st.save(trainer, ckpt);
      files.write_curve();
    }
    p.fraction = fraction();
    if (on_progress) on_progress(p);
  }
  res.steps = trainer.steps_done();
  res.start_step = start_step;
  res.epochs_done = st.epoch + (st.batch >= per_epoch() ? 1 : 0);  // an epoch whose last batch ran is done
  res.epochs = static_cast<double>(st.epoch) +
               std::min(1.0, static_cast<double>(st.batch) / static_cast<double>(std::max<int64_t>(1, per_epoch())));
  res.seconds = elapsed();
  // A run that ended between evaluations is validated once more (its weights may be the best).
  const bool ended_between = !res.interrupted && last_eval_step != trainer.steps_done();
  std::optional<EvalResult> final_eval;
  if (ended_between && data.has_validation() && trainer.steps_done() > start_step) final_eval = data.validate(model);
  if (!lead) return res;
  if (final_eval) {
    validated(*final_eval);
    files.add(Metric{trainer.steps_done(), nan, final_eval->loss, {}}, {{"valid_accuracy", final_eval->accuracy}});
  }
  // Interrupted or out of time between evaluations: the last state is saved either way (the
  // metrics first, as above).
  files.write_metrics();
  if (ended_between) files.snapshot(model, trainer.steps_done());
  st.save(trainer, ckpt);
  files.write_curve();
  struct stat sb{};
  if (::stat((out_dir + "/model.safetensors").c_str(), &sb) != 0) model.save(out_dir);
  // Checkpoint averaging (on this process: the other ranks have returned).
  if (!res.interrupted)
    files.average(model, [&] { return evaluate(model, task, valid, config.max_tokens).loss; }, !valid.empty(), st.best,
                  res);
  res.best_valid_loss = std::isfinite(st.best) ? st.best : nan;
  res.last_valid_loss = st.last_valid;
  return res;
}

}  // namespace qkv
