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

// The same product with the weights requested before the kernel waits for x (q4_linear.cu,
// "staged"): each block bulk-copies its tiles into shared memory as soon as it is resident, so
// under PDL the weights stream while the previous kernel finishes. Bit for bit q_gemv's result.
// Available on Hopper (bulk copies: compute capability 9.0) for matrices whose 8-group sets
// each fit one warp at q_gemv's split and whose block's tiles fit 80 KB of shared memory (the
// decode projections: in_proj, qkv, out_proj / o_proj, the router; not lm_head). x 16-byte
// aligned. Throws when not available.
bool q_gemv_staged_available(const QMatrix& W);
void q_gemv_staged(const QMatrix& W, const bf16* x, float* y, GemvOut mode, cudaStream_t stream);
// rms_norm (norm.h, same order: bit for bit) fused in front: y = W x, x = bf16 of
// h * rsqrt(mean(h^2) + eps) * norm_scale computed by every block from h f32 [W.cols]; block 0
// also stores x into x_out (bf16 [W.cols]) unless it is null. y is stored (GemvOut::Store).
// h, norm_scale, x_out 16-byte aligned.
void q_gemv_rms_staged(const QMatrix& W, const float* h, const float* norm_scale, float eps,
                       float* y, bf16* x_out, cudaStream_t stream);

// q_gemv_rms_staged with the router's top-k in the same launch: logits = y [W.rows] (E routed
// experts, then the shared expert's gate logit), then router_topk's selection over logits[0, E)
// by the last block to finish -> idx [k], w [k] (moe_decode.h). Bit for bit rms_norm + q_gemv +
// router_topk. workspace: moe_router_workspace_bytes(), zeroed once (each launch leaves it
// zeroed). E <= 256, k <= min(E, 32).
void q_gemv_router_staged(const QMatrix& W, const float* h, const float* norm_scale, float eps,
                          float* logits, bf16* x_out, int E, int k, int32_t* idx, float* w,
                          void* workspace, cudaStream_t stream);

// T token rows at once (the dense projections of a batched decode step; q4_gemv_rows.cu):
// y[t, r] (=|+=) sum_k W[r, k] x[t, k] for t < T, r < W.rows; x bf16 [T, W.cols], y f32
// [T, W.rows]. Each weight is read once for all rows (the tokens are the MMA's n dimension).
// Same arithmetic as q_gemv per (row, group); the f32 sums over groups run in another order, so
// a row's result equals q_gemv's up to f32 rounding. T >= 1: up to kQGemvRowsMax tokens share each
// weight read; more run as slabs of kQGemvRowsMax side by side in one launch (each slab reads the
// weights again: for prompt chunks through small 8-bit matrices). x 16-byte aligned; needs
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
