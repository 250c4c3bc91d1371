// MoE for one decode token: router top-k, the selected experts' gate/up GEMVs with SwiGLU, and
// their down GEMVs combined into the residual. Real shapes: H = 2048, E = 256, k = 8, I = Is = 512.
//
// router_topk: reads E + 1 f32 logits per token (1 KB): pure latency, one warp per token.
//   Lane l holds logits l, l + 32, ... (E <= 256: 8 per lane); max and sum by shuffles; softmax
//   p = expf(l - max) / sum; then k rounds of a warp argmax over (p desc, index asc), the winner
//   removed; the renormaliser is summed in selection order as in the twin. ~2 us standalone.
//
// moe_gate_up_gemv: (k * 2I + 2Is) rows x H = 9216 x 2048 bf16 = 37.7 MB (the 8 experts' gate_up
//   and the shared expert's): 8.8 us at 4.3 TB/s; 2 FLOP per weight.
//   Grid: k * ceil(I / 8) + ceil(Is / 8) blocks (576) of 8 warps; block b serves expert slot
//   j = b / ceil(I / 8) (the shared expert after the k routed ones), warp w output i = 8 (b mod
//   ceil(I / 8)) + w. The expert id is read from idx[j] on the device, so the grid depends on
//   k, I, Is only. x (4 KB) is staged in shared memory. A warp computes the gate row i and the
//   up row I + i together (R = 2 rows, U = 4 chunks each per step: 8 independent 16-byte loads in
//   flight per lane, 2 steps for H = 2048), shuffle-reduces both, and lane 0 writes
//   bf16(silu(g) * u) with silu(g) = g / (1 + expf(-g)).
//
// moe_down_gemv: (k + 1) x H x I bf16 = 9 x 2048 x 512 = 18.9 MB: 4.4 us at 4.3 TB/s.
//   Grid: ceil(H / 8) blocks (256) of 8 warps, warp w -> output c = 8 b + w. The k + 1
//   activation vectors (9 KB bf16), idx, w and sigmoid(shared logit) are staged in shared memory.
//   A warp walks the expert slots in groups of J (J = 3 when 3 divides k + 1, as for k = 8; else
//   4): per step each lane loads U = 2 chunks of each of the J rows down_e[c] (6-8 loads in
//   flight; I = 512 is 64 chunks = one step), dots them with act_j from shared memory, and adds
//   w_j * partial_j to its running sum in slot order (shared expert last). One shuffle tree at the
//   end, lane 0 adds into h[c]. Slots past k in the last group re-read the shared expert's row
//   with weight 0 (no branch in the load path). Deterministic: no atomics, fixed order.
//
// Both GEMVs see far fewer rows than the dense projections, so they rely on every one of the
// 576 / 256 blocks being resident at once (8-9 warps per SM), each with 6-8 loads per lane in
// flight: ~8 MB in flight in total, enough to cover the memory latency at full bandwidth.
#include "cuda/moe_decode.h"

#include <cfloat>

#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxE = 256;  // router: 8 logits per lane
constexpr int kMaxK = 32;   // router: one selected expert per lane

// ---- router ----------------------------------------------------------------------------------

constexpr int kRouterWarps = 4;

__global__ void __launch_bounds__(kRouterWarps * 32)
    router_topk_kernel(const float* __restrict__ logits, int stride, int T, int E, int k,
                       int32_t* __restrict__ idx, float* __restrict__ w) {
  constexpr int kPer = kMaxE / 32;
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (t >= T) return;  // whole warps only
  const float* l = logits + size_t(t) * stride;
  float v[kPer];
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -FLT_MAX;
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
  for (int i = 0; i < kPer; ++i)
    v[i] = lane + 32 * i < E ? v[i] / sum : -1.f;  // -1: never selected

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
    if ((be & 31) == lane) {
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (i == (be >> 5)) v[i] = -2.f;
    }
  }
  if (lane < k) {
    idx[size_t(t) * k + lane] = my_e;
    w[size_t(t) * k + lane] = my_p / top;
  }
}

// ---- gate/up ---------------------------------------------------------------------------------

constexpr int kGateUpU = 4;

