// Opening a model directory for inference, and the inputs each task reads (models/model_dir.h).
#include "models/model_dir.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/json_strict.h"
#include "qkv/autograd.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/gguf.h"
#include "qkv/hf.h"
#include "qkv/quant.h"

namespace qkv {

void note_dtype_fallback(const std::vector<std::string>& fallback, const std::string& dtype) {
  if (fallback.empty()) return;
  std::string names;
  for (size_t i = 0; i < fallback.size() && i < 3; ++i) names += (i ? ", " : "") + fallback[i];
  std::fprintf(stderr, "qkv: note: --dtype %s: %zu matri%s whose rows are not whole blocks of 32 (%s%s) packed as bf16\n",
               dtype.c_str(), fallback.size(), fallback.size() == 1 ? "x" : "ces", names.c_str(),
               fallback.size() > 3 ? ", ..." : "");
}

Model load_model(const std::string& dir, const std::string& dtype) {
  LoadOptions opt;
  opt.dtype = dtype_of(dtype);
  std::vector<std::string> fallback;
  opt.fallback = &fallback;
  if (is_gguf_file(dir)) {
    GgufLoadReport report;
    Model m = load_gguf_model(dir, opt, &report);
    note_dtype_fallback(fallback, dtype);
    if (!report.converted.empty())
      std::fprintf(stderr, "qkv: note: %s: %zu matrices of types qkv does not compute with were packed as q8_0 (%s%s)\n",
                   dir.c_str(), report.converted.size(), report.converted[0].c_str(),
                   report.converted.size() > 1 ? ", ..." : "");
    if (!report.unused.empty())
      std::fprintf(stderr, "qkv: note: %s: %zu tensors are not used by the model (%s%s)\n", dir.c_str(),
                   report.unused.size(), report.unused[0].c_str(), report.unused.size() > 1 ? ", ..." : "");
    return m;
  }
  if (!is_hf_model_dir(dir)) {
    Model m = Model::load(dir, opt);
    note_dtype_fallback(fallback, dtype);
    return m;
  }
  HfLoadReport report;
  Model m = load_hf_model(dir, &report, opt);
  note_dtype_fallback(fallback, dtype);
  if (!report.unused.empty()) {
    std::string names;
    for (size_t i = 0; i < report.unused.size() && i < 4; ++i) names += (i ? ", " : "") + report.unused[i];
    std::fprintf(stderr, "qkv: note: %s: %zu tensors of the %s folder are not used by this model (%s%s)\n",
                 dir.c_str(), report.unused.size(), report.model_type.c_str(), names.c_str(),
                 report.unused.size() > 4 ? ", ..." : "");
  }
  return m;
}

TaskInfo model_task_info(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (is_gguf_file(dir)) {
    // llama.cpp's files hold language models
    TaskInfo t;
    t.task = Task::LanguageModel;
    const GgufFile f(dir);  // the header once (a tokenizer's arrays can be megabytes)
    t.max_len = f.integer_or(f.string_or("general.architecture", "llama") + ".context_length", 2048, 1, int64_t{1} << 24);
    return t;
  }
  if (fs::exists(dir + "/task.json", ec)) return TaskInfo::load(dir);
  // No task.json: a Hugging Face folder, whose config.json says so. What is wrong with it is the
  // error (a broken config.json was once reported as "DIR/task.json: not found").
  const std::string path = dir + "/config.json";
  if (!fs::exists(fs::symlink_status(path, ec)))
    throw Error(detail::concat(path, ": not found, and neither is ", dir, "/task.json: ", dir,
                               " is neither a model written by qkv train nor a Hugging Face folder"));
  const std::string text = read_file(path, "config.json");  // a FIFO, a directory, a dangling link: named
  check(text.size() < (64u << 20), path, ": larger than 64 MiB; not a config file");
  const nlohmann::json j = detail::parse_json_object(text, path);  // bad JSON, a key twice, a NUL byte
  if (!j.contains("model_type")) {
    if (j.contains("qkv_format")) return TaskInfo::load(dir);  // qkv's own model, without its task.json
    throw Error(detail::concat(path, ": no \"model_type\", so not a Hugging Face config, and ", dir,
                               " has no task.json (as a model written by qkv train has)"));
  }
  const ModelConfig c = hf_config(text, path);
  TaskInfo t;
  t.max_len = c.positional == Positional::Learned ? c.max_len : 0;
  switch (c.arch) {
    case Arch::Decoder: t.task = Task::LanguageModel; break;
    case Arch::EncoderDecoder: t.task = Task::Translate; break;
    case Arch::EncoderClassifier: {
      t.task = Task::Classify;
      for (int64_t k = 0; k < c.num_classes; ++k) {
        const std::string key = std::to_string(k);
        const bool named = j.contains("id2label") && j["id2label"].is_object() && j["id2label"].contains(key) &&
                           j["id2label"][key].is_string();
        t.labels.push_back(named ? j["id2label"][key].get<std::string>() : "LABEL_" + key);
      }
      break;
    }
    default:
      throw Error(detail::concat("--model ", dir, ": a Hugging Face ", arch_name(c.arch),
                                 " has no task of qkv's (generate, translate, classify); use qkv forward or fill-mask"));
  }
  return t;
}

std::vector<std::vector<TokenChoice>> top_tokens(const Tensor& logits, const std::vector<size_t>& at, int64_t k,
                                                 const std::string& model) {
  const int64_t V = logits.size(-1), T = logits.numel() / std::max<int64_t>(V, 1), K = std::min<int64_t>(k, V);
  std::vector<std::vector<TokenChoice>> out;
  for (size_t pos : at) {
    check(static_cast<int64_t>(pos) < T, "top_tokens: position ", pos, " is outside the ", T, " positions");
    const float* row = logits.data<float>() + static_cast<int64_t>(pos) * V;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) {
      check(std::isfinite(row[v]), model, ": the model's logits are not finite (token ", v, " is ", row[v],
            "): its weights hold NaN or infinity, or its activations overflow");
      mx = std::max(mx, static_cast<double>(row[v]));
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    std::vector<int32_t> best(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) best[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    std::partial_sort(best.begin(), best.begin() + K, best.end(),
                      [&](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    std::vector<TokenChoice> top;
    for (int64_t r = 0; r < K; ++r) {
      const int32_t id = best[static_cast<size_t>(r)];
      top.push_back({id, row[id], std::exp(static_cast<double>(row[id]) - mx) / sum});
    }
    out.push_back(std::move(top));
  }
  return out;
}

std::vector<int32_t> trace_ids(const Tokenizer& tok, const ModelConfig& c, const TaskInfo& info, std::string_view text) {
  if (c.arch == Arch::EncoderDecoder) {
    std::vector<int32_t> ids = {static_cast<int32_t>(c.bos_id)};
    for (int32_t t : tok.encode(text)) ids.push_back(t);
    return ids;
  }
  if (info.task == Task::Classify) return classifier_ids(tok, text, info.max_len);
  return prompt_ids(tok, text);
}

Batch trace_batch(const std::vector<int32_t>& ids, const std::vector<int32_t>& src) {
  const auto row = [](const std::vector<int32_t>& v) {
    Tensor t({1, static_cast<int64_t>(v.size())}, DType::I64);
    std::copy(v.begin(), v.end(), t.data<int64_t>());
    return t;
  };
  Batch b;
  if (src.empty()) {
    b.input = row(ids);
  } else {
    b.input = row(src);
    b.decoder_input = row(ids);
  }
  return b;
}

Tensor logits_of(const Model& model, const std::vector<int32_t>& ids) {
  Batch b;
  b.input = Tensor({1, static_cast<int64_t>(ids.size())}, DType::I64);
  std::copy(ids.begin(), ids.end(), b.input.data<int64_t>());
  Tape tape;
  tape.recording = false;
  return model.logits(tape, b)->value;
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> prompt = encode_input(tok, text);
  if (tok.type() == "gpt2") prompt.insert(prompt.begin(), tok.eos_id());
  if (prompt.empty()) prompt.push_back(tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id());
  check(prompt.front() >= 0, "the tokenizer has no token to start an empty prompt with");
  return prompt;
}

std::vector<int32_t> source_ids(const Tokenizer& tok, std::vector<int32_t> ids) {
  if (!tok.with_special_tokens({}).empty()) return tok.with_special_tokens(ids);
  check(tok.eos_id() >= 0, "the tokenizer has no end-of-sequence token");
  ids.push_back(tok.eos_id());
  return ids;
}

std::vector<int32_t> classifier_ids(const Tokenizer& tok, std::string_view text, int64_t max_len) {
  std::vector<int32_t> ids = encode_input(tok, text, max_len);  // [CLS] ... [SEP] for BERT
  if (ids.empty()) ids.push_back(tok.eos_id());
  return ids;
}

std::string output_text(const Tokenizer& tok, std::vector<int32_t> tokens) {
  if (!tokens.empty() && tokens.back() == tok.eos_id()) tokens.pop_back();
  return tok.decode(tokens);
}

std::optional<WType> dtype_of(const std::string& dtype) {
  if (dtype.empty()) return std::nullopt;
  return parse_wtype(dtype, "--dtype");
}

}  // namespace qkv
