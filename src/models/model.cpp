// The three architectures, their parameters (PyTorch state_dict names), initialisation, and
// the model directory (config.json + model.safetensors).
#include "qkv/model.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/json_strict.h"
#include "kernels/quant.h"
#include "models/model_impl.h"
#include "nn/layers.h"
#include "qkv/cpu.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/gguf.h"
#include "qkv/hf.h"
#include "qkv/rng.h"
#include "qkv/safetensors.h"

namespace qkv {


namespace {

void check_ids(const Tensor& ids, const char* what) {
  check(ids.defined(), "batch: ", what, " is missing");
  check(ids.dim() == 2, "batch: ", what, " must be (B, T), got ", shape_str(ids.shape()));
  check(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, "batch: ", what, " must be int32 or int64, got ",
        ids.describe());
  check(ids.size(0) >= 1 && ids.size(1) >= 1, "batch: ", what, " ", shape_str(ids.shape()),
        " is empty: expected at least one row of at least one token");
}

nn::Context context(Tape& tape, const ModelConfig& cfg, const ForwardOptions& opt) {
  return nn::Context{tape, opt.training, static_cast<float>(cfg.dropout), opt.dropout_seed, 0};
}

}  // namespace

AttentionSpec Model::Impl::self_spec(bool causal, const Tensor& lengths) {
  AttentionSpec s;
  s.causal = causal;
  if (lengths.defined()) s.key_lengths = lengths;
  return s;
}

AttentionSpec Model::Impl::cross_spec(const Tensor& src_lengths) {
  AttentionSpec s;
  if (src_lengths.defined()) s.key_lengths = src_lengths;
  return s;
}

namespace {

// The parameters of a model with `enc` layers in its first stack (the decoder-only model's or
// classifier's layers, or the encoder's) and `dec` decoder layers, in order, through r. The
// constructor builds them; parameter_count plans with a counting registry.
void build(const ModelConfig& c, Model::Impl& m, nn::Registry& r, int64_t enc, int64_t dec) {
  m.arch = c.arch;
  switch (c.arch) {
    case Arch::Decoder:
      m.embed.create_table(r, "embed.weight", c.vocab_size, c);
      m.embed.positions.create(r, "pos_embed", c);
      m.embed.create_extras(r, "", c);
      m.stack.create(r, "", enc, c, m.embed.positions.attention());
      m.lm_head.create(r, "lm_head", c.vocab_size, c, m.embed.table);
      break;
    case Arch::EncoderClassifier:
    case Arch::EncoderMLM:
    case Arch::Encoder:
      m.embed.create_table(r, "embed.weight", c.vocab_size, c);
      m.embed.positions.create(r, "pos_embed", c);
      m.embed.create_extras(r, "", c);
      m.stack.create(r, "encoder.", enc, c, m.embed.positions.attention());
      if (c.arch == Arch::EncoderClassifier) m.classifier.create(r, "pooler", "classifier", c);
      if (c.arch == Arch::EncoderMLM) m.mlm.create(r, "mlm.", c.vocab_size, c, m.embed.table);
      break;
    case Arch::EncoderDecoder:
      if (c.share_embeddings) {
        m.embed.create_table(r, "shared_embed.weight", c.vocab_size, c);
        m.src_embed.table = m.embed.table;  // one parameter, both sides
        m.src_embed.scale = m.embed.scale;
      } else {
        m.src_embed.create_table(r, "src_embed.weight", c.source_vocab(), c);
        m.embed.create_table(r, "tgt_embed.weight", c.vocab_size, c);
      }
      m.src_embed.positions.create(r, "src_pos_embed", c);
      m.embed.positions.create(r, "tgt_pos_embed", c);
      m.stack.create(r, "encoder.", enc, c, m.src_embed.positions.attention());
      m.decoder.create(r, "decoder.", dec, c, m.embed.positions.attention());
      m.lm_head.create(r, "lm_head", c.vocab_size, c, m.embed.table);
      break;
  }
}

int64_t first_stack_layers(const ModelConfig& c) {
  return c.arch == Arch::EncoderDecoder ? c.n_encoder_layers : c.n_layers;
}

// What a config's parameters come to: outside the layers, per first-stack layer and per decoder
// layer, each counted by planning the real construction.
struct ParameterPlan {
  double base = 0, per_layer = 0, per_dec_layer = 0;
  double total(const ModelConfig& c) const {
    return base + per_layer * static_cast<double>(first_stack_layers(c)) +
           (c.arch == Arch::EncoderDecoder ? per_dec_layer * static_cast<double>(c.n_decoder_layers) : 0.0);
  }
};
ParameterPlan plan_parameters(const ModelConfig& c) {
  auto count = [&](int64_t enc, int64_t dec) {
    double n = 0;
    Model::Impl m;
    nn::Registry r{nullptr, nullptr, &n};
    build(c, m, r, enc, dec);
    return n;
  };
  ParameterPlan p;
  p.base = count(0, 0);
  p.per_layer = count(1, 0) - p.base;
  if (c.arch == Arch::EncoderDecoder) p.per_dec_layer = count(0, 1) - p.base;
  return p;
}

std::string fmt_bytes(double b) {
  const char* unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return buf;
}

std::string fmt_count(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, n < 1e9 ? "%.0f" : "%.3g", n);
  return buf;
}

// Where most of a config's parameters sit, naming the keys: "n_layers = 10000 layers of
// 3152384 parameters each, mostly the feed-forward (d_ff = 2048 x d_model = 512)".
std::string largest_part(const ModelConfig& c, const ParameterPlan& p) {
  const double enc = p.per_layer * static_cast<double>(first_stack_layers(c));
  const double dec = c.arch == Arch::EncoderDecoder ? p.per_dec_layer * static_cast<double>(c.n_decoder_layers) : 0.0;
  if (p.base > enc && p.base > dec)
    return detail::concat("the embeddings and output layer (vocab_size = ", c.vocab_size,
                          c.arch == Arch::EncoderDecoder ? detail::concat(", src_vocab_size = ", c.source_vocab()) : "",
                          ", d_model = ", c.d_model,
                          c.positional == Positional::Learned ? detail::concat(", max_len = ", c.max_len) : "", ")");
  const bool in_dec = dec > enc;
  const int64_t layers = in_dec ? c.n_decoder_layers : first_stack_layers(c);
  const double per = in_dec ? p.per_dec_layer : p.per_layer;
  // a layer's feed-forward: linear1 (inner x d_model) and linear2 (d_model x d_ff)
  const double ff = (c.gated ? 3.0 : 2.0) * static_cast<double>(c.d_ff) *
                    static_cast<double>(c.d_model);
  const std::string bulk =
      ff >= per / 2 ? detail::concat("the feed-forward (d_ff = ", c.d_ff, " x d_model = ", c.d_model, ")")
                    : detail::concat("attention (n_heads = ", c.n_heads, ", d_k = ", c.head_dim_k(), ", d_v = ",
                                     c.head_dim_v(), ", d_model = ", c.d_model, ")");
  const char* key = in_dec ? "n_decoder_layers" : c.arch == Arch::EncoderDecoder ? "n_encoder_layers" : "n_layers";
  return detail::concat(key, " = ", layers, layers == 1 ? " layer" : " layers", " of ", fmt_count(per),
                        " parameters each, mostly ", bulk);
}

// Refuses a config whose float32 weights alone exceed the memory available, before anything is
// allocated, naming the keys behind the largest part (a huge n_layers or d_ff otherwise ran the
// machine out of memory layer by layer, or failed in the allocator with a bare size).
void check_fits_in_memory(const ModelConfig& c) {
  const ParameterPlan p = plan_parameters(c);
  const double n = p.total(c), bytes = 4.0 * n;
  std::string source;
  const double avail = available_memory_bytes(&source);
  if (avail < 0 || bytes <= avail) return;
  throw Error(detail::concat("config: the model would have ", fmt_count(n), " parameters, ", fmt_bytes(bytes),
                             " as float32, more than the ", fmt_bytes(avail), " of memory available (", source,
                             "); most of them in ", largest_part(c, p)));
}

}  // namespace

