// The BF16 decode GEMV over T token rows at once (gemv_rows.cu): the dense projections of a
// batched decode step, each weight read once for all rows (the tokens as the MMA's n dimension).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/linear.h"

namespace lilac::cuda {

// y[t, r] (=|+=) sum_k W[r, k] x[t, k] for t < T <= kGemvRowsMax, r < rows; W bf16 [rows, cols],
// x bf16 [T, cols], y f32 [T, rows]; cols a positive multiple of 64, W and x 16-byte aligned.
// f32 accumulation (tensor cores); the sums run in another order than gemv's, so a row equals
// gemv's result up to f32 rounding. Deterministic. Launched with PDL; graph-capturable.
constexpr int kGemvRowsMax = 64;
// `slices` (benchmarks): 0 lets the launcher choose the K-slices per 16-row tile; else that many
// (1, 2, 4, 8, or 16 at T <= 32).
void gemv_rows(const bf16* W, int rows, int cols, const bf16* x, int T, float* y, GemvOut mode,
               cudaStream_t stream, int slices = 0);

// Whether gemv_rows takes its staged form where it applies (sm_90, T <= 32: x in shared memory, a
// cluster of up to 8 K-slices per 8 row tiles; gemv_rows.cu). On by default; the same bits as the
// other form at the same K-slice count (`slices`), though each form picks its own by default. The
// CUDA backend sets it from CudaOptions::gemv_rows_staged (LILAC_GEMV_ROWS_STAGED=0 for A/B runs).
void set_gemv_rows_staged_enabled(bool on);
bool gemv_rows_staged_enabled();
// Whether a gemv_rows call of this shape would take the staged form (the batched step sends the
// few-tile matrices of 33-64 rows here instead of to the GEMM when it does).
bool gemv_rows_staged_takes(int rows, int cols, int T);

}  // namespace lilac::cuda
