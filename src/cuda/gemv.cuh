// The decode GEMV kernel shared by linear.cu (gemv, gemv_bf16out, gemv_rms) and moe_decode.cu
// (moe_router: the router GEMV with its top-k in the last block), and the router's top-k
// selection (also router_topk's). Included by .cu files only. Design and numbers: linear.cu.
#pragma once

#include <algorithm>
#include <cfloat>
#include <climits>

#include "cuda/vec_util.cuh"

namespace lilac::cuda::gemv_detail {

constexpr int kThreads = 256;  // == kRmsThreads: the fused norm runs in the GEMV's blocks
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCols = 16384;  // x staged in <= 32 KB of shared memory
static_assert(kThreads == kRmsThreads, "the fused RMS norm needs blocks of kRmsThreads");

enum : int { kOutF32 = 0, kOutAddF32 = 1, kOutBf16 = 2 };
enum : int { kEpiNone = 0, kEpiRouter = 1 };

struct Params {
  const bf16* W = nullptr;
  int rows = 0, cols = 0;
  const bf16* x = nullptr;   // the input, bf16 [cols] (without the fused norm)
  const float* h = nullptr;  // with the fused norm: x = bf16(h * rsqrt(mean(h^2) + eps) * scale)
  const float* scale = nullptr;
  float eps = 0.f;
  void* y = nullptr;  // f32 or bf16 [rows]
  int splits = 1, items = 0;
  int prefetch = 1;  // prefetch the warp's first item into L2 before pdl_wait (launch.h)
  // kEpiRouter: the last block picks the top k of softmax(y[0, E)) into idx / w (router_select);
  // block 0 writes the normalised x to x_out (when not null); counter: zero between launches.
  int E = 0, k = 0;
  int32_t* idx = nullptr;
  float* w = nullptr;
  bf16* x_out = nullptr;
  unsigned int* counter = nullptr;
};

// Softmax over the E logits l[0, E) in f32, then the top k of p (ties: lower index first) in
// descending order -> idx[0, k), their weights renormalised to sum 1 -> w[0, k). Executed by one
// whole warp (lanes 0..31 of it), E <= 256, k <= min(E, 32). The logits are read through L2 (they
// may come from other blocks of this launch or from the previous kernel). A NaN probability ranks
// below every number (and above nothing), so the chosen ids are always valid rows even then.
__device__ __forceinline__ void router_select(const float* l, int E, int k,
                                              int32_t* __restrict__ idx, float* __restrict__ w) {
  constexpr int kPer = 256 / 32;
  const int lane = threadIdx.x & 31;
  float v[kPer];
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    const float le = __ldcg(l + min(e, E - 1));  // always a valid address
    v[i] = e < E ? le : -FLT_MAX;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? expf(v[i] - mx) : 0.f;
    sum += v[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float p = v[i] / sum;
    v[i] = lane + 32 * i < E ? (p == p ? p : -0.5f) : -1.f;  // -1: padding, never selected
  }

  int my_e = 0;
  float my_p = 0.f, top = 0.f;
  for (int j = 0; j < k; ++j) {
    // This lane's best (highest p, then lowest index: i ascending is index ascending).
    float bp = -2.f;
    int be = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (v[i] > bp) bp = v[i], be = lane + 32 * i;
        // Warp argmax under the total order (p desc, index asc): every lane ends with the winner.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (op > bp || (op == bp && oe < be)) bp = op, be = oe;
    }
    if (lane == j) my_e = be, my_p = bp;
    top += bp;
#pragma unroll
    for (int i = 0; i < kPer;
         ++i)  // the winner leaves the race (compares only: v stays in registers)
      v[i] = lane + 32 * i == be ? -2.f : v[i];
  }
  if (lane < k) {
    idx[lane] = my_e;
    w[lane] = my_p / top;
  }
}

// Output store of one row's dot product.
template <int kMode>
__device__ __forceinline__ void store_out(void* y, int row, float v) {
  if (kMode == kOutF32)
    static_cast<float*>(y)[row] = v;
  else if (kMode == kOutAddF32)
    static_cast<float*>(y)[row] = __ldcg(static_cast<const float*>(y) + row) + v;
  else
    static_cast<bf16*>(y)[row] = __float2bfloat16_rn(v);
}

