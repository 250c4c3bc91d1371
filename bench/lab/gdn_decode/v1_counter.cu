// gdn_decode version 1, the counter kernel (lost to version 2, the cluster kernel of
// src/cuda/gated_deltanet_decode.cu; numbers in README.md). Moved here unchanged from
// src/cuda/gated_deltanet_decode.cu (as of 1507892): the kernel and its helper are the same code,
// the launcher keeps only this kernel's branch.
//
// 128 blocks of 2 Dk threads, grid (Dv/32, Hv), block (cb, v) owning value columns
// [32 cb, 32 cb + 32) of value head v. Every block recomputes the conv + l2norm of its key head's q
// and k; two cross-block steps go through "last block to arrive" counters in a global workspace:
// (1) the q/k conv-state shift of key head kh is written by the last of its Hv/Hk x Dv/32 readers;
// (2) the gated norm over the head's Dv/32 blocks is finished by the last block of the head, which
// reads the others' outputs and sums of squares back from the workspace. Each step costs a
// __threadfence (the block's writes reach L2), an atomic round trip and an L2 read by the last
// block: ~4 dependent L2 round trips on top of the state's DRAM round trip. Needs no clusters (any
// device); launched without PDL.
#include <algorithm>

#include "cuda/common.cuh"
#include "gdn_decode_lab.h"
#include "util/error.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::sigmoid;
using cuda::silu;
using cuda::warp_sum;

constexpr int kCols = 32;  // value columns per block

// Causal conv + SiLU of one channel for one new input x: rows [conv_state rows 0..KC-2, x].
// next[] receives what the channel's state becomes (rows 1..KC-2 and x).
template <int KC>
__device__ __forceinline__ float conv_silu(const float* __restrict__ conv_state,
                                           const float* __restrict__ taps, float x, int ch, int C,
                                           float (&next)[KC - 1]) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) {
    const float s = conv_state[size_t(j) * C + ch];
    acc += taps[size_t(ch) * KC + j] * s;
    if (j >= 1) next[j - 1] = s;
  }
  acc += taps[size_t(ch) * KC + KC - 1] * x;
  next[KC - 2] = x;
  return silu(acc);
}

// ---- version 1: cross-block steps through counters in global memory

template <int DK, int KC>
__global__ void __launch_bounds__(2 * DK)
    gdn_decode_counter_kernel(const float* __restrict__ proj, const float* __restrict__ taps,
                              float* __restrict__ conv_state, const float* __restrict__ neg_exp_A,
                              const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                              float* __restrict__ state, int Hk, int Hv, int Dv, float eps,
                              int* __restrict__ counters, float* __restrict__ o_ws,
                              float* __restrict__ ss_ws, bf16* __restrict__ out) {
  constexpr int NTH = 2 * DK, NW = NTH / 32;
  __shared__ __align__(16) float qs[DK];
  __shared__ __align__(16) float ks[DK];
  __shared__ __align__(16) float us[kCols];
  __shared__ float vs[kCols];
  __shared__ __align__(16) float red[NW][kCols];
  __shared__ float wsum[NW];
  __shared__ float s_beta, s_decay;
  __shared__ int s_last;

  const int cb = blockIdx.x, v = blockIdx.y, nsplit = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ratio = Hv / Hk, kh = v / ratio;
  const int C = 2 * Hk * DK + Hv * Dv;
  const int c0 = cb * kCols;
  const int cq = tid & 7, rg = tid >> 3;  // columns 4cq..4cq+3 (of 32), rows 4rg..4rg+3

  // 1. This thread's 4 x 4 slice of S, in flight while the rest is computed.
  float* Sp = state + (size_t(v) * DK + 4 * rg) * Dv + c0 + 4 * cq;
  float4 S[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) S[i] = *reinterpret_cast<const float4*>(Sp + size_t(i) * Dv);

  // 2. Conv + SiLU: thread tid < DK takes q channel tid of key head kh, the others k channel tid -
  // DK;
  //    threads < 32 also take v channel c0 + tid of value head v (owned by this block alone).
  const int qk_ch = tid < DK ? kh * DK + tid : Hk * DK + kh * DK + (tid - DK);
  float qk_next[KC - 1];
  const float qk_val = conv_silu<KC>(conv_state, taps, proj[qk_ch], qk_ch, C, qk_next);
  if (tid < kCols) {
    const int v_ch = 2 * Hk * DK + v * Dv + c0 + tid;
    float v_next[KC - 1];
    vs[tid] = conv_silu<KC>(conv_state, taps, proj[v_ch], v_ch, C, v_next);
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + v_ch] = v_next[r];
  }
  const float sq = warp_sum(qk_val * qk_val);
  if (lane == 0) wsum[warp] = sq;
  if (tid == 0) {
    const float* ba = proj + C + size_t(Hv) * Dv;  // b [Hv], then a [Hv]
    s_beta = sigmoid(ba[v]);
    const float x = ba[Hv + v] + dt_bias[v];
    s_decay = expf(neg_exp_A[v] * (x > 20.f ? x : log1pf(expf(x))));
  }
  __syncthreads();  // (A) every thread has consumed its conv-state reads; wsum, gates visible

  // 3. l2norm: q by (sum q^2 + 1e-6)^-1/2 * Dk^-1/2, k by (sum k^2 + 1e-6)^-1/2.
  float ssq = 0.f, ssk = 0.f;
