// Device pieces of the MoE routing shared by moe_route.cu's kernels (the routing of prompt chunks
// and batches): the top-k of one token's logits by one warp, a block-wide exclusive scan and the
// routing tables from the experts' counts. Included by .cu files only.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/moe_prefill.h"

namespace lilac::cuda {

// The top-k of one token's logits L [E] by one warp: lane j < k gets the j-th expert (`my_idx`)
// and its renormalised weight (returned); other lanes return 0.
template <int PER>  // logits per lane: E <= 32 * PER
__device__ __forceinline__ float topk_of_token(const float* __restrict__ L, int E, int k,
                                               int& my_idx) {
  const int lane = threadIdx.x & 31;
  float v[PER];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int e = j * 32 + lane;
    v[j] = e < E ? L[e] : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j)
    if (j * 32 + lane < E) sum += expf(v[j] - mx);
  sum = warp_sum(sum);

  // k rounds of a warp arg-max over (logit desc, index asc). A logit's order key: a uint32 that
  // orders as the float does (-0 folded into +0, so the two tie as floats do; NaN lowest of the
  // real keys), 0 for "no candidate". A round is the lane's own best (strict >, j ascending: the
  // lowest index among its ties), the warp's largest key (redux.max) and, among the lanes holding
  // it, the lowest index (redux.min): two reductions instead of five shuffle-and-compare levels.
  uint32_t key[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const uint32_t u = __float_as_uint(__fadd_rn(v[j], 0.f));  // -0 -> +0
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    key[j] = j * 32 + lane >= E ? 0u : (v[j] != v[j] ? 1u : max(o, 2u));
  }
  uint32_t taken = 0;
  float my_val = -INFINITY;
  my_idx = 0;
  for (int s = 0; s < k; ++s) {
    uint32_t bk = 0;
    float bv = 0.f;
    int bj = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if (!((taken >> j) & 1u) && key[j] > bk) bk = key[j], bv = v[j], bj = j;
    const uint32_t top = __reduce_max_sync(0xffffffffu, bk);  // > 0: k <= E real candidates
    const uint32_t bi =
        __reduce_min_sync(0xffffffffu, bk == top ? uint32_t(bj * 32 + lane) : 0xffffffffu);
    const float val = __shfl_sync(0xffffffffu, bv, int(bi & 31));
    if (int(bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == s) my_val = val, my_idx = int(bi);
  }
  const float p = lane < k ? expf(my_val - mx) / sum : 0.f;
  const float top = warp_sum(p);
  return lane < k ? p / top : 0.f;
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32); `total` gets the block sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* sh, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int s = lane < warps ? sh[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    sh[lane] = s;
  }
  __syncthreads();
  const int prefix = warp > 0 ? sh[warp - 1] : 0;
  total = sh[warps - 1];
  __syncthreads();  // sh may be reused
  return prefix + x - v;
}

// The routing tables from the experts' pair counts, block-wide (every thread calls it: it has
// barriers; thread e < E holds expert e's total n): the exclusive scans of the counts (the expert
// offsets) and of their tiles of BM sorted rows (the tile table). With `write`, the offsets, the
// tile table and num_tiles go to r (one block of a cluster writes them). Returns expert e's
// offset to thread e < E.
__device__ __forceinline__ int route_tables(int n, int E, int BM, bool write, const MoeRouting& r,
                                            int* sh) {
  const int tid = int(threadIdx.x);
  const int tiles = (n + BM - 1) / BM;
  int pairs_total, tiles_total;
  const int off = block_exclusive_scan(n, sh, pairs_total);
  const int tile0 = block_exclusive_scan(tiles, sh, tiles_total);
  if (write && tid < E) {
    r.expert_offsets[tid] = off;
    for (int i = 0; i < tiles; ++i) {
      r.tile_expert[tile0 + i] = tid;
      r.tile_row0[tile0 + i] = off + i * BM;
    }
  }
  if (write && tid == 0) {
    r.expert_offsets[E] = pairs_total;
    *r.num_tiles = tiles_total;
  }
  return off;
}

}  // namespace lilac::cuda