__global__ void __launch_bounds__(kThreads)
    moe_gate_up_kernel(const bf16* __restrict__ gate_up, const bf16* __restrict__ shared_gate_up,
                       const int32_t* __restrict__ idx, int k, const bf16* __restrict__ x, int H,
                       int I, int Is, bf16* __restrict__ act, int blocks_per_expert) {
  extern __shared__ uint4 xs[];  // [H / 8]
  const int nch = H >> 3;
  for (int i = threadIdx.x; i < nch; i += kThreads) xs[i] = reinterpret_cast<const uint4*>(x)[i];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.x;
  const bf16* base;
  bf16* out;
  int n, i;
  if (b < k * blocks_per_expert) {
    const int j = b / blocks_per_expert;
    i = (b - j * blocks_per_expert) * kWarps + warp;
    n = I;
    base = gate_up + size_t(idx[j]) * 2 * I * H;
    out = act + size_t(j) * I;
  } else {
    i = (b - k * blocks_per_expert) * kWarps + warp;
    n = Is;
    base = shared_gate_up;
    out = act + size_t(k) * I;
  }
  if (i >= n) return;  // no barrier below
  const uint4* const wr[2] = {reinterpret_cast<const uint4*>(base + size_t(i) * H),
                              reinterpret_cast<const uint4*>(base + size_t(n + i) * H)};
  float acc[2] = {0.f, 0.f};
  int c = 0;
  for (; c + 32 * kGateUpU <= nch; c += 32 * kGateUpU)
    gemv_step<2, kGateUpU, false>(wr, xs, c + lane, nch, acc);
  if (c < nch) gemv_step<2, kGateUpU, true>(wr, xs, c + lane, nch, acc);
  const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
  if (lane == 0) out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

// ---- down ------------------------------------------------------------------------------------

constexpr int kDownU = 2;

// One step over J expert rows, each with its own activation vector: lane chunks c + 32u, u < U.
template <int J, bool kCheck>
__device__ __forceinline__ void down_step(const uint4* const (&wr)[J], const uint4* const (&xr)[J],
                                          const int (&nch)[J], int c, float (&part)[J]) {
  uint4 wv[kDownU][J];
#pragma unroll
  for (int u = 0; u < kDownU; ++u)
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const bool ok = !kCheck || c + 32 * u < nch[jj];
      wv[u][jj] = ok ? ld_weights(wr[jj] + c + 32 * u) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
  for (int u = 0; u < kDownU; ++u)
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const bool ok = !kCheck || c + 32 * u < nch[jj];
      const uint4 xv = ok ? xr[jj][c + 32 * u] : make_uint4(0, 0, 0, 0);
      part[jj] = dot8(wv[u][jj], xv, part[jj]);
    }
}

template <int J>
__global__ void __launch_bounds__(kThreads)
    moe_down_kernel(const bf16* __restrict__ down, const bf16* __restrict__ shared_down,
                    const int32_t* __restrict__ idx, const float* __restrict__ w,
                    const float* __restrict__ shared_logit, const bf16* __restrict__ act, int k,
                    int H, int I, int Is, float* __restrict__ h) {
  extern __shared__ uint4 as[];  // [(k * I + Is) / 8]
  __shared__ int s_idx[kMaxK];
  __shared__ float s_w[kMaxK + 1];
  const int n_act = (k * I + Is) >> 3;
  for (int i = threadIdx.x; i < n_act; i += kThreads)
    as[i] = reinterpret_cast<const uint4*>(act)[i];
  if (threadIdx.x < k) {
    s_idx[threadIdx.x] = idx[threadIdx.x];
    s_w[threadIdx.x] = w[threadIdx.x];
  }
  if (threadIdx.x == 0) s_w[k] = 1.f / (1.f + expf(-*shared_logit));
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c = blockIdx.x * kWarps + warp;
  if (c >= H) return;  // no barrier below
  const int nI = I >> 3, nS = Is >> 3;
  float acc = 0.f;
  for (int j0 = 0; j0 <= k; j0 += J) {
    const uint4* wr[J];
    const uint4* xr[J];
    int nch[J];
    float wj[J];
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const int j = j0 + jj;
      if (j < k) {
        wr[jj] = reinterpret_cast<const uint4*>(down + (size_t(s_idx[j]) * H + c) * I);
        xr[jj] = as + j * nI;
        nch[jj] = nI;
        wj[jj] = s_w[j];
      } else {  // the shared expert (j == k), or a slot past it: the same row with weight 0
        wr[jj] = reinterpret_cast<const uint4*>(shared_down + size_t(c) * Is);
        xr[jj] = as + k * nI;
        nch[jj] = nS;
        wj[jj] = j == k ? s_w[k] : 0.f;
      }
    }
    int lo = nch[0], hi = nch[0];
#pragma unroll
    for (int jj = 1; jj < J; ++jj) lo = min(lo, nch[jj]), hi = max(hi, nch[jj]);
    float part[J];
#pragma unroll
    for (int jj = 0; jj < J; ++jj) part[jj] = 0.f;
    int base = 0;
    for (; base + 32 * kDownU <= lo; base += 32 * kDownU)
      down_step<J, false>(wr, xr, nch, base + lane, part);
    for (; base < hi; base += 32 * kDownU) down_step<J, true>(wr, xr, nch, base + lane, part);
#pragma unroll
    for (int jj = 0; jj < J; ++jj) acc = fmaf(wj[jj], part[jj], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) h[c] += acc;
}

}  // namespace

