// MoE for one decode token: the router (GEMV + top-k, with the post-attention norm fused), the
// selected experts' gate/up GEMVs with SwiGLU, and their down GEMVs combined into the residual.
// Real shapes: H = 2048, E = 256, k = 8, I = Is = 512. Measured numbers (H200, version 1) and the
// version 2 predictions: docs/kernels.md.
//
// moe_router: (E + 1) x H = 257 x 2048 bf16 = 1.05 MB, latency-bound. The GEMV kernel of gemv.cuh
//   with the RMS norm in its prologue (each of the 33 blocks normalises h from L2) and a last-block
//   epilogue: every block stores its logits, fences and counts itself in on a counter in the
//   workspace; the last one runs router_select (one warp: softmax, k rounds of a warp argmax under
//   (p desc, index asc), renormalised) and zeroes the counter. Block 0 also writes the normalised
//   x for moe_gate_up_gemv (so both consumers of the post norm read the same bits). Replaces
//   rms_norm + gemv + router_topk (v1: 2.0 + 3.2 + 3.7 us in a graph) by one launch.
// router_topk (prefill, tests): one warp per token runs router_select on the token's logits.
//
// moe_gate_up_gemv: (k * 2I + 2Is) rows x H = 9216 x 2048 bf16 = 37.7 MB (the 8 experts' gate_up
//   and the shared expert's): 8.8 us at 4.3 TB/s; 2 FLOP per weight. v1 measured 11.4 us (77%).
//   Grid: k * ceil(I / 8) + ceil(Is / 8) blocks (576) of 8 warps; block b serves expert slot
//   j = b / ceil(I / 8) (the shared expert after the k routed ones), warp w output i = 8 (b mod
//   ceil(I / 8)) + w. The expert id is read from idx[j] on the device, so the grid depends on
//   k, I, Is only. A warp computes the gate row i and the up row I + i together (R = 2 rows, U = 4
//   chunks each per step: 8 independent 16-byte loads in flight per lane, 2 steps for H = 2048),
//   shuffle-reduces both, and lane 0 writes bf16(silu(g) * u) with silu(g) = g / (1 + expf(-g)).
//   v2: the first step's loads are issued before x (4 KB) is staged: the shared expert's blocks
//   even before pdl_wait (their rows do not depend on the router), the routed ones right after
//   reading idx[j]; launched with PDL.
//
// moe_down_gemv: (k + 1) x H x I bf16 = 9 x 2048 x 512 = 18.9 MB: 4.4 us at 4.3 TB/s. v1 (a warp
//   per output walking the slots in 3 groups, 3 dependent load rounds) measured 9.7 us (45%).
//   v2: grid ceil(H / 8) = 256 blocks of 8 warps, warp w -> output c = 8 b + w, 2 blocks per SM
//   (<= 128 registers): all 256 blocks resident at once. A warp loads all 9 rows of its output in
//   one round: register slot 0 holds the shared expert's row shared_down[c] (loaded before
//   pdl_wait), slots 1..8 the routed experts' rows down_{idx[j]}[c] (idx read by lanes j < k,
//   spread by shuffles), U = 2 chunks per row per lane: 18 independent 16-byte loads per lane, the
//   whole 18.9 MB requested at once. The k + 1 activation vectors (9 KB bf16), w and sigmoid(shared
//   logit) are staged in shared memory while the loads fly. Each lane keeps one partial dot per
//   slot; then acc = sum_j w_j * part_j (j ascending), + sigmoid * part_shared last, one shuffle
//   tree, lane 0 adds into h[c]. Deterministic: no atomics, fixed order. k > 8 takes further passes
//   of 8 routed rows, I or Is > 512 further steps.
#include "cuda/moe_decode.h"

#include "cuda/gemv.cuh"
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
  pdl_launch_dependents();
  pdl_wait();
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (t >= T) return;  // whole warps only
  gemv_detail::router_select(logits + size_t(t) * stride, E, k, idx + size_t(t) * k,
                             w + size_t(t) * k);
}

// ---- gate/up ---------------------------------------------------------------------------------

constexpr int kGateUpU = 4;

