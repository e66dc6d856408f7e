// column_sums: the sums down the columns of a row-major matrix (a bias's gradient is the column
// sums of its output's gradient), optionally rounding the matrix to bfloat16 in the same pass.
// Each column is summed over its rows in row order, in double, then rounded once to float: the
// result does not depend on the number of threads or on how the columns are split between them.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// col_sum[j] <- (add ? col_sum[j] : 0) + float(sum over i < N of double(x[i * ld + j])), j < C.
// With bf16_out, also bf16_out[i * out_ld + j] <- x[i * ld + j] rounded to bfloat16 as
// f32_to_bf16 rounds. threads: the most threads to use (1 runs it on the caller's).
void column_sums(const float* x, int64_t N, int64_t C, int64_t ld, float* col_sum, bool add, uint16_t* bf16_out,
                 int64_t out_ld, int threads);

}  // namespace qkv::kernels