void router_topk(const float* logits, int stride, int T, int E, int k, int32_t* idx, float* w,
                 cudaStream_t stream) {
  if (!logits || !idx || !w) fail("cuda::router_topk: null pointer");
  if (T < 1 || E < 1 || E > kMaxE || k < 1 || k > E || k > kMaxK || stride < E)
    fail(
        "cuda::router_topk: unsupported T={} E={} k={} stride={} (E <= {}, k <= min(E, {}), stride "
        ">= E)",
        T, E, k, stride, kMaxE, kMaxK);
  router_topk_kernel<<<ceil_div(T, kRouterWarps), kRouterWarps * 32, 0, stream>>>(logits, stride, T,
                                                                                  E, k, idx, w);
  LILAC_CUDA_LAUNCHED();
}

void moe_gate_up_gemv(const bf16* gate_up, const bf16* shared_gate_up, const int32_t* idx, int k,
                      const bf16* x, int H, int I, int Is, bf16* act, cudaStream_t stream) {
  if (!gate_up || !shared_gate_up || !idx || !x || !act)
    fail("cuda::moe_gate_up_gemv: null pointer");
  if (k < 1 || k > kMaxK || H < 8 || H % 8 || H > 16384 || I < 8 || I % 8 || Is < 8 || Is % 8)
    fail("cuda::moe_gate_up_gemv: unsupported k={} H={} I={} Is={}", k, H, I, Is);
  if (!is_aligned(gate_up, 16) || !is_aligned(shared_gate_up, 16) || !is_aligned(x, 16))
    fail("cuda::moe_gate_up_gemv: weights and x must be 16-byte aligned");
  const int bpe = ceil_div(I, kWarps);
  const int grid = k * bpe + ceil_div(Is, kWarps);
  moe_gate_up_kernel<<<grid, kThreads, size_t(H) * 2, stream>>>(gate_up, shared_gate_up, idx, k, x,
                                                                H, I, Is, act, bpe);
  LILAC_CUDA_LAUNCHED();
}

void moe_down_gemv(const bf16* down, const bf16* shared_down, const int32_t* idx, const float* w,
                   const float* shared_logit, const bf16* act, int k, int H, int I, int Is,
                   float* h, cudaStream_t stream) {
  if (!down || !shared_down || !idx || !w || !shared_logit || !act || !h)
    fail("cuda::moe_down_gemv: null pointer");
  if (k < 1 || k > kMaxK || H < 1 || I < 8 || I % 8 || Is < 8 || Is % 8 || k * I + Is > 65536)
    fail("cuda::moe_down_gemv: unsupported k={} H={} I={} Is={}", k, H, I, Is);
  if (!is_aligned(down, 16) || !is_aligned(shared_down, 16) || !is_aligned(act, 16))
    fail("cuda::moe_down_gemv: weights and act must be 16-byte aligned");
  const size_t smem = size_t(k * I + Is) * 2;
  const int grid = ceil_div(H, kWarps);
  if ((k + 1) % 3 == 0) {
    if (smem > 48 * 1024)
      LILAC_CUDA_CHECK(cudaFuncSetAttribute(
          moe_down_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    moe_down_kernel<3><<<grid, kThreads, smem, stream>>>(down, shared_down, idx, w, shared_logit,
                                                         act, k, H, I, Is, h);
  } else {
    if (smem > 48 * 1024)
      LILAC_CUDA_CHECK(cudaFuncSetAttribute(
          moe_down_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    moe_down_kernel<4><<<grid, kThreads, smem, stream>>>(down, shared_down, idx, w, shared_logit,
                                                         act, k, H, I, Is, h);
  }
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