__global__ void __launch_bounds__(kThreads)
    moe_gate_up_kernel(const bf16* __restrict__ gate_up, const bf16* __restrict__ shared_gate_up,
                       const int32_t* __restrict__ idx, int k, const bf16* __restrict__ x, int H,
                       int I, int Is, bf16* __restrict__ act, int blocks_per_expert, int prefetch) {
  extern __shared__ uint4 xs[];  // [H / 8]
  // Batched: token blockIdx.y (its experts, x and act row).
  idx += blockIdx.y * k;
  x += size_t(blockIdx.y) * H;
  act += size_t(blockIdx.y) * (size_t(k) * I + Is);
  const int nch = H >> 3;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.x;
  const bool shared = b >= k * blocks_per_expert;
  const int j = shared ? k : b / blocks_per_expert;  // the act slot
  const int n = shared ? Is : I;
  const int i = (b - j * blocks_per_expert) * kWarps + warp;
  const int il = min(i, n - 1);  // outputs past n: load a valid row, store nothing

  pdl_launch_dependents();
  if (prefetch && shared) {  // weights that do not depend on the router: into L2 before the wait
    prefetch_chunks_l2(reinterpret_cast<const uint4*>(shared_gate_up + size_t(il) * H), 0, nch,
                       lane);
    prefetch_chunks_l2(reinterpret_cast<const uint4*>(shared_gate_up + size_t(n + il) * H), 0, nch,
                       lane);
  }
  pdl_wait();
  // (idx is read at a valid index by every block: no load past its k entries)
  const int e = __ldcg(idx + min(j, k - 1));
  const bf16* base = shared ? shared_gate_up : gate_up + size_t(e) * 2 * size_t(I) * H;
  const uint4* const wr[2] = {reinterpret_cast<const uint4*>(base + size_t(il) * H),
                              reinterpret_cast<const uint4*>(base + size_t(n + il) * H)};
  if (prefetch && !shared) {  // both rows, all steps, into L2 now: all bytes requested at once
    prefetch_chunks_l2(wr[0], 0, nch, lane);
    prefetch_chunks_l2(wr[1], 0, nch, lane);
  }
  // x arrives while idx does (both right after the wait); the loads follow the barrier.
  for (int t = threadIdx.x; t < nch; t += kThreads) cp_async16(xs + t, x + 8 * t);
  cp_async_wait_all();
  __syncthreads();

  float acc[2] = {0.f, 0.f};
  int c = 0;
  for (; c + 32 * kGateUpU <= nch; c += 32 * kGateUpU) {  // full steps: unconditional loads
    uint4 wv[kGateUpU][2];
    load_rows<2, kGateUpU, false>(wr, c + lane, nch, wv);
    dot_rows<2, kGateUpU, false>(wv, xs, c + lane, nch, acc);
  }
  if (c < nch) {  // the tail: predicated loads
    uint4 wv[kGateUpU][2];
    load_rows<2, kGateUpU, true>(wr, c + lane, nch, wv);
    dot_rows<2, kGateUpU, true>(wv, xs, c + lane, nch, acc);
  }
  const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
  if (lane == 0 && i < n) act[size_t(j) * I + i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

// ---- down ------------------------------------------------------------------------------------

constexpr int kDownJ = 9;  // register slots: 0 = the shared expert (pass 0), 1..8 = routed rows
constexpr int kDownRouted = kDownJ - 1;
constexpr int kDownSplit = 2;                   // warps per output: each takes half of every row
constexpr int kDownOuts = kWarps / kDownSplit;  // outputs per block
constexpr int kDownStep = 32 * kDownSplit;      // chunks of a row per step (I = 512: one step)

__global__ void __launch_bounds__(kThreads, 4)
    moe_down_kernel(const bf16* __restrict__ down, const bf16* __restrict__ shared_down,
                    const int32_t* __restrict__ idx, const float* __restrict__ w,
                    const float* __restrict__ shared_logit, const bf16* __restrict__ act, int k,
                    int H, int I, int Is, float* __restrict__ h, int prefetch, int logit_stride) {
  // Batched: token blockIdx.y (its experts, weights, shared logit, act and residual rows).
  idx += blockIdx.y * k;
  w += blockIdx.y * k;
  shared_logit += size_t(blockIdx.y) * logit_stride;
  act += size_t(blockIdx.y) * (size_t(k) * I + Is);
  h += size_t(blockIdx.y) * H;
  extern __shared__ uint4 as[];  // [(k * I + Is) / 8]: act slot j at j * I / 8, shared at k * I / 8
  __shared__ float s_w[kMaxK + 1];
  __shared__ float s_half[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o = warp % kDownOuts, half = warp / kDownOuts;
  const int c = blockIdx.x * kDownOuts + o;
  const int cc = min(c, H - 1);  // outputs past H: load a valid row, store nothing
  const int nI = I >> 3, nS = Is >> 3;
  const int passes = max(1, (k + kDownRouted - 1) / kDownRouted);
  const int steps = (max(nI, nS) + kDownStep - 1) / kDownStep;
  const int total = passes * steps;
  const int lc = half * 32 + lane;  // this lane's chunk within a step

  pdl_launch_dependents();
  const uint4* srow = reinterpret_cast<const uint4*>(shared_down + size_t(cc) * Is);
  // The shared expert's row does not depend on the router: into L2 before the wait (the half of
  // it this warp reads: 32 chunks per 64 from chunk half * 32).
  for (int q = half * 32; q < nS; q += kDownStep)
    prefetch_chunks_l2(srow, q, min(32, nS - q), lane);
  pdl_wait();
  uint4 wv[kDownJ];
  const int my_e = __ldcg(idx + min(lane, k - 1));  // k <= 32: lane j < k holds expert j
  auto load = [&](int pass, int step) {             // the 9 rows' chunks of iteration (pass, step)
    const int ch = step * kDownStep + lc;
    wv[0] = pass == 0 && ch < nS ? ld_weights(srow + ch) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int jj = 1; jj < kDownJ; ++jj) {
      const int j = pass * kDownRouted + jj - 1;
      const int e = __shfl_sync(0xffffffffu, my_e, j < k ? j : 0);
      const uint4* row = reinterpret_cast<const uint4*>(down + (size_t(e) * H + cc) * I);
      wv[jj] = j < k && ch < nI ? ld_weights(row + ch) : make_uint4(0, 0, 0, 0);
    }
  };
  load(0, 0);

  const int n_act = (k * I + Is) >> 3;
  for (int i = threadIdx.x; i < n_act; i += kThreads) cp_async16(as + i, act + 8 * i);
  if (threadIdx.x < k) s_w[threadIdx.x] = __ldcg(w + min(int(threadIdx.x), k - 1));
  if (threadIdx.x == 0) s_w[k] = 1.f / (1.f + expf(-__ldcg(shared_logit)));
  cp_async_wait_all();
  __syncthreads();

  float part[kDownJ];
#pragma unroll
  for (int jj = 0; jj < kDownJ; ++jj) part[jj] = 0.f;
  float acc = 0.f, shared_part = 0.f;
  for (int t = 0; t < total; ++t) {
    const int pass = t / steps, step = t - pass * steps;
    const int ch = step * kDownStep + lc;
    const uint4 x0 = pass == 0 && ch < nS ? as[k * nI + ch] : make_uint4(0, 0, 0, 0);
    part[0] = dot8(wv[0], x0, part[0]);
#pragma unroll
    for (int jj = 1; jj < kDownJ; ++jj) {
      const int j = pass * kDownRouted + jj - 1;
      const uint4 xv = j < k && ch < nI ? as[j * nI + ch] : make_uint4(0, 0, 0, 0);
      part[jj] = dot8(wv[jj], xv, part[jj]);
    }
    if (step == steps - 1) {  // the pass is complete: weight its routed slots in order
#pragma unroll
      for (int jj = 1; jj < kDownJ; ++jj) {
        const int j = pass * kDownRouted + jj - 1;
        if (j < k) acc = fmaf(s_w[j], part[jj], acc);
      }
      if (pass == 0) shared_part = part[0];
#pragma unroll
      for (int jj = 0; jj < kDownJ; ++jj) part[jj] = 0.f;
    }
    if (t + 1 < total) {
      const int np = (t + 1) / steps;
      load(np, t + 1 - np * steps);
    }
  }
  acc = fmaf(s_w[k], shared_part, acc);  // the shared expert last
  acc = warp_sum(acc);
  if (lane == 0) s_half[warp] = acc;
  __syncthreads();
  if (half == 0 && lane == 0 && c < H) {
    float v = s_half[o];
#pragma unroll
    for (int q = 1; q < kDownSplit; ++q) v += s_half[o + q * kDownOuts];
    h[c] = __ldcg(h + c) + v;
  }
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
  launch_kernel(true, router_topk_kernel, dim3(ceil_div(T, kRouterWarps)), dim3(kRouterWarps * 32),
                0, stream, logits, stride, T, E, k, idx, w);
}

size_t moe_router_workspace_bytes() {
  return 256;
}

void moe_router(const bf16* router, int E, int H, const float* h, const float* scale, float eps,
                int k, float* logits, int32_t* idx, float* w, bf16* x_out, void* workspace,
                cudaStream_t stream) {
  if (!router || !h || !scale || !logits || !idx || !w || !workspace)
    fail("cuda::moe_router: null pointer");
  if (E < 1 || E > kMaxE || k < 1 || k > E || k > kMaxK || H < 8 || H % 8 ||
      H > gemv_detail::kMaxCols)
    fail(
        "cuda::moe_router: unsupported E={} k={} H={} (E <= {}, k <= min(E, {}), H a multiple of 8 "
        "<= {})",
        E, k, H, kMaxE, kMaxK, gemv_detail::kMaxCols);
  if (!is_aligned(router, 16) || !is_aligned(h, 16) || !is_aligned(scale, 16) ||
      !is_aligned(x_out, 16))
    fail("cuda::moe_router: router, h, scale and x_out must be 16-byte aligned");
  gemv_detail::Params p;
  p.W = router;
  p.rows = E + 1;
  p.cols = H;
  p.h = h;
  p.scale = scale;
  p.eps = eps;
  p.y = logits;
  p.E = E;
  p.k = k;
  p.idx = idx;
  p.w = w;
  p.x_out = x_out;
  p.counter = static_cast<unsigned int*>(workspace);
  gemv_detail::dispatch_gemv<gemv_detail::kOutF32, true, gemv_detail::kEpiRouter>(p, stream);
}

void moe_gate_up_gemv(const bf16* gate_up, const bf16* shared_gate_up, const int32_t* idx, int k,
                      const bf16* x, int H, int I, int Is, bf16* act, cudaStream_t stream, int B) {
  if (B < 1 || B > 65535) fail("cuda::moe_gate_up_gemv: B = {}", B);
  if (!gate_up || !shared_gate_up || !idx || !x || !act)
    fail("cuda::moe_gate_up_gemv: null pointer");
  if (k < 1 || k > kMaxK || H < 8 || H % 8 || H > 16384 || I < 8 || I % 8 || Is < 8 || Is % 8)
    fail("cuda::moe_gate_up_gemv: unsupported k={} H={} I={} Is={}", k, H, I, Is);
  if (!is_aligned(gate_up, 16) || !is_aligned(shared_gate_up, 16) || !is_aligned(x, 16))
    fail("cuda::moe_gate_up_gemv: weights and x must be 16-byte aligned");
  const int bpe = ceil_div(I, kWarps);
  const int grid = k * bpe + ceil_div(Is, kWarps);
  launch_kernel(true, moe_gate_up_kernel, dim3(grid, B), dim3(kThreads), size_t(H) * 2, stream,
                gate_up, shared_gate_up, idx, k, x, H, I, Is, act, bpe,
                l2_prefetch_enabled() ? 1 : 0);
}

void moe_down_gemv(const bf16* down, const bf16* shared_down, const int32_t* idx, const float* w,
                   const float* shared_logit, const bf16* act, int k, int H, int I, int Is,
                   float* h, cudaStream_t stream, int B, int logit_stride) {
  if (B < 1 || B > 65535) fail("cuda::moe_down_gemv: B = {}", B);
  if (!down || !shared_down || !idx || !w || !shared_logit || !act || !h)
    fail("cuda::moe_down_gemv: null pointer");
  if (k < 1 || k > kMaxK || H < 1 || I < 8 || I % 8 || Is < 8 || Is % 8 || k * I + Is > 65536)
    fail("cuda::moe_down_gemv: unsupported k={} H={} I={} Is={}", k, H, I, Is);
  if (!is_aligned(down, 16) || !is_aligned(shared_down, 16) || !is_aligned(act, 16))
    fail("cuda::moe_down_gemv: weights and act must be 16-byte aligned");
  const size_t smem = size_t(k * I + Is) * 2;
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(moe_down_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_kernel(true, moe_down_kernel, dim3(ceil_div(H, kDownOuts), B), dim3(kThreads), smem,
                stream, down, shared_down, idx, w, shared_logit, act, k, H, I, Is, h,
                l2_prefetch_enabled() ? 1 : 0, logit_stride);
}

}  // namespace lilac::cuda
