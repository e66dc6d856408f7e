// Readers (TSV pairs, parallel files, labeled TSV, plain lines), splits, LM windows and batching
// by length. The rules are in include/qkv/data.h.
#include "qkv/data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "qkv/error.h"
#include "qkv/tokenizer.h"
#include "qkv/rng.h"
#include "unicode.h"

namespace qkv {
namespace {

constexpr const char* kSpace = " \t\r\n\v\f";

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

bool is_blank(std::string_view s) { return s.find_first_not_of(kSpace) == std::string_view::npos; }

void note_malformed(ReadReport& r, int64_t line, std::string reason) {
  ++r.malformed;
  if (r.first_malformed_line == 0) {
    r.first_malformed_line = line;
    r.first_malformed_reason = std::move(reason);
  }
}

// "PATH: no usable pairs in 3 lines (3 malformed; first: line 1: no TAB)"
void check_not_empty(const ReadReport& r, const std::string& path) {
  if (r.used > 0) return;
  std::string why = detail::concat(path, ": no usable ", r.unit, " in ", r.lines, r.lines == 1 ? " line" : " lines");
  if (r.malformed > 0)
    why += detail::concat(" (", r.malformed, " malformed; first: line ", r.first_malformed_line, ": ",
                          r.first_malformed_reason, ")");
  throw Error(why);
}

// One TSV line split at its single TAB into two trimmed, non-empty fields, or the reason it
// cannot be ("" on success).
std::string split_two(const std::string& line, const char* first, const char* second, std::string_view& a,
                      std::string_view& b) {
  if (std::string p = utf8_problem(line); !p.empty()) return p;
  const size_t tabs = static_cast<size_t>(std::count(line.begin(), line.end(), '\t'));
  if (tabs == 0) return "no TAB";
  if (tabs > 1) return detail::concat(tabs, " TABs, expected 1");
  const size_t t = line.find('\t');
  a = trim(std::string_view(line).substr(0, t));
  b = trim(std::string_view(line).substr(t + 1));
  if (a.empty()) return detail::concat("empty ", first);
  if (b.empty()) return detail::concat("empty ", second);
  return "";
}

// Fisher-Yates: for i = n-1 down to 1, swap v[i] with v[j], j uniform in [0, i].
template <class T>
void shuffle_in_place(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

// ---- reading -------------------------------------------------------------------------------

std::string ReadReport::summary(const std::string& path) const {
  std::string s = detail::concat(path, ": ", used, " ", unit, " from ", lines, lines == 1 ? " line" : " lines");
  if (malformed == 0) return s + "; no malformed lines";
  return s + detail::concat("; ", malformed, malformed == 1 ? " malformed line" : " malformed lines",
                            " skipped (first: line ", first_malformed_line, ": ", first_malformed_reason, ")");
}

LineReader::LineReader(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  check(st.type() != fs::file_type::not_found, path, ": no such file");  // other status errors: open() says
  check(!fs::is_directory(st), path, ": is a directory, expected a text file");
  // Only regular files: a FIFO would block the open (and a device never ends).
  check(fs::is_regular_file(st), path, ": is ", fs::is_fifo(st) ? "a FIFO (named pipe)" : "not a regular file",
        ", expected a text file");
  in_.open(path, std::ios::binary);
  check(in_.is_open(), path, ": cannot open for reading: ", std::strerror(errno));
}

bool LineReader::next(std::string& line) {
  if (!std::getline(in_, line)) {
    check(!in_.bad(), path_, ": read error after line ", line_);
    return false;
  }
  ++line_;
  // line <- line without one trailing '\r' and, on line 1, without a byte-order mark
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line_ == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  return true;
}

std::string utf8_problem(std::string_view s) {
  // the validation rules are the tokenizers' (qkv/tokenizer.h); positions here count from 1
  if (const size_t nul = s.find('\0'); nul != std::string_view::npos) {
    const int64_t bad = invalid_utf8_offset(s.substr(0, nul));
    if (bad < 0) return detail::concat("NUL byte at byte ", nul + 1);
    return detail::concat("invalid UTF-8 at byte ", bad + 1);
  }
  const int64_t bad = invalid_utf8_offset(s);
  return bad < 0 ? std::string() : detail::concat("invalid UTF-8 at byte ", bad + 1);
}

namespace {

// Lines of "first<TAB>second" as {first, second} records; malformed lines counted, not used.
template <class Record>
std::vector<Record> read_two_columns(const std::string& path, ReadReport* report, const char* unit, const char* first,
                                     const char* second) {
  ReadReport r;
  r.unit = unit;
  std::vector<Record> out;
  LineReader in(path);
  std::string line;
  while (in.next(line)) {
    ++r.lines;
    if (is_blank(line)) continue;
    std::string_view a, b;
    if (std::string why = split_two(line, first, second, a, b); !why.empty()) {
      note_malformed(r, in.line_number(), std::move(why));
      continue;
    }
    out.push_back({std::string(a), std::string(b)});
    ++r.used;
  }
  if (report) *report = r;
  check_not_empty(r, path);
  return out;
}

}  // namespace

std::vector<TextPair> read_parallel_tsv(const std::string& path, ReadReport* report) {
  return read_two_columns<TextPair>(path, report, "pairs", "source", "target");
}

std::vector<TextPair> read_parallel_files(const std::string& src, const std::string& tgt, ReadReport* report) {
  ReadReport r;
  r.unit = "pairs";
  std::vector<TextPair> out;
  LineReader in_src(src), in_tgt(tgt);
  std::string a, b;
  for (;;) {
    const bool has_a = in_src.next(a), has_b = in_tgt.next(b);
    if (!has_a || !has_b) {
      // Count what is left of the longer file, to name both counts.
      if (has_a || has_b) {
        LineReader& rest = has_a ? in_src : in_tgt;
        std::string& buf = has_a ? a : b;
        while (rest.next(buf)) {
        }
        throw Error(detail::concat("parallel files differ in length: ", src, " has ", in_src.line_number(),
                                   " lines but ", tgt, " has ", in_tgt.line_number(),
                                   " lines; expected one line per sentence pair in each"));
      }
      break;
    }
    ++r.lines;
    const int64_t ln = in_src.line_number();
    if (std::string p = utf8_problem(a); !p.empty()) {
      note_malformed(r, ln, "source: " + p);
      continue;
    }
    if (std::string p = utf8_problem(b); !p.empty()) {
      note_malformed(r, ln, "target: " + p);
      continue;
    }
    const std::string_view ta = trim(a), tb = trim(b);
    if (ta.empty() && tb.empty()) continue;
    if (ta.empty() || tb.empty()) {
      note_malformed(r, ln, ta.empty() ? "empty source" : "empty target");
      continue;
    }
    out.push_back({std::string(ta), std::string(tb)});
    ++r.used;
  }
  if (report) *report = r;
  check_not_empty(r, src + " + " + tgt);
  return out;
}

std::vector<LabeledText> read_labeled_tsv(const std::string& path, ReadReport* report) {
  return read_two_columns<LabeledText>(path, report, "labeled texts", "label", "text");
}

std::vector<std::string> read_lines(const std::string& path, ReadReport* report) {
  ReadReport r;
  r.unit = "text lines";
  std::vector<std::string> out;
  LineReader in(path);
  std::string line;
  bool pending_break = false;  // a blank line was seen since the last text line
  while (in.next(line)) {
    ++r.lines;
    if (std::string p = utf8_problem(line); !p.empty()) {
      note_malformed(r, in.line_number(), std::move(p));
      continue;
    }
    if (is_blank(line)) {
      pending_break = !out.empty();
      continue;
    }
    // out <- out + [""] when blank lines separate this line from the previous text line
    if (pending_break) out.emplace_back();
    pending_break = false;
    out.push_back(line);
    ++r.used;
  }
  if (report) *report = r;
  check_not_empty(r, path);
  return out;
}

// ---- splits and batches --------------------------------------------------------------------

int64_t held_out_count(int64_t n, double fraction) {
  // count <- round(n f), at least 1 when f > 0, at most n
  int64_t c = static_cast<int64_t>(std::llround(static_cast<double>(n) * fraction));
  if (fraction > 0.0) c = std::max<int64_t>(c, 1);
  return std::min(c, n);
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  check(n >= 0, "seeded_permutation: n = ", n, ", expected n >= 0");
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  Rng rng(seed);
  shuffle_in_place(perm, rng);
  return perm;
}

SplitIndices split_indices(int64_t n, double valid_fraction, double test_fraction, uint64_t seed) {
  check(n >= 1, "split_indices: n = ", n, " examples, expected n >= 1");
  std::vector<int64_t> group(static_cast<size_t>(n));
  std::iota(group.begin(), group.end(), int64_t{0});
  return split_groups(group, valid_fraction, test_fraction, seed);
}

SplitIndices split_groups(const std::vector<int64_t>& group, double valid_fraction, double test_fraction,
                          uint64_t seed) {
  const int64_t n = static_cast<int64_t>(group.size());
  check(n >= 1, "split_indices: n = ", n, " examples, expected n >= 1");
  for (auto [name, f] : {std::pair{"valid_fraction", valid_fraction}, std::pair{"test_fraction", test_fraction}})
    check(std::isfinite(f) && f >= 0.0 && f < 1.0, "split_indices: ", name, " = ", f, ", expected 0 <= f < 1");
  check(valid_fraction + test_fraction < 1.0, "split_indices: valid_fraction + test_fraction = ",
        valid_fraction + test_fraction, ", expected < 1 (something must be left to train on)");
  const int64_t n_valid = held_out_count(n, valid_fraction), n_test = held_out_count(n, test_fraction);
  check(n_valid + n_test < n, "split_indices: n = ", n, " examples cannot give ", n_valid, " valid and ", n_test,
        " test examples and still leave one to train on");
  // members[g] <- the examples of group g, ascending
  int64_t n_groups = 0;
  for (int64_t i = 0; i < n; ++i) {
    check(group[i] >= 0 && group[i] < n, "split_groups: group[", i, "] = ", group[i], ", expected 0 <= g < ", n);
    n_groups = std::max(n_groups, group[i] + 1);
  }
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(n_groups));
  for (int64_t i = 0; i < n; ++i) members[group[i]].push_back(i);
  SplitIndices s;
  const std::vector<int64_t> perm = seeded_permutation(n_groups, seed);
  auto fits = [&](const std::vector<int64_t>& split, int64_t count, int64_t g) {
    return static_cast<int64_t>(split.size() + members[g].size()) <= count;
  };
  for (int64_t g : perm) {
    if (members[g].empty()) continue;
    std::vector<int64_t>& to = fits(s.valid, n_valid, g) ? s.valid : fits(s.test, n_test, g) ? s.test : s.train;
    to.insert(to.end(), members[g].begin(), members[g].end());
  }
  check(!s.train.empty(), "split_groups: ", n, " examples in ", n_groups, " groups leave none to train on after ",
        s.valid.size(), " valid and ", s.test.size(), " test examples");
  for (auto* v : {&s.train, &s.valid, &s.test}) std::sort(v->begin(), v->end());
  return s;
}

std::string near_copy_key(std::string_view s) {
  std::string out;
  bool gap = false;
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t len = decode_utf8(s, i, cp);
    i += len > 0 ? len : 1;  // (an invalid byte is not a letter)
    const bool word = len > 0 && ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
                      (cp >= 0xC0 && cp != 0xD7 && cp != 0xF7 && !(cp >= 0x2000 && cp <= 0x2BFF) &&
                       !(cp >= 0x3000 && cp <= 0x303F)));
    if (!word) {
      gap = !out.empty();
      continue;
    }
    if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) cp += 0x20;
    if (gap) out += ' ';
    gap = false;
    text::append_utf8(out, cp);
  }
  return out;
}

