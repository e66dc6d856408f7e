// BPE's merge loop over token ids, shared by GPT-2's tokenizer (gpt2_bpe.cpp) and Hugging Face's
// BPE model (hf_tokenizer.cpp).
//
// Two orders, which differ only when a merge's result takes part in a merge of lower rank (never
// in a merge list a BPE trainer learned, where a token is merged further only by later merges):
//   OneByOne  merge the adjacent pair of lowest (rank, position) whose two symbols are still the
//             ones it was found with, then look again: the Rust tokenizers library's
//             Word::merge_all (Hugging Face's BPE model);
//   Rounds    merge every occurrence of the lowest-rank pair in one left-to-right pass (an
//             occurrence overlapping one just merged is skipped), then look again: OpenAI's
//             encoder.py (GPT-2's own tokenizer). One rank is one pair (a, b) and no merge of it
//             creates another (a, b), so popping all of a rank's entries and merging them in
//             position order is that pass.
// A heap of candidates makes a long word cost O(n log n) rather than O(n^2).
#pragma once
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace qkv::text {

struct BpeMerge {
  int32_t rank;    // lower merges first
  int32_t result;  // the id of the merged token
};

enum class BpeOrder { OneByOne, Rounds };

// `find(a, b)`: the merge of ids a, b, or nullptr when the pair is not one.
template <class Find>
std::vector<int32_t> bpe_merge(const std::vector<int32_t>& symbols, BpeOrder order, Find&& find) {
  struct Sym {
    int32_t id, prev, next;  // prev / next: the neighbouring live symbols, -1 at the ends
    bool alive;
  };
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<Sym> s(symbols.size());
  for (int32_t i = 0; i < n; ++i) s[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Entry {
    int32_t rank, pos, left, right;  // left / right: the ids the pair had when it was pushed
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  const auto push = [&](int32_t pos) {
    if (pos < 0 || s[pos].next < 0) return;
    const int32_t l = s[pos].id, r = s[s[pos].next].id;
    if (const BpeMerge* m = find(l, r)) heap.push({m->rank, pos, l, r});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<Entry> round;
  while (!heap.empty()) {
    // round <- the lowest entry (OneByOne), or every entry of the lowest rank, in position order
    round.clear();
    const int32_t rank = heap.top().rank;
    do {
      round.push_back(heap.top());
      heap.pop();
    } while (order == BpeOrder::Rounds && !heap.empty() && heap.top().rank == rank);
    for (const Entry& e : round) {
      Sym& a = s[e.pos];
      // a stale entry: its left symbol merged away or grew, or its right neighbour changed
      if (!a.alive || a.id != e.left || a.next < 0 || s[a.next].id != e.right) continue;
      // a <- a + next; unlink next
      Sym& b = s[a.next];
      a.id = find(e.left, e.right)->result;
      b.alive = false;
      a.next = b.next;
      if (b.next >= 0) s[b.next].prev = e.pos;
      push(a.prev);
      push(e.pos);
    }
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i)
    if (s[i].alive) out.push_back(s[i].id);
  return out;
}

}  // namespace qkv::text