double Model::parameter_count(const ModelConfig& config) {
  config.validate();
  return plan_parameters(config).total(config);
}

Model::Model(ModelConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  config_.validate();
  check_fits_in_memory(config_);
  nn::Registry r{&params_, &impl_->inits};
  build(config_, *impl_, r, first_stack_layers(config_), config_.arch == Arch::EncoderDecoder ? config_.n_decoder_layers : 0);
}

Model::Model(ModelConfig config, Uninitialised) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  config_.validate();
  check_fits_in_memory(config_);
  nn::Registry r{&params_, &impl_->inits};
  r.zero = false;  // untouched pages cost no memory until the loader writes them
  build(config_, *impl_, r, first_stack_layers(config_), config_.arch == Arch::EncoderDecoder ? config_.n_decoder_layers : 0);
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
  for (const Parameter& p : params_) n += p.var->packed ? p.var->packed->rows * p.var->packed->cols : p.var->value.numel();
  return n;
}

WType Model::pack_type_of(const Parameter& p, WType t, bool* fell_back) const {
  *fell_back = false;
  const Var& v = p.var;
  const int64_t dims = v->packed ? 2 : v->value.dim();
  if (t == WType::F32 || dims != 2) return WType::F32;
  // The output layer and the token embeddings (often one matrix) at 8 bits or more, as llama.cpp's
  // mixes keep them: Q8_0 for q4, the type itself otherwise. The projections: the type.
  const bool table = v == impl_->lm_head.w || v == impl_->mlm.decoder.w || v == impl_->embed.table ||
                     v == impl_->src_embed.table;
  if (!table && !p.decay) return WType::F32;  // position and token-type tables stay float32
  WType pt = table && t == WType::Q4_0 ? WType::Q8_0 : t;
  const int64_t cols = v->packed ? v->packed->cols : v->value.size(1);
  if ((pt == WType::Q8_0 || pt == WType::Q4_0) && cols % kernels::kQBlock != 0) {
    pt = WType::BF16;  // a row that is not whole blocks of 32 (a feed-forward width of 172, say)
    *fell_back = true;
  }
  return pt;
}