std::vector<int64_t> near_copy_groups(const std::vector<TextPair>& pairs) {
  const int64_t n = static_cast<int64_t>(pairs.size());
  // parent: a union-find forest over the pairs; pairs sharing a side's key are joined
  std::vector<int64_t> parent(static_cast<size_t>(n));
  std::iota(parent.begin(), parent.end(), int64_t{0});
  auto root = [&](int64_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::unordered_map<std::string, int64_t> first[2];  // per side: key -> the first pair with it
  for (int64_t i = 0; i < n; ++i)
    for (int side = 0; side < 2; ++side) {
      std::string key = near_copy_key(side == 0 ? pairs[i].source : pairs[i].target);
      if (key.empty()) continue;  // a side with no letter or digit ("?!") joins nothing
      const auto [it, added] = first[side].emplace(std::move(key), i);
      if (!added) {
        const int64_t a = root(i), b = root(it->second);
        parent[std::max(a, b)] = std::min(a, b);
      }
    }
  // group <- each root's rank among the roots, in order of first member
  std::vector<int64_t> group(static_cast<size_t>(n), -1), id(static_cast<size_t>(n), -1);
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = root(i);
    if (id[r] < 0) id[r] = next++;
    group[i] = id[r];
  }
  return group;
}

BatchPlan plan_epoch(const std::vector<int64_t>& lengths, int64_t max_tokens, uint64_t seed, int64_t epoch,
                     int64_t core, int64_t pool_per_epoch) {
  check(epoch >= 0, "plan_epoch: epoch = ", epoch, ", expected >= 0");
  const uint64_t epoch_seed = seed + 7919 * static_cast<uint64_t>(epoch);
  const auto n = static_cast<int64_t>(lengths.size());
  if (core < 0 || core >= n) return batch_by_length(lengths, max_tokens, epoch_seed, true);
  check(pool_per_epoch >= 0, "plan_epoch: pool_per_epoch = ", pool_per_epoch, ", expected >= 0");
  // pool <- [core, n) shuffled once; idx <- [0, core), then the epoch's slice of the pool
  std::vector<int64_t> pool = seeded_permutation(n - core, seed + 104729);
  const int64_t P = n - core, take = std::min(pool_per_epoch, P);
  std::vector<int64_t> idx(static_cast<size_t>(core));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  __extension__ typedef unsigned __int128 u128;  // epoch * take may pass 2^64
  const auto first = static_cast<int64_t>((static_cast<u128>(epoch) * static_cast<uint64_t>(take)) %
                                          static_cast<uint64_t>(P));
  for (int64_t i = 0; i < take; ++i) idx.push_back(core + pool[static_cast<size_t>((first + i) % P)]);
  // the plan over idx's lengths, mapped back to indices of `lengths`
  std::vector<int64_t> sub(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) sub[i] = lengths[static_cast<size_t>(idx[i])];
  BatchPlan plan = batch_by_length(sub, max_tokens, epoch_seed, true);
  for (auto& batch : plan.batches)
    for (int64_t& i : batch) i = idx[static_cast<size_t>(i)];
  return plan;
}

