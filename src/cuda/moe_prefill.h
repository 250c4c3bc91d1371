// Mixture-of-experts prefill on the GPU (docs/model.md section 2.4), T tokens at once, with the
// tokens grouped by expert on the device (no host round trip, no readback of counts):
// - moe_route: top-k per token + stable counting sort of the T*k (token, slot) pairs;
// - moe_grouped_gate_up: act[s] = bf16(silu(x[tok(s)] . gate_e) * (x[tok(s)] . up_e)), sorted rows;
// - moe_grouped_down: y[s] = act[s] . down_e^T (f32, sorted order);
// - moe_shared_gate_up: the shared expert's act (same kernel, every token, one "expert"); its
//   down projection is a plain gemm (gemm.h) by the caller;
// - moe_combine: h[t] += sum_j w_tj y[pos(t, j)] + sigmoid(logit_tE) shared[t].
// Design and roofline numbers: moe_prefill.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// Sorted rows per tile of the grouped GEMMs (the tile table is built for this BM).
constexpr int kMoeTileRows = 128;

// Whether moe_route's one-block path, the grouped GEMMs (BF16 here, and the 4/8-bit small-M
// register kernels of q4_moe_small.cu) and moe_combine are launched with PDL
// (launch.h; each waits before its first access anyway): on by default where launch.h allows it.
// The CUDA backend sets it from CudaOptions::moe_pdl (LILAC_MOE_PDL=0 for A/B runs).
void set_moe_pdl_enabled(bool on);
bool moe_pdl_enabled();

// Whether moe_route takes 65-512 rows (E <= 256: prompt chunks) in one launch, a thread-block
// cluster doing the top-k, rank, scan and scatter (moe_route.cu), instead of the top-k kernel then
// the one-block sort: on unless LILAC_MOE_ROUTE_CLUSTER=off, and only on compute capability 9.x.
// The setter overrides the environment (tests and A/B runs compare both; the tables are the same
// bits).
void set_moe_route_cluster(bool on);
bool moe_route_cluster_enabled();

// Device routing state of one prefill chunk, carved from a caller-provided workspace by
// moe_routing_layout(). Pairs are p = t * k + j (token t, slot j in descending-weight order).
struct MoeRouting {
  int T = 0, E = 0, k = 0;       // sizes the workspace was laid out for
  int max_tiles = 0;             // upper bound of num_tiles: the grouped GEMMs' grid
  int num_chunks = 0;            // pair chunks of the counting sort
  int32_t* topk_idx = nullptr;   // [T*k] expert of pair p
  float* topk_weight = nullptr;  // [T*k] renormalised routing weight of pair p
  int32_t* chunk_rank =
      nullptr;  // [T*k] scratch: rank of p among earlier same-expert pairs of its chunk
  int32_t* chunk_base = nullptr;  // [num_chunks, E] scratch: counts, then bases within the expert
  int32_t* expert_offsets = nullptr;  // [E+1] first sorted row of each expert; [E] = T*k
  int32_t* sorted_token =
      nullptr;  // [T*k] token of sorted row s (stable: token order within an expert)
  float* sorted_weight = nullptr;    // [T*k] weight of sorted row s
  int32_t* pair_position = nullptr;  // [T*k] sorted row of pair p
  int32_t* tile_expert = nullptr;    // [max_tiles] expert of tile i (tiles in expert order)
  int32_t* tile_row0 =
      nullptr;  // [max_tiles] first sorted row of tile i (rows to min(+BM, end of expert))
  int32_t* num_tiles = nullptr;  // [1] tiles actually used
};

// Workspace bytes for (T, E, k) with the tile size kMoeTileRows.
size_t moe_routing_workspace_bytes(int T, int E, int k);
// Lays MoeRouting out in `workspace` (moe_routing_workspace_bytes() bytes, 256-byte aligned).
MoeRouting moe_routing_layout(void* workspace, int T, int E, int k);

