// ModelConfig: validation and config.json (strict: unknown keys and wrong types are errors).
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/json_strict.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/model.h"

namespace qkv {
namespace {

using json = nlohmann::json;

template <class E>
struct Names {
  E value;
  const char* name;
};

constexpr Names<Arch> kArch[] = {{Arch::Decoder, "decoder"},
                                 {Arch::EncoderDecoder, "encoder-decoder"},
                                 {Arch::EncoderClassifier, "encoder-classifier"},
                                 {Arch::EncoderMLM, "encoder-mlm"},
                                 {Arch::Encoder, "encoder"}};
constexpr Names<Positional> kPos[] = {{Positional::Sinusoidal, "sinusoidal"},
                                      {Positional::Learned, "learned"},
                                      {Positional::Rope, "rope"},
                                      {Positional::Alibi, "alibi"},
                                      {Positional::None, "none"},
                                      {Positional::SinusoidalSplitHalf, "sinusoidal_split_half"}};
constexpr Names<NormKind> kNorm[] = {{NormKind::LayerNorm, "layernorm"}, {NormKind::RMSNorm, "rmsnorm"}};
constexpr Names<Activation> kAct[] = {{Activation::ReLU, "relu"},
                                      {Activation::GeluErf, "gelu"},
                                      {Activation::GeluTanh, "gelu_tanh"},
                                      {Activation::SiLU, "silu"},
                                      {Activation::Tanh, "tanh"}};
constexpr Names<Pooling> kPool[] = {{Pooling::Mean, "mean"}, {Pooling::First, "first"}};

template <class E, size_t N>
const char* name_of(const Names<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <class E, size_t N>
E parse_enum(const Names<E> (&table)[N], const json& j, const std::string& key, const std::string& source) {
  check(j.is_string(), source, ": \"", key, "\" must be a string");
  const std::string s = j.get<std::string>();
  std::string valid;
  for (const auto& e : table) {
    if (s == e.name) return e.value;
    valid += valid.empty() ? "" : ", ";
    valid += e.name;
  }
  throw Error(detail::concat(source, ": \"", key, "\" is \"", s, "\"; expected one of ", valid));
}

int64_t get_int(const json& j, const std::string& key, const std::string& source) {
  check(j.is_number_integer(), source, ": \"", key, "\" must be an integer, got ", j.dump());
  // nlohmann keeps integers above INT64_MAX as unsigned; get<int64_t> would wrap them
  check(!j.is_number_unsigned() || j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        source, ": \"", key, "\" is ", j.dump(), ", beyond any size a model can have");
  return j.get<int64_t>();
}
double get_num(const json& j, const std::string& key, const std::string& source) {
  check(j.is_number(), source, ": \"", key, "\" must be a number, got ", j.dump());
  const double v = j.get<double>();
  check(std::isfinite(v), source, ": \"", key, "\" must be finite");
  return v;
}
bool get_bool(const json& j, const std::string& key, const std::string& source) {
  check(j.is_boolean(), source, ": \"", key, "\" must be true or false, got ", j.dump());
  return j.get<bool>();
}

}  // namespace

const char* arch_name(Arch a) { return name_of(kArch, a); }
const char* activation_name(Activation a) { return name_of(kAct, a); }
const char* positional_name(Positional p) { return name_of(kPos, p); }

void ModelConfig::validate() const {
  // Sizes are bounded so that every product of two of them fits in 64 bits (what a config
  // implies in memory is checked when a Model is built); ids are int32, as token ids are.
  constexpr int64_t kMaxSize = int64_t{1} << 40, kMaxId = std::numeric_limits<int32_t>::max();
  auto in_range = [](int64_t v, int64_t lo, int64_t hi, const char* name, const char* note = "") {
    check(v >= lo && v <= hi, "config: ", name, " must be in [", lo, ", ", hi, "]", note, ", got ", v);
  };
  in_range(vocab_size, 1, kMaxId, "vocab_size");
  in_range(src_vocab_size, 0, kMaxId, "src_vocab_size", " (0: vocab_size)");
  in_range(d_model, 1, kMaxSize, "d_model");
  in_range(n_heads, 1, kMaxSize, "n_heads");
  in_range(n_kv_heads, 0, kMaxSize, "n_kv_heads", " (0: n_heads)");
  in_range(d_ff, 1, kMaxSize, "d_ff");
  in_range(d_k, 0, kMaxSize, "d_k", " (0: d_model / n_heads)");
  in_range(d_v, 0, kMaxSize, "d_v", " (0: d_k)");
  check(kv_heads() <= n_heads && n_heads % kv_heads() == 0, "config: n_kv_heads = ", kv_heads(),
        " must divide n_heads = ", n_heads);
  check(d_k > 0 || d_model % n_heads == 0, "config: d_model = ", d_model, " is not divisible by n_heads = ", n_heads,
        "; set d_k");
  check(head_dim_k() >= 1, "config: d_k must be >= 1, got ", head_dim_k(), " (d_model / n_heads)");
  // the projections' widths n_heads * d_k and n_heads * d_v (both <= 2^40, so no overflow here)
  check(n_heads <= kMaxSize / head_dim_k(), "config: n_heads * d_k = ", n_heads, " * ", head_dim_k(),
        " is more than ", kMaxSize);
  check(n_heads <= kMaxSize / head_dim_v(), "config: n_heads * d_v = ", n_heads, " * ", head_dim_v(),
        " is more than ", kMaxSize);
  check(positional != Positional::Rope || head_dim_k() % 2 == 0, "config: rope needs an even d_k, got ", head_dim_k());
  check(std::isfinite(rope_theta) && rope_theta > 0, "config: rope_theta must be finite and > 0, got ", rope_theta);
  check(std::isfinite(norm_eps) && norm_eps > 0, "config: norm_eps must be finite and > 0, got ", norm_eps);
  check(dropout >= 0 && dropout < 1, "config: dropout must be in [0, 1), got ", dropout);
  check(std::isfinite(init_std) && init_std >= 0, "config: init_std must be finite and >= 0, got ", init_std);
  in_range(max_len, positional == Positional::Learned ? 1 : 0, kMaxSize, "max_len",
           positional == Positional::Learned ? " (the learned positions' table)" : "");
  check(pad_id >= -1 && pad_id < std::max(vocab_size, source_vocab()), "config: pad_id ", pad_id,
        " is outside the vocabulary");
  check(bos_id >= -1 && bos_id < vocab_size, "config: bos_id ", bos_id, " is outside the vocabulary");
  check(eos_id >= -1 && eos_id < vocab_size, "config: eos_id ", eos_id, " is outside the vocabulary");
  switch (arch) {
    case Arch::Decoder: in_range(n_layers, 1, kMaxSize, "n_layers"); break;
    case Arch::EncoderClassifier:
      in_range(n_layers, 1, kMaxSize, "n_layers");
      in_range(num_classes, 1, kMaxId, "num_classes");
      check(!tie_embeddings, "config: tie_embeddings does not apply to encoder-classifier");
      break;
    case Arch::EncoderDecoder:
      in_range(n_encoder_layers, 1, kMaxSize, "n_encoder_layers");
      in_range(n_decoder_layers, 1, kMaxSize, "n_decoder_layers");
      break;
    case Arch::EncoderMLM: in_range(n_layers, 1, kMaxSize, "n_layers"); break;
    case Arch::Encoder:
      in_range(n_layers, 1, kMaxSize, "n_layers");
      check(!tie_embeddings, "config: tie_embeddings does not apply to a bare encoder (it has no output layer)");
      break;
  }
  check(!share_embeddings || arch == Arch::EncoderDecoder, "config: share_embeddings applies to encoder-decoder only");
  check(!share_embeddings || source_vocab() == vocab_size, "config: share_embeddings needs src_vocab_size = vocab_size, got ",
        source_vocab(), " and ", vocab_size);
  in_range(type_vocab_size, 0, kMaxId, "type_vocab_size", " (0: no token types)");
  check(type_vocab_size == 0 || arch != Arch::EncoderDecoder, "config: type_vocab_size does not apply to encoder-decoder");
  check(!logits_bias || arch == Arch::Decoder || arch == Arch::EncoderDecoder || arch == Arch::EncoderMLM,
        "config: logits_bias needs an LM head (decoder, encoder-decoder or encoder-mlm)");
  check(!pooler || arch == Arch::EncoderClassifier, "config: pooler applies to encoder-classifier only");
}

std::string ModelConfig::to_json() const {
  json j;
  j["qkv_format"] = 1;
  j["arch"] = arch_name(arch);
  j["vocab_size"] = vocab_size;
  if (arch == Arch::EncoderDecoder) j["src_vocab_size"] = source_vocab();
  j["d_model"] = d_model;
  j["n_heads"] = n_heads;
  j["n_kv_heads"] = kv_heads();
  j["d_k"] = head_dim_k();
  j["d_v"] = head_dim_v();
  j["d_ff"] = d_ff;
  if (arch == Arch::EncoderDecoder) {
    j["n_encoder_layers"] = n_encoder_layers;
    j["n_decoder_layers"] = n_decoder_layers;
  } else {
    j["n_layers"] = n_layers;
  }
  j["activation"] = name_of(kAct, activation);
  j["gated"] = gated;
  j["norm"] = name_of(kNorm, norm);
  j["norm_eps"] = norm_eps;
  j["norm_first"] = norm_first;
  j["final_norm"] = final_norm;
  j["positional"] = positional_name(positional);
  j["max_len"] = max_len;
  j["rope_theta"] = rope_theta;
  j["scale_embeddings"] = scale_embeddings;
  j["tie_embeddings"] = tie_embeddings;
  if (arch == Arch::EncoderDecoder) j["share_embeddings"] = share_embeddings;
  if (type_vocab_size > 0) j["type_vocab_size"] = type_vocab_size;
  j["embed_norm"] = embed_norm;
  j["logits_bias"] = logits_bias;
  if (arch == Arch::EncoderClassifier) j["pooler"] = pooler;
  j["bias"] = bias;
  j["fused_qkv"] = fused_qkv;
  j["dropout"] = dropout;
  if (arch == Arch::EncoderClassifier) {
    j["num_classes"] = num_classes;
    j["pooling"] = name_of(kPool, pooling);
  }
  j["pad_id"] = pad_id;
  j["bos_id"] = bos_id;
  j["eos_id"] = eos_id;
  j["init_std"] = init_std;
  return j.dump(2) + "\n";
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  // A key given twice is an error (nlohmann::json alone would keep the last value silently).
  const json j = detail::parse_json_object(text, source);
  ModelConfig c;
  // Directories written before "gated" existed say "activation": "swiglu" (silu, gated).
  bool legacy_swiglu = false, gated_given = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "qkv_format") {
      check(get_int(v, k, source) == 1, source, ": qkv_format ", v.dump(), " is not supported (expected 1)");
    } else if (k == "arch") c.arch = parse_enum(kArch, v, k, source);
    else if (k == "vocab_size") c.vocab_size = get_int(v, k, source);
    else if (k == "src_vocab_size") c.src_vocab_size = get_int(v, k, source);
    else if (k == "d_model") c.d_model = get_int(v, k, source);
    else if (k == "n_heads") c.n_heads = get_int(v, k, source);
    else if (k == "n_kv_heads") c.n_kv_heads = get_int(v, k, source);
    else if (k == "d_k") c.d_k = get_int(v, k, source);
    else if (k == "d_v") c.d_v = get_int(v, k, source);
    else if (k == "d_ff") c.d_ff = get_int(v, k, source);
    else if (k == "n_layers") c.n_layers = get_int(v, k, source);
    else if (k == "n_encoder_layers") c.n_encoder_layers = get_int(v, k, source);
    else if (k == "n_decoder_layers") c.n_decoder_layers = get_int(v, k, source);
    else if (k == "activation" && v.is_string() && v.get<std::string>() == "swiglu") {
      legacy_swiglu = true;
      c.activation = Activation::SiLU;
    } else if (k == "activation") c.activation = parse_enum(kAct, v, k, source);
    else if (k == "gated") {
      c.gated = get_bool(v, k, source);
      gated_given = true;
    }
    else if (k == "norm") c.norm = parse_enum(kNorm, v, k, source);
    else if (k == "norm_eps") c.norm_eps = get_num(v, k, source);
    else if (k == "norm_first") c.norm_first = get_bool(v, k, source);
    else if (k == "final_norm") c.final_norm = get_bool(v, k, source);
    else if (k == "positional") c.positional = parse_enum(kPos, v, k, source);
    else if (k == "max_len") c.max_len = get_int(v, k, source);
    else if (k == "rope_theta") c.rope_theta = get_num(v, k, source);
    else if (k == "scale_embeddings") c.scale_embeddings = get_bool(v, k, source);
    else if (k == "tie_embeddings") c.tie_embeddings = get_bool(v, k, source);
    else if (k == "share_embeddings") c.share_embeddings = get_bool(v, k, source);
    else if (k == "type_vocab_size") c.type_vocab_size = get_int(v, k, source);
    else if (k == "embed_norm") c.embed_norm = get_bool(v, k, source);
    else if (k == "logits_bias") c.logits_bias = get_bool(v, k, source);
    else if (k == "pooler") c.pooler = get_bool(v, k, source);
    else if (k == "bias") c.bias = get_bool(v, k, source);
    else if (k == "fused_qkv") c.fused_qkv = get_bool(v, k, source);
    else if (k == "dropout") c.dropout = get_num(v, k, source);
    else if (k == "num_classes") c.num_classes = get_int(v, k, source);
    else if (k == "pooling") c.pooling = parse_enum(kPool, v, k, source);
    else if (k == "pad_id") c.pad_id = get_int(v, k, source);
    else if (k == "bos_id") c.bos_id = get_int(v, k, source);
    else if (k == "eos_id") c.eos_id = get_int(v, k, source);
    else if (k == "init_std") c.init_std = get_num(v, k, source);
    else throw Error(detail::concat(source, ": unknown key \"", k, "\""));
  }
  if (legacy_swiglu) {
    check(!gated_given || c.gated, source, ": \"activation\": \"swiglu\" is silu, gated, but \"gated\" is false");
    c.gated = true;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(detail::concat(source, ": ", e.what()));
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  const std::string text = read_file(path, "config.json");
  check(text.size() < (64u << 20), path, ": larger than 64 MiB; not a config file");
  return from_json(text, path);
}

}  // namespace qkv
