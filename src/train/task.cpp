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

LoopResult run_training(Trainer& trainer, Task task, const std::vector<Example>& train,
                        const std::vector<Example>& valid, const std::string& out_dir, const LoopConfig& config,
                        bool resume, const std::function<void(const LoopProgress&)>& on_progress) {
  Communicator* comm = trainer.communicator();
  const bool lead = !comm || comm->rank() == 0;  // validates, writes and reports
  // With ranks, rank 0 alone holds the data (it read and tokenised it): the others get every
  // example's length (for the batch plan) now, and the examples of their parts epoch by epoch.
  check(!lead || !train.empty(), "train: the training set is empty");
  check(config.max_steps > 0 || config.max_epochs > 0 || config.max_minutes > 0 || config.stop,
        "train: give a limit: steps, epochs or minutes");
  check(config.max_tokens >= 1, "train: max_tokens must be >= 1");
  Model& model = trainer.model();
  const ModelConfig& cfg = model.config();
  const std::string ckpt = out_dir + "/checkpoint.safetensors", metrics_path = out_dir + "/metrics.jsonl";
  const double nan = std::numeric_limits<double>::quiet_NaN();

  // Where the data stands: epoch e's batch order is a function of (seed, e) only, so a position
  // (epoch, batch) is all a checkpoint needs to continue with the same batches.
  int64_t epoch = 0, batch_pos = 0;
  double best = std::numeric_limits<double>::infinity(), last_valid = nan;
  std::vector<Metric> metrics;
  if (resume) {
    std::string state;
    if (!comm) {
      state = trainer.load_checkpoint(ckpt);
    } else {
      // rank 0 reads the checkpoint and hands its contents to the others (which need no file)
      SafetensorsFile f;
      on_lead(*comm, [&] {
        f = read_safetensors(ckpt);
        state = trainer.load_checkpoint(f, ckpt);
      });
      broadcast_safetensors(*comm, f, 0);
      if (!lead) state = trainer.load_checkpoint(f, ckpt + " (from rank 0)");
      uint64_t h = fnv1a(nullptr, 0);
      for (const Parameter& p : trainer.model().parameters())
        h = fnv1a(p.var->value.data<float>(), static_cast<size_t>(p.var->value.numel()) * sizeof(float), h);
      check(same_on_every_rank(*comm, h), ckpt, ": the ranks loaded different weights (checksums differ): is ", out_dir,
            " the same directory on every machine?");
    }
    json j;
    try {
      j = json::parse(state);
    } catch (const json::exception& e) {
      throw Error(ckpt + ": the data position is not valid JSON: " + e.what());
    }
    check(j.is_object() && j.contains("epoch") && j.contains("batch") && j["epoch"].is_number_integer() &&
              j["batch"].is_number_integer(),
          ckpt, ": the checkpoint has no data position (epoch, batch); was it written by qkv train?");
    epoch = j["epoch"].get<int64_t>();
    batch_pos = j["batch"].get<int64_t>();
    check(epoch >= 0 && epoch <= (int64_t{1} << 40) && batch_pos >= 0, ckpt, ": the data position (epoch ", epoch,
          ", batch ", batch_pos, ") is out of range; expected non-negative integers");
    // A validation loss is a finite non-negative number, or null when there was none.
    auto loss_field = [&](const char* key, double& dst) {
      if (!j.contains(key) || j[key].is_null()) return;
      check(j[key].is_number() && std::isfinite(j[key].get<double>()) && j[key].get<double>() >= 0, ckpt,
            ": the data position's \"", key, "\" must be a finite loss >= 0 or null, got ", j[key].dump());
      dst = j[key].get<double>();
    };
    loss_field("best", best);
    loss_field("last_valid", last_valid);
    // metrics up to the checkpoint's step (later lines belong to steps that will be redone)
    if (lead)
      for (const Metric& m : read_metrics(metrics_path))
        if (m.step <= trainer.steps_done()) metrics.push_back(m);
  }
  std::string metrics_text;
  for (const Metric& m : metrics) metrics_text += m.line + "\n";
  // Snapshots beyond the checkpoint's step belong to steps that will be redone.
  if (lead && config.average > 1)
    for (int64_t s : snapshot_steps(out_dir))
      if (s > trainer.steps_done()) std::filesystem::remove(snapshot_path(out_dir, s));
  // The weights now as a snapshot; only the last config.average are kept.
  auto save_snapshot = [&] {
    if (config.average <= 1) return;
    std::filesystem::create_directories(snapshot_dir(out_dir));
    write_safetensors(snapshot_path(out_dir, trainer.steps_done()), model.state_dict());
    std::vector<int64_t> steps = snapshot_steps(out_dir);
    for (size_t i = 0; i + static_cast<size_t>(config.average) < steps.size(); ++i)
      std::filesystem::remove(snapshot_path(out_dir, steps[i]));
  };

  std::vector<int64_t> lengths = lead ? lengths_of(task, train) : std::vector<int64_t>{};
  int64_t n_valid = static_cast<int64_t>(valid.size()), core = config.core, pool_per_epoch = config.pool_per_epoch;
  if (comm) {
    int64_t n[4] = {static_cast<int64_t>(lengths.size()), n_valid, core, pool_per_epoch};
    comm->broadcast(n, sizeof n, 0);
    lengths.resize(static_cast<size_t>(n[0]));
    n_valid = n[1];
    core = n[2];
    pool_per_epoch = n[3];
    comm->broadcast(lengths.data(), n[0] * static_cast<int64_t>(sizeof(int64_t)), 0);
  }
  auto plan_for = [&](int64_t e) {
    return plan_epoch(lengths, config.max_tokens, config.seed, e, core, pool_per_epoch);
  };
  // Every epoch has its own plan, and plans under a token budget differ in length from epoch to
  // epoch: the batch count is always the current plan's.
  BatchPlan plan = plan_for(epoch);
  auto per_epoch = [&] { return static_cast<int64_t>(plan.batches.size()); };
  if (resume)
    check(batch_pos <= per_epoch(), ckpt, ": the data position (epoch ", epoch, ", batch ", batch_pos,
          ") lies beyond that epoch's ", per_epoch(), " batches: the checkpoint does not belong to this data and --max-tokens");

  LoopResult res;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const int64_t start_step = trainer.steps_done();
  int64_t tokens = 0, last_eval_step = -1;
  const int64_t pad = cfg.pad_id;

  auto save_checkpoint = [&] {
    const json state = {{"epoch", epoch}, {"batch", batch_pos}, {"best", std::isfinite(best) ? json(best) : json()},
                        {"last_valid", std::isnan(last_valid) ? json() : json(last_valid)}};
    trainer.save_checkpoint(ckpt, state.dump());
  };
  auto fraction = [&]() -> double {
    double f = -1;
    const int64_t done = trainer.steps_done();
    if (config.max_steps > 0) f = std::max(f, static_cast<double>(done) / static_cast<double>(config.max_steps));
    if (config.max_epochs > 0)
      f = std::max(f, (static_cast<double>(epoch) + static_cast<double>(batch_pos) / static_cast<double>(per_epoch())) /
                          static_cast<double>(config.max_epochs));
    if (config.max_minutes > 0) f = std::max(f, elapsed() / (60.0 * config.max_minutes));
    return std::min(f, 1.0);
  };
  auto limit_reached = [&] {
    if (config.max_steps > 0 && trainer.steps_done() >= config.max_steps) return true;
    if (config.max_epochs > 0 && epoch >= config.max_epochs) return true;
    if (config.max_minutes > 0 && elapsed() >= 60.0 * config.max_minutes) return true;
    return false;
  };

  const double start_fraction = std::max(0.0, fraction());

  // Data parallelism: each global batch (the plan's, as in one process) is split into `parts`
  // strided parts; rank r trains on part r. Every rank runs this same loop, so every decision
  // that is not a function of the data (a time limit, a signal) is agreed once per step.
  const int64_t parts = comm ? comm->size() : std::max<int64_t>(1, config.parts);
  check(!comm || config.parts <= 1 || config.parts == comm->size(), "train: ", config.parts, " parts on ",
        comm ? comm->size() : 1, " ranks: with a communicator the parts are the ranks");
  check(parts == 1 || comm || trainer.config().token_mean,
        "train: parts > 1 need token_mean (one process accumulating what N ranks compute)");
  bool limit = false, stop_now = false;
  // a validation by the clock (LoopConfig::eval_every_seconds) is due: agreed like the limits
  bool clock_eval = false;
  double next_clock_eval = config.eval_every_seconds;
  auto decide = [&] {
    limit = limit_reached();
    stop_now = config.stop && config.stop->load();
    clock_eval = config.eval_every <= 0 && config.eval_every_seconds > 0 && elapsed() >= next_clock_eval;
    if (comm) {
      double f[3] = {limit ? 1.0 : 0.0, stop_now ? 1.0 : 0.0, clock_eval ? 1.0 : 0.0};
      comm->sum_doubles(f, 3);
      limit = f[0] > 0;
      stop_now = f[1] > 0;
      clock_eval = f[2] > 0;
    }
  };
  decide();
  // Validation: with N ranks each scores every N-th example (rank 0 sends the others theirs, once)
  // and the sums are added (in rank order).
  std::vector<Example> valid_share;
  if (comm && n_valid > 0) {
    const int64_t N = comm->size();
    auto share_of = [&](int64_t r) {
      std::vector<int64_t> idx;
      for (int64_t i = r; i < n_valid; i += N) idx.push_back(i);
      return idx;
    };
    if (lead) {
      for (int r = 1; r < N; ++r) comm->send_string(pack_examples(valid, share_of(r)), r);
      for (int64_t i : share_of(0)) valid_share.push_back(valid[static_cast<size_t>(i)]);
    } else {
      valid_share = unpack_examples(comm->recv_string(0), share_of(comm->rank()).size());
    }
  }
  auto validate = [&]() -> EvalResult {
    if (!comm) return evaluate(model, task, valid, config.max_tokens);
    const std::vector<Example>& share = valid_share;
    const EvalResult e = share.empty() ? EvalResult{} : evaluate(model, task, share, config.max_tokens);
    const auto n = static_cast<double>(e.count);
    double sums[3] = {e.loss * n, n, e.accuracy * n};
    comm->sum_doubles(sums, 3);
    EvalResult all;
    all.count = static_cast<int64_t>(sums[1]);
    all.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    all.accuracy = sums[1] > 0 ? sums[2] / sums[1] : 0.0;
    return all;
  };

  // The examples this rank trains on: rank 0 (or one process) has them all in `train`; another
  // rank holds those its parts of the current epoch's remaining batches need (`held`, by sorted
  // global index), which rank 0 sends it when the epoch begins.
  std::vector<int64_t> held_index;
  std::vector<Example> held;
  int64_t held_epoch = -1;
  // need[r]: the examples of rank r's parts of this epoch's batches from batch_pos on, sorted
  auto needed = [&] {
    std::vector<std::vector<int64_t>> need(static_cast<size_t>(parts));
    for (size_t b = static_cast<size_t>(batch_pos); b < plan.batches.size(); ++b) {
      const std::vector<int64_t>& global = plan.batches[b];
      for (size_t i = 0; i < global.size(); ++i) need[i % static_cast<size_t>(parts)].push_back(global[i]);
    }
    for (auto& n : need) std::sort(n.begin(), n.end());
    return need;
  };
  auto hand_out_epoch = [&] {
    std::vector<std::vector<int64_t>> need = needed();
    if (lead) {
      for (int r = 1; r < comm->size(); ++r) comm->send_string(pack_examples(train, need[static_cast<size_t>(r)]), r);
    } else {
      held.clear();
      held_index = std::move(need[static_cast<size_t>(comm->rank())]);
      held = unpack_examples(comm->recv_string(0), held_index.size());
    }
    held_epoch = epoch;
  };
  // A part's batch from the examples this rank holds.
  auto batch_of = [&](const std::vector<int64_t>& idx) {
    if (lead) return make_batch(cfg, task, train, idx);
    std::vector<int64_t> local;
    for (int64_t i : idx) {
      const auto at = std::lower_bound(held_index.begin(), held_index.end(), i);
      check(at != held_index.end() && *at == i, "train: internal: example ", i, " was not sent to rank ",
            comm->rank());
      local.push_back(at - held_index.begin());
    }
    return make_batch(cfg, task, held, local);
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
    if (batch_pos >= per_epoch()) {
      ++epoch;
      batch_pos = 0;
      plan = plan_for(epoch);
      if (comm) decide();
      continue;  // the epoch limit is checked first
    }
    if (comm && held_epoch != epoch) hand_out_epoch();
    const std::vector<int64_t>& global = plan.batches[static_cast<size_t>(batch_pos)];
    std::vector<Batch> micro;
    if (parts == 1) {
      micro.push_back(make_batch(cfg, task, train, global));
    } else {
      for (int64_t part = 0; part < parts; ++part) {
        if (comm && part != comm->rank()) continue;
        const std::vector<int64_t> idx = part_of(global, part, parts);
        if (!idx.empty()) micro.push_back(batch_of(idx));
      }
    }
    const auto step_t0 = std::chrono::steady_clock::now();
    const StepReport rep = trainer.step(micro);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
    res.step_seconds += step_s;
    res.comm_seconds += rep.comm_seconds;
    ++batch_pos;
    const int64_t tokens_before = tokens;
    if (parts > 1) {
      // the global batch's: counted over every rank (classify: its input tokens)
      if (task == Task::Classify) {
        for (int64_t i : global) tokens += lengths[static_cast<size_t>(i)];
      } else {
        tokens += rep.tokens;
      }
    } else if (task == Task::Classify) {
      // a classifier's tokens are its inputs' (each example has one target)
      const Batch& b = micro[0];
      for (int64_t r = 0; r < b.input_lengths.numel(); ++r) tokens += b.input_lengths.data<int64_t>()[r];
    } else {
      tokens += counted_targets(micro[0], pad);
    }
    decide();  // (ranks: agreed here, once per step)
    LoopProgress p;
    p.step = rep.step;
    p.epoch = epoch;
    p.loss = rep.loss;
    p.lr = rep.lr;
    p.elapsed_s = elapsed();
    p.start_fraction = start_fraction;
    p.valid_loss = last_valid;  // the latest known (from the checkpoint on resume), NaN when none
    p.tokens_per_s = p.elapsed_s > 0 ? static_cast<double>(tokens) / p.elapsed_s : 0;
    Metric m{rep.step, rep.skipped ? nan : rep.loss, nan, {}};
    json extra = {{"epoch", epoch},
                  {"lr", rep.lr},
                  {"grad_norm", rep.grad_norm},
                  {"tokens_per_s", p.tokens_per_s},
                  {"tokens", tokens - tokens_before},
                  {"step_seconds", step_s}};
    if (rep.skipped) extra["skipped"] = true;
    if (comm) {
      extra["comm_wait_fraction"] = step_s > 0 ? rep.comm_seconds / step_s : 0.0;
      extra["buckets"] = rep.buckets;
      extra["buckets_in_backward"] = rep.buckets_early;
      if (rep.resummed) extra["resummed"] = true;
    }
    // (a stop request skips validation: Ctrl-C should save and return at once)
    // (without --eval-every: at the end of each epoch, whatever its length)
    // (with eval_every_seconds: when the clock says so, instead of at each epoch's end)
    const bool eval_now = (config.eval_every > 0             ? rep.step % config.eval_every == 0
                           : config.eval_every_seconds > 0 ? clock_eval
                                                           : batch_pos == per_epoch()) ||
                          limit;
    if (eval_now) last_eval_step = rep.step;
    if (clock_eval) next_clock_eval = elapsed() + config.eval_every_seconds;
    std::optional<EvalResult> evaluated;
    if (eval_now && n_valid > 0) evaluated = validate();  // (every rank: its share)
    if (!lead) continue;  // the other ranks go on to the next step (and wait there for rank 0)
    if (evaluated) {
      const EvalResult ev = *evaluated;
      m.valid_loss = last_valid = ev.loss;
      extra["valid_accuracy"] = ev.accuracy;
      p.evaluated = true;
      p.valid_loss = ev.loss;
      if (ev.loss < best) {
        best = ev.loss;
        p.best = true;
        model.save(out_dir);  // the best weights are the model directory's
      }
    }
    if (eval_now && n_valid == 0) model.save(out_dir);
    metrics.push_back(m);
    metrics_text += metric_line(m, extra) + "\n";
    if (eval_now) {
      // metrics first: a kill between the two writes leaves lines past the checkpoint's step (the
      // resumed run drops and redoes them), never a checkpoint whose steps have no lines; so with
      // the snapshot
      write_file_atomic(metrics_path, metrics_text);
      save_snapshot();
      save_checkpoint();
      write_curve(out_dir, metrics, task, cfg.dropout, trainer.config().label_smoothing);
    }
    p.fraction = fraction();
    if (on_progress) on_progress(p);
  }
  res.steps = trainer.steps_done();
  res.start_step = start_step;
  res.epochs_done = epoch + (batch_pos >= per_epoch() ? 1 : 0);  // an epoch whose last batch ran is done
  res.epochs = static_cast<double>(epoch) +
               std::min(1.0, static_cast<double>(batch_pos) / static_cast<double>(std::max<int64_t>(1, per_epoch())));
  res.seconds = elapsed();
  // A run that ended between evaluations is validated once more (its weights may be the best).
  std::optional<EvalResult> final_eval;
  if (!res.interrupted && last_eval_step != trainer.steps_done() && n_valid > 0 &&
      trainer.steps_done() > start_step)
    final_eval = validate();
  if (!lead) return res;
  if (final_eval) {
    const EvalResult ev = *final_eval;
    last_valid = ev.loss;
    if (ev.loss < best) {
      best = ev.loss;
      model.save(out_dir);
    }
    Metric m{trainer.steps_done(), nan, ev.loss, {}};
    metrics.push_back(m);
    metrics_text += metric_line(m, {{"valid_accuracy", ev.accuracy}}) + "\n";
  }
  // Interrupted or out of time between evaluations: the last state is saved either way (the
  // metrics first, as above).
  write_file_atomic(metrics_path, metrics_text);
  if (!res.interrupted && last_eval_step != trainer.steps_done()) save_snapshot();
  save_checkpoint();
  write_curve(out_dir, metrics, task, cfg.dropout, trainer.config().label_smoothing);
  struct stat st{};
  if (::stat((out_dir + "/model.safetensors").c_str(), &st) != 0) model.save(out_dir);
  // Checkpoint averaging: the mean of the kept snapshots, validated (on this process: the other
  // ranks have returned), replaces the model directory's weights if it validates better.
  const std::vector<int64_t> snaps = config.average > 1 && !res.interrupted ? snapshot_steps(out_dir)
                                                                           : std::vector<int64_t>{};
  if (snaps.size() >= 2) {
    const std::vector<std::pair<std::string, Tensor>> now = model.state_dict();
    std::vector<std::vector<double>> sum(now.size());
    for (size_t k = 0; k < now.size(); ++k) sum[k].assign(static_cast<size_t>(now[k].second.numel()), 0.0);
    for (int64_t s : snaps) {
      const std::string path = snapshot_path(out_dir, s);
      const SafetensorsFile f = read_safetensors(path);
      for (size_t k = 0; k < now.size(); ++k) {
        const Tensor* t = f.find(now[k].first);
        check(t && t->shape() == now[k].second.shape() && t->dtype() == DType::F32, path, ": ", now[k].first,
              t ? " has another shape or type than the model's" : " is missing", "; remove ", snapshot_dir(out_dir),
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
    res.averaged_valid_loss = valid.empty() ? nan : evaluate(model, task, valid, config.max_tokens).loss;
    if (!valid.empty() && res.averaged_valid_loss < best) {
      best = res.averaged_valid_loss;
      res.averaged_kept = true;
      model.save(out_dir);
    }
    model.load_state_dict(now);
  }
  res.best_valid_loss = std::isfinite(best) ? best : nan;
  res.last_valid_loss = last_valid;
  return res;
}

}  // namespace qkv
