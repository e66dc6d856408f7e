// Trainer: accumulation, clipping, non-finite step skipping, AdamW, checkpoints.
#include "qkv/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "kernels/adamw.h"
#include "train/grad_reducer.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/safetensors.h"

namespace qkv {
namespace {

using json = nlohmann::json;

// Dropout seed of micro-batch k at step s: distinct streams per (seed, step, k).
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void validate(const TrainConfig& c) {
  qkv::validate(c.schedule);
  check(c.beta1 >= 0 && c.beta1 < 1, "train: beta1 must be in [0, 1), got ", c.beta1);
  check(c.beta2 >= 0 && c.beta2 < 1, "train: beta2 must be in [0, 1), got ", c.beta2);
  check(std::isfinite(c.eps) && c.eps > 0, "train: eps must be finite and > 0, got ", c.eps);
  check(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "train: weight_decay must be finite and >= 0, got ",
        c.weight_decay);
  check(std::isfinite(c.clip_norm) && c.clip_norm >= 0, "train: clip_norm must be finite and >= 0 (0 = off), got ",
        c.clip_norm);
  check(c.label_smoothing >= 0 && c.label_smoothing <= 1, "train: label_smoothing must be in [0, 1]");
}

json schedule_json(const Schedule& s) {
  return {{"kind", schedule_name(s.kind)}, {"lr", s.lr}, {"warmup", s.warmup}, {"total", s.total},
          {"min_lr", s.min_lr}, {"d_model", s.d_model}};
}

}  // namespace

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "f32"; }