#pragma unroll
  for (int w = 0; w < NW / 2; ++w) ssq += wsum[w], ssk += wsum[NW / 2 + w];
  if (tid < DK)
    qs[tid] = qk_val * (rsqrtf(ssq + 1e-6f) * rsqrtf(float(DK)));
  else
    ks[tid - DK] = qk_val * rsqrtf(ssk + 1e-6f);
  // The q/k conv state of key head kh: written by the last of its ratio * nsplit readers.
  if (tid == 0) {
    __threadfence();
    const bool last = atomicAdd(&counters[kh], 1) == ratio * nsplit - 1;
    if (last) __threadfence();
    s_last = last;
  }
  __syncthreads();  // (B) qs, ks, s_last visible
  if (s_last) {
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + qk_ch] = qk_next[r];
    if (tid == 0) counters[kh] = 0;
  }

  // 4. kS[c] = sum_i S[i][c] k[i]: 4 rows here, then over the 4 row groups of the warp (lanes
  //    cq + 8m), then over the warps in shared memory.
  const float decay = s_decay, beta = s_beta;
  const float4 k4 = *reinterpret_cast<const float4*>(&ks[4 * rg]);
  const float4 q4 = *reinterpret_cast<const float4*>(&qs[4 * rg]);
  const float kr[4] = {k4.x, k4.y, k4.z, k4.w}, qr[4] = {q4.x, q4.y, q4.z, q4.w};
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[0] += S[i].x * kr[i], a[1] += S[i].y * kr[i], a[2] += S[i].z * kr[i], a[3] += S[i].w * kr[i];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j] += __shfl_xor_sync(0xffffffffu, a[j], 8);
    a[j] += __shfl_xor_sync(0xffffffffu, a[j], 16);
  }
  if (lane < 8)
    *reinterpret_cast<float4*>(&red[warp][4 * cq]) = make_float4(a[0], a[1], a[2], a[3]);
  __syncthreads();  // (C)
  if (tid < kCols) {
    float kS = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) kS += red[w][tid];
    us[tid] = beta * (vs[tid] - decay * kS);  // u = beta (v - (e^g S)^T k)
  }
  __syncthreads();  // (D)

  // 5. S' = e^g S + k u^T (stored), o = S'^T q.
  const float4 u4 = *reinterpret_cast<const float4*>(&us[4 * cq]);
  float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    S[i].x = decay * S[i].x + kr[i] * u4.x;
    S[i].y = decay * S[i].y + kr[i] * u4.y;
    S[i].z = decay * S[i].z + kr[i] * u4.z;
    S[i].w = decay * S[i].w + kr[i] * u4.w;
    *reinterpret_cast<float4*>(Sp + size_t(i) * Dv) = S[i];
    o[0] += S[i].x * qr[i], o[1] += S[i].y * qr[i], o[2] += S[i].z * qr[i], o[3] += S[i].w * qr[i];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[j] += __shfl_xor_sync(0xffffffffu, o[j], 8);
    o[j] += __shfl_xor_sync(0xffffffffu, o[j], 16);
  }
  if (lane < 8)
    *reinterpret_cast<float4*>(&red[warp][4 * cq]) = make_float4(o[0], o[1], o[2], o[3]);
  __syncthreads();  // (E)

  // 6. Gated RMS norm over the head: out = w * o * rsqrt(mean(o^2) + eps) * silu(z).
  const float* z = proj + C + size_t(v) * Dv;
  bf16* outv = out + size_t(v) * Dv;
  if (warp == 0) {  // lanes = this block's 32 columns
    float ov = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) ov += red[w][lane];
    const float ss = warp_sum(ov * ov);
    if (nsplit == 1) {
      const float r = rsqrtf(ss / float(Dv) + eps);
      outv[lane] = __float2bfloat16_rn(norm_w[lane] * (ov * r) * silu(z[lane]));
    } else {
      o_ws[size_t(v) * Dv + c0 + lane] = ov;
      if (lane == 0) ss_ws[v * nsplit + cb] = ss;
    }
  }
  if (nsplit == 1) return;
  __syncthreads();  // (F)
  if (tid == 0) {
    __threadfence();
    const bool last = atomicAdd(&counters[Hk + v], 1) == nsplit - 1;
    if (last) __threadfence();
    s_last = last;
  }
  __syncthreads();  // (G)
  if (!s_last) return;
  float tot = 0.f;
  for (int c = 0; c < nsplit; ++c) tot += __ldcg(ss_ws + v * nsplit + c);
  const float r = rsqrtf(tot / float(Dv) + eps);
  for (int j = tid; j < Dv; j += NTH)
    outv[j] = __float2bfloat16_rn(norm_w[j] * (__ldcg(o_ws + size_t(v) * Dv + j) * r) * silu(z[j]));
  if (tid == 0) counters[Hk + v] = 0;
}