bool Model::pack_parameter_from(const std::string& name, WType t,
                                const std::function<void(int64_t, int64_t, float*)>& read,
                                std::vector<std::string>* fallback) {
  Parameter* p = nullptr;
  for (Parameter& q : params_)
    if (q.name == name) p = &q;
  check(p != nullptr, "pack: the model has no parameter \"", name, "\"");
  bool fell_back = false;
  const WType pt = pack_type_of(*p, t, &fell_back);
  if (pt == WType::F32 || p->var->packed) return false;
  if (fell_back && fallback) fallback->push_back(p->name);
  const std::vector<int64_t> shape = p->var->value.shape();
  p->var->packed = pack_rows(pt, shape[0], shape[1], p->name, read);
  p->var->value = Tensor();  // the float32 values are freed (a loader's were never written)
  weight_type_ = t;
  return true;
}

bool Model::pack_parameter(const std::string& name, WType t, std::vector<std::string>* fallback) {
  const Parameter* p = find(name);
  check(p != nullptr, "pack: the model has no parameter \"", name, "\"");
  if (!p->var->value.defined()) return false;
  const Tensor w = p->var->value.contiguous();  // held while packing
  const float* src = w.data<float>();
  const int64_t cols = w.dim() == 2 ? w.size(1) : 0;
  return pack_parameter_from(name, t, [&](int64_t r0, int64_t n, float* dst) {
    std::copy(src + r0 * cols, src + (r0 + n) * cols, dst);
  }, fallback);
}

void Model::adopt_packed(const std::string& name, std::shared_ptr<const PackedWeight> w) {
  Parameter* p = nullptr;
  for (Parameter& q : params_)
    if (q.name == name) p = &q;
  check(p != nullptr, "weights: the model has no parameter \"", name, "\"");
  check(w != nullptr, "weights: \"", name, "\": no packed matrix");
  bool fell_back = false;
  check(pack_type_of(*p, w->type, &fell_back) != WType::F32, "weights: \"", name, "\" is packed to ",
        wtype_name(w->type), ", but it is not a matrix that qkv packs (only projections, the output layer and the "
        "token embeddings are)");
  const std::vector<int64_t> want = p->var->packed ? std::vector<int64_t>{p->var->packed->rows, p->var->packed->cols}
                                                   : p->var->value.shape();
  check(want == std::vector<int64_t>{w->rows, w->cols}, "weights: \"", name, "\" packed as (", w->rows, ", ", w->cols,
        ") but the config needs ", shape_str(want));
  p->var->packed = std::move(w);
  p->var->value = Tensor();
  if (weight_type_ == WType::F32) weight_type_ = p->var->packed->type;
}

