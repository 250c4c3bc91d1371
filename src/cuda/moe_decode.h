// Mixture-of-experts for one decode token on the GPU (docs/cuda-design.md, "moe", decode part):
// routing, the selected experts' gate/up projections with SwiGLU, and their down projections
// combined into the residual stream. No host round trip: expert ids are read on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// Per token t < T: p = softmax(logits[t * stride + e], e < E) in f32; the k largest p (ties: lower
// index first) in descending order -> idx[t * k + j] (int32), their weights renormalised to sum 1
// -> w[t * k + j] (f32). stride >= E (the router GEMV writes E + 1 columns: the last is the shared
// expert's gate logit). 1 <= E <= 256, 1 <= k <= min(E, 32); used by decode (T = 1) and prefill.
// Twin: cpu::router_top_k.
void router_topk(const float* logits, int stride, int T, int E, int k, int32_t* idx, float* w,
                 cudaStream_t stream);

// Workspace bytes of moe_router (a counter): zero-fill it once after allocation (cudaMemset);
// every launch leaves it zeroed. One workspace serves every layer (launches on one stream).
size_t moe_router_workspace_bytes();

// The decode router in one launch: x = bf16(h * rsqrt(mean(h^2) + eps) * scale) (the post-
// attention norm, fused), logits[r] = router[r] . x for r < E + 1 (f32; column E is the shared
// expert's gate logit), then router_topk's selection over logits[0, E) by the last block to finish
// -> idx [k], w [k]. Block 0 also writes x to x_out [H] (bf16, when not null) for
// moe_gate_up_gemv. Equal bit for bit to rms_norm + gemv(router, E + 1, H) + router_topk. router
// bf16 [E + 1, H]; h, scale f32 [H]; E <= 256, k <= min(E, 32); H a multiple of 8, <= 16384;
// router, h, scale, x_out 16-byte aligned. Twin: cpu::rms_norm, bf16 rounding, cpu::matmul,
// cpu::router_top_k.
void moe_router(const bf16* router, int E, int H, const float* h, const float* scale, float eps,
                int k, float* logits, int32_t* idx, float* w, bf16* x_out, void* workspace,
                cudaStream_t stream);

// act = the SwiGLU activations of the k selected experts and the shared expert for one token:
//   act[j * I + i] = bf16(silu(gate_e[i] . x) * (up_e[i] . x)), e = idx[j], j < k, i < I
//   act[k * I + i] = the same with the shared expert's rows, i < Is
// gate_up bf16 [E, 2I, H] (per expert I gate rows then I up rows), shared_gate_up bf16 [2Is, H],
// idx int32 [k] on the device (router_topk's output), x bf16 [H], act bf16 [k * I + Is].
// The grid depends on k, I, Is only (graph-safe). H, I, Is multiples of 8; H <= 16384. In decode
// x is moe_router's x_out. Launched with PDL (launch.h). Twin: cpu::moe_token_act (then bf16
// rounding).
void moe_gate_up_gemv(const bf16* gate_up, const bf16* shared_gate_up, const int32_t* idx, int k,
                      const bf16* x, int H, int I, int Is, bf16* act, cudaStream_t stream,
                      int B = 1);

// h[c] += sum_{j<k} w[j] * (down_{idx[j]}[c] . act_j) + sigmoid(*shared_logit) * (shared_down[c] .
// act_k) for c < H, with act laid out as moe_gate_up_gemv writes it. down bf16 [E, H, I],
// shared_down bf16 [H, Is], idx int32 [k] and w f32 [k] (router_topk's output), shared_logit: one
// f32 on the device (the router GEMV's column E: pass router_logits + E). Fixed summation order
// (two warps per output, each over half of every row: each lane adds w_j * its partial dot for
// j = 0..k-1, then sigmoid * the shared expert's; a shuffle tree per warp; the two halves added):
// deterministic. I, Is multiples of 8; k <= 32; k * I + Is <= 65536. Launched with PDL
// (launch.h). Twin: cpu::moe_token_down (added to h).
void moe_down_gemv(const bf16* down, const bf16* shared_down, const int32_t* idx, const float* w,
                   const float* shared_logit, const bf16* act, int k, int H, int I, int Is,
                   float* h, cudaStream_t stream, int B = 1, int logit_stride = 0);
// Batched decode (B tokens of B sequences, grid y = the token): token b reads idx/w at b * k, x and
// h at b * H, act at b * (k * I + Is) and its shared logit at b * logit_stride; each token's result
// is exactly the B = 1 result for it. The experts' weights are read per token (a touched expert
// once per token that picked it; L2 serves the shared expert and repeats).

// order[0, n) = the pair indices p (of idx [n], e.g. [B, k] flattened) sorted by (idx[p], p): the
// pairs that share an expert become neighbours. One block; n <= 2048. (moe_sort.cu)
void moe_sort_pairs(const int32_t* idx, int n, int32_t* order, cudaStream_t stream);

}  // namespace lilac::cuda
