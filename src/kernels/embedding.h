// embedding: row lookup in a (V, C) table and its backward, a scatter-add into the table's
// gradient. ids are trusted here: the op layer calls embedding_check_ids first and throws.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// Index of the first id outside [0, V), or -1 if none.   ids: (N)
int64_t embedding_check_ids(const int64_t* ids, int64_t N, int64_t V);

// out_i <- table[ids_i]
// table: (V, C)   ids: (N)   out: (N, C), overwritten
void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t N, int64_t V, int64_t C,
                       int threads);

// dtable[ids_i] += dout_i for i = 0 .. N-1 in that order. dtable is accumulated into, not
// overwritten, so a table tied to an output projection can collect both gradients. Threads
// split the columns, so every element receives its additions in increasing i: no atomics, and
// the result is bitwise identical for any thread count.
// ids: (N)   dout: (N, C)   dtable: (V, C), accumulated
void embedding_backward(const int64_t* ids, const float* dout, float* dtable, int64_t N, int64_t V, int64_t C,
                        int threads);

}  // namespace qkv::kernels
