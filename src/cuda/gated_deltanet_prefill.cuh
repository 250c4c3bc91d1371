// The Gated DeltaNet prefill's state-pass pieces: the chunk length, the columns a state block
// carries, the 3xTF32 tensor-core helpers and the sequential loop's steps, used by
// gdn_state_kernel (gated_deltanet_prefill.cu, whose header comment gives the chunked maths).
//
// mma.sync m16n8k8 tf32 (f32 accumulation). Every product runs as 3xTF32: x = hi + lo with
// hi = tf32(x), lo = tf32(x - hi), and A B ~ A_lo B_hi + A_hi B_lo + A_hi B_hi (the dropped
// lo*lo term is ~2^-22 relative): f32-level accuracy, which the state needs (it is carried through
// the whole sequence; the tests hold it to 1e-4 of its scale against the token recurrence).
// Fragments (lane = 4 g + t):  A (16x8): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4],
// a3 = A[g+8][t+4];  B (8x8): b0 = B[t][g], b1 = B[t+4][g];  C (16x8): c0 = C[g][2t],
// c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1].
// The reduction index of a product may be permuted freely if A and B agree. Taking logical k = t
// to be physical 2t and k = t + 4 to be 2t + 1 (within each group of 8), an accumulator tile
// (c0, c2, c1, c3) IS an A operand tile over its column index (a_from_acc): S^T and U^T stay in
// registers as accumulators and feed the next products with no shared-memory round trip (B then
// reads physical rows/columns 2t and 2t + 1: one float2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_mma.cuh"
#include "cuda/common.h"
#include "cuda/gated_deltanet_step.cuh"

namespace lilac::cuda::gdn_chunked {

constexpr int kBT = 64;     // chunk length
constexpr int kColsB = 32;  // value columns per state block

// tf32(x) (cvt.rna.tf32.f32: to nearest, ties away from zero) for a finite x in two integer
// operations: add half a tf32 ulp to the magnitude bits, clear the 13 low bits (an infinity maps
// to itself). ptxas expands cvt.rna itself into these two plus an |x| < inf test and a select:
// s29's ncu of gdn_state_kernel found those tests and selects at ~22% of its instructions
// (FSETP 14.4%, SEL 7.2%), with the tensor-core instructions at 8%.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
// x = hi + lo. lo keeps its 13 low bits: mma.sync reads only the tf32 bits of a .tf32 operand, so
// rounding lo needs only the add (ptxas's own expansion of cvt.rna feeds lo to the mma unmasked
// the same way). For a finite x the mma sees the same operand bits as with cvt.rna.
// TRUNC (s32; the state pass under LILAC_GDN_TF32_SPLIT=trunc): hi truncated, not rounded. x
// itself is then hi's operand (the mma drops its low 13 bits) and lo = x - (x with those bits
// cleared), exact, passed unrounded: 2 instructions instead of 4. Different bits: |lo| < 2^-10 |x|
// instead of 2^-11 and lo truncated by the mma, so a product's error is ~2^-20 of it, not ~2^-22.
template <bool TRUNC = false>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  if constexpr (TRUNC) {
    hi = __float_as_uint(x);
    lo = __float_as_uint(x - __uint_as_float(hi & 0xffffe000u));
  } else {
    hi = tf32_bits(x);
    lo = __float_as_uint(x - __uint_as_float(hi)) + 0x1000u;
  }
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A operand (hi, lo) from an accumulator tile c[4] under the permutation above.
template <bool TRUNC = false>
__device__ __forceinline__ void a_from_acc(const float (&c)[4], uint32_t (&hi)[4],
                                           uint32_t (&lo)[4]) {
  split_tf32<TRUNC>(c[0], hi[0], lo[0]);
  split_tf32<TRUNC>(c[2], hi[1], lo[1]);
  split_tf32<TRUNC>(c[1], hi[2], lo[2]);
  split_tf32<TRUNC>(c[3], hi[3], lo[3]);
}
// d += A B in 3xTF32, B given as its two f32 values.
template <bool TRUNC = false>
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4],
                                     const uint32_t (&al)[4], float b0, float b1) {
  uint32_t bh0, bl0, bh1, bl1;
  split_tf32<TRUNC>(b0, bh0, bl0);
  split_tf32<TRUNC>(b1, bh1, bl1);
  mma_tf32(d, al, bh0, bh1);
  mma_tf32(d, ah, bl0, bl1);
  mma_tf32(d, ah, bh0, bh1);
}