// y[r] (=|+=) W[r] . x. Block: 8 warps = (8 / splits) row groups x splits column slices; an item
// is 8 / splits * R consecutive rows; warp (g, s) of an item computes rows r0 .. r0 + R - 1 over
// slice s (chunks [c0, c1)), in steps of U chunks per row per lane (R * U = 8 loads in flight,
// all issued before the step's FMAs). Blocks loop over items (grid <= items). Prologue, in this
// order: let the next kernel launch (PDL); prefetch into L2 the lines of the warp's first item
// (up to 2 steps; weights need no wait, and a prefetch holds no registers); kNorm: start
// copying the scale into shared memory; wait for the previous kernel (PDL); copy x (or h) into
// shared memory with cp.async; normalise (kNorm); barrier. The first loads then hit L2. Dynamic
// shared memory: x bf16 [cols]; kNorm adds h and scale f32 [cols] each.
template <int R, int U, int kMode, bool kNorm, int kEpi>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Params p) {
  extern __shared__ uint4 xs[];  // [cols / 8] bf16 x; kNorm: then h [cols], scale [cols] f32
  __shared__ float part[kWarps][R];
  __shared__ float scratch[32];
  const int nch = p.cols >> 3;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int splits = p.splits;
  const int groups = kWarps / splits;  // row groups per item
  const int g = warp / splits, s = warp - g * splits;
  const int per = (nch + splits - 1) / splits;
  const int c0 = min(nch, s * per), c1 = min(nch, c0 + per);
  float* hs = reinterpret_cast<float*>(xs + nch);  // kNorm only
  float* scale_s = hs + p.cols;

  pdl_launch_dependents();
  if (p.prefetch) {  // the warp's first item (up to 2 steps) into L2
    const int r0 = (blockIdx.x * groups + g) * R;
    const int n = min(c1 - c0, 2 * 32 * U);
#pragma unroll
    for (int r = 0; r < R; ++r)
      prefetch_chunks_l2(
          reinterpret_cast<const uint4*>(p.W + size_t(min(r0 + r, p.rows - 1)) * p.cols), c0, n,
          lane);
  }
  if constexpr (kNorm) {  // the scale is a weight: its copy starts before the wait
    for (int i = threadIdx.x; i < 2 * nch; i += kThreads)
      cp_async16(scale_s + 4 * i, p.scale + 4 * i);
  }

  pdl_wait();
  if constexpr (kNorm) {
    for (int i = threadIdx.x; i < 2 * nch; i += kThreads) cp_async16(hs + 4 * i, p.h + 4 * i);
    cp_async_wait_all();
    __syncthreads();
    rms_norm_staged(hs, scale_s, p.cols, p.eps, xs, scratch);
  } else {
    for (int i = threadIdx.x; i < nch; i += kThreads) cp_async16(xs + i, p.x + 8 * i);
    cp_async_wait_all();
  }
  __syncthreads();
  if constexpr (kEpi == kEpiRouter) {
    if (blockIdx.x == 0 && p.x_out)
      for (int i = threadIdx.x; i < nch; i += kThreads)
        reinterpret_cast<uint4*>(p.x_out)[i] = xs[i];
  }

  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
    const int r0 = (item * groups + g) * R;
    const uint4* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r)  // rows past the end: the last row is loaded, nothing stored
      wr[r] = reinterpret_cast<const uint4*>(p.W + size_t(min(r0 + r, p.rows - 1)) * p.cols);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    int base = c0;
    for (; base + 32 * U <= c1; base += 32 * U) {  // full steps: unconditional loads
      uint4 wv[U][R];
      load_rows<R, U, false>(wr, base + lane, c1, wv);
      dot_rows<R, U, false>(wv, xs, base + lane, c1, acc);
    }
    if (base < c1) {  // the slice's tail: predicated loads
      uint4 wv[U][R];
      load_rows<R, U, true>(wr, base + lane, c1, wv);
      dot_rows<R, U, true>(wv, xs, base + lane, c1, acc);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
    if (splits > 1) {  // the slices' sums meet in shared memory, added in slice order
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
      }
      __syncthreads();
      if (s == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v = 0.f;
          for (int j = 0; j < splits; ++j) v += part[warp + j][r];
          acc[r] = v;
        }
      }
      __syncthreads();  // part is rewritten by the next item
    }
    if (s == 0 && lane < R) {
      float v = acc[0];
#pragma unroll
      for (int r = 1; r < R; ++r) v = lane == r ? acc[r] : v;  // constant indices: registers
      const int row = r0 + lane;
      if (row < p.rows) store_out<kMode>(p.y, row, v);
    }
  }

  if constexpr (kEpi == kEpiRouter) {
    // The last block to finish (threadfence-reduction pattern) selects the experts.
    __shared__ bool s_last;
    __threadfence();  // this thread's logits (and x_out) are visible before the count moves
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (warp == 0) router_select(static_cast<const float*>(p.y), p.E, p.k, p.idx, p.w);
    if (threadIdx.x == 0) *p.counter = 0u;  // ready for the next launch
  }
}