int64_t Model::pack_weights(WType t, std::vector<std::string>* fallback) {
  int64_t n = 0;
  for (const Parameter& p : params_) n += pack_parameter(p.name, t, fallback);
  release_cached_memory();
  return n;
}

void Model::check_not_packed(const char* what) const {
  if (weight_type_ == WType::F32) return;
  for (const Parameter& p : params_)
    check(!p.var->packed, what, ": the model's weights are packed to ", wtype_name(weight_type_),
          " for inference (--dtype, qkv quantize), and their float32 values are not kept (\"", p.name,
          "\" is packed); load the float32 model for this");
}

double Model::weight_bytes_per_token() const {
  double bytes = 0;
  for (const Parameter& p : params_) {
    // a table only looked up (not also an output layer) is read one row per token
    const Var& v = p.var;
    const bool lookup = (v == impl_->embed.table || v == impl_->src_embed.table) && v != impl_->lm_head.w &&
                        v != impl_->mlm.decoder.w;
    const bool one_row = lookup || p.name == "pos_embed.weight";
    if (v->packed) {
      bytes += static_cast<double>(v->packed->row_bytes) * static_cast<double>(one_row ? 1 : v->packed->rows);
    } else {
      const int64_t n = one_row && v->value.dim() == 2 ? v->value.size(1) : v->value.numel();
      bytes += static_cast<double>(n) * sizeof(float);
    }
  }
  return bytes;
}