// ---- gdn_state_kernel's sequential loop in pieces (256 loop threads: 8 warps, warp w = m-tile
// mt = w & 1 (columns 16 mt .. + 15 of the block's 32) x Dk quarter dq = w >> 1).
// A lane's state tiles s[j], j < Dk / 32: S^T over Dk rows Dk/4 dq + 8 j + (2t, 2t+1), columns
// colA (s[j][0], s[j][1]) and colB = colA + 8 (s[j][2], s[j][3]); S0 = the block's first column of
// its value head's state [Dk, Dv].
template <int DK, class ST>
__device__ __forceinline__ void load_state_tiles(const ST* S0, int Dv, int dq, int t, int colA,
                                                 int colB, float (&s)[DK / 32][4]) {
  constexpr int KQ = DK / 4;
#pragma unroll
  for (int j = 0; j < DK / 32; ++j) {
    const int r = KQ * dq + 8 * j + 2 * t;
    s[j][0] = gdn::load_state1(S0 + size_t(r) * Dv + colA);
    s[j][1] = gdn::load_state1(S0 + size_t(r + 1) * Dv + colA);
    s[j][2] = gdn::load_state1(S0 + size_t(r) * Dv + colB);
    s[j][3] = gdn::load_state1(S0 + size_t(r + 1) * Dv + colB);
  }
}
template <int DK, class ST>
__device__ __forceinline__ void store_state_tiles(ST* S0, int Dv, int dq, int t, int colA, int colB,
                                                  const float (&s)[DK / 32][4]) {
  constexpr int KQ = DK / 4;
#pragma unroll
  for (int j = 0; j < DK / 32; ++j) {
    const int r = KQ * dq + 8 * j + 2 * t;
    gdn::store_state1(S0 + size_t(r) * Dv + colA, s[j][0]);
    gdn::store_state1(S0 + size_t(r + 1) * Dv + colA, s[j][1]);
    gdn::store_state1(S0 + size_t(r) * Dv + colB, s[j][2]);
    gdn::store_state1(S0 + size_t(r + 1) * Dv + colB, s[j][3]);
  }
}

// One head's Dk-wide rows of the chunk starting at token t0 into shared memory (dst [64][STRIDE]),
// from src + t * row_stride + head_offset, by NTHREADS threads (this one: tid); rows past T: zeros.
template <int DK, int STRIDE, int NTHREADS>
__device__ __forceinline__ void copy_head_rows(float* dst, const float* src, size_t row_stride,
                                               size_t head_offset, int t0, int T, int tid) {
  using attn::cp_async16;
  using attn::smem_addr;
  for (int e = tid; e < 64 * (DK / 4); e += NTHREADS) {
    const int r = e / (DK / 4), i4 = e % (DK / 4), tt = t0 + r;
    const bool ok = tt < T;
    cp_async16(smem_addr(dst + r * STRIDE + 4 * i4),
               ok ? src + size_t(tt) * row_stride + head_offset + 4 * i4 : src, ok ? 16 : 0);
  }
}

// The loop's per-chunk copies of K~ (the key head's rows, [64][KPK]), this block's 32 columns of
// U~ ([64][UP], from vb) and G ([64]) for chunk c, by the 256 loop threads (rows past T: zeros).
template <int DK, int KPK, int UP>
__device__ __forceinline__ void load_k_u_g(int tid, int c, int T, int NC, const float* kn,
                                           size_t rowQ, int kh, const float* vb, size_t rowV, int v,
                                           int Dv, int c0, const float* Gc, float* Ks, float* Ut,
                                           float* Gs) {
  using attn::cp_async16;
  using attn::smem_addr;
  const int t0 = c * kBT;
  copy_head_rows<DK, KPK, 256>(Ks, kn, rowQ, size_t(kh) * DK, t0, T, tid);
  for (int e = tid; e < 64 * 8; e += 256) {
    const int r = e >> 3, i4 = e & 7, tt = t0 + r;
    const bool ok = tt < T;
    cp_async16(smem_addr(Ut + r * UP + 4 * i4),
               ok ? vb + size_t(tt) * rowV + size_t(v) * Dv + c0 + 4 * i4 : vb, ok ? 16 : 0);
  }
  if (tid < 16) cp_async16(smem_addr(Gs + 4 * tid), Gc + (size_t(v) * NC + c) * kBT + 4 * tid, 16);
}

