// Row norms and the embedding lookup on the GPU (docs/cuda-design.md, "norm").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// out[t, :] = bf16(h[t, :] * rsqrt(mean(h[t, :]^2) + eps) * scale[:]) for t < T.
// h f32 [T, H] (the residual stream), scale f32 [H] (1 + w already folded), out bf16 [T, H].
// Twin: cpu::rms_norm, then bf16 rounding. Any T >= 1, H >= 1.
void rms_norm(const float* h, const float* scale, bf16* out, int T, int H, float eps,
              cudaStream_t stream);

// h[t, :] = f32(table[ids[t], :]) for t < T. ids int32 [T] in device memory (graph-safe: the
// decode graph's sampled token is written there), table bf16 [V, H], h f32 [T, H]. The ids must
// be valid rows of the table (the kernel does not know V). Twin: widen_row (exact).
void embed(const int32_t* ids, const bf16* table, float* h, int T, int H, cudaStream_t stream);

}  // namespace lilac::cuda
