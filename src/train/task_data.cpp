// A task's data as records and token ids (train/task_data.h).
#include "train/task_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "qkv/error.h"
#include "models/model_dir.h"
#include "qkv/files.h"

namespace qkv {

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

}  // namespace qkv
