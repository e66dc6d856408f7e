// A GGUF file's model: llama.cpp's names and hyper-parameters mapped onto qkv's Llama (the same
// parameters load_hf_model fills from a Hugging Face folder), packed weights used as they are.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "models/families.h"
#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/hf.h"
#include "qkv/model.h"
#include "qkv/quant.h"

namespace qkv {

namespace {

// One of a parameter's parts: a GGUF tensor whose rows, stacked after the parts before it, are
// the parameter's rows; `heads` > 0 puts back the Q or K rows that llama.cpp's converter reorders.
struct Part {
  std::string name;
  int64_t rows = 0, cols = 0;
  int64_t heads = 0;
};
struct Rule {
  std::string param;
  std::vector<Part> parts;
};

// The file row holding parameter row r of a Q or K matrix of `heads` heads. Hugging Face's rows
// of a head are its rotate-half order [first halves | second halves]; llama.cpp's converter
// interleaves them (pair i = rows 2i, 2i + 1), as its RoPE rotates adjacent pairs.
int64_t file_row(int64_t r, int64_t heads, int64_t rows) {
  if (heads == 0) return r;
  const int64_t hd = rows / heads, half = hd / 2;
  const int64_t h = r / hd, within = r % hd, t = within / half, i = within % half;
  return h * hd + 2 * i + t;
}

// A native packed type for a GGUF type, or F32 when qkv does not compute with it as stored.
WType native(GgmlType t) {
  switch (t) {
    case GgmlType::F16: return WType::F16;
    case GgmlType::BF16: return WType::BF16;
    case GgmlType::Q8_0: return WType::Q8_0;
    case GgmlType::Q4_0: return WType::Q4_0;
    default: return WType::F32;
  }
}

ModelConfig llama_config(const GgufFile& f) {
  const std::string& file = f.path();
  const std::string a = "llama.";
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.d_model = f.integer(a + "embedding_length", 1, int64_t{1} << 20);
  c.n_layers = f.integer(a + "block_count", 1, int64_t{1} << 16);
  c.d_ff = f.integer(a + "feed_forward_length", 1, int64_t{1} << 24);
  c.n_heads = f.integer(a + "attention.head_count", 1, int64_t{1} << 14);
  c.n_kv_heads = f.integer_or(a + "attention.head_count_kv", c.n_heads, 1, c.n_heads);
  check(c.n_heads % c.n_kv_heads == 0, file, ": \"", a, "attention.head_count\" ", c.n_heads,
        " is not a multiple of \"", a, "attention.head_count_kv\" ", c.n_kv_heads);
  if (f.find(a + "attention.key_length") || f.find(a + "attention.value_length")) {
    c.d_k = f.integer_or(a + "attention.key_length", c.d_model / c.n_heads, 1, int64_t{1} << 16);
    c.d_v = f.integer_or(a + "attention.value_length", c.d_k, 1, int64_t{1} << 16);
  } else {
    check(c.d_model % c.n_heads == 0, file, ": \"", a, "embedding_length\" ", c.d_model, " is not a multiple of \"", a,
          "attention.head_count\" ", c.n_heads, " (and no attention.key_length says the head size)");
  }
  const int64_t dk = c.d_k > 0 ? c.d_k : c.d_model / c.n_heads;
  check(dk % 2 == 0, file, ": a head of ", dk, " dimensions cannot be rotated in pairs (RoPE)");
  const int64_t rot = f.integer_or(a + "rope.dimension_count", dk, 1, int64_t{1} << 16);
  check(rot == dk, file, ": \"", a, "rope.dimension_count\" is ", rot, ", but a head has ", dk,
        " dimensions: partial rotary embeddings are not supported");
  const std::string scaling = f.string_or(a + "rope.scaling.type", "none");
  check(scaling == "none", file, ": \"", a, "rope.scaling.type\" is \"", scaling,
        "\": scaled RoPE (linear, yarn, llama3) is not supported");
  const double factor = f.number_or(a + "rope.scaling.factor", 1.0);
  check(factor == 1.0 || factor == 0.0, file, ": \"", a, "rope.scaling.factor\" is ", factor,
        ": scaled RoPE is not supported");
  check(!f.tensor("rope_freqs.weight"), file, ": holds \"rope_freqs.weight\" (Llama 3.1's scaled RoPE frequencies), "
        "which is not supported");
  c.positional = Positional::Rope;
  c.rope_theta = f.number_or(a + "rope.freq_base", 10000.0);
  check(c.rope_theta > 0, file, ": \"", a, "rope.freq_base\" is ", c.rope_theta, "; expected a positive number");
  c.norm = NormKind::RMSNorm;
  c.norm_eps = f.number_or(a + "attention.layer_norm_rms_epsilon", 1e-5);
  check(c.norm_eps > 0 && c.norm_eps < 1, file, ": \"", a, "attention.layer_norm_rms_epsilon\" is ", c.norm_eps,
        "; expected a small positive number");
  c.activation = Activation::SiLU;
  c.gated = true;
  c.norm_first = true;
  c.final_norm = true;
  c.bias = false;
  c.fused_qkv = false;
  c.max_len = f.integer_or(a + "context_length", 2048, 1, int64_t{1} << 24);
  const GgufFile::Tensor* embed = f.tensor("token_embd.weight");
  check(embed && embed->ne.size() == 2, file, ": tensor \"token_embd.weight\" (the token embeddings, (d_model, vocab) "
        "in ggml's order) is missing");
  c.vocab_size = embed->ne[1];
  c.tie_embeddings = f.tensor("output.weight") == nullptr;
  const int64_t V = c.vocab_size;
  c.bos_id = f.integer_or("tokenizer.ggml.bos_token_id", V > 1 ? 1 : -1, -1, V - 1);
  c.eos_id = f.integer_or("tokenizer.ggml.eos_token_id", V > 2 ? 2 : -1, -1, V - 1);
  c.pad_id = -1;  // llama.cpp scores every position; padding is qkv's own concern (lengths)
  return c;
}

// llama.cpp's name for a tensor of Hugging Face's Llama (the family record's names, under
// "model."), and, for Q and K, the heads whose rows its converter interleaves.
Part gguf_part(const family::Part& hf, const ModelConfig& c) {
  struct Name {
    const char* hf;
    const char* gguf;
    int64_t heads;
  };
  const Name top[] = {{"model.embed_tokens.weight", "token_embd.weight", 0},
                      {"model.norm.weight", "output_norm.weight", 0},
                      {"lm_head.weight", "output.weight", 0}};
  const Name layer[] = {{"input_layernorm.weight", "attn_norm.weight", 0},
                        {"self_attn.q_proj.weight", "attn_q.weight", c.n_heads},
                        {"self_attn.k_proj.weight", "attn_k.weight", c.kv_heads()},
                        {"self_attn.v_proj.weight", "attn_v.weight", 0},
                        {"self_attn.o_proj.weight", "attn_output.weight", 0},
                        {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
                        {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
                        {"mlp.up_proj.weight", "ffn_up.weight", 0},
                        {"mlp.down_proj.weight", "ffn_down.weight", 0}};
  // a matrix (rows, cols); a vector as one row of ggml's ne[0] = cols
  const int64_t rows = hf.shape.size() == 2 ? hf.shape[0] : 1, cols = hf.shape.back();
  for (const Name& n : top)
    if (hf.name == n.hf) return {n.gguf, rows, cols, n.heads};
  const std::string layers = "model.layers.";
  if (hf.name.rfind(layers, 0) == 0) {
    const size_t dot = hf.name.find('.', layers.size());
    const std::string i = hf.name.substr(layers.size(), dot - layers.size()), rest = hf.name.substr(dot + 1);
    for (const Name& n : layer)
      if (rest == n.hf) return {"blk." + i + "." + n.gguf, rows, cols, n.heads};
  }
  throw Error(detail::concat("GGUF: llama.cpp's Llama has no tensor for Hugging Face's \"", hf.name, "\""));
}

// The llama family's rules (src/models/hf.cpp) under llama.cpp's names.
std::vector<Rule> llama_rules(const ModelConfig& c) {
  check(!c.bias, "GGUF: llama.cpp's Llama has no biases");
  std::vector<Rule> r;
  for (const family::Rule& hf : family::rules("llama", c, "model.")) {
    Rule g{hf.param, {}};
    for (const family::Part& p : hf.parts) g.parts.push_back(gguf_part(p, c));
    r.push_back(std::move(g));
  }
  return r;
}

}  // namespace

Model load_gguf_model(const std::string& path, const LoadOptions& opt, GgufLoadReport* report) {
  const GgufFile f(path);
  const std::string arch = f.string_or("general.architecture", "");
  check(arch == "llama", path, ": general.architecture is \"", arch,
        "\"; qkv reads \"llama\" GGUF files (Llama, TinyLlama, Mistral-shaped models)");
  const ModelConfig cfg = llama_config(f);
  const std::vector<Rule> rules = llama_rules(cfg);
  // every tensor present with its shape before anything is allocated
  std::set<std::string> used;
  for (const Rule& r : rules)
    for (const Part& p : r.parts) {
      const GgufFile::Tensor* t = f.tensor(p.name);
      check(t != nullptr, path, ": tensor \"", p.name, "\" is missing (qkv's ", r.param, ")");
      const std::vector<int64_t> want = p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.cols, p.rows};
      check(t->ne == want, path, ": tensor \"", p.name, "\" has ggml shape ", shape_str(t->ne), "; the metadata implies ",
            shape_str(want));
      used.insert(p.name);
    }

  Model m(cfg, Model::Uninitialised{});
  WType primary = WType::F32;
  for (const Rule& r : rules) {
    const Parameter* param = m.find(r.param);
    check(param != nullptr, "internal: gguf rule for unknown parameter ", r.param);
    const int64_t cols = r.parts[0].cols;
    const bool matrix = param->var->value.dim() == 2;
    // the float32 rows [r0, r0 + n) of the parameter, the Q / K rows put back in order
    const auto read_f32 = [&](int64_t r0, int64_t n, float* out) {
      int64_t base = 0;
      for (const Part& p : r.parts) {
        const GgufFile::Tensor& t = *f.tensor(p.name);
        const int64_t lo = std::max(r0, base), hi = std::min(r0 + n, base + p.rows);
        if (p.heads == 0 && lo < hi) f.read_rows_f32(t, lo - base, hi - lo, out + (lo - r0) * cols);
        for (int64_t x = lo; p.heads > 0 && x < hi; ++x)
          f.read_rows_f32(t, file_row(x - base, p.heads, p.rows), 1, out + (x - r0) * cols);
        base += p.rows;
      }
    };
    std::set<GgmlType> types;
    for (const Part& p : r.parts) types.insert(f.tensor(p.name)->type);
    const GgmlType first = *types.begin();
    try {
      if (matrix && opt.dtype) {
        // --dtype: every matrix packed to it from float32 rows, as for a float32 model
        if (m.pack_parameter_from(r.param, *opt.dtype, read_f32, opt.fallback)) continue;
      } else if (matrix && types.size() == 1 && native(first) != WType::F32) {
        // as the file holds it: the bytes themselves, rows reordered
        const WType t = native(first);
        const uint64_t rb = ggml_row_bytes(first, cols);
        const int64_t rows = param->var->value.size(0);
        auto bytes = std::make_shared<Storage>(rb * static_cast<uint64_t>(rows), false);
        auto* dst = static_cast<uint8_t*>(bytes->data());
        int64_t base = 0;
        for (const Part& p : r.parts) {
          const GgufFile::Tensor& gt = *f.tensor(p.name);
          if (p.heads == 0) {
            f.read_rows(gt, 0, p.rows, dst + static_cast<uint64_t>(base) * rb);
          } else {
            for (int64_t x = 0; x < p.rows; ++x)
              f.read_rows(gt, file_row(x, p.heads, p.rows), 1, dst + static_cast<uint64_t>(base + x) * rb);
          }
          base += p.rows;
        }
        m.adopt_packed(r.param, packed_from_bytes(t, rows, cols, std::move(bytes), r.param));
        continue;
      } else if (matrix && !(types.size() == 1 && first == GgmlType::F32)) {
        // K-quants, or parts of different types: dequantised, packed to Q8_0
        if (m.pack_parameter_from(r.param, WType::Q8_0, read_f32, opt.fallback)) {
          if (report) {
            std::string from;
            for (GgmlType t : types) {
              if (!from.empty()) from += "+";
              from += ggml_type_name(static_cast<uint32_t>(t));
            }
            report->converted.push_back(r.param + " (" + from + " -> " +
                                        wtype_name(m.find(r.param)->var->packed->type) + ")");
          }
          continue;
        }
      }
      // float32 values: norms, F32 matrices
      read_f32(0, matrix ? param->var->value.size(0) : 1, param->var->value.data<float>());
    } catch (const Error& e) {
      throw Error(detail::concat(path, ": ", r.param, ": ", e.what()));
    }
  }
  release_cached_memory();
  // the packing's name: the first projection's type (layers.0.linear2 is "the feed-forward")
  for (const Parameter& p : m.parameters())
    if (primary == WType::F32 && p.var->packed && p.decay && p.name.rfind("layers.", 0) == 0)
      primary = p.var->packed->type;
  if (const Parameter* down = m.find("layers.0.linear2.weight"); down && down->var->packed)
    primary = down->var->packed->type;
  m.set_weight_type(opt.dtype ? *opt.dtype : primary);
  if (report) {
    report->architecture = arch;
    for (const GgufFile::Tensor& t : f.tensors())
      if (!used.count(t.name)) report->unused.push_back(t.name);
  }
  return m;
}

}  // namespace qkv

namespace qkv {

namespace {

GgufValue value(GgufValue::Kind kind, uint64_t u, double f = 0, const std::string& s = "") {
  GgufValue x;
  x.kind = kind;
  x.u = u;
  x.f = f;
  x.s = s;
  return x;
}
GgufValue u32(uint64_t v) { return value(GgufValue::U32, v); }
GgufValue f32(double v) { return value(GgufValue::F32, 0, v); }
GgufValue str(const std::string& s) { return value(GgufValue::String, 0, 0, s); }
GgufValue boolean(bool b) { return value(GgufValue::Bool, b ? 1 : 0); }

GgmlType ggml_of(WType t) {
  switch (t) {
    case WType::BF16: return GgmlType::BF16;
    case WType::F16: return GgmlType::F16;
    case WType::Q8_0: return GgmlType::Q8_0;
    case WType::Q4_0: return GgmlType::Q4_0;
    case WType::F32: break;
  }
  return GgmlType::F32;
}

}  // namespace

void save_gguf_model(const Model& model, const Tokenizer* tok, const std::string& path, std::string* tokenizer_note) {
  const ModelConfig& c = model.config();
  std::string type;
  try {
    type = hf_model_type_for(c);
  } catch (const Error& e) {
    throw Error(detail::concat("export --format gguf: ", e.what()));
  }
  check(type == "llama", "export --format gguf: the model maps onto Hugging Face's ", type,
        "; GGUF is written for Llama-shaped models (positional = rope, norm = rmsnorm, gated)");
  check(!c.bias, "export --format gguf: bias = true: llama.cpp's Llama has no biases");
  check(c.activation == Activation::SiLU, "export --format gguf: activation = ", activation_name(c.activation),
        ": llama.cpp's Llama is SwiGLU (silu)");
  const int64_t H = c.n_heads, G = c.kv_heads(), Dk = c.head_dim_k();
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"general.architecture", str("llama")},
      {"general.name", str("qkv export")},
      {"llama.context_length", u32(static_cast<uint64_t>(c.max_len))},
      {"llama.embedding_length", u32(static_cast<uint64_t>(c.d_model))},
      {"llama.block_count", u32(static_cast<uint64_t>(c.n_layers))},
      {"llama.feed_forward_length", u32(static_cast<uint64_t>(c.d_ff))},
      {"llama.rope.dimension_count", u32(static_cast<uint64_t>(Dk))},
      {"llama.attention.head_count", u32(static_cast<uint64_t>(H))},
      {"llama.attention.head_count_kv", u32(static_cast<uint64_t>(G))},
      {"llama.attention.layer_norm_rms_epsilon", f32(c.norm_eps)},
      {"llama.rope.freq_base", f32(c.rope_theta)},
  };
  if (Dk * H != c.d_model) {
    kv.emplace_back("llama.attention.key_length", u32(static_cast<uint64_t>(Dk)));
    kv.emplace_back("llama.attention.value_length", u32(static_cast<uint64_t>(c.head_dim_v())));
  }
  // the tokenizer, where it has GGUF's form
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  bool add_bos = false, space = true;
  const std::string why = tok ? tok->sentencepiece_vocab(&pieces, &scores, &types, &add_bos, &space) : "no tokenizer";
  if (why.empty()) {
    check(static_cast<int64_t>(pieces.size()) <= c.vocab_size, "export --format gguf: the tokenizer has ", pieces.size(),
          " tokens, more than the model's vocab_size ", c.vocab_size);
    // llama.cpp needs one token per embedding row: rows past the tokenizer's are unused pieces
    for (int64_t i = static_cast<int64_t>(pieces.size()); i < c.vocab_size; ++i) {
      pieces.push_back(detail::concat("<qkv_unused_", i, ">"));
      scores.push_back(-1e9f);
      types.push_back(5);
    }
    GgufValue t, s, ty;
    t.kind = s.kind = ty.kind = GgufValue::Array;
    t.elem = GgufValue::String, s.elem = GgufValue::F32, ty.elem = GgufValue::I32;
    t.strings = pieces;
    for (size_t i = 0; i < pieces.size(); ++i) {
      s.numbers.push_back(scores[i]);
      ty.numbers.push_back(types[i]);
    }
    kv.emplace_back("tokenizer.ggml.model", str("llama"));
    kv.emplace_back("tokenizer.ggml.tokens", t);
    kv.emplace_back("tokenizer.ggml.scores", s);
    kv.emplace_back("tokenizer.ggml.token_type", ty);
    for (const auto& [key, id] : {std::pair<const char*, int32_t>{"bos", tok->bos_id()}, {"eos", tok->eos_id()},
                                  {"padding", tok->pad_id()}})
      if (id >= 0) kv.emplace_back(detail::concat("tokenizer.ggml.", key, "_token_id"), u32(static_cast<uint64_t>(id)));
    for (size_t i = 0; i < types.size(); ++i)
      if (types[i] == 2) kv.emplace_back("tokenizer.ggml.unknown_token_id", u32(i));
    kv.emplace_back("tokenizer.ggml.add_bos_token", boolean(add_bos));
    kv.emplace_back("tokenizer.ggml.add_space_prefix", boolean(space));
  } else if (tokenizer_note) {
    *tokenizer_note = why;
  }