// Workspace layout (floats): counters [Hk + Hv] (ints, padded to 4), o [Hv * Dv], sum of squares
// [Hv * (Dv / 32)].
size_t counters_floats(int Hk, int Hv) {
  return size_t(Hk + Hv + 3) / 4 * 4;
}

template <int DK, int KC>
void launch(const GdnDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.Dv / kCols, a.Hv);
  int* counters = reinterpret_cast<int*>(a.workspace);
  float* o_ws = a.workspace + counters_floats(a.Hk, a.Hv);
  float* ss_ws = o_ws + size_t(a.Hv) * a.Dv;
  gdn_decode_counter_kernel<DK, KC>
      <<<grid, 2 * DK, 0, stream>>>(a.proj, a.taps, a.conv_state, a.neg_exp_A, a.dt_bias, a.norm_w,
                                    a.state, a.Hk, a.Hv, a.Dv, a.eps, counters, o_ws, ss_ws, a.out);
  LILAC_CUDA_LAUNCHED();
}

template <int DK>
void launch_k(const GdnDecodeArgs& a, cudaStream_t stream) {
  switch (a.K) {
    case 2:
      launch<DK, 2>(a, stream);
      break;
    case 3:
      launch<DK, 3>(a, stream);
      break;
    default:
      launch<DK, 4>(a, stream);
      break;
  }
}

}  // namespace

size_t gdn_decode_v1_workspace_floats(int Hk, int Hv, int Dv) {
  return counters_floats(Hk, Hv) + size_t(Hv) * Dv + size_t(Hv) * std::max(1, Dv / kCols);
}

void gdn_decode_v1_counter(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    fail("gdn_decode v1: {} value heads not a multiple of {} key heads", a.Hv, a.Hk);
  if (a.Dv <= 0 || a.Dv % kCols != 0)
    fail("gdn_decode v1: Dv {} not a multiple of {}", a.Dv, kCols);
  if (a.K < 2 || a.K > 4) fail("gdn_decode v1: conv kernel {} not supported (2..4)", a.K);
  if (!a.workspace) fail("gdn_decode v1: no workspace");
  switch (a.Dk) {
    case 32:
      launch_k<32>(a, stream);
      break;
    case 64:
      launch_k<64>(a, stream);
      break;
    case 128:
      launch_k<128>(a, stream);
      break;
    default:
      fail("gdn_decode v1: Dk {} not supported (32, 64, 128)", a.Dk);
  }
}

}  // namespace lilac::lab