void Model::init(uint64_t seed) {
  check_not_packed("init");
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

Tensor Model::Impl::resolve_lengths(const Model& m, const Tensor& ids, const Tensor& given) {
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

Var Model::Impl::forward(nn::Context& c, Pass& p) const {
  if (!p.memory && p.src.defined()) {
    nn::Context& e = p.encoder ? *p.encoder : c;
    p.memory = stack(e, src_embed(e, p.src), self_spec(false, p.lengths), p.encoder_caches);
  }
  if (!p.ids.defined()) return p.memory;
  Var x = embed(c, p.ids);
  if (p.memory) {
    x = decoder(c, x, p.memory, self_spec(true, Tensor()), cross_spec(p.lengths), p.caches);
  } else {
    x = stack(c, x, self_spec(p.causal, p.lengths), p.caches);
  }
  if (p.last) {
    // x <- x[b, last[b]]   (B, D): only the rows that predict the next token reach the head
    const int64_t B = x->value.size(0), T = x->value.size(1), D = x->value.size(2);
    check(static_cast<int64_t>(p.last->size()) == B, "forward: internal: ", p.last->size(), " last tokens for ", B,
          " rows");
    Tensor sel = Tensor::empty({B, D});
    const float* px = x->value.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = (*p.last)[static_cast<size_t>(b)];
      check(t >= 0 && t < T, "forward: internal: last token ", t, " of row ", b, " is outside [0, ", T, ")");
      std::copy(px + (b * T + t) * D, px + (b * T + t + 1) * D, sel.data<float>() + b * D);
    }
    x = make_var(sel);
  }
  if (p.hidden) return x;
  if (p.memory) return lm_head(c, x);
  switch (arch) {
    case Arch::Decoder: return lm_head(c, x);
    case Arch::EncoderClassifier: return classifier(c, x, p.lengths);  // pool, then the head
    case Arch::EncoderMLM: return mlm(c, x);
    default: return x;  // Encoder: the hidden states
  }
}

Var Model::encode(Tape& tape, const Tensor& src, const Tensor& src_lengths, const ForwardOptions& opt) const {
  check(config_.arch == Arch::EncoderDecoder, "encode: the model is ", arch_name(config_.arch),
        ", not encoder-decoder");
  check_ids(src, "input (source ids)");
  nn::Context c = context(tape, config_, opt);
  c.next_stream = 1000;  // encoder dropout sites: streams 1000...
  Impl::Pass p{.lengths = src_lengths, .src = src};
  return impl_->forward(c, p);
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
  Impl::Pass p{.ids = tgt_in, .lengths = src_lengths, .memory = memory};
  return impl_->forward(c, p);
}

Var Model::logits(Tape& tape, const Batch& batch, const ForwardOptions& opt) const {
  check_ids(batch.input, "input");
  const Tensor lengths = Impl::resolve_lengths(*this, batch.input, batch.input_lengths);
  if (config_.arch == Arch::EncoderDecoder) {
    check(batch.decoder_input.defined(), "batch: an encoder-decoder model needs decoder_input (the shifted target)");
    check_ids(batch.decoder_input, "decoder_input");
    nn::Context e = context(tape, config_, opt), c = context(tape, config_, opt);
    e.next_stream = 1000;    // encoder dropout sites: streams 1000...
    c.next_stream = 1u << 20;  // decoder dropout sites
    Impl::Pass p{.ids = batch.decoder_input, .lengths = lengths, .src = batch.input, .encoder = &e};
    return impl_->forward(c, p);
  }
  nn::Context c = context(tape, config_, opt);
  Impl::Pass p{.ids = batch.input, .lengths = lengths, .causal = config_.arch == Arch::Decoder};
  return impl_->forward(c, p);
}

Var Model::hidden_states(Tape& tape, const Tensor& ids, const Tensor& input_lengths) const {
  check(config_.arch != Arch::EncoderDecoder, "hidden_states: an encoder-decoder model's are its encoder's (encode)");
  check_ids(ids, "input");
  const Tensor lengths = Impl::resolve_lengths(*this, ids, input_lengths);
  nn::Context c = context(tape, config_, {});
  Impl::Pass p{.ids = ids, .lengths = lengths, .causal = config_.arch == Arch::Decoder, .hidden = true};
  return impl_->forward(c, p);
}

void Model::check_batch(const Batch& b, const BatchNames& names) const {
  const ModelConfig& c = config_;
  const bool encdec = c.arch == Arch::EncoderDecoder;
  // ids: (B, T) int ids in [0, vocab), within max_len for learned positions
  auto ids = [&](const Tensor& t, const std::string& name, int64_t vocab) {
    check(t.dtype() == DType::I64 || t.dtype() == DType::I32, name, ": expected int32 or int64 token ids, got ",
          t.describe());
    check(t.dim() == 2, name, ": expected token ids shaped (B, T), got ", shape_str(t.shape()));
    check(t.size(0) >= 1 && t.size(1) >= 1, name, ": ", shape_str(t.shape()),
          " is empty: expected at least one row of at least one token");
    check(c.positional != Positional::Learned || t.size(1) <= c.max_len, name, ": rows of ", t.size(1),
          " tokens exceed the model's max_len ", c.max_len, " (its learned positions)");
    const Tensor v = ops::as_ids(t, name.c_str());
    const int64_t* p = v.data<int64_t>();
    for (int64_t i = 0; i < v.numel(); ++i)
      check(p[i] >= 0 && p[i] < vocab, name, ": token id ", p[i], " at (", i / t.size(1), ", ", i % t.size(1),
            ") is outside the vocabulary [0, ", vocab, ")");
  };
  check(b.input.defined(), names.input, ": missing");
  ids(b.input, names.input, encdec ? c.source_vocab() : c.vocab_size);
  const int64_t B = b.input.size(0), T = b.input.size(1);
  if (b.input_lengths.defined()) {
    const Tensor& l = b.input_lengths;
    check(l.dim() == 1 && l.size(0) == B, names.input_lengths, ": expected (B) = (", B, ") lengths, one per row of ",
          names.input, ", got ", l.describe());
    const Tensor v = ops::as_ids(l, names.input_lengths.c_str());
    for (int64_t i = 0; i < B; ++i)
      check(v.data<int64_t>()[i] >= 0 && v.data<int64_t>()[i] <= T, names.input_lengths, ": length ",
            v.data<int64_t>()[i], " of row ", i, " is outside [0, ", T, "]");
  }
  if (encdec) {
    check(b.decoder_input.defined(), names.decoder_input, ": an encoder-decoder model needs the decoder's input");
    ids(b.decoder_input, names.decoder_input, c.vocab_size);
    check(b.decoder_input.size(0) == B, names.decoder_input, ": ", b.decoder_input.size(0), " rows, but ",
          names.input, " has ", B);
  } else {
    check(!b.decoder_input.defined(), names.decoder_input, ": only an encoder-decoder model takes a decoder input; this is ",
          arch_name(c.arch));
  }
  if (!b.target.defined()) return;
  check(c.arch != Arch::Encoder, names.target, ": a bare encoder has no output layer, so nothing to score against");
  const Tensor& t = b.target;
  const bool cls = c.arch == Arch::EncoderClassifier;
  const std::vector<int64_t> want = cls ? std::vector<int64_t>{B} : (encdec ? b.decoder_input : b.input).shape();
  check(t.dtype() == DType::I64 || t.dtype() == DType::I32, names.target, ": expected int32 or int64 ",
        cls ? "labels" : "token ids", ", got ", t.describe());
  check(t.shape() == want, names.target, ": expected ", cls ? "one label per row, " : "one next token per position, ",
        shape_str(want), ", got ", shape_str(t.shape()));
  const int64_t classes = cls ? c.num_classes : c.vocab_size,
                ignore = cls || c.arch == Arch::EncoderMLM ? -100 : (c.pad_id >= 0 ? c.pad_id : -100);
  const Tensor v = ops::as_ids(t, names.target.c_str());
  for (int64_t i = 0; i < v.numel(); ++i) {
    const int64_t x = v.data<int64_t>()[i];
    check((x >= 0 && x < classes) || x == ignore, names.target, ": ", x, " at flat index ", i, " is neither a ",
          cls ? "class in [0, " : "token in [0, ", classes, ") nor the ignored id ", ignore);
  }
}

Var Model::loss(Tape& tape, const Var& logits, const Batch& batch, float label_smoothing, int64_t* n_counted) const {
  check(batch.target.defined(), "batch: target is missing (needed for the loss)");
  check(config_.arch != Arch::Encoder, "loss: a bare encoder has no output layer to score");
  const int64_t ignore = config_.arch == Arch::EncoderClassifier || config_.arch == Arch::EncoderMLM
                             ? -100
                             : (config_.pad_id >= 0 ? config_.pad_id : -100);
  const std::vector<int64_t>& ls = logits->value.shape();
  std::vector<int64_t> want(ls.begin(), ls.end() - 1);
  check(batch.target.shape() == want, "batch: target ", shape_str(batch.target.shape()), " does not match the logits ",
        shape_str(ls), " (expected ", shape_str(want), ")");
  return ops::cross_entropy(tape, logits, batch.target, ignore, label_smoothing, n_counted);
}

std::vector<std::pair<std::string, Tensor>> Model::state_dict() const {
  check_not_packed("state_dict");
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
  check_not_packed("load_state_dict");
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

namespace {

// A packed matrix as a .safetensors entry: bf16 and f16 as BF16 / F16 (rows, cols), which every
// safetensors reader understands; Q8_0 and Q4_0 as U8 (rows, row bytes) holding GGUF's blocks in
// GGUF's row layout (a grouped Q4_0 matrix's rows ungrouped into `keep`, which must outlive the
// entry).
SafetensorsEntry packed_entry(const std::string& name, const PackedWeight& w, std::string& keep) {
  const bool half = w.type == WType::BF16 || w.type == WType::F16;
  std::string_view bytes(static_cast<const char*>(w.bytes->data()), w.row_bytes * static_cast<size_t>(w.rows));
  if (w.type == WType::Q4_0) bytes = keep = w.file_bytes();
  return {name, w.type == WType::BF16 ? "BF16" : w.type == WType::F16 ? "F16" : "U8",
          {w.rows, half ? w.cols : static_cast<int64_t>(w.row_bytes)}, bytes};
}

constexpr char kPackedKey[] = "qkv_packed";  // metadata: {"name": "q8_0", ...} as a JSON string

// The packed tensors a file declares, checked: an object of tensor name -> bf16, f16, q8_0, q4_0.
std::map<std::string, WType> packed_of(const std::map<std::string, std::string>& metadata, const std::string& file) {
  std::map<std::string, WType> out;
  auto it = metadata.find(kPackedKey);
  if (it == metadata.end()) return out;
  const nlohmann::json j = detail::parse_json_object(it->second, file + ": __metadata__[\"qkv_packed\"]");
  for (const auto& [name, v] : j.items()) {
    check(v.is_string(), file, ": __metadata__[\"qkv_packed\"][\"", name, "\"] is ", v.dump(),
          "; expected a weight type (bf16, f16, q8_0, q4_0)");
    const std::string t = v.get<std::string>();
    check(t == "bf16" || t == "f16" || t == "q8_0" || t == "q4_0", file, ": __metadata__[\"qkv_packed\"][\"", name,
          "\"] is \"", t, "\"; expected bf16, f16, q8_0 or q4_0");
    out[name] = parse_wtype(t, "qkv_packed");
  }
  return out;
}

}  // namespace

void Model::save(const std::string& dir) const {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(detail::concat(dir, ": cannot create the model directory: ", std::strerror(errno)));
  struct stat st {};
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": exists and is not a directory");
  std::map<std::string, std::string> meta{{"format", "pt"}, {"qkv_format", "1"}};
  std::vector<SafetensorsEntry> entries;
  std::deque<std::string> ungrouped;  // Q4_0 matrices' bytes in GGUF's row layout, while written
  nlohmann::json packed = nlohmann::json::object();
  for (const Parameter& p : params_) {
    if (p.var->packed) {
      entries.push_back(packed_entry(p.name, *p.var->packed, ungrouped.emplace_back()));
      packed[p.name] = wtype_name(p.var->packed->type);
    } else {
      const Tensor& t = p.var->value;
      entries.push_back({p.name, "F32", t.shape(), std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes())});
    }
  }
  if (!packed.empty()) {
    meta[kPackedKey] = packed.dump();
    // the packing's name: --dtype's, or (a GGUF file whose named matrix stayed float32) the first
    // packed matrix's type, never f32
    WType named = weight_type_;
    for (const Parameter& p : params_)
      if (named == WType::F32 && p.var->packed) named = p.var->packed->type;
    meta["qkv_dtype"] = wtype_name(named);
  }
  write_safetensors(dir + "/model.safetensors", entries, meta);
  write_file_atomic(dir + "/config.json", config_.to_json());
}