  // the tensors: the reader's rules, backwards
  std::vector<GgufTensorBytes> out;
  for (const Rule& r : llama_rules(c)) {
    const Parameter* p = model.find(r.param);
    check(p != nullptr, "internal: gguf rule for unknown parameter ", r.param);
    const PackedWeight* w = p->var->packed.get();
    const int64_t cols = r.parts[0].cols;
    const GgmlType gt = w ? ggml_of(w->type) : GgmlType::F32;
    const uint64_t rb = w ? w->row_bytes : static_cast<uint64_t>(cols) * 4;
    const Tensor keep = w ? Tensor() : p->var->value.contiguous();
    const char* src = w ? nullptr : static_cast<const char*>(keep.raw_data());
    int64_t base = 0;
    for (const Part& part : r.parts) {
      GgufTensorBytes t;
      t.name = part.name;
      t.ne = part.rows == 1 ? std::vector<int64_t>{part.cols} : std::vector<int64_t>{part.cols, part.rows};
      t.type = gt;
      t.bytes.resize(rb * static_cast<uint64_t>(part.rows));
      for (int64_t x = 0; x < part.rows; ++x)  // parameter row base + x -> file row file_row(x)
      {
        auto* dst = reinterpret_cast<uint8_t*>(t.bytes.data()) + static_cast<uint64_t>(file_row(x, part.heads, part.rows)) * rb;
        if (w)
          w->file_row(base + x, dst);
        else
          std::memcpy(dst, src + static_cast<uint64_t>(base + x) * rb, rb);
      }
      base += part.rows;
      out.push_back(std::move(t));
    }
  }
  write_gguf(path, kv, out);
}

}  // namespace qkv
