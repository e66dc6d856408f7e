// BLEU and chrF as sacreBLEU 2.x defines them (see include/qkv/metrics.h). Every formula below
// mirrors sacreBLEU's order of floating-point operations, so scores agree to the last bits, not
// just to the printed digits.
#include "qkv/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "qkv/error.h"
#include "qkv/tokenizer.h"

namespace qkv {
namespace {

// ---------------------------------------------------------------------------------------------
// UTF-8 and Python's notion of whitespace.

// Decodes one code point at s[i]; returns its length in bytes. A byte that does not start a
// valid, shortest-form sequence decodes to 0xDC00 + byte (as Python's surrogateescape does), so
// it is one character that equals no valid character.
size_t next_code_point(std::string_view s, size_t i, char32_t& cp) {
  if (const size_t len = decode_utf8(s, i, cp)) return len;
  cp = 0xDC00 + static_cast<unsigned char>(s[i]);
  return 1;
}

// Python's str.isspace(): what str.split() and str.rstrip() treat as whitespace.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's s.split(): the maximal runs of non-whitespace.
std::vector<std::string_view> py_split(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = std::string_view::npos;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const size_t len = next_code_point(s, i, c);
    if (is_py_space(c)) {
      if (start != std::string_view::npos) out.push_back(s.substr(start, i - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = i;
    }
    i += len;
  }
  if (start != std::string_view::npos) out.push_back(s.substr(start));
  return out;
}

// Python's s.rstrip().
std::string_view py_rstrip(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const size_t len = next_code_point(s, i, c);
    i += len;
    if (!is_py_space(c)) end = i;
  }
  return s.substr(0, end);
}

// Python's s.replace(from, to): non-overlapping occurrences, left to right.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t hit; (hit = s.find(from, i)) != std::string_view::npos; i = hit + from.size()) {
    out.append(s.substr(i, hit - i));
    out.append(to);
  }
  out.append(s.substr(i));
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// 13a's first rule's class [\{-\~\[-\` -\&\(-\+\:-\@\/]: ASCII punctuation and space except
// ' , - . (which later rules or nothing handle).
bool is_13a_punct(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

std::string join_spaced(const std::vector<std::string_view>& words) {
  std::string out;
  for (size_t k = 0; k < words.size(); ++k) {
    if (k) out.push_back(' ');
    out.append(words[k]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// n-gram counting. An n-gram's key is the bytes of its n 32-bit symbols (word ids or code
// points), so the order of an n-gram is key.size() / 4.

using Counts = std::unordered_map<std::string, int64_t>;

void append_symbol(std::string& key, uint32_t sym) {
  char b[4];
  std::memcpy(b, &sym, 4);
  key.append(b, 4);
}

// counts[n-1][key] <- occurrences of each n-gram of `syms`, n = 1..max_order
std::vector<Counts> count_ngrams(const std::vector<uint32_t>& syms, int max_order) {
  std::vector<Counts> counts(static_cast<size_t>(max_order));
  for (int n = 1; n <= max_order; ++n) {
    for (size_t i = 0; i + static_cast<size_t>(n) <= syms.size(); ++i) {
      std::string key;
      key.reserve(4 * static_cast<size_t>(n));
      for (int k = 0; k < n; ++k) append_symbol(key, syms[i + static_cast<size_t>(k)]);
      ++counts[static_cast<size_t>(n - 1)][key];
    }
  }
  return counts;
}

// Maps words to ids; one per corpus call, so equal words get equal ids across segments.
class Vocab {
 public:
  std::vector<uint32_t> ids(const std::vector<std::string_view>& words) {
    std::vector<uint32_t> out;
    out.reserve(words.size());
    for (auto w : words) {
      auto [it, fresh] = map_.try_emplace(std::string(w), static_cast<uint32_t>(map_.size()));
      out.push_back(it->second);
    }
    return out;
  }

 private:
  std::unordered_map<std::string, uint32_t> map_;
};

// Checks the reference streams against the hypotheses; returns sacreBLEU's nrefs (-1 = var).
int check_refs(const char* fn, const std::vector<std::string>& hyps,
               const std::vector<std::vector<std::string>>& ref_streams) {
  check(!ref_streams.empty(), fn, ": no reference streams given (", hyps.size(), " hypotheses)");
  for (size_t k = 0; k < ref_streams.size(); ++k) {
    check(ref_streams[k].size() == hyps.size(), fn, ": ", hyps.size(), " hypotheses but ",
          ref_streams[k].size(), " references",
          ref_streams.size() > 1 ? " in reference stream " + std::to_string(k) : std::string());
  }
  check(!hyps.empty(), fn, ": the corpus is empty (0 hypotheses, 0 references)");
  int nrefs = 0;
  for (size_t i = 0; i < hyps.size(); ++i) {
    int here = 0;
    for (const auto& stream : ref_streams) here += !stream[i].empty();
    check(here > 0, fn, ": segment ", i, " has an empty reference (sacreBLEU rejects empty "
          "references; every segment needs at least one non-empty reference)");
    nrefs = i == 0 ? here : (here == nrefs ? nrefs : -1);
  }
  return nrefs;
}

std::vector<std::vector<std::string>> one_stream(const std::vector<std::string>& refs) {
  return {refs};
}

std::string nrefs_str(int nrefs) { return nrefs < 0 ? "var" : std::to_string(nrefs); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// sacreBLEU's my_log: log, with log(0) floored to -9999999999.
double floored_log(double x) { return x == 0.0 ? -9999999999.0 : std::log(x); }

// ---------------------------------------------------------------------------------------------
// BLEU

std::vector<uint32_t> bleu_words(std::string_view line, BleuTokenize tok, Vocab& vocab) {
  // words <- split(tokenize(rstrip(line))), as BLEU._preprocess_segment then extract_all_word_ngrams
  if (tok == BleuTokenize::t13a) {
    const std::string t = tokenize_13a(py_rstrip(line));
    return vocab.ids(py_split(t));
  }
  return vocab.ids(py_split(line));
}

// ---------------------------------------------------------------------------------------------
// chrF

constexpr const char* kPuncts = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
bool is_chrf_punct(char c) { return c != '\0' && std::strchr(kPuncts, c) != nullptr; }

// chrF++'s word splitting: whitespace split, then one ASCII punctuation mark split off the end
// of a word, or else off its start ("(hi)" -> "(hi" ")").
std::vector<std::string_view> chrf_words(std::string_view s) {
  std::vector<std::string_view> out;
  for (auto w : py_split(s)) {
    char32_t c;
    if (next_code_point(w, 0, c) == w.size()) {
      out.push_back(w);
    } else if (is_chrf_punct(w.back())) {
      out.push_back(w.substr(0, w.size() - 1));
      out.push_back(w.substr(w.size() - 1));
    } else if (is_chrf_punct(w.front())) {
      out.push_back(w.substr(0, 1));
      out.push_back(w.substr(1));
    } else {
      out.push_back(w);
    }
  }
  return out;
}

// n-gram counts of one segment: character orders 1..char_order, then word orders 1..word_order.
std::vector<Counts> chrf_ngrams(std::string_view s, const ChrfOptions& o, Vocab& vocab) {
  // chars <- code points of s, whitespace dropped unless o.whitespace
  std::vector<uint32_t> chars;
  chars.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    i += next_code_point(s, i, c);
    if (o.whitespace || !is_py_space(c)) chars.push_back(static_cast<uint32_t>(c));
  }
  std::vector<Counts> all = count_ngrams(chars, o.char_order);
  if (o.word_order > 0) {
    std::vector<Counts> words = count_ngrams(vocab.ids(chrf_words(s)), o.word_order);
    for (auto& w : words) all.push_back(std::move(w));
  }
  return all;
}

// stats[3 * i .. 3 * i + 2] <- (hypothesis n-grams, reference n-grams, matches) for order i;
// hypothesis n-grams count only where the reference has n-grams of that order.
std::vector<int64_t> chrf_match_stats(const std::vector<Counts>& hyp, const std::vector<Counts>& ref) {
  std::vector<int64_t> stats;
  stats.reserve(3 * hyp.size());
  for (size_t i = 0; i < hyp.size(); ++i) {
    int64_t n_hyp = 0, n_ref = 0, n_match = 0;
    for (const auto& [ng, count] : hyp[i]) {
      n_hyp += count;
      auto it = ref[i].find(ng);
      if (it != ref[i].end()) n_match += std::min(count, it->second);
    }
    for (const auto& kv : ref[i]) n_ref += kv.second;
    stats.push_back(ref[i].empty() ? 0 : n_hyp);
    stats.push_back(n_ref);
    stats.push_back(n_match);
  }
  return stats;
}

// chrF from (summed) statistics: sacreBLEU's CHRF._compute_f_score, 0..100.
double chrf_f_score(const std::vector<int64_t>& stats, const ChrfOptions& o) {
  const double eps = 1e-16;
  const int order = o.char_order + o.word_order;
  const double factor = static_cast<double>(o.beta) * o.beta;
  double score = 0.0, avg_prec = 0.0, avg_rec = 0.0;
  int effective_order = 0;
  for (int i = 0; i < order; ++i) {
    const int64_t n_hyp = stats[3 * i], n_ref = stats[3 * i + 1], n_match = stats[3 * i + 2];
    // prec <- match / hyp, rec <- match / ref (eps where the denominator is 0)
    const double prec = n_hyp > 0 ? static_cast<double>(n_match) / static_cast<double>(n_hyp) : eps;
    const double rec = n_ref > 0 ? static_cast<double>(n_match) / static_cast<double>(n_ref) : eps;
    // score += F_beta(prec, rec)  (eps when prec = rec = 0)
    const double denom = factor * prec + rec;
    score += denom > 0 ? (1 + factor) * prec * rec / denom : eps;
    // avg_prec += prec, avg_rec += rec over the orders both sides have
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective_order;
    }
  }
  if (o.eps_smoothing) return 100 * score / order;
  // avg <- avg / effective_order; chrF <- F_beta(avg_prec, avg_rec)
  if (effective_order == 0) {
    avg_prec = avg_rec = 0.0;
  } else {
    avg_prec /= effective_order;
    avg_rec /= effective_order;
  }
  if (avg_prec + avg_rec == 0.0) return 0.0;
  double f = (1 + factor) * avg_prec * avg_rec;
  f /= (factor * avg_prec) + avg_rec;
  return 100 * f;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string tokenize_13a(std::string_view line) {
  // s <- line with "<skipped>" removed, "-\n" joined, "\n" -> " ", entities unescaped in order
  std::string s = py_replace(line, "<skipped>", "");
  s = py_replace(s, "-\n", "");
  s = py_replace(s, "\n", " ");
  if (s.find('&') != std::string::npos) {
    s = py_replace(s, "&quot;", "\"");
    s = py_replace(s, "&amp;", "&");
    s = py_replace(s, "&lt;", "<");
    s = py_replace(s, "&gt;", ">");
  }
  s = " " + s + " ";
  // The four regular expressions are applied one after another, each as Python's re.sub does:
  // left to right, non-overlapping. Their classes are ASCII, so working on UTF-8 bytes gives
  // the same result as working on code points (a multi-byte character's bytes are never ASCII).
  std::string t;
  // t <- s with each punctuation mark p replaced by " p "
  t.reserve(2 * s.size());
  for (char c : s) {
    if (is_13a_punct(c)) {
      t.push_back(' ');
      t.push_back(c);
      t.push_back(' ');
    } else {
      t.push_back(c);
    }
  }
  // s <- t with ([^0-9])([.,]) -> "\1 \2 "   (split '.' and ',' unless preceded by a digit)
  s.clear();
  for (size_t i = 0; i < t.size();) {
    if (i + 1 < t.size() && !is_digit(t[i]) && (t[i + 1] == '.' || t[i + 1] == ',')) {
      s += t[i], s += ' ', s += t[i + 1], s += ' ';
      i += 2;
    } else {
      s += t[i++];
    }
  }
  // t <- s with ([.,])([^0-9]) -> " \1 \2"   (split '.' and ',' unless followed by a digit)
  t.clear();
  for (size_t i = 0; i < s.size();) {
    if (i + 1 < s.size() && (s[i] == '.' || s[i] == ',') && !is_digit(s[i + 1])) {
      t += ' ', t += s[i], t += ' ', t += s[i + 1];
      i += 2;
    } else {
      t += s[i++];
    }
  }
  // s <- t with ([0-9])(-) -> "\1 \2 "   (split '-' after a digit)
  s.clear();
  for (size_t i = 0; i < t.size();) {
    if (i + 1 < t.size() && is_digit(t[i]) && t[i + 1] == '-') {
      s += t[i], s += " - ";
      i += 2;
    } else {
      s += t[i++];
    }
  }
  // result <- " ".join(s.split())
  return join_spaced(py_split(s));
}

BleuResult bleu_from_stats(const BleuStats& stats, const BleuOptions& options) {
  constexpr int kOrder = 4;
  BleuResult r;
  r.stats = stats;
  r.options = options;
  r.hyp_len = stats.hyp_len;
  r.ref_len = stats.ref_len;
  r.ratio = stats.ref_len ? static_cast<double>(stats.hyp_len) / static_cast<double>(stats.ref_len) : 0.0;
  const double sys_len = static_cast<double>(stats.hyp_len), ref_len = static_cast<double>(stats.ref_len);
  // bp <- exp(1 - ref_len / hyp_len) when the hypotheses are shorter, else 1
  if (stats.hyp_len < stats.ref_len) {
    r.bp = stats.hyp_len > 0 ? std::exp(1 - ref_len / sys_len) : 0.0;
  } else {
    r.bp = 1.0;
  }
  // No matches at all: score 0, precisions 0 (sacreBLEU's early stop).
  if (std::all_of(stats.matches.begin(), stats.matches.end(), [](int64_t m) { return m == 0; })) {
    r.score = 0.0;
    return r;
  }
  double smooth_value = 0.0;
  if (options.smooth == BleuSmooth::floor) smooth_value = options.smooth_value.value_or(0.1);
  if (options.smooth == BleuSmooth::add_k) smooth_value = options.smooth_value.value_or(1.0);
  double correct[kOrder], total[kOrder];
  for (int n = 0; n < kOrder; ++n) {
    correct[n] = static_cast<double>(stats.matches[static_cast<size_t>(n)]);
    total[n] = static_cast<double>(stats.totals[static_cast<size_t>(n)]);
  }
  // p_n <- 100 * correct_n / total_n, smoothed where correct_n = 0; stop at the first order
  // the hypotheses do not have
  double smooth_mteval = 1.0;
  int eff_order = kOrder;
  for (int n = 1; n <= kOrder; ++n) {
    if (options.smooth == BleuSmooth::add_k && n > 1) {
      correct[n - 1] += smooth_value;
      total[n - 1] += smooth_value;
    }
    if (total[n - 1] == 0) break;
    if (options.effective_order) eff_order = n;
    double& p = r.precisions[static_cast<size_t>(n - 1)];
    if (correct[n - 1] == 0) {
      if (options.smooth == BleuSmooth::exp) {
        smooth_mteval *= 2;
        p = 100. / (smooth_mteval * total[n - 1]);
      } else if (options.smooth == BleuSmooth::floor) {
        p = 100. * smooth_value / total[n - 1];
      }
    } else {
      p = 100. * correct[n - 1] / total[n - 1];
    }
  }
  // score <- bp * exp(mean_n log p_n) over the first eff_order orders
  double sum = 0;
  for (int n = 0; n < eff_order; ++n) sum += floored_log(r.precisions[static_cast<size_t>(n)]);
  r.score = r.bp * std::exp(sum / eff_order);
  return r;
}

BleuResult corpus_bleu_multiref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams,
                                const BleuOptions& options) {
  constexpr int kOrder = 4;
  const int nrefs = check_refs("corpus_bleu", hyps, ref_streams);
  Vocab vocab;
  BleuStats stats;
  for (size_t i = 0; i < hyps.size(); ++i) {
    // ref_max[g] <- max over references of count(g); ref_lens <- reference lengths
    Counts ref_max;
    std::vector<int64_t> ref_lens;
    for (const auto& stream : ref_streams) {
      if (stream[i].empty()) continue;
      const std::vector<uint32_t> words = bleu_words(stream[i], options.tokenize, vocab);
      ref_lens.push_back(static_cast<int64_t>(words.size()));
      for (auto& counts : count_ngrams(words, kOrder)) {
        for (auto& [ng, c] : counts) {
          int64_t& m = ref_max[ng];
          m = std::max(m, c);
        }
      }
    }
    const std::vector<uint32_t> hyp = bleu_words(hyps[i], options.tokenize, vocab);
    const auto hyp_len = static_cast<int64_t>(hyp.size());
    // ref_len += the reference length closest to hyp_len (the shorter on ties)
    int64_t closest = -1, closest_diff = -1;
    for (int64_t len : ref_lens) {
      const int64_t diff = std::abs(hyp_len - len);
      if (closest_diff == -1 || diff < closest_diff) {
        closest_diff = diff;
        closest = len;
      } else if (diff == closest_diff && len < closest) {
        closest = len;
      }
    }
    stats.hyp_len += hyp_len;
    stats.ref_len += closest;
    // totals_n += hypothesis n-grams; matches_n += sum_g min(count_hyp(g), ref_max(g))
    const std::vector<Counts> hyp_counts = count_ngrams(hyp, kOrder);
    for (size_t n = 0; n < hyp_counts.size(); ++n) {
      for (const auto& [ng, c] : hyp_counts[n]) {
        stats.totals[n] += c;
        auto it = ref_max.find(ng);
        if (it != ref_max.end()) stats.matches[n] += std::min(c, it->second);
      }
    }
  }
  BleuResult r = bleu_from_stats(stats, options);
  r.nrefs = nrefs;
  return r;
}

BleuResult corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                       const BleuOptions& options) {
  check(hyps.size() == refs.size(), "corpus_bleu: ", hyps.size(), " hypotheses but ", refs.size(),
        " references (one reference per hypothesis expected)");
  return corpus_bleu_multiref(hyps, one_stream(refs), options);
}

std::string BleuResult::signature() const {
  std::string smooth;
  switch (options.smooth) {
    case BleuSmooth::none: smooth = "none"; break;
    case BleuSmooth::exp: smooth = "exp"; break;
    case BleuSmooth::floor: smooth = "floor" + fmt("[%.2f]", options.smooth_value.value_or(0.1)); break;
    case BleuSmooth::add_k: smooth = "add-k" + fmt("[%.2f]", options.smooth_value.value_or(1.0)); break;
  }
  return "nrefs:" + nrefs_str(nrefs) + "|case:mixed|eff:" + (options.effective_order ? "yes" : "no") +
         "|tok:" + (options.tokenize == BleuTokenize::t13a ? "13a" : "none") + "|smooth:" + smooth +
         "|version:" + kMetricsVersion;
}

std::string BleuResult::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld)",
                score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio,
                static_cast<long long>(hyp_len), static_cast<long long>(ref_len));
  return buf;
}