Model Model::load(const std::string& dir, const LoadOptions& opt) {
  if (is_hf_model_dir(dir)) return load_hf_model(dir, nullptr, opt);  // a Hugging Face folder (qkv/hf.h)
  struct stat st {};
  // a file: llama.cpp's GGUF (qkv/gguf.h)
  if (::stat(dir.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    check(is_gguf_file(dir), dir, ": not a model: a file that is not GGUF (it does not start with \"GGUF\"); a model "
          "is a directory with config.json and model.safetensors, or a GGUF file");
    return load_gguf_model(dir, opt);
  }
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": not a model directory (expected a directory with config.json and model.safetensors)");
  const std::string cfg_path = dir + "/config.json", w_path = dir + "/model.safetensors";
  check(::stat(cfg_path.c_str(), &st) == 0, dir, ": not a model directory: config.json is missing");
  check(::stat(w_path.c_str(), &st) == 0, dir, ": not a model directory: model.safetensors is missing");
  const ModelConfig cfg = ModelConfig::load(cfg_path);
  // The weights file's header first, with the reader's own checks (truncated, a directory, a
  // FIFO, ... each named precisely); then the values it declares, whatever their dtype (F16 holds
  // a parameter in 2 bytes, a packed Q4_0 matrix 18 bytes per 32), must cover the config's
  // parameters: a config that implies more belongs to another model, and is refused before
  // allocating it.
  const SafetensorsReader file(w_path);
  const std::map<std::string, WType> packed = packed_of(file.metadata(), w_path);
  double held = 0;
  for (const SafetensorsReader::Info& t : file.tensors()) {
    auto it = packed.find(t.name);
    const WType pt = it == packed.end() || t.dtype != "U8" ? WType::F32 : it->second;
    held += static_cast<double>(t.numel()) *
            (pt == WType::Q8_0 ? 32.0 / 34 : pt == WType::Q4_0 ? 32.0 / 18 : 1.0);
  }
  const size_t count = file.tensors().size();
  const ParameterPlan plan = plan_parameters(cfg);
  const double n = plan.total(cfg);
  check(n <= held + 0.5, cfg_path, ": the config implies ", fmt_count(n), " parameters (most of them in ",
        largest_part(cfg, plan), "), but ", w_path, " holds only ", fmt_count(held), " values in ", count,
        count == 1 ? " tensor" : " tensors", ": the two files do not belong together");
  WType stored_type = WType::F32;
  if (!packed.empty()) {
    auto it = file.metadata().find("qkv_dtype");
    check(it != file.metadata().end(), w_path, ": __metadata__ has \"qkv_packed\" but no \"qkv_dtype\"");
    const std::string stored = it->second;
    stored_type = parse_wtype(stored, w_path + ": __metadata__[\"qkv_dtype\"]");
    check(stored_type != WType::F32, w_path, ": __metadata__[\"qkv_dtype\"] is f32, but the file holds packed weights");
    check(!opt.dtype || wtype_name(*opt.dtype) == stored, dir, ": its weights are packed to ", stored,
          " (qkv quantize); --dtype ", opt.dtype ? wtype_name(*opt.dtype) : "", " would pack them again from the "
          "packed values: load it without --dtype (or with --dtype ", stored, "), or quantize the float32 model");
  }
  for (const auto& [name, t] : packed)
    check(file.find(name) != nullptr, w_path, ": __metadata__[\"qkv_packed\"] names \"", name,
          "\", which the file does not hold");

  Model m(cfg, Uninitialised{});
  for (const SafetensorsReader::Info& t : file.tensors())
    check(m.find(t.name) != nullptr, w_path, ": unexpected tensor \"", t.name, "\" ", shape_str(t.shape), ": this ",
          arch_name(cfg.arch), " model has no parameter of that name",
          cfg.tie_embeddings && t.name == "lm_head.weight" ? " (tie_embeddings is on: lm_head is the embedding)" : "");
  for (size_t i = 0; i < m.params_.size(); ++i) {
    const std::string name = m.params_[i].name;
    const SafetensorsReader::Info* t = file.find(name);
    check(t != nullptr, w_path, ": parameter \"", name, "\" ",
          shape_str(m.params_[i].var->value.shape()), " is missing");
    const std::vector<int64_t> want = m.params_[i].var->value.shape();
    auto pk = packed.find(name);
    if (pk != packed.end()) {
      // stored packed: the bytes as they are
      const WType pt = pk->second;
      check(want.size() == 2, w_path, ": \"", name, "\" is packed to ", wtype_name(pt), ", but the parameter is ",
            shape_str(want), ", not a matrix");
      const bool half = pt == WType::BF16 || pt == WType::F16;
      size_t rb = 0;
      try {
        rb = packed_row_bytes(pt, want[1]);
      } catch (const Error& e) {
        throw Error(detail::concat(w_path, ": \"", name, "\" ", shape_str(want), ": ", e.what()));
      }
      const std::vector<int64_t> stored_shape{want[0], half ? want[1] : static_cast<int64_t>(rb)};
      const char* dtype = pt == WType::BF16 ? "BF16" : pt == WType::F16 ? "F16" : "U8";
      check(t->dtype == dtype && t->shape == stored_shape, w_path, ": \"", name, "\" is ", t->dtype, " ",
            shape_str(t->shape), "; ", wtype_name(pt), " packing of ", shape_str(want), " is ", dtype, " ",
            shape_str(stored_shape));
      auto bytes = std::make_shared<Storage>(t->bytes, false);
      file.read_bytes(name, bytes->data(), t->bytes);
      try {
        m.adopt_packed(name, packed_from_bytes(pt, want[0], want[1], std::move(bytes), name));
      } catch (const Error& e) {
        throw Error(detail::concat(w_path, ": ", e.what()));
      }
    } else {
      check(t->shape == want, w_path, ": weights: \"", name, "\" has shape ", shape_str(t->shape),
            " but the config needs ", shape_str(want));
      check(t->dtype == "F32" || t->dtype == "F64" || t->dtype == "F16" || t->dtype == "BF16", w_path, ": weights: \"",
            name, "\" has dtype ", t->dtype, "; expected float32");
      bool packed_now = false;
      if (opt.dtype) {
        // packed from the file a few MiB of rows at a time: its float32 values are never held
        const int64_t cols = want.size() == 2 ? want[1] : 0;
        try {
          packed_now = m.pack_parameter_from(name, *opt.dtype, [&](int64_t r0, int64_t rows, float* dst) {
            file.read_f32_range(name, r0 * cols, rows * cols, dst);
          }, opt.fallback);
        } catch (const Error& e) {
          throw Error(detail::concat(w_path, ": ", e.what()));
        }
        if (packed_now) release_cached_memory();  // the unwritten float32 allocation, now
      }
      if (!packed_now) file.read_f32(name, m.params_[i].var->value.data<float>());
    }
  }
  if (opt.dtype) m.weight_type_ = *opt.dtype;
  if (!packed.empty()) m.weight_type_ = stored_type;
  return m;
}

}  // namespace qkv