// Step 1 of a chunk: this lane's partial X^T = S^T B^T over its Dk quarter for the NT 8-row
// tiles of B (the rows of W, then of Q where NT = 16; [8 NT][KPW] in shared memory): x[n] for B
// rows 8n .. 8n+7, the accumulators of s as A operands (a_from_acc), B read as float2.
template <int DK, int NT, int KPW, bool TRUNC>
__device__ __forceinline__ void state_partials(const float (&s)[DK / 32][4], const float* B, int dq,
                                               int g, int t, float (&x)[NT][4]) {
  constexpr int KQ = DK / 4;
#pragma unroll
  for (int n = 0; n < NT; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.f;
#pragma unroll
  for (int j = 0; j < DK / 32; ++j) {
    uint32_t ah[4], al[4];
    a_from_acc<TRUNC>(s[j], ah, al);
    const float* brow = B + g * KPW + KQ * dq + 8 * j + 2 * t;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float2 b = *reinterpret_cast<const float2*>(brow + 8 * n * KPW);
      mma3<TRUNC>(x[n], ah, al, b.x, b.y);
    }
  }
}

// U^T = U~^T - (W S)^T for this lane: tiles u[n] over chunk rows 8n + (2t, 2t+1), columns colA,
// colB, from the four Dk quarters' partials of W S (part[((mt * 4 + dq) * NT + n) * 32 + lane],
// NT partial tiles per warp, the first 8 for W), summed in quarter order (so the four warps of an
// m-tile get the same bits), and U~ (Ut [64][UP]).
template <int NT, int UP>
__device__ __forceinline__ void u_from_partials(const float4* part, int mt, int lane, int t,
                                                const float* Ut, int colA, int colB,
                                                float (&u)[8][4]) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    float4 w4 = part[((mt * 4 + 0) * NT + n) * 32 + lane];
#pragma unroll
    for (int q = 1; q < 4; ++q) {
      const float4 p4 = part[((mt * 4 + q) * NT + n) * 32 + lane];
      w4.x += p4.x, w4.y += p4.y, w4.z += p4.z, w4.w += p4.w;
    }
    const int r = 8 * n + 2 * t;
    u[n][0] = Ut[r * UP + colA] - w4.x;
    u[n][1] = Ut[(r + 1) * UP + colA] - w4.y;
    u[n][2] = Ut[r * UP + colB] - w4.z;
    u[n][3] = Ut[(r + 1) * UP + colB] - w4.w;
  }
}

// The chunk's state update, S^T = e^{G_L} S^T + (U e^{G_L - G})^T K~[:, quarter], from this lane's
// U^T tiles u[n] (chunk rows 8n + (2t, 2t+1), columns colA, colB), G (Gs, GL = G_63) and K~ (Ks).
template <int DK, int KPK, bool TRUNC>
__device__ __forceinline__ void update_state(float (&s)[DK / 32][4], const float (&u)[8][4],
                                             const float* Gs, const float* Ks, float GL, int dq,
                                             int g, int t) {
  constexpr int KQ = DK / 4;
  const float eGL = expf(GL);
#pragma unroll
  for (int j = 0; j < DK / 32; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] *= eGL;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int r = 8 * ks + 2 * t;
    const float d0 = expf(GL - Gs[r]), d1 = expf(GL - Gs[r + 1]);
    const float ud[4] = {u[ks][0] * d0, u[ks][1] * d1, u[ks][2] * d0, u[ks][3] * d1};
    uint32_t ah[4], al[4];
    a_from_acc<TRUNC>(ud, ah, al);
    const float* k0 = Ks + r * KPK + KQ * dq + g;
#pragma unroll
    for (int j = 0; j < DK / 32; ++j) mma3<TRUNC>(s[j], ah, al, k0[8 * j], k0[KPK + 8 * j]);
  }
}

}  // namespace lilac::cuda::gdn_chunked
