// qkv/metrics.h: corpus BLEU and chrF computed exactly as sacreBLEU 2.x computes them, and
// perplexity. The defaults are sacreBLEU's defaults, so `corpus_bleu(hyps, refs).score` is the
// number `sacrebleu hyps.txt -r refs.txt` prints:
//   BLEU: 13a tokenisation, case-sensitive, max order 4, smoothing 'exp', corpus-level sums of
//         clipped n-gram matches, brevity penalty from the summed closest reference lengths.
//   chrF: character order 6, word order 0, beta 2, whitespace removed, effective-order averaging
//         (eps_smoothing off): statistics summed over the corpus, then precision and recall
//         averaged over the orders that have both hypothesis and reference n-grams, then F_beta.
// Strings are UTF-8; chrF counts code points, not bytes. A byte that is not part of valid UTF-8
// counts as one character of its own (it never matches a valid character).
//
// What sacreBLEU rejects, qkv rejects (qkv::Error): different numbers of hypotheses and
// references, a segment with no non-empty reference, and an empty corpus. In the *_multiref
// functions an empty string means "no reference for this segment in this stream" (sacreBLEU's
// variable number of references; the signature then says nrefs:var).
//
// Not provided: lowercasing (needs Unicode case tables), tokenisers other than 13a and none,
// TER.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// Identifies qkv's scoring code in signatures ("version:qkv-1"). It follows sacreBLEU 2.x's
// definitions; bump it whenever a score this code prints could change.
inline constexpr const char* kMetricsVersion = "qkv-1";

// sacreBLEU's 13a tokeniser (mteval-v13a.pl's), exact: removes "<skipped>", joins "-\n", turns
// newlines into spaces, unescapes &quot; &amp; &lt; &gt; (in that order, each once over the
// line), splits off ASCII punctuation except ' , - . ; splits '.' and ',' unless they sit
// between digits on the relevant side; splits '-' after a digit; then collapses whitespace
// (Python's str.split(): ASCII and Unicode spaces such as U+00A0 and U+3000) to single spaces.
std::string tokenize_13a(std::string_view line);

enum class BleuSmooth { none, floor, add_k, exp };  // sacreBLEU's smooth_method
enum class BleuTokenize { t13a, none };             // sacreBLEU's tokenize ("13a", "none")

struct BleuOptions {
  BleuSmooth smooth = BleuSmooth::exp;
  std::optional<double> smooth_value = std::nullopt;  // floor: default 0.1; add-k: default 1; others: unused
  bool effective_order = false;        // true for sentence-level BLEU, as sacreBLEU advises
  BleuTokenize tokenize = BleuTokenize::t13a;
};

// Sufficient statistics of corpus BLEU: sums over segments.
struct BleuStats {
  std::array<int64_t, 4> matches{};  // clipped n-gram matches, n = 1..4
  std::array<int64_t, 4> totals{};   // hypothesis n-grams, n = 1..4
  int64_t hyp_len = 0;               // hypothesis tokens
  int64_t ref_len = 0;               // closest reference length (ties: the shorter)
};

struct BleuResult {
  double score = 0;                    // 0..100
  std::array<double, 4> precisions{};  // %, after smoothing
  double bp = 0;                       // brevity penalty
  double ratio = 0;                    // hyp_len / ref_len (0 when ref_len is 0)
  int64_t hyp_len = 0, ref_len = 0;
  BleuStats stats;                     // what the score was computed from
  int nrefs = 1;                       // references per segment; -1 = variable ("var")
  BleuOptions options;
  // "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-1"
  std::string signature() const;
  // "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)"
  std::string str() const;
};

// One reference per hypothesis: refs[i] is the reference of hyps[i].
BleuResult corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                       const BleuOptions& options = {});
// Several reference streams, as sacreBLEU takes them: ref_streams[k][i] is the k-th reference
// of hyps[i]; "" means the segment has no k-th reference.
BleuResult corpus_bleu_multiref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams,
                                const BleuOptions& options = {});
// BLEU from already summed statistics (sacreBLEU's BLEU.compute_bleu).
BleuResult bleu_from_stats(const BleuStats& stats, const BleuOptions& options = {});

struct ChrfOptions {
  int char_order = 6;
  int word_order = 0;          // 2 gives chrF++
  int beta = 2;                // recall weighs beta times as much as precision
  bool whitespace = false;     // keep whitespace inside character n-grams
  bool eps_smoothing = false;  // chrF++.py / NLTK / Moses averaging of per-order F scores
};

struct ChrfResult {
  double score = 0;  // 0..100
  int nrefs = 1;     // -1 = variable
  ChrfOptions options;
  std::string str() const;        // "chrF2 = 59.73" ("chrF2++ = ..." with word order 2)
  std::string signature() const;  // "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:qkv-1"
};

ChrfResult corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                       const ChrfOptions& options = {});
// Several references: each segment keeps the reference whose statistics give the best
// sentence-level chrF (the first on ties), as sacreBLEU does.
ChrfResult corpus_chrf_multiref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams,
                                const ChrfOptions& options = {});

// perplexity = exp(mean_nll), mean_nll in nats per token. Negative or NaN -> qkv::Error;
// +inf gives +inf.
double perplexity(double mean_nll);

}  // namespace qkv
