#include "task_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "io/json_strict.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/autograd.h"
#include "qkv/gguf.h"
#include "qkv/hf.h"
#include "qkv/npy.h"

namespace qkv::cli {

namespace {

void note_fallback(const std::vector<std::string>& fallback, const std::string& dtype) {
  if (fallback.empty()) return;
  std::string names;
  for (size_t i = 0; i < fallback.size() && i < 3; ++i) names += (i ? ", " : "") + fallback[i];
  std::fprintf(stderr, "qkv: note: --dtype %s: %zu matri%s whose rows are not whole blocks of 32 (%s%s) packed as bf16\n",
               dtype.c_str(), fallback.size(), fallback.size() == 1 ? "x" : "ces", names.c_str(),
               fallback.size() > 3 ? ", ..." : "");
}

}  // namespace

Model load_model(const std::string& dir, const std::string& dtype) {
  LoadOptions opt;
  opt.dtype = dtype_of(dtype);
  std::vector<std::string> fallback;
  opt.fallback = &fallback;
  if (is_gguf_file(dir)) {
    GgufLoadReport report;
    Model m = load_gguf_model(dir, opt, &report);
    note_fallback(fallback, dtype);
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
    note_fallback(fallback, dtype);
    return m;
  }
  HfLoadReport report;
  Model m = load_hf_model(dir, &report, opt);
  note_fallback(fallback, dtype);
  if (!report.unused.empty()) {
    std::string names;
    for (size_t i = 0; i < report.unused.size() && i < 4; ++i) names += (i ? ", " : "") + report.unused[i];
    std::fprintf(stderr, "qkv: note: %s: %zu tensors of the %s folder are not used by this model (%s%s)\n",
                 dir.c_str(), report.unused.size(), report.model_type.c_str(), names.c_str(),
                 report.unused.size() > 4 ? ", ..." : "");
  }
  return m;
}


bool is_model_dir(const std::string& path) {
  std::error_code ec;
  return (std::filesystem::is_directory(path, ec) && std::filesystem::exists(path + "/config.json", ec)) ||
         is_gguf_file(path);
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

int64_t RawData::size() const {
  return static_cast<int64_t>(pairs.size() + labeled.size() + lines.size());
}

RawData read_task_data(Task task, const std::string& data, const std::string& source, const std::string& target) {
  RawData d;
  if (task == Task::Translate && data.empty()) {
    check(!source.empty() && !target.empty(), "--task translate needs --data FILE.tsv or --source and --target files");
    d.pairs = read_parallel_files(source, target, &d.report);
    d.path = source;
    return d;
  }
  check(!data.empty(), "--data is required for --task ", task_name(task));
  d.path = data;
  switch (task) {
    case Task::Translate: d.pairs = read_parallel_tsv(data, &d.report); break;
    case Task::Classify: d.labeled = read_labeled_tsv(data, &d.report); break;
    case Task::LanguageModel: {
      for (std::string& l : read_lines(data, &d.report))
        if (!l.empty()) d.lines.push_back(std::move(l));
      check(!d.lines.empty(), data, ": no text");
      break;
    }
  }
  return d;
}

RawData subset(const RawData& d, const std::vector<int64_t>& idx) {
  RawData s;
  s.path = d.path;
  for (int64_t i : idx) {
    if (!d.pairs.empty()) s.pairs.push_back(d.pairs[static_cast<size_t>(i)]);
    if (!d.labeled.empty()) s.labeled.push_back(d.labeled[static_cast<size_t>(i)]);
    if (!d.lines.empty()) s.lines.push_back(d.lines[static_cast<size_t>(i)]);
  }
  return s;
}

std::vector<std::string> all_texts(const RawData& d) {
  std::vector<std::string> t;
  for (const auto& p : d.pairs) t.push_back(p.source), t.push_back(p.target);
  for (const auto& l : d.labeled) t.push_back(l.text);
  for (const auto& l : d.lines) t.push_back(l);
  return t;
}

RawData without_near_copies(const RawData& extra, const std::vector<const RawData*>& held_out, int64_t* dropped) {
  std::unordered_set<std::string> keys;  // near_copy_key of every held-out text
  for (const RawData* h : held_out)
    for (const std::string& t : all_texts(*h))
      if (std::string k = near_copy_key(t); !k.empty()) keys.insert(std::move(k));
  auto held = [&](const std::string& t) {
    const std::string k = near_copy_key(t);
    return !k.empty() && keys.count(k) > 0;
  };
  RawData out;
  out.path = extra.path;
  out.report = extra.report;
  int64_t n = 0;
  for (const auto& p : extra.pairs)
    if (held(p.source) || held(p.target)) ++n;
    else out.pairs.push_back(p);
  for (const auto& l : extra.labeled)
    if (held(l.text)) ++n;
    else out.labeled.push_back(l);
  for (const auto& l : extra.lines)
    if (held(l)) ++n;
    else out.lines.push_back(l);
  if (dropped) *dropped = n;
  return out;
}

Encoded encode_task(Task task, const RawData& d, const Tokenizer& tok, int64_t max_len,
                    const std::vector<std::string>& labels, bool skip_unknown_labels) {
  Encoded out;
  const int32_t eos = tok.eos_id();
  check(eos >= 0, "the tokenizer has no end-of-sequence token");
  switch (task) {
    case Task::Translate:
      for (const TextPair& p : d.pairs) {
        const size_t index = static_cast<size_t>(&p - d.pairs.data());
        Example e;
        e.src = source_ids(tok, tok.encode(p.source));
        e.tgt = tok.encode_target(p.target);
        e.tgt.push_back(eos);
        if (static_cast<int64_t>(std::max(e.src.size(), e.tgt.size())) > max_len) {
          ++out.dropped;
          continue;
        }
        out.examples.push_back(std::move(e));
        out.kept.push_back(index);
      }
      break;
    case Task::Classify:
      for (const LabeledText& l : d.labeled) {
        Example e;
        e.src = classifier_ids(tok, l.text, max_len);
        const auto it = std::find(labels.begin(), labels.end(), l.label);
        if (it == labels.end() && skip_unknown_labels) {
          ++out.unknown_labels;
          continue;
        }
        check(it != labels.end(), d.describe(), ": label '", l.label, "' is not one the model was trained on (",
              labels.size(), " labels: see the model's task.json)");
        e.label = it - labels.begin();
        out.examples.push_back(std::move(e));
      }
      break;
    case Task::LanguageModel: {
      std::vector<int32_t> stream;
      for (const std::string& line : d.lines) {
        // the line as the model reads it (Llama: <s> first), then eos; an eos that the special
        // tokens would repeat right after the last line's is given once
        const std::vector<int32_t> ids = tok.with_special_tokens(tok.encode(line));
        const size_t skip = !ids.empty() && !stream.empty() && ids[0] == eos && stream.back() == eos ? 1 : 0;
        stream.insert(stream.end(), ids.begin() + static_cast<std::ptrdiff_t>(skip), ids.end());
        stream.push_back(eos);
      }
      const int64_t n = static_cast<int64_t>(stream.size());
      check(n >= 2, d.describe(), ": ", n, " token(s); a language model needs at least 2");
      out.window = max_len;
      if (n <= max_len) {
        // A text shorter than one window of max_len + 1 tokens is one shorter window.
        out.window = n - 1;
        out.note = detail::concat(d.describe(), ": ", n, " tokens, fewer than one window of ", max_len + 1,
                                  " (--max-len ", max_len, " + 1): one window of ", n, " tokens instead");
      }
      for (auto& w : pack_windows(stream, out.window)) {
        Example e;
        e.src = std::move(w);
        out.examples.push_back(std::move(e));
      }
      break;
    }
  }
  return out;
}

void write_task_data(Task task, const RawData& d, const std::string& path) {
  std::string s;
  auto clean = [](std::string t) {
    std::replace(t.begin(), t.end(), '\t', ' ');
    std::replace(t.begin(), t.end(), '\n', ' ');
    return t;
  };
  switch (task) {
    case Task::Translate:
      for (const auto& p : d.pairs) s += clean(p.source) + "\t" + clean(p.target) + "\n";
      break;
    case Task::Classify:
      for (const auto& l : d.labeled) s += clean(l.label) + "\t" + clean(l.text) + "\n";
      break;
    case Task::LanguageModel:
      for (const auto& l : d.lines) s += clean(l) + "\n";
      break;
  }
  write_file_atomic(path, s);
}

std::string fmt_duration(double s) {
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
  }
  return buf;
}

std::string fmt_perplexity(double loss) {
  if (std::isnan(loss)) return "nan";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "0";
  char buf[64];
  const double ppl = std::exp(loss);
  if (ppl < 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f", ppl);
    return buf;
  }
  // ppl = m 10^e with e <- floor(loss / ln 10), m <- 10^(loss / ln 10 - e): no exp to overflow
  const double e10 = loss / std::log(10.0);
  double e = std::floor(e10), m = std::pow(10.0, e10 - e);
  if (m >= 9.9995) m /= 10, e += 1;  // "10.000e+5" rounds to "1.000e+6"
  std::snprintf(buf, sizeof buf, "%.3fe+%.0f", m, e);
  return buf;
}

Progress::Progress(double every_s)
    : tty_(isatty(fileno(stderr)) != 0), every_s_(every_s), t0_(std::chrono::steady_clock::now()) {}

void Progress::update(double fraction, const std::string& status) {
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (!tty_ && el - last_ < every_s_) return;
  last_ = el;
  std::string eta = "?";
  // eta <- time so far * left / done in this session
  const double done = fraction - start_fraction_;
  if (done > 0.001 && fraction <= 1) eta = fmt_duration(el * (1 - fraction) / done);
  const int width = 24, filled = fraction < 0 ? 0 : static_cast<int>(std::lround(fraction * width));
  std::string line = "[";
  line.append(static_cast<size_t>(filled), '#').append(static_cast<size_t>(width - filled), '.').append("] ");
  char pct[16];
  std::snprintf(pct, sizeof pct, fraction < 0 ? "  ?%%" : "%3.0f%%", fraction * 100);
  line.append(pct).append(" ").append(status).append(" | ").append(fmt_duration(el)).append(" ETA ").append(eta);
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

const char* const kDtypeHelp =
    "Weight type of the projection matrices: f32, bf16, f16, int8 (GGUF's Q8_0) or q4 (Q4_0), packed as they load "
    "(default: as stored: float32, or what qkv quantize packed); the output layer and token embeddings at 8 bits or "
    "more, norms float32 (docs/formats.md)";

std::optional<WType> dtype_of(const std::string& dtype) {
  if (dtype.empty()) return std::nullopt;
  return parse_wtype(dtype, "--dtype");
}

void pack_for_dtype(Model& m, const std::string& dtype) {
  const std::optional<WType> t = dtype_of(dtype);
  if (!t) return;
  std::vector<std::string> fallback;
  m.pack_weights(*t, &fallback);
  note_fallback(fallback, dtype);
}

}  // namespace qkv::cli