std::vector<std::vector<int32_t>> pack_windows(const std::vector<int32_t>& ids, int64_t window) {
  check(window >= 1, "pack_windows: window = ", window, ", expected >= 1");
  const int64_t n = static_cast<int64_t>(ids.size());
  check(n >= window + 1, "pack_windows: ", n, " tokens, expected at least window + 1 = ", window + 1,
        " for one window");
  // w_k <- ids[k window, k window + window + 1) for k in [0, (n - 1) / window)
  const int64_t count = (n - 1) / window;
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k)
    out.emplace_back(ids.begin() + k * window, ids.begin() + k * window + window + 1);
  return out;
}

BatchPlan batch_by_length(const std::vector<int64_t>& lengths, int64_t max_tokens, uint64_t seed, bool shuffle) {
  check(max_tokens >= 1, "batch_by_length: max_tokens = ", max_tokens, ", expected >= 1");
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (int64_t i = 0; i < n; ++i)
    check(lengths[i] >= 1, "batch_by_length: lengths[", i, "] = ", lengths[i], ", expected >= 1");
  BatchPlan plan;
  if (n == 0) return plan;

  // Sorts one pool by (length, index) and appends its batches: a batch grows while
  // (count + 1) * length <= max_tokens; lengths ascend, so the newcomer is the longest.
  auto cut_pool = [&](std::vector<int64_t>::iterator first, std::vector<int64_t>::iterator last) {
    std::sort(first, last, [&](int64_t a, int64_t b) {
      return lengths[a] != lengths[b] ? lengths[a] < lengths[b] : a < b;
    });
    std::vector<int64_t> batch;
    for (auto it = first; it != last; ++it) {
      const int64_t len = lengths[*it];
      const int64_t fit = max_tokens / len;  // examples of this length the budget allows
      if (!batch.empty() && static_cast<int64_t>(batch.size()) + 1 > fit) {
        plan.batches.push_back(std::move(batch));
        batch.clear();
      }
      batch.push_back(*it);
    }
    if (!batch.empty()) plan.batches.push_back(std::move(batch));
  };

  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) {
    cut_pool(order.begin(), order.end());
    return plan;
  }
  // order <- a permutation of [0, n); pools <- runs of order holding >= pool_tokens tokens
  Rng rng(seed);
  shuffle_in_place(order, rng);
  constexpr int64_t kPoolBatches = 100;
  const int64_t pool_tokens = max_tokens > std::numeric_limits<int64_t>::max() / kPoolBatches
                                  ? std::numeric_limits<int64_t>::max()
                                  : max_tokens * kPoolBatches;
  auto start = order.begin();
  int64_t tokens = 0;
  for (auto it = order.begin(); it != order.end(); ++it) {
    const int64_t len = lengths[*it];
    const bool full = len >= pool_tokens - tokens;  // tokens + len >= pool_tokens, without overflow
    tokens += full ? 0 : len;
    if (full) {
      cut_pool(start, it + 1);
      start = it + 1;
      tokens = 0;
    }
  }
  if (start != order.end()) cut_pool(start, order.end());
  // batches <- batches in shuffled order
  shuffle_in_place(plan.batches, rng);
  return plan;
}

}  // namespace qkv
