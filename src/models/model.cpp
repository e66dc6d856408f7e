// The three architectures, their parameters (PyTorch state_dict names), initialisation, and
// the model directory (config.json + model.safetensors).
#include "qkv/model.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "kernels/positional.h"
#include "models/model_impl.h"
#include "nn/layers.h"
#include "qkv/error.h"
#include "qkv/npy.h"
#include "qkv/rng.h"
#include "qkv/safetensors.h"

namespace qkv {


namespace {

Var embed_tokens(nn::Context& c, const ModelConfig& cfg, const Tensor& ids, const Var& table, const Var& pos_table) {
  // x <- E[ids] (* sqrt(d_model)) + P[0..T) ; dropout
  Var x = ops::embedding(c.tape, ids, table);
  if (cfg.scale_embeddings) x = ops::scale(c.tape, x, static_cast<float>(std::sqrt(static_cast<double>(cfg.d_model))));
  const int64_t T = ids.size(1);
  if (cfg.positional == Positional::Sinusoidal) {
    Tensor pe({T, cfg.d_model}, DType::F32);
    kernels::sinusoidal_positions(pe.data<float>(), T, cfg.d_model, 0);
    x = ops::add_positions(c.tape, x, make_var(pe), 0);
  } else if (cfg.positional == Positional::Learned) {
    x = ops::add_positions(c.tape, x, pos_table, 0);
  }
  return c.drop(x);
}

void check_ids(const Tensor& ids, const char* what) {
  check(ids.defined(), "batch: ", what, " is missing");
  check(ids.dim() == 2, "batch: ", what, " must be (B, T), got ", shape_str(ids.shape()));
  check(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, "batch: ", what, " must be int32 or int64, got ",
        ids.describe());
}

AttentionSpec self_spec(const ModelConfig& cfg, bool causal, const Tensor& lengths) {
  AttentionSpec s;
  s.causal = causal;
  s.alibi = cfg.positional == Positional::Alibi;
  if (lengths.defined()) s.key_lengths = lengths;
  return s;
}

double rope_of(const ModelConfig& cfg) { return cfg.positional == Positional::Rope ? cfg.rope_theta : 0.0; }

nn::Context context(Tape& tape, const ModelConfig& cfg, const ForwardOptions& opt) {
  return nn::Context{tape, opt.training, static_cast<float>(cfg.dropout), opt.dropout_seed, 0};
}

}  // namespace

Model::Model(ModelConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  config_.validate();
  const ModelConfig& c = config_;
  Impl& m = *impl_;
  nn::Registry r{&params_, &m.inits};
  const int64_t D = c.d_model;
  auto layer_list = [](const std::string& prefix, int64_t i) { return prefix + "layers." + std::to_string(i) + "."; };
  switch (c.arch) {
    case Arch::Decoder:
      m.embed = r.add("embed.weight", {c.vocab_size, D}, false, nn::Init::Embedding);
      if (c.positional == Positional::Learned) m.pos_embed = r.add("pos_embed.weight", {c.max_len, D}, false, nn::Init::Normal);
      m.enc_layers.resize(static_cast<size_t>(c.n_layers));
      for (int64_t i = 0; i < c.n_layers; ++i) m.enc_layers[static_cast<size_t>(i)].create(r, layer_list("", i), c);
      if (c.final_norm) {
        m.enc_norm.create(r, "norm", D, c.norm, c.norm_eps);
        m.has_enc_norm = true;
      }
      m.lm_head = c.tie_embeddings ? m.embed : r.add("lm_head.weight", {c.vocab_size, D}, true, nn::Init::Normal);
      break;
    case Arch::EncoderClassifier:
      m.embed = r.add("embed.weight", {c.vocab_size, D}, false, nn::Init::Embedding);
      if (c.positional == Positional::Learned) m.pos_embed = r.add("pos_embed.weight", {c.max_len, D}, false, nn::Init::Normal);
      m.enc_layers.resize(static_cast<size_t>(c.n_layers));
      for (int64_t i = 0; i < c.n_layers; ++i) m.enc_layers[static_cast<size_t>(i)].create(r, layer_list("encoder.", i), c);
      if (c.final_norm) {
        m.enc_norm.create(r, "encoder.norm", D, c.norm, c.norm_eps);
        m.has_enc_norm = true;
      }
      m.classifier.create(r, "classifier", c.num_classes, D, true, nn::Init::Normal);
      break;
    case Arch::EncoderDecoder:
      m.src_embed = r.add("src_embed.weight", {c.source_vocab(), D}, false, nn::Init::Embedding);
      m.embed = r.add("tgt_embed.weight", {c.vocab_size, D}, false, nn::Init::Embedding);
      if (c.positional == Positional::Learned) {
        m.src_pos_embed = r.add("src_pos_embed.weight", {c.max_len, D}, false, nn::Init::Normal);
        m.pos_embed = r.add("tgt_pos_embed.weight", {c.max_len, D}, false, nn::Init::Normal);
      }
      m.enc_layers.resize(static_cast<size_t>(c.n_encoder_layers));
      for (int64_t i = 0; i < c.n_encoder_layers; ++i) m.enc_layers[static_cast<size_t>(i)].create(r, layer_list("encoder.", i), c);
      if (c.final_norm) {
        m.enc_norm.create(r, "encoder.norm", D, c.norm, c.norm_eps);
        m.has_enc_norm = true;
      }
      m.dec_layers.resize(static_cast<size_t>(c.n_decoder_layers));
      for (int64_t i = 0; i < c.n_decoder_layers; ++i) m.dec_layers[static_cast<size_t>(i)].create(r, layer_list("decoder.", i), c);
      if (c.final_norm) {
        m.dec_norm.create(r, "decoder.norm", D, c.norm, c.norm_eps);
        m.has_dec_norm = true;
      }
      m.lm_head = c.tie_embeddings ? m.embed : r.add("lm_head.weight", {c.vocab_size, D}, true, nn::Init::Normal);
      break;
  }
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const Parameter* Model::find(const std::string& name) const {
  for (const Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.var->value.numel();
  return n;
}

void Model::init(uint64_t seed) {
  Rng rng(seed);
  const ModelConfig& c = config_;
  const int64_t layers = c.arch == Arch::EncoderDecoder ? c.n_encoder_layers + c.n_decoder_layers : c.n_layers;
  const double resid_std = c.init_std / std::sqrt(2.0 * static_cast<double>(layers));
  const double embed_std = c.scale_embeddings ? 1.0 / std::sqrt(static_cast<double>(c.d_model)) : c.init_std;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& t = params_[i].var->value;
    float* p = t.data<float>();
    const int64_t n = t.numel();
    switch (impl_->inits[i]) {
      case nn::Init::Zero: std::fill(p, p + n, 0.0f); break;
      case nn::Init::One: std::fill(p, p + n, 1.0f); break;
      case nn::Init::Normal: rng.fill_normal(p, n, 0.0, c.init_std); break;
      case nn::Init::Residual: rng.fill_normal(p, n, 0.0, resid_std); break;
      case nn::Init::Embedding: rng.fill_normal(p, n, 0.0, embed_std); break;
    }
  }
}

Tensor Model::lengths_of(const Tensor& ids_in) const {
  Tensor ids = ops::as_ids(ids_in, "lengths");
  check(ids.dim() == 2, "lengths: ids must be (B, T), got ", shape_str(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  Tensor len({B}, DType::I64);
  const int64_t* p = ids.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = T;
    if (config_.pad_id >= 0)
      while (n > 0 && p[b * T + n - 1] == config_.pad_id) --n;
    len.data<int64_t>()[b] = n;
  }
  return len;
}

namespace {
Tensor resolve_lengths(const Model& m, const Tensor& ids, const Tensor& given) {
  if (!given.defined()) return m.config().pad_id >= 0 ? m.lengths_of(ids) : Tensor();
  Tensor l = ops::as_ids(given, "input_lengths");
  check(l.dim() == 1 && l.size(0) == ids.size(0), "batch: input_lengths must be (B) = (", ids.size(0), "), got ",
        shape_str(l.shape()));
  for (int64_t b = 0; b < l.size(0); ++b) {
    const int64_t v = l.data<int64_t>()[b];
    check(v >= 0 && v <= ids.size(1), "batch: input_lengths[", b, "] = ", v, " is outside [0, ", ids.size(1), "]");
  }
  return l;
}
}  // namespace

Var Model::encode(Tape& tape, const Tensor& src, const Tensor& src_lengths, const ForwardOptions& opt) const {
  check(config_.arch == Arch::EncoderDecoder, "encode: the model is ", arch_name(config_.arch),
        ", not encoder-decoder");
  check_ids(src, "input (source ids)");
  nn::Context c = context(tape, config_, opt);
  c.next_stream = 1000;  // encoder dropout sites: streams 1000...
  const Impl& m = *impl_;
  Var x = embed_tokens(c, config_, src, m.src_embed, m.src_pos_embed);
  const AttentionSpec spec = self_spec(config_, false, src_lengths);
  for (const auto& layer : m.enc_layers) x = layer(c, x, spec, rope_of(config_));
  if (m.has_enc_norm) x = m.enc_norm(c, x);
  return x;
}

Var Model::decode(Tape& tape, const Tensor& tgt_in, const Var& memory, const Tensor& src_lengths,
                  const ForwardOptions& opt) const {
  check(config_.arch == Arch::EncoderDecoder, "decode: the model is ", arch_name(config_.arch),
        ", not encoder-decoder");
  check_ids(tgt_in, "decoder_input");
  check(memory && memory->value.dim() == 3 && memory->value.size(0) == tgt_in.size(0), "decode: memory ",
        memory ? shape_str(memory->value.shape()) : std::string("(none)"), " does not match the batch of ",
        tgt_in.size(0));
  nn::Context c = context(tape, config_, opt);
  c.next_stream = 1u << 20;  // decoder dropout sites
  const Impl& m = *impl_;
  Var x = embed_tokens(c, config_, tgt_in, m.embed, m.pos_embed);
  const AttentionSpec sspec = self_spec(config_, true, Tensor());
  AttentionSpec cspec;
  if (src_lengths.defined()) cspec.key_lengths = src_lengths;
  for (const auto& layer : m.dec_layers) x = layer(c, x, memory, sspec, cspec, rope_of(config_));
  if (m.has_dec_norm) x = m.dec_norm(c, x);
  return ops::linear(tape, x, m.lm_head, nullptr);
}

Var Model::logits(Tape& tape, const Batch& batch, const ForwardOptions& opt) const {
  const Impl& m = *impl_;
  check_ids(batch.input, "input");
  const Tensor lengths = resolve_lengths(*this, batch.input, batch.input_lengths);
  if (config_.arch == Arch::EncoderDecoder) {
    check(batch.decoder_input.defined(), "batch: an encoder-decoder model needs decoder_input (the shifted target)");
    Var memory = encode(tape, batch.input, lengths, opt);
    return decode(tape, batch.decoder_input, memory, lengths, opt);
  }
  nn::Context c = context(tape, config_, opt);
  Var x = embed_tokens(c, config_, batch.input, m.embed, m.pos_embed);
  const bool causal = config_.arch == Arch::Decoder;
  const AttentionSpec spec = self_spec(config_, causal, lengths);
  for (const auto& layer : m.enc_layers) x = layer(c, x, spec, rope_of(config_));
  if (m.has_enc_norm) x = m.enc_norm(c, x);
  if (config_.arch == Arch::Decoder) return ops::linear(tape, x, m.lm_head, nullptr);
  // EncoderClassifier: pool, then the head
  Var pooled = config_.pooling == Pooling::Mean ? ops::mean_pool(tape, x, lengths) : ops::first_token(tape, x);
  return m.classifier(c, pooled);
}

Var Model::loss(Tape& tape, const Var& logits, const Batch& batch, float label_smoothing, int64_t* n_counted) const {
  check(batch.target.defined(), "batch: target is missing (needed for the loss)");
  const int64_t ignore = config_.arch == Arch::EncoderClassifier ? -100 : (config_.pad_id >= 0 ? config_.pad_id : -100);
  const std::vector<int64_t>& ls = logits->value.shape();
  std::vector<int64_t> want(ls.begin(), ls.end() - 1);
  check(batch.target.shape() == want, "batch: target ", shape_str(batch.target.shape()), " does not match the logits ",
        shape_str(ls), " (expected ", shape_str(want), ")");
  return ops::cross_entropy(tape, logits, batch.target, ignore, label_smoothing, n_counted);
}

std::vector<std::pair<std::string, Tensor>> Model::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(params_.size());
  for (const Parameter& p : params_) out.emplace_back(p.name, p.var->value);
  return out;
}

Tensor shift_right(const Tensor& target_in, int64_t bos_id) {
  Tensor target = ops::as_ids(target_in, "shift_right target");
  check(target.dim() == 2, "shift_right: target must be (B, T), got ", shape_str(target.shape()));
  check(bos_id >= 0, "shift_right: needs a bos_id >= 0, got ", bos_id);
  const int64_t B = target.size(0), T = target.size(1);
  Tensor out({B, T}, DType::I64);
  const int64_t* t = target.data<int64_t>();
  int64_t* o = out.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    if (T > 0) o[b * T] = bos_id;
    for (int64_t i = 1; i < T; ++i) o[b * T + i] = t[b * T + i - 1];
  }
  return out;
}

void Model::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& tensors, bool allow_missing) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    check(by_name.emplace(name, &t).second, "weights: tensor \"", name, "\" appears twice");
  }
  for (const auto& [name, t] : tensors) {
    check(find(name) != nullptr, "weights: unexpected tensor \"", name, "\" ", shape_str(t.shape()),
          ": this ", arch_name(config_.arch), " model has no parameter of that name",
          config_.tie_embeddings && name == "lm_head.weight" ? " (tie_embeddings is on: lm_head is the embedding)" : "");
  }
  // Validate everything before changing anything.
  for (const Parameter& p : params_) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      check(allow_missing, "weights: parameter \"", p.name, "\" ", shape_str(p.var->value.shape()), " is missing");
      continue;
    }
    const Tensor& t = *it->second;
    check(t.shape() == p.var->value.shape(), "weights: \"", p.name, "\" has shape ", shape_str(t.shape()),
          " but the config needs ", shape_str(p.var->value.shape()));
    check(t.dtype() == DType::F32 || t.dtype() == DType::F64, "weights: \"", p.name, "\" has dtype ",
          dtype_name(t.dtype()), "; expected float32");
  }
  for (Parameter& p : params_) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) continue;
    Tensor src = it->second->to(DType::F32);
    std::memcpy(p.var->value.data<float>(), src.data<float>(), src.nbytes());
  }
}

void Model::save(const std::string& dir) const {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(detail::concat(dir, ": cannot create the model directory: ", std::strerror(errno)));
  struct stat st {};
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": exists and is not a directory");
  write_safetensors(dir + "/model.safetensors", state_dict(), {{"format", "pt"}, {"qkv_format", "1"}});
  write_file_atomic(dir + "/config.json", config_.to_json());
}

Model Model::load(const std::string& dir) {
  struct stat st {};
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": not a model directory (expected a directory with config.json and model.safetensors)");
  const std::string cfg_path = dir + "/config.json", w_path = dir + "/model.safetensors";
  check(::stat(cfg_path.c_str(), &st) == 0, dir, ": not a model directory: config.json is missing");
  check(::stat(w_path.c_str(), &st) == 0, dir, ": not a model directory: model.safetensors is missing");
  Model m(ModelConfig::load(cfg_path));
  SafetensorsFile f = read_safetensors(w_path);
  try {
    m.load_state_dict(f.tensors);
  } catch (const Error& e) {
    throw Error(detail::concat(w_path, ": ", e.what()));
  }
  return m;
}

}  // namespace qkv