// Top-k of the router logits f32 [T, stride] (columns [0, E) experts; softmax in f32, the k
// largest, ties to the lower index, weights renormalised; as cpu::router_top_k) and the counting
// sort into r. E <= 512 and <= 1024 threads of the scan, 1 <= k <= min(E, 32).
void moe_route(const float* logits, int stride, int T, int E, int k, const MoeRouting& r,
               cudaStream_t stream);

// The shared expert run inside the grouped launches (its intermediate size equal to the routed
// experts' I): its row tiles come first in each grid, so one launch does the routed experts and
// the shared one (a batched decode step's shared expert was three launches of its own: 22 us per
// layer at 16 rows, s9). gate_up bf16 [2 I, H], down bf16 [H, I]; act bf16 [T, I] (written by
// moe_grouped_gate_up, read by moe_grouped_down), out f32 [T, H] (written by moe_grouped_down).
struct MoeSharedPart {
  const bf16* gate_up = nullptr;
  const bf16* down = nullptr;
  bf16* act = nullptr;
  float* out = nullptr;
};

// act [T*k, I] bf16 (sorted rows) = silu(x_g . gate_e^T) * (x_g . up_e^T), x_g the tokens gathered
// through sorted_token; x bf16 [T, H], gate_up bf16 [E, 2I, H] (per expert I gate rows, then I up
// rows). H, I multiples of 8. use_wgmma = false forces the mma.sync kernels (tests; non-Hopper).
// With `shared`, also shared->act = the shared expert's act over all T tokens (as
// moe_shared_gate_up computes it, bit for bit: the same tile kernel).
void moe_grouped_gate_up(const bf16* x, int H, const bf16* gate_up, int I, const MoeRouting& r,
                         bf16* act, cudaStream_t stream, bool use_wgmma = true,
                         const MoeSharedPart* shared = nullptr);

// y [T*k, H] f32 (sorted rows) = act . down_e^T; down bf16 [E, H, I]. With `shared`, also
// shared->out [T, H] = shared->act . shared->down^T (f32).
void moe_grouped_down(const bf16* act, int I, const bf16* down, int H, const MoeRouting& r,
                      float* y, cudaStream_t stream, bool use_wgmma = true,
                      const MoeSharedPart* shared = nullptr);

// Shared expert: act [T, Is] bf16 = silu(x . sg^T) * (x . su^T); shared_gate_up bf16 [2 Is, H].
void moe_shared_gate_up(const bf16* x, int T, int H, const bf16* shared_gate_up, int Is, bf16* act,
                        cudaStream_t stream, bool use_wgmma = true);

// The shared expert's act from its gate and up projections computed as a plain product (the
// small-T path of the batched decode step: gemv_rows over [2 Is, H] into gu):
// act [T, Is] bf16 = bf16(silu(gu[t, i]) * gu[t, Is + i]), gu f32 [T, 2 Is]. The same expression
// as the grouped kernels' epilogue (only the sums that feed it run in another order).
void moe_shared_swiglu(const float* gu, int T, int Is, bf16* act, cudaStream_t stream);

// h [T, H] += sum_j topk_weight[t, j] * y[pair_position[t, j]] (j = 0 .. k-1 in order)
//           + sigmoid(logits[t * stride + E]) * shared [T, H]. H a multiple of 4.
// With norm_scale, each block then also writes the next layer's norm of its new row:
// norm_out [T, H] = rms_norm(h, norm_scale, eps) bit for bit (the same device function as
// norm.h's rms_norm; saves that launch: s11). Needs moe_combine_norm_supported().
// y_bf16: y's memory holds bf16 rows [T k, H] (q_moe_grouped_down_wgmma's y_bf16), each widened
// to f32 before the same sums; H then a multiple of 8 and y 16-byte aligned.
void moe_combine(const float* y, const MoeRouting& r, const float* logits, int stride,
                 const float* shared, int H, float* h, cudaStream_t stream,
                 const float* norm_scale = nullptr, bf16* norm_out = nullptr, float eps = 0.f,
                 bool y_bf16 = false);
bool moe_combine_norm_supported(int H, const float* h, const float* norm_scale,
                                const bf16* norm_out);

}  // namespace lilac::cuda
