// The per-block arithmetic the two Gated DeltaNet decode kernels share: the single-row cluster
// kernel (gated_deltanet_decode.cu) and the batched state pass (gated_deltanet_decode_batch.cu).
// A block of 2 Dk threads (NW warps) owns kCols = 32 value columns of one value head; thread
// (rg = tid / 8, cq = tid % 8) holds S rows 4rg..4rg+3 x columns 4cq..4cq+3 in registers. Both
// kernels run these steps in this order, which is what makes their outputs and states equal bit
// for bit (tests/cuda/batch_kernels_test.cpp).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/vec_util.cuh"

namespace lilac::cuda::gdn {

constexpr int kCols = 32;  // value columns per block

// The recurrent state's storage (model/state_format.h): f32, or bf16 rounded to nearest even at
// each store; the arithmetic is f32 either way. Four consecutive columns of one row: 16 bytes in
// f32, 8 in bf16 (the columns 4cq..4cq+3 start at a multiple of 4 elements: aligned).
__device__ __forceinline__ float4 load_state4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load_state4(const bf16* p) {
  const uint2 r = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store_state4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ void store_state4(bf16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 r;
  r.x = *reinterpret_cast<const uint32_t*>(&a);
  r.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = r;
}
// A batch row's recurrent state in the format ST.
template <class ST>
__device__ __forceinline__ ST* row_state(const DecodeBatchRow& r);
template <>
__device__ __forceinline__ float* row_state<float>(const DecodeBatchRow& r) {
  return r.rec;
}
template <>
__device__ __forceinline__ bf16* row_state<bf16>(const DecodeBatchRow& r) {
  return r.rec_bf16;
}
// One element (the prefill state kernel's loads and stores).
__device__ __forceinline__ float load_state1(const float* p) {
  return *p;
}
__device__ __forceinline__ float load_state1(const bf16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void store_state1(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_state1(bf16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

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

// A thread's 4 column partials summed over the warp's 4 row groups (lanes cq + 8m) and parked in
// red[warp][4 cq..4 cq + 3] by lanes 0..7; the caller's block barrier makes them visible.
__device__ __forceinline__ void warp_columns_to_smem(float (&a)[4], float (*red)[kCols], int warp,
                                                     int lane, int cq) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j] += __shfl_xor_sync(0xffffffffu, a[j], 8);
    a[j] += __shfl_xor_sync(0xffffffffu, a[j], 16);
  }
  if (lane < 8)
    *reinterpret_cast<float4*>(&red[warp][4 * cq]) = make_float4(a[0], a[1], a[2], a[3]);
}

// kS[c] = sum_i S[i][c] k[i] for the thread's 4 columns: its 4 rows, then the warp's row groups,
// then the NW warps through red in warp order (one block barrier). kr: the thread's 4 rows of the
// normalised k.
template <int NW>
__device__ __forceinline__ float4 column_kS(const float4 (&S)[4], const float (&kr)[4],
                                            float (*red)[kCols], int warp, int lane, int cq) {
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[0] += S[i].x * kr[i], a[1] += S[i].y * kr[i], a[2] += S[i].z * kr[i], a[3] += S[i].w * kr[i];
  warp_columns_to_smem(a, red, warp, lane, cq);
  __syncthreads();
  float4 kS = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const float4 r4 = *reinterpret_cast<const float4*>(&red[w][4 * cq]);
    kS.x += r4.x, kS.y += r4.y, kS.z += r4.z, kS.w += r4.w;
  }
  return kS;
}

// u = beta (v - e^g S^T k) for the thread's 4 columns (v4: its 4 columns of v).
__device__ __forceinline__ float4 delta_u(float4 kS, float4 v4, float beta, float decay) {
  return make_float4(beta * (v4.x - decay * kS.x), beta * (v4.y - decay * kS.y),
                     beta * (v4.z - decay * kS.z), beta * (v4.w - decay * kS.w));
}

// S' = e^g S + k u^T, stored in place at Sp (row i at Sp + i Dv), and o = S'^T q: the thread's
// partials summed over the warp into red2, then one block barrier; block_o gives a column's o.
// o is computed from the f32 S' (what a bf16 store rounds is the state the next step starts
// from, not this step's output).
template <class ST>
__device__ __forceinline__ void update_store_o(float4 (&S)[4], const float (&kr)[4],
                                               const float (&qr)[4], float4 u4, float decay, ST* Sp,
                                               int Dv, float (*red2)[kCols], int warp, int lane,
                                               int cq) {
  float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    S[i].x = decay * S[i].x + kr[i] * u4.x;
    S[i].y = decay * S[i].y + kr[i] * u4.y;
    S[i].z = decay * S[i].z + kr[i] * u4.z;
    S[i].w = decay * S[i].w + kr[i] * u4.w;
    store_state4(Sp + size_t(i) * Dv, S[i]);
    o[0] += S[i].x * qr[i], o[1] += S[i].y * qr[i], o[2] += S[i].z * qr[i], o[3] += S[i].w * qr[i];
  }
  warp_columns_to_smem(o, red2, warp, lane, cq);
  __syncthreads();
}

// Column `lane` of the block's o: the NW warps' partials in warp order.
template <int NW>
__device__ __forceinline__ float block_o(const float (*red2)[kCols], int lane) {
  float ov = 0.f;
#pragma unroll
  for (int w = 0; w < NW; ++w) ov += red2[w][lane];
  return ov;
}

}  // namespace lilac::cuda::gdn
