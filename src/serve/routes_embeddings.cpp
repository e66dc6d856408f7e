// /v1/embeddings: one vector per input, the model's final hidden states pooled (mean, the first or
// the last token) and optionally normalised, as a sentence-transformers folder or the options say.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "qkv/autograd.h"
#include "qkv/data.h"
#include "qkv/files.h"
#include "serve/server_impl.h"

namespace qkv::serve {

namespace fs = std::filesystem;

// How texts become vectors: the pooling of the final hidden states, and whether they are
// normalised. A sentence-transformers folder says both (modules.json: a Pooling module's
// config.json, a Normalize module); --embedding-pooling and --embedding-normalize override.
void ServerImpl::load_embedding_setup() {
  pooling_ = "mean";
  normalize_ = o_.embedding_normalize;
  if (fs::is_directory(o_.model)) {
    std::string pooling_dir;
    const fs::path modules = fs::path(o_.model) / "modules.json";
    if (fs::is_regular_file(modules)) {
      Json m;
      try {
        m = Json::parse(read_file(modules.string(), "modules.json"));
      } catch (const Json::exception& e) {
        fail(modules.string(), ": not valid JSON (", e.what(), ")");
      }
      check(m.is_array(), modules.string(), ": expected a list of modules");
      for (const Json& e : m) {
        if (!e.is_object() || !e.contains("type") || !e["type"].is_string()) continue;
        const std::string type = e["type"].get<std::string>();
        if (type == "sentence_transformers.models.Normalize") normalize_ = true;
        if (type == "sentence_transformers.models.Pooling" && e.contains("path") && e["path"].is_string())
          pooling_dir = e["path"].get<std::string>();
      }
      check(pooling_dir.find("..") == std::string::npos && (pooling_dir.empty() || pooling_dir[0] != '/'),
            modules.string(), ": the Pooling module's path '", pooling_dir, "' leaves the model folder");
    } else if (fs::is_regular_file(fs::path(o_.model) / "1_Pooling" / "config.json")) {
      pooling_dir = "1_Pooling";
    }
    if (!pooling_dir.empty()) {
      const fs::path cfg = fs::path(o_.model) / pooling_dir / "config.json";
      Json c;
      try {
        c = Json::parse(read_file(cfg.string(), "the pooling config"));
      } catch (const Json::exception& e) {
        fail(cfg.string(), ": not valid JSON (", e.what(), ")");
      }
      check(c.is_object(), cfg.string(), ": expected an object");
      std::vector<std::string> modes;
      for (const auto& [key, name] : {std::pair<const char*, const char*>{"pooling_mode_mean_tokens", "mean"},
                                      {"pooling_mode_cls_token", "cls"}, {"pooling_mode_lasttoken", "last"},
                                      {"pooling_mode_max_tokens", "max"}, {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"},
                                      {"pooling_mode_weightedmean_tokens", "weightedmean"}})
        if (c.contains(key) && c[key] == true) modes.push_back(name);
      if (modes.size() == 1 && (modes[0] == "mean" || modes[0] == "cls" || modes[0] == "last")) {
        pooling_ = modes[0];
      } else if (o_.embedding_pooling.empty()) {
        std::string list;
        for (const std::string& m : modes) list += (list.empty() ? "" : ", ") + m;
        embedding_error_ = detail::concat(cfg.string(), " asks for pooling '", list.empty() ? "none" : list,
                                          "'; qkv pools by one of mean, cls, last (--embedding-pooling)");
      }
    }
  }
  if (!o_.embedding_pooling.empty()) pooling_ = o_.embedding_pooling;
}

// OpenAI's embeddings: {"input": a string, a list of strings, a list of token ids or a list of
// those; "encoding_format": "float" | "base64"; "dimensions": the model's only} -> one vector per
// input, each computed alone (so the same whatever else was sent with it).
void ServerImpl::embeddings(const http::Request& req, http::Response& res) {
  if (model_->config().arch == Arch::EncoderDecoder)
    bad("input", "/v1/embeddings needs a decoder or encoder model; this one is encoder-decoder (a translator)");
  if (!embedding_error_.empty()) throw HttpError{400, embedding_error_, "invalid_request_error", "input"};
  Fields f(req.body);
  if (const Json* m = f.get("model"); m && !m->is_string()) bad("model", "'model' must be a string");
  f.get("user");
  const Json* in = f.get("input");
  const Json* ef = f.get("encoding_format");
  const std::string format = ef && ef->is_string() ? ef->get<std::string>() : ef ? ef->dump() : "float";
  if (format != "float" && format != "base64")
    bad("encoding_format", "'encoding_format' is " + (ef ? ef->dump() : format) + "; expected \"float\" or \"base64\"");
  const int64_t D = model_->config().d_model;
  const int64_t dims = f.integer("dimensions", 1, 1 << 20, D);
  if (dims != D)
    bad("dimensions", detail::concat("'dimensions' is ", dims, "; this model's embeddings have ", D,
                                     " dimensions and it cannot give fewer"));
  f.done();
  if (!in) bad("input", "'input' is required: a string, a list of strings, or token ids");
  constexpr size_t kMaxInputs = 256;
  std::vector<std::vector<int32_t>> inputs;
  const auto ids_of = [&](const Json& list, const std::string& where) {
    std::vector<int32_t> ids;
    for (const Json& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok_->vocab_size())
        bad("input", detail::concat(where, " holds ", t.dump(), "; token ids are in [0, ", tok_->vocab_size(), ")"));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
  };
  const auto add_text = [&](const Json& t, const std::string& where) {
    const std::string text = t.get<std::string>();
    if (const std::string why = utf8_problem(text); !why.empty()) bad("input", where + ": " + why);
    inputs.push_back(encode_input(*tok_, text));
  };
  if (in->is_string()) {
    add_text(*in, "'input'");
  } else if (in->is_array() && !in->empty() && in->front().is_number()) {
    inputs.push_back(ids_of(*in, "'input'"));
  } else if (in->is_array() && !in->empty() && in->size() <= kMaxInputs) {
    for (size_t k = 0; k < in->size(); ++k) {
      const Json& e = (*in)[k];
      const std::string where = detail::concat("'input'[", k, "]");
      if (e.is_string()) add_text(e, where);
      else if (e.is_array()) inputs.push_back(ids_of(e, where));
      else bad("input", where + " is " + e.dump() + "; expected a string or a list of token ids");
    }
  } else {
    bad("input", detail::concat("'input' must be a string, a list of token ids, or a list of 1 to ", kMaxInputs,
                                " strings or lists of token ids"));
  }
  const int64_t context = sched_->options().max_len;
  int64_t tokens = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].empty()) bad("input", detail::concat("input ", k, " has no tokens"));
    if (static_cast<int64_t>(inputs[k].size()) > context)
      bad("input", detail::concat("input ", k, " is ", inputs[k].size(), " tokens; the model reads at most ", context));
    tokens += static_cast<int64_t>(inputs[k].size());
  }
  // e <- pool(hidden states of the input alone); e <- e / max(|e|, 1e-12) when normalising
  const std::string pooling = pooling_;
  const bool normalize = normalize_;
  std::vector<std::vector<float>> vecs;
  try {
    vecs = sched_->run([&inputs, &pooling, normalize, D](const Model& m) {
      std::vector<std::vector<float>> out;
      for (const auto& ids : inputs) {
        Tensor t({1, static_cast<int64_t>(ids.size())}, DType::I64);
        std::copy(ids.begin(), ids.end(), t.data<int64_t>());
        Tape tape;
        tape.recording = false;
        const Tensor h = m.hidden_states(tape, t)->value.contiguous();  // (1, T, D)
        const auto T = static_cast<int64_t>(ids.size());
        const float* x = h.data<float>();
        std::vector<double> e(static_cast<size_t>(D), 0.0);
        if (pooling == "mean") {
          for (int64_t i = 0; i < T; ++i)
            for (int64_t d = 0; d < D; ++d) e[d] += x[i * D + d];
          for (double& v : e) v /= static_cast<double>(T);
        } else {
          const int64_t row = pooling == "cls" ? 0 : T - 1;
          for (int64_t d = 0; d < D; ++d) e[d] = x[row * D + d];
        }
        double norm = 0;
        for (double v : e) norm += v * v;
        norm = std::sqrt(norm);
        std::vector<float> v(static_cast<size_t>(D));
        for (int64_t d = 0; d < D; ++d) {
          check(std::isfinite(e[d]), "the model's hidden states are not finite");
          v[d] = static_cast<float>(normalize ? e[d] / std::max(norm, 1e-12) : e[d]);
        }
        out.push_back(std::move(v));
      }
      return out;
    }).get();
  } catch (const Error& e) {
    throw HttpError{500, e.what(), "server_error", ""};
  }
  Json data = Json::array();
  for (size_t k = 0; k < vecs.size(); ++k) {
    Json emb;
    if (format == "float") {
      emb = Json::array();
      for (float v : vecs[k]) emb.push_back(v);
    } else {
      // the float32 values' little-endian bytes, base64 (OpenAI's)
      std::string bytes(vecs[k].size() * 4, '\0');
      for (size_t i = 0; i < vecs[k].size(); ++i) {
        uint32_t u;
        std::memcpy(&u, &vecs[k][i], 4);
        for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = static_cast<char>((u >> (8 * b)) & 0xff);
      }
      emb = base64(bytes);
    }
    data.push_back({{"object", "embedding"}, {"index", k}, {"embedding", emb}});
  }
  res.body = dump({{"object", "list"},
                   {"data", data},
                   {"model", id_},
                   {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}

std::string ServerImpl::base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += k[(v >> 6) & 63], out += k[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
    out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += k[(v >> 6) & 63], out += '=';
  }
  return out;
}

}  // namespace qkv::serve