// Dynamic shared memory of a GEMV launch.
inline size_t gemv_smem(int cols, bool norm) {
  return size_t(cols) * (norm ? 10 : 2);
}

// ---- host side -------------------------------------------------------------------------------

// Rows per warp: R = 1 (8 loads per lane per step) for rows of >= 256 chunks (cols >= 2048), 2
// (4 loads per row) for >= 128, 4 for >= 64, else 8: a step covers 256 / R chunks of each row.
inline int rows_per_warp(int nch) {
  return nch >= 256 ? 1 : nch >= 128 ? 2 : nch >= 64 ? 4 : 8;
}

// The column splits: the fewest serial load rounds for the busiest warp, rounds = waves of items
// over the resident blocks x steps per slice (ties: fewer splits). Slices keep >= 32 chunks (one
// per lane). E.g. out_proj (2048 x 512 chunks): 2 splits -> 512 items of 1 step, one wave; in_proj
// (12352 x 256): 1 split; the router (257 x 256): 1 split (33 blocks); lm_head: 1 split.
inline int choose_splits(int rows, int nch, int R, int U, long long capacity) {
  int best = 1;
  long long best_rounds = LLONG_MAX;
  for (int splits = 1; splits <= kWarps; splits *= 2) {
    if (splits > 1 && nch < 32 * splits) break;
    const long long per = (nch + splits - 1) / splits;
    const long long steps = (per + 32 * U - 1) / (32 * U);
    const long long items =
        ((long long)((rows + R - 1) / R) + kWarps / splits - 1) / (kWarps / splits);
    const long long rounds = (items + capacity - 1) / capacity * steps;
    if (rounds < best_rounds) best = splits, best_rounds = rounds;
  }
  return best;
}

// Launches one GEMV. The plan (R, U, splits) depends only on the shape and the device (the
// capacity is the plain Store kernel's, whatever variant runs), so every variant of a shape sums
// in the same order: gemv_rms equals rms_norm + gemv bit for bit, moe_router equals
// rms_norm + gemv + router_topk.
template <int R, int kMode, bool kNorm, int kEpi>
void launch_gemv(Params p, cudaStream_t stream) {
  constexpr int U = 8 / R;
  const size_t smem = gemv_smem(p.cols, kNorm);
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<R, U, kMode, kNorm, kEpi>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const size_t plain_smem = gemv_smem(p.cols, false);
  const long long capacity =
      (long long)resident_blocks_per_sm(gemv_kernel<R, U, kOutF32, false, kEpiNone>, kThreads,
                                        plain_smem) *
      sm_count();
  p.splits = choose_splits(p.rows, p.cols / 8, R, U, capacity);
  p.items = (((p.rows + R - 1) / R) + kWarps / p.splits - 1) / (kWarps / p.splits);
  p.prefetch = l2_prefetch_enabled() ? 1 : 0;
  const long long own =
      (long long)resident_blocks_per_sm(gemv_kernel<R, U, kMode, kNorm, kEpi>, kThreads, smem) *
      sm_count();
  const int grid = int(std::min<long long>(p.items, own));
  launch_kernel(true, gemv_kernel<R, U, kMode, kNorm, kEpi>, dim3(grid), dim3(kThreads), smem,
                stream, p);
}

template <int kMode, bool kNorm, int kEpi>
void dispatch_gemv(const Params& p, cudaStream_t stream) {
  switch (rows_per_warp(p.cols / 8)) {
    case 1:
      launch_gemv<1, kMode, kNorm, kEpi>(p, stream);
      break;
    case 2:
      launch_gemv<2, kMode, kNorm, kEpi>(p, stream);
      break;
    case 4:
      launch_gemv<4, kMode, kNorm, kEpi>(p, stream);
      break;
    default:
      launch_gemv<8, kMode, kNorm, kEpi>(p, stream);
      break;
  }
}

}  // namespace lilac::cuda::gemv_detail
