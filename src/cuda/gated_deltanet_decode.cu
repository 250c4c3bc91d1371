// Gated DeltaNet decode: one token, one fused kernel per layer.
//
// Bytes at the real shapes (Hk 16, Hv 32, Dk = Dv = 128, C = 8192, K = 4): the recurrent state,
// 32 x 128 x 128 f32 = 2 MiB, read and written once (4 MiB); proj 48 KiB; conv state 96 KiB read,
// 96 KiB written; taps 128 KiB. ~4.4 MB -> 1.0 us at 4.3 TB/s. FLOPs ~ 4 * 2 MiB/4 * 2 = 4 MFLOP
// (nothing). The floor is DRAM latency + one pass over the state: aim ~3 us.
//
// Design: grid (Dv / 32, Hv) = 128 blocks of 2 * Dk = 256 threads; block (cb, v) owns value columns
// [32 cb, 32 cb + 32) of value head v (the columns of S evolve independently). Thread (rg, cq)
// holds S rows 4rg..4rg+3 x columns 4cq..4cq+3 (four 16-byte loads, issued first so that DRAM
// latency overlaps the rest). Each block recomputes the conv + SiLU + l2norm of its key head's q
// and k (2 x Dk channels; cheaper than a separate kernel launch, ~1.5 us in a graph) and of its own
// 32 v channels, and the gates. S^T k and S'^T q are reduced over rows with shuffles and one
// shared-memory pass; u = beta (v - e^g S^T k); S' = e^g S + k u^T is written back in place. Two
// cross-block steps, each by the "last block to arrive" on a counter in the workspace (atomicAdd
// after a __threadfence; the last block resets the counter, so the workspace stays zero between
// launches):
//  - the conv state of the q/k channels of key head kh is read by the Hv/Hk x (Dv/32) blocks of kh;
//    the last of them to finish reading writes the shifted state (a block's v channels are its own
//    and are updated at once);
//  - the gated RMS norm needs the mean square of o over the whole head: each block stores its 32
//    values of o and their sum of squares; the last block of head v normalises all Dv columns.
// With Dv = 32 (one block per head) the norm is done in the block.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/gated_deltanet.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

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

template <int DK, int KC>
__global__ void __launch_bounds__(2 * DK)
    gdn_decode_kernel(const float* __restrict__ proj, const float* __restrict__ taps,
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
void launch_gdn_decode(const float* proj, const float* taps, float* conv_state,
                       const float* neg_exp_A, const float* dt_bias, const float* norm_w,
                       float* state, int Hk, int Hv, int Dv, float eps, float* ws, bf16* out,
                       cudaStream_t stream) {
  int* counters = reinterpret_cast<int*>(ws);
  float* o_ws = ws + counters_floats(Hk, Hv);
  float* ss_ws = o_ws + size_t(Hv) * Dv;
  gdn_decode_kernel<DK, KC><<<dim3(Dv / kCols, Hv), 2 * DK, 0, stream>>>(
      proj, taps, conv_state, neg_exp_A, dt_bias, norm_w, state, Hk, Hv, Dv, eps, counters, o_ws,
      ss_ws, out);
  LILAC_CUDA_LAUNCHED();
}

template <int DK>
void launch_gdn_decode_k(int K, const float* proj, const float* taps, float* conv_state,
                         const float* neg_exp_A, const float* dt_bias, const float* norm_w,
                         float* state, int Hk, int Hv, int Dv, float eps, float* ws, bf16* out,
                         cudaStream_t stream) {
  switch (K) {
    case 2:
      launch_gdn_decode<DK, 2>(proj, taps, conv_state, neg_exp_A, dt_bias, norm_w, state, Hk, Hv,
                               Dv, eps, ws, out, stream);
      break;
    case 3:
      launch_gdn_decode<DK, 3>(proj, taps, conv_state, neg_exp_A, dt_bias, norm_w, state, Hk, Hv,
                               Dv, eps, ws, out, stream);
      break;
    default:
      launch_gdn_decode<DK, 4>(proj, taps, conv_state, neg_exp_A, dt_bias, norm_w, state, Hk, Hv,
                               Dv, eps, ws, out, stream);
      break;
  }
}

}  // namespace

size_t gdn_decode_workspace_floats(int Hk, int Hv, int Dv) {
  return counters_floats(Hk, Hv) + size_t(Hv) * Dv + size_t(Hv) * std::max(1, Dv / kCols);
}

void gdn_decode_workspace_init(float* workspace, int Hk, int Hv, int Dv, cudaStream_t stream) {
  LILAC_CUDA_CHECK(cudaMemsetAsync(
      workspace, 0, gdn_decode_workspace_floats(Hk, Hv, Dv) * sizeof(float), stream));
}

void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, float* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace, bf16* out,
                cudaStream_t stream) {
  if (Hk <= 0 || Hv % Hk != 0)
    fail("gdn_decode: {} value heads not a multiple of {} key heads", Hv, Hk);
  if (Dv <= 0 || Dv % kCols != 0) fail("gdn_decode: Dv {} not a multiple of {}", Dv, kCols);
  if (K < 2 || K > 4) fail("gdn_decode: conv kernel {} not supported (2..4)", K);
  switch (Dk) {
    case 32:
      launch_gdn_decode_k<32>(K, proj, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state,
                              Hk, Hv, Dv, eps, workspace, out, stream);
      break;
    case 64:
      launch_gdn_decode_k<64>(K, proj, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state,
                              Hk, Hv, Dv, eps, workspace, out, stream);
      break;
    case 128:
      launch_gdn_decode_k<128>(K, proj, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale,
                               state, Hk, Hv, Dv, eps, workspace, out, stream);
      break;
    default:
      fail("gdn_decode: Dk {} not supported (32, 64, 128)", Dk);
  }
}

}  // namespace lilac::cuda