Precision parse_precision(const std::string& s, const std::string& what) {
  if (s == "f32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  fail(what, ": '", s, "' is not a training precision; expected f32 or bf16");
}

Trainer::Trainer(Model& model, TrainConfig config) : model_(model), config_(std::move(config)), rng_(config_.seed) {
  validate(config_);
  model_.check_not_packed("train");
  for (const Parameter& p : model_.parameters()) {
    m_.emplace_back(p.var->value.shape(), DType::F32);
    v_.emplace_back(p.var->value.shape(), DType::F32);
  }
}

StepReport Trainer::step(const std::vector<Batch>& micro) {
  const bool token_mean = config_.token_mean || comm_ != nullptr;
  check(!micro.empty() || comm_, "train: a step needs at least one batch");
  std::vector<Parameter>& params = model_.parameters();
  for (Parameter& p : params) p.var->zero_grad();
  StepReport r;
  r.step = step_ + 1;
  // --precision bf16: the forward and backward passes' matrix products in bfloat16
  std::optional<Bf16Matmul> bf16;
  // and each weight rounded once for the step's forward and backward passes (closed before the
  // optimiser writes the weights; the copies' memory is kept in bf16_buffers_ for the next step)
  std::optional<Bf16Weights> bf16_weights;
  if (config_.precision == Precision::BF16) {
    bf16.emplace();
    std::vector<std::pair<const float*, int64_t>> arrays;
    for (const Parameter& p : params) arrays.emplace_back(p.var->value.data<float>(), p.var->value.numel());
    if (!bf16_buffers_) bf16_buffers_ = std::make_shared<Bf16WeightBuffers>();
    bf16_weights.emplace(arrays, bf16_buffers_.get());
  }
  const float inv = 1.0f / static_cast<float>(micro.size());
  // a rank's micro-batch k is part rank + k of the global batch: its dropout stream is that part's
  const uint64_t first = comm_ ? static_cast<uint64_t>(comm_->rank()) : 0;
  if (comm_ && (!reducer_ || reducer_bytes_ != config_.bucket_bytes)) {
    reducer_ = std::make_shared<GradientReducer>(params, config_.bucket_bytes);
    reducer_bytes_ = config_.bucket_bytes;
  }
  if (comm_) reducer_->begin(params, !micro.empty());
  bool backward_ran = false;
  double loss_sum = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    Tape tape;
    if (comm_ && k + 1 == micro.size())  // the last backward finishes gradients: send them as it does
      tape.after_op = [this, &params](size_t i) { reducer_->after_op(params, *comm_, i); };
    ForwardOptions opt;
    opt.training = true;
    opt.dropout_seed = mix(mix(config_.seed, static_cast<uint64_t>(r.step)), first + k);
    Var logits = model_.logits(tape, micro[k], opt);
    int64_t counted = 0;
    Var loss = model_.loss(tape, logits, micro[k], config_.label_smoothing, &counted);
    logits.reset();
    const double l = loss->value.data<float>()[0];
    r.tokens += counted;
    if (token_mean) {
      // the sum of the part's token losses; the gradient likewise, divided by the global count below
      if (counted == 0) {
        tape.clear();
        continue;
      }
      loss_sum += l * static_cast<double>(counted);
      if (std::isfinite(l)) {
        tape.backward(loss, static_cast<float>(counted));
        if (k + 1 == micro.size()) backward_ran = true;
      } else {
        tape.clear();
      }
      continue;
    }
    loss_sum += l;
    if (std::isfinite(l)) {
      // grad <- grad + (1 / micro-batches) d(loss_k)
      tape.backward(loss, inv);
    } else {
      tape.clear();
    }
  }
  bf16_weights.reset();
  r.lr = learning_rate(config_.schedule, r.step);
  step_ = r.step;
  double grad_divisor = 1.0;  // token_mean: the gradient so far is of the sum of token losses
  int64_t late = 0;
  if (comm_) {
    // the buckets not sent during backward, and every sum awaited: the wait is what overlapping
    // did not hide
    const auto t0 = std::chrono::steady_clock::now();
    late = reducer_->finish(params, *comm_, backward_ran);
    r.buckets = reducer_->buckets();
    r.buckets_early = reducer_->buckets_early();
    r.comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (token_mean) {
    double totals[3] = {loss_sum, static_cast<double>(r.tokens), static_cast<double>(late)};
    if (comm_) {
      const auto t0 = std::chrono::steady_clock::now();
      comm_->sum_doubles(totals, 3);
      r.comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    late = static_cast<int64_t>(totals[2]);
    r.resummed = late > 0;
    r.tokens = static_cast<int64_t>(totals[1]);
    r.loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
    grad_divisor = std::max(totals[1], 1.0);
  } else {
    r.loss = loss_sum / static_cast<double>(micro.size());
  }

  // A parameter no gradient reached (e.g. an unused embedding row's whole table) has gradient 0.
  std::vector<const float*> gp;
  std::vector<int64_t> sizes;
  for (Parameter& p : params) {
    if (!p.var->has_grad) {
      bool add = false;
      float* g = p.var->grad_dest(&add);
      std::fill(g, g + p.var->value.numel(), 0.0f);
    }
    gp.push_back(p.var->grad.data<float>());
    sizes.push_back(p.var->value.numel());
  }
  if (comm_) r.comm_seconds += reducer_->land(params, *comm_, late > 0);
  const int threads = num_threads();
  r.grad_norm = std::sqrt(kernels::global_grad_norm_sq(gp.data(), sizes.data(), static_cast<int64_t>(gp.size()), threads)) /
                grad_divisor;
  // NaN fails every comparison, so test finiteness, never "norm > limit".
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  // g <- g * min(1, clip / (norm + 1e-6))   (torch.nn.utils.clip_grad_norm_), applied inside
  // the AdamW pass; the gradients themselves are left as backward made them.
  double scale = 1.0 / grad_divisor;
  if (config_.clip_norm > 0) {
    const double coef = config_.clip_norm / (r.grad_norm + 1e-6);
    if (coef < 1.0) scale *= coef;
  }
  const auto grad_scale = static_cast<float>(scale);
  ++updates_;
  // every parameter in one parallel region (the same bits as one adamw_step each)
  std::vector<kernels::AdamWTensor> update(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    kernels::AdamWParams& ap = update[i].p;
    ap.lr = static_cast<float>(r.lr);
    ap.beta1 = static_cast<float>(config_.beta1);
    ap.beta2 = static_cast<float>(config_.beta2);
    ap.eps = static_cast<float>(config_.eps);
    ap.weight_decay = (params[i].decay || config_.decay_all) ? static_cast<float>(config_.weight_decay) : 0.0f;
    ap.step = updates_;
    ap.grad_scale = grad_scale;
    update[i].param = params[i].var->value.data<float>();
    update[i].grad = params[i].var->grad.data<float>();
    update[i].m = m_[i].data<float>();
    update[i].v = v_[i].data<float>();
    update[i].n = params[i].var->value.numel();
  }
  kernels::adamw_steps(update.data(), static_cast<int64_t>(update.size()), threads);
  return r;
}

void Trainer::save_checkpoint(const std::string& path, const std::string& data_state) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::vector<Parameter>& params = model_.parameters();
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back("model." + params[i].name, params[i].var->value);
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back("adam_m." + params[i].name, m_[i]);
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back("adam_v." + params[i].name, v_[i]);
  const Rng::State s = rng_.state();
  json rng = {{"s", {s.s[0], s.s[1], s.s[2], s.s[3]}}, {"has_spare", s.has_spare}};
  // The spare normal as its exact bits.
  uint64_t spare_bits = 0;
  std::memcpy(&spare_bits, &s.spare, sizeof spare_bits);
  rng["spare_bits"] = spare_bits;
  json train = {{"precision", precision_name(config_.precision)},
                {"step", step_},
                {"updates", updates_},
                {"schedule", schedule_json(config_.schedule)},
                {"beta1", config_.beta1},
                {"beta2", config_.beta2},
                {"eps", config_.eps},
                {"weight_decay", config_.weight_decay},
                {"decay_all", config_.decay_all},
                {"clip_norm", config_.clip_norm},
                {"label_smoothing", config_.label_smoothing},
                {"token_mean", config_.token_mean},
                {"seed", config_.seed}};
  std::map<std::string, std::string> meta = {{"qkv_checkpoint", "1"},
                                             {"config", model_.config().to_json()},
                                             {"train", train.dump()},
                                             {"rng", rng.dump()},
                                             {"data", data_state}};
  write_safetensors(path, tensors, meta);
}

namespace {
json meta_json(const SafetensorsFile& f, const std::string& key, const std::string& path) {
  auto it = f.metadata.find(key);
  check(it != f.metadata.end(), path, ": not a qkv checkpoint (metadata \"", key, "\" is missing)");
  try {
    return json::parse(it->second);
  } catch (const json::exception& e) {
    throw Error(detail::concat(path, ": checkpoint metadata \"", key, "\" is not valid JSON: ", e.what()));
  }
}
}  // namespace

ModelConfig checkpoint_model_config(const std::string& path) {
  const SafetensorsReader f(path);
  auto it = f.metadata().find("config");
  check(f.metadata().count("qkv_checkpoint") && it != f.metadata().end(), path, ": not a qkv checkpoint");
  return ModelConfig::from_json(it->second, path + " (config)");
}

Precision checkpoint_precision(const std::string& path) {
  const SafetensorsReader f(path);
  check(f.metadata().count("qkv_checkpoint"), path, ": not a qkv checkpoint");
  auto it = f.metadata().find("train");
  check(it != f.metadata().end(), path, ": not a qkv checkpoint (metadata \"train\" is missing)");
  json train;
  try {
    train = json::parse(it->second);
  } catch (const json::exception& e) {
    throw Error(detail::concat(path, ": checkpoint metadata \"train\" is not valid JSON: ", e.what()));
  }
  if (!train.is_object() || !train.contains("precision")) return Precision::F32;
  check(train.at("precision").is_string(), path, ": checkpoint \"precision\" is ", train.at("precision").dump(),
        "; expected \"f32\" or \"bf16\"");
  return parse_precision(train.at("precision").get<std::string>(), path + ": checkpoint \"precision\"");
}

std::string Trainer::load_checkpoint(const std::string& path) { return load_checkpoint(read_safetensors(path), path); }

std::string Trainer::load_checkpoint(const SafetensorsFile& f, const std::string& path) {
  check(f.metadata.count("qkv_checkpoint") && f.metadata.at("qkv_checkpoint") == "1", path,
        ": not a qkv checkpoint (format 1)");
  const ModelConfig saved = ModelConfig::from_json(f.metadata.count("config") ? f.metadata.at("config") : "",
                                                   path + " (config)");
  check(saved.to_json() == model_.config().to_json(), path, ": the checkpoint's model config differs from this model's");
  const std::vector<Parameter>& params = model_.parameters();
  std::vector<std::pair<std::string, Tensor>> weights;
  std::vector<const Tensor*> ms(params.size()), vs(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor* w = f.find("model." + params[i].name);
    const Tensor* m = f.find("adam_m." + params[i].name);
    const Tensor* v = f.find("adam_v." + params[i].name);
    check(w && m && v, path, ": checkpoint lacks model/adam_m/adam_v tensors for \"", params[i].name, "\"");
    for (const Tensor* t : {w, m, v})
      check(t->shape() == params[i].var->value.shape() && t->dtype() == DType::F32, path, ": \"", params[i].name,
            "\" is ", t->describe(), " in the checkpoint; the model needs float32 ",
            shape_str(params[i].var->value.shape()));
    // AdamW's moments: finite, and the second one (a running mean of squares) never negative.
    const float* mp = m->data<float>();
    const float* vp = v->data<float>();
    for (int64_t k = 0; k < m->numel(); ++k) {
      check(std::isfinite(mp[k]), path, ": \"adam_m.", params[i].name, "\" element ", k, " is ", mp[k],
            "; expected a finite first moment");
      check(std::isfinite(vp[k]) && vp[k] >= 0, path, ": \"adam_v.", params[i].name, "\" element ", k, " is ", vp[k],
            "; expected a finite second moment >= 0");
    }
    weights.emplace_back(params[i].name, *w);
    ms[i] = m;
    vs[i] = v;
  }
  check(f.tensors.size() == 3 * params.size(), path, ": checkpoint holds ", f.tensors.size(),
        " tensors; expected ", 3 * params.size());
  const json train = meta_json(f, "train", path);
  const json rng = meta_json(f, "rng", path);
  Rng::State s{};
  int64_t step = 0, updates = 0;
  TrainConfig cfg;
  try {
    step = train.at("step").get<int64_t>();
    updates = train.at("updates").get<int64_t>();
    const json& sc = train.at("schedule");
    cfg.schedule.kind = parse_schedule_kind(sc.at("kind").get<std::string>());
    cfg.schedule.lr = sc.at("lr").get<double>();
    cfg.schedule.warmup = sc.at("warmup").get<int64_t>();
    cfg.schedule.total = sc.at("total").get<int64_t>();
    cfg.schedule.min_lr = sc.at("min_lr").get<double>();
    cfg.schedule.d_model = sc.at("d_model").get<int64_t>();
    cfg.beta1 = train.at("beta1").get<double>();
    cfg.beta2 = train.at("beta2").get<double>();
    cfg.eps = train.at("eps").get<double>();
    cfg.weight_decay = train.at("weight_decay").get<double>();
    cfg.decay_all = train.at("decay_all").get<bool>();
    cfg.clip_norm = train.at("clip_norm").get<double>();
    cfg.label_smoothing = train.at("label_smoothing").get<float>();
    // (absent from checkpoints written before it existed: those averaged micro-batch means)
    if (train.contains("token_mean")) cfg.token_mean = train.at("token_mean").get<bool>();
    // (likewise: those trained in float32)
    if (train.contains("precision")) {
      check(train.at("precision").is_string(), path, ": checkpoint \"precision\" is ", train.at("precision").dump(),
            "; expected \"f32\" or \"bf16\"");
      cfg.precision = parse_precision(train.at("precision").get<std::string>(), path + ": checkpoint \"precision\"");
    }
    check(train.at("seed").is_number_unsigned(), path, ": checkpoint \"seed\" is ", train.at("seed").dump(),
          "; expected an integer in [0, 2^64)");
    cfg.seed = train.at("seed").get<uint64_t>();
    check(rng.at("s").is_array() && rng.at("s").size() == 4, path, ": checkpoint RNG state must be 4 integers");
    bool any = false;
    for (int i = 0; i < 4; ++i) {
      const json& w = rng.at("s").at(static_cast<size_t>(i));
      check(w.is_number_unsigned(), path, ": checkpoint RNG word ", i, " is ", w.dump(), "; expected an integer in [0, 2^64)");
      s.s[i] = w.get<uint64_t>();
      any = any || s.s[i] != 0;
    }
    check(any, path, ": checkpoint RNG state is all zeros (not a state the generator can be in)");
    check(rng.at("spare_bits").is_number_unsigned(), path, ": checkpoint RNG spare_bits must be an unsigned integer");
    for (const char* key : {"step", "updates"})
      check(train.at(key).is_number_integer(), path, ": checkpoint \"", key, "\" is ", train.at(key).dump(),
            "; expected an integer");
    s.has_spare = rng.at("has_spare").get<bool>();
    const uint64_t bits = rng.at("spare_bits").get<uint64_t>();
    std::memcpy(&s.spare, &bits, sizeof bits);
  } catch (const json::exception& e) {
    throw Error(detail::concat(path, ": checkpoint metadata is malformed: ", e.what()));
  }
  check(step >= 0 && updates >= 0 && updates <= step && step <= (int64_t{1} << 40), path,
        ": checkpoint step counters are inconsistent (step ", step, ", updates ", updates,
        "; expected 0 <= updates <= step <= 2^40)");
  try {
    validate(cfg);
  } catch (const Error& e) {
    throw Error(detail::concat(path, ": checkpoint training settings are invalid: ", e.what()));
  }
  // Everything validated: now change state.
  model_.load_state_dict(weights);
  for (size_t i = 0; i < params.size(); ++i) {
    std::memcpy(m_[i].data<float>(), ms[i]->data<float>(), m_[i].nbytes());
    std::memcpy(v_[i].data<float>(), vs[i]->data<float>(), v_[i].nbytes());
  }
  step_ = step;
  updates_ = updates;
  config_ = cfg;
  rng_.set_state(s);
  auto d = f.metadata.find("data");
  return d == f.metadata.end() ? std::string() : d->second;
}

}  // namespace qkv
