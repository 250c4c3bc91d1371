// Decode GEMV and the embedding lookup for MLX affine 4/8-bit weights in the tiled device layout
// (q4_layout.h). Same contracts as linear.h's gemv / norm.h's embed, with the weights given as a
// QMatrix.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"
#include "cuda/linear.h"
#include "cuda/q4_layout.h"

namespace lilac::cuda {

// y[r] (=|+=) sum_k W[r, k] x[k] for r < W.rows, W[r, k] = scale * q + bias (q4_layout.h),
// x bf16 [W.cols] (4-byte aligned), y f32 [W.rows]. W.bits 4 or 8, W.cols a positive multiple of
// 64 and at most 65536. Twin: dequantize_row + cpu::matmul with x rounded to bf16; the
// kernel's result differs from the twin by the f32 summation order only (the dequantised
// weight never goes through bf16: q4_tile.cuh). Never synchronises; graph-capturable.
void q_gemv(const QMatrix& W, const bf16* x, float* y, GemvOut mode, cudaStream_t stream);

// rms_norm (norm.h) fused in front of q_gemv, with the weights requested before the kernel waits
// for the previous one (q4_linear.cu, "staged"): y = W x, x = bf16 of h * rsqrt(mean(h^2) + eps)
// * norm_scale computed by every block from h f32 [W.cols]. Each block bulk-copies its tiles into
// shared memory as soon as it is resident. Bit for bit rms_norm + q_gemv (Store). Available on
// Hopper (bulk copies: compute capability 9.0) for matrices whose 8-group sets each fit one warp
// at q_gemv's split and whose block's tiles fit 80 KB of shared memory (the decode projections
// in_proj, qkv, out_proj / o_proj, the router; not lm_head). h, norm_scale 16-byte aligned.
// Throws when not available.
bool q_gemv_staged_available(const QMatrix& W);
void q_gemv_rms_staged(const QMatrix& W, const float* h, const float* norm_scale, float eps,
                       float* y, cudaStream_t stream);

// T token rows at once (the dense projections of a batched decode step; q4_gemv_rows.cu):
// y[t, r] (=|+=) sum_k W[r, k] x[t, k] for t < T, r < W.rows; x bf16 [T, W.cols], y f32
// [T, W.rows]. Each weight is read once for all rows (the tokens are the MMA's n dimension).
// Same arithmetic as q_gemv per (row, group); the f32 sums over groups run in another order, so
// a row's result equals q_gemv's up to f32 rounding. T >= 1: up to kQGemvRowsMax tokens share each
// weight read; more run as slabs of kQGemvRowsMax side by side in one launch (each slab reads the
// weights again: for prompt chunks through small 8-bit matrices), and a matrix of few row blocks
// (the router) takes slabs of 16 tokens from 17 tokens on. x 16-byte aligned; needs
// thread-block clusters (sm_90: the K-slices of a row block meet in distributed shared memory,
// deterministically).
constexpr int kQGemvRowsMax = 64;
void q_gemv_rows(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                 cudaStream_t stream);
// Whether the current device runs q_gemv_rows (thread-block clusters: compute capability >= 9).
bool q_gemv_rows_available();
// The same with a bf16 store (round to nearest even).
void q_gemv_bf16out(const QMatrix& W, const bf16* x, bf16* y, cudaStream_t stream);

// h[t, :] = f32(scale * q + bias) of row ids[t] of the table (exactly dequantize_row: one
// fmaf per element). ids int32 [T] on the device (graph-safe), valid rows of the table.
void q_embed(const int32_t* ids, const QMatrix& table, float* h, int T, cudaStream_t stream);

}  // namespace lilac::cuda
