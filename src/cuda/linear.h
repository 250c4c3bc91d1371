// Decode GEMV on the GPU (docs/cuda-design.md, "linear"): y = W x for one token, bf16 weights
// and activations, f32 accumulation.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.h"

namespace lilac::cuda {

enum class GemvOut {
  Store,       // y[r] = W[r] . x
  Accumulate,  // y[r] += W[r] . x (adding a projection into the f32 residual stream)
};

// y[r] (=|+=) sum_j W[r, j] * x[j] for r < rows. W bf16 [rows, cols] row-major, x bf16 [cols],
// y f32 [rows]. rows >= 1; cols a positive multiple of 8 (16-byte rows) and at most 16384;
// W and x 16-byte aligned. Bad arguments throw lilac::Error before anything is launched.
// y must not overlap W or x. Launched with PDL (launch.h). Twin: cpu::matmul with x rounded to
// bf16.
void gemv(const bf16* W, int rows, int cols, const bf16* x, float* y, GemvOut mode,
          cudaStream_t stream);

// The same with a bf16 store, round to nearest even: y[r] = bf16(W[r] . x) (chained projections).
void gemv_bf16out(const bf16* W, int rows, int cols, const bf16* x, bf16* y, cudaStream_t stream);

// The GEMV with the RMS norm fused into its prologue: x = bf16(h * rsqrt(mean(h^2) + eps) *
// scale) (every block normalises the f32 row h [cols] itself, from L2), then y (=|+=) W x. Equal
// bit for bit to rms_norm(h, scale, x, 1, cols, eps) followed by gemv(W, rows, cols, x, y, mode)
// (same norm order, same GEMV plan). h and scale f32 [cols], 16-byte aligned; the other
// requirements as gemv. Used by decode for in_proj / qkv_proj (input norm) and lm_head (final
// norm). Twin: cpu::rms_norm, bf16 rounding, cpu::matmul.
void gemv_rms(const bf16* W, int rows, int cols, const float* h, const float* scale, float eps,
              float* y, GemvOut mode, cudaStream_t stream);

}  // namespace lilac::cuda