ChrfResult corpus_chrf_multiref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams,
                                const ChrfOptions& options) {
  check(options.char_order >= 0 && options.word_order >= 0 &&
            options.char_order + options.word_order >= 1 && options.beta >= 0,
        "corpus_chrf: needs char_order >= 0, word_order >= 0, at least one order and beta >= 0; got "
        "char_order ", options.char_order, ", word_order ", options.word_order, ", beta ", options.beta);
  const int nrefs = check_refs("corpus_chrf", hyps, ref_streams);
  const size_t order = static_cast<size_t>(options.char_order + options.word_order);
  Vocab vocab;
  // corpus <- sum over segments of the statistics against each segment's best reference
  std::vector<int64_t> corpus(3 * order, 0);
  for (size_t i = 0; i < hyps.size(); ++i) {
    const std::vector<Counts> hyp = chrf_ngrams(hyps[i], options, vocab);
    std::vector<int64_t> best;
    double best_f = -1.0;
    for (const auto& stream : ref_streams) {
      if (stream[i].empty()) continue;
      std::vector<int64_t> stats = chrf_match_stats(hyp, chrf_ngrams(stream[i], options, vocab));
      const double f = chrf_f_score(stats, options);
      if (f > best_f) {
        best_f = f;
        best = std::move(stats);
      }
    }
    for (size_t k = 0; k < corpus.size(); ++k) corpus[k] += best[k];
  }
  ChrfResult r;
  r.score = chrf_f_score(corpus, options);
  r.nrefs = nrefs;
  r.options = options;
  return r;
}

ChrfResult corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                       const ChrfOptions& options) {
  check(hyps.size() == refs.size(), "corpus_chrf: ", hyps.size(), " hypotheses but ", refs.size(),
        " references (one reference per hypothesis expected)");
  return corpus_chrf_multiref(hyps, one_stream(refs), options);
}

std::string ChrfResult::str() const {
  return "chrF" + std::to_string(options.beta) + std::string(static_cast<size_t>(options.word_order), '+') +
         " = " + fmt("%.2f", score);
}

std::string ChrfResult::signature() const {
  return "nrefs:" + nrefs_str(nrefs) + "|case:mixed|eff:" + (options.eps_smoothing ? "no" : "yes") +
         "|nc:" + std::to_string(options.char_order) + "|nw:" + std::to_string(options.word_order) +
         "|space:" + (options.whitespace ? "yes" : "no") + "|version:" + kMetricsVersion;
}

double perplexity(double mean_nll) {
  check(!std::isnan(mean_nll) && mean_nll >= 0, "perplexity: mean negative log-likelihood must be a "
        "non-negative number of nats per token; got ", mean_nll);
  // ppl <- exp(mean_nll)
  return std::exp(mean_nll);
}

}  // namespace qkv
