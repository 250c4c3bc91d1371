// q_gemv_rows in the kernel lab (README.md here): the versions kept in this directory (the
// production version is src/cuda's q_gemv_rows). Every version takes q_gemv_rows' arguments.
#pragma once

#include <cuda_runtime.h>

#include "cuda/q4_linear.h"

namespace lilac::lab {

// y[t, r] (=|+=) sum_k W[r, k] x[t, k] for t < T (1..64), r < W.rows; x bf16 [T, W.cols], y f32
// [T, W.rows]: the contract of src/cuda/q4_linear.h's q_gemv_rows.
// Version 1, the set-dot-tokens kernel (v1_set_dot_tokens.cu): x 4-byte aligned, no clusters.
void q_gemv_rows_v1(const cuda::QMatrix& W, const cuda::bf16* x, int T, float* y,
                    cuda::GemvOut mode, cudaStream_t stream);
// Version 2, the staged cluster kernel (v2_staged.cu; production until s6): x 16-byte aligned,
// sm_90.
void q_gemv_rows_v2(const cuda::QMatrix& W, const cuda::bf16* x, int T, float* y,
                    cuda::GemvOut mode, cudaStream_t stream);

}  // namespace lilac::lab
