// Device building blocks of the 4/8-bit kernels (q4_linear.cu, q4_moe_decode.cu, q4_gemm.cu,
// q4_moe_prefill.cu), over the tiled layout of q4_layout.h. Included by .cu files only.
//
// Dequantisation without per-element conversions. A code word's nibble pair i (bits [4i, 4i+4)
// and [16 + 4i, 20 + 4i)) becomes a bf16x2 (128 + q_lo, 128 + q_hi) with one SHF and one LOP3
// ((w >> 4i) & 0x000F000F | 0x43004300: 0x4300 is 128.0 in bf16, whose 7 mantissa bits take
// the nibble). Two ways to use it:
//  * decode (q_set_dot): the pair goes into mma.sync as it is. The MMA multiplies the exact
//    (128 + q) by bf16 x (products exact in f32, f32 accumulation), and the offset is removed
//    per group in f32 with the group's x sum Sx (from one extra MMA with an all-ones A):
//        sum_k (s q_k + b) x_k = s * sum_k (128 + q_k) x_k + (b - 128 s) * Sx.
//    Scale and bias are applied once per (row, group), not per weight: ~7 integer/ALU
//    instructions per 8 weights plus one HMMA per 256 weight-products.
//  * prefill (QGemm mainloop): the weights are rebuilt as bf16 for a bf16 x bf16 MMA:
//        q = fma(128 + q, 1, -128)  (exact),  w = fma(q, s, b)  (fma.rn.bf16x2: one rounding),
//    so w = RNE_bf16(s q + b) exactly (twin: dequantize_row_bf16); 2 HFMA2 per pair,
//    amortised over the 128 tokens of the block.
// 8-bit codes are two nibble planes (q = lo + 16 hi): decode keeps a second accumulator for the
// high plane (C = C_lo + 16 C_hi, offset 2176 = 128 * 17), prefill rebuilds q = lo + 16 hi
// exactly in bf16 (<= 255) before the scale.
#pragma once

#include <cstdint>

#include "cuda/gemm.h"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_layout.h"
#include "cuda/vec_util.cuh"

namespace lilac::cuda::qtile {

using tile::mma_bf16_16816;

constexpr uint32_t kBf16x2One = 0x3F803F80u;      // (1.0, 1.0)
constexpr uint32_t kBf16x2Neg128 = 0xC300C300u;   // (-128, -128)
constexpr uint32_t kBf16x2Sixteen = 0x41804180u;  // (16, 16)
constexpr uint32_t kBf16x2Neg2048 = 0xC500C500u;  // (-2048, -2048)

// (w & 0x000F000F) | 0x43004300 as one LOP3 (immLut 0xEA = (a & b) | c).
__device__ __forceinline__ uint32_t magic128(uint32_t w) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "r"(0x000F000Fu), "r"(0x43004300u));
  return d;
}

// a * b + c on bf16x2, one rounding (round to nearest even).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// 16-byte weight load (non-coherent, no L1 allocation), 8-byte and 4-byte read-only loads.
__device__ __forceinline__ uint4 ld_w16(const uint32_t* p) {
  return ld_weights(p);
}
__device__ __forceinline__ uint2 ld_ro8(const uint32_t* p) {
  uint2 v;
  asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_ro4(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Shared-memory twins of the three loads (q_set_dot<..., kSmem = true>: weights a kernel staged
// with bulk copies, x staged by the block).
__device__ __forceinline__ uint4 lds16(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}
__device__ __forceinline__ uint2 lds8(const uint32_t* p) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}
__device__ __forceinline__ uint32_t lds4(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];"
               : "=r"(v)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int kb) {
  return kb == 0 ? v.x : kb == 1 ? v.y : kb == 2 ? v.z : v.w;  // kb is a compile-time constant
}

// ---- decode: one 8-group set of NT row tiles against x ----------------------------------------
//
// q_set_dot adds to y[nt][0] / y[nt][1] (rows g and g + 8 of tile nt, g = lane / 4) this lane's
// share of the dot products over the groups [8 set, 8 set + 8) ∩ [0, G): the groups 2t and 2t + 1
// of the set (t = lane % 4); a quad shuffle (xor 1, 2) completes the rows afterwards.
// MMA m (group 8 set + m), k16 block kb: A = the 16 rows x 16 columns of codes as (128 + q);
// B (16 x 8) has x of group m in column m and zeros elsewhere (lane (g, t) holds column g: its x
// when g == m), so C column m accumulates group m's sums for the 16 rows; after the set, lane
// (g, t) holds C[g][2t], C[g][2t + 1], C[g + 8][2t], C[g + 8][2t + 1]: exactly the (row, group)
// pairs whose scale and bias it loads (one 8-byte load per group: rows g and g + 8). One more
// MMA per kb with A = 1 gives Sx of every group of the set in the same positions.
// codes[nt] / sb[nt]: the tile's block (group 0, plane 0) in codes and sb.
// x: bf16 [64 G] (global memory, read through the non-coherent path; 4-byte aligned).
// kSmem: codes, sb and x are in shared memory instead (q4_gemv_staged.cu); same arithmetic.
template <int BITS, int NT, bool kSmem = false>
__device__ __forceinline__ void q_set_dot(const uint32_t* const (&codes)[NT],
                                          const uint32_t* const (&sb)[NT], int G, int set,
                                          const bf16* __restrict__ x, float (&y)[NT][2]) {
  constexpr int P = BITS / 4;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int grp0 = set * 8;
  const int ng = min(8, G - grp0);

  // All weight loads first: NT * 8 * P 16-byte loads (4 KB per tile and plane) in flight.
  uint4 cw[NT][8][P];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < 8; ++m)
#pragma unroll
      for (int p = 0; p < P; ++p)
      // Addresses are clamped to a valid group so a speculated load cannot fault.
      {
        const uint32_t* wp =
            codes[nt] + (size_t(grp0 + (m < ng ? m : 0)) * P + p) * kQBlockWords + lane * 4;
        cw[nt][m][p] = m < ng ? (kSmem ? lds16(wp) : ld_w16(wp)) : make_uint4(0, 0, 0, 0);
      }
  uint2 sbv[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int grp = grp0 + 2 * t + h;
      const uint32_t* sp = sb[nt] + size_t(grp < G ? grp : grp0) * kQSbWords + 2 * g;
      sbv[nt][h] = grp < G ? (kSmem ? lds8(sp) : ld_ro8(sp)) : make_uint2(0, 0);
    }
  // x of group grp0 + g at this lane's B positions: elements 16 kb + 2t (+1) and 16 kb + 2t + 8
  // (+1), i.e. 32-bit words 8 kb + t and 8 kb + t + 4 of the group.
  uint32_t X[4][2];
  {
    const bool has = g < ng;
    const uint32_t* xg = reinterpret_cast<const uint32_t*>(x) + size_t(grp0 + (has ? g : 0)) * 32;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      X[kb][0] = has ? (kSmem ? lds4(xg + 8 * kb + t) : ld_ro4(xg + 8 * kb + t)) : 0u;
      X[kb][1] = has ? (kSmem ? lds4(xg + 8 * kb + t + 4) : ld_ro4(xg + 8 * kb + t + 4)) : 0u;
    }
  }
  float sx[4] = {0.f, 0.f, 0.f, 0.f};
  {
    const uint32_t ones[4] = {kBf16x2One, kBf16x2One, kBf16x2One, kBf16x2One};
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) mma_bf16_16816(sx, ones, X[kb][0], X[kb][1]);
  }

#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float c[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p) c[p][0] = c[p][1] = c[p][2] = c[p][3] = 0.f;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      if (m < ng) {  // warp-uniform
        const bool mine = g == m;
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            const uint32_t w = word_of(cw[nt][m][p], kb);
            const uint32_t a[4] = {magic128(w), magic128(w >> 4), magic128(w >> 8),
                                   magic128(w >> 12)};
            mma_bf16_16816(c[p], a, mine ? X[kb][0] : 0u, mine ? X[kb][1] : 0u);
          }
      }
    }
    // Per (row, group): s * C + (b - offset * s) * Sx, offset 128 (4-bit) or 128 * 17 (8-bit,
    // C = C_lo + 16 C_hi).
    constexpr float kOffset = P == 1 ? 128.f : 2176.f;
    float cc[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) cc[q] = P == 1 ? c[0][q] : fmaf(16.f, c[P - 1][q], c[0][q]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // group 2t + h: C column 2t + h = c[h] (row g), c[2 + h]
      const float s0 = bf16_lo(sbv[nt][h].x), b0 = bf16_hi(sbv[nt][h].x);  // row g
      const float s1 = bf16_lo(sbv[nt][h].y), b1 = bf16_hi(sbv[nt][h].y);  // row g + 8
      y[nt][0] = fmaf(s0, cc[h], y[nt][0]);
      y[nt][0] = fmaf(fmaf(-kOffset, s0, b0), sx[h], y[nt][0]);
      y[nt][1] = fmaf(s1, cc[2 + h], y[nt][1]);
      y[nt][1] = fmaf(fmaf(-kOffset, s1, b1), sx[2 + h], y[nt][1]);
    }
  }
}

// Completes q_set_dot's row sums over the quad (lanes 4g .. 4g + 3), fixed order.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// ---- small M: one set of GS groups of NT row tiles against 8-token chunks ----------------------
//
// The tokens take the MMA's n dimension (q4_moe_small.cu, with x staged in shared memory; the
// register-only version 5 of q_gemv_rows, q_set_dot_tokens, is in the kernel lab:
// bench/lab/q_gemv_rows/v1_set_dot_tokens.cu): for group m of the set, A = the tile's codes as
// (128 + q), B = 8 tokens' x of that group (column n = token n), so C[row][token] is the group's
// partial dot and lane (g, t) owns rows g, g + 8 x tokens 2t, 2t + 1 of every chunk. The offset is
// removed per (row, group) in f32 with the tokens' group sums Sx (one MMA with an all-ones A), as
// in q_set_dot:
//     sum_k (s q_k + b) x_k = s * sum_k (128 + q_k) x_k + (b - 128 s) * Sx.
// The set's codes and scales are loaded first (NT * GS * P 16-byte loads per lane in flight) and
// held in registers while every chunk of 8 tokens uses them: each weight is read once per call,
// whatever the number of tokens.

// The weights of one set: NT row tiles x GS groups, this lane's codes (P planes) and its (row g,
// row g + 8) scale/bias pair of each group.
template <int BITS, int NT, int GS>
struct QSet {
  uint4 cw[NT][GS][BITS / 4];
  uint2 sbv[NT][GS];
};

// Loads the set's groups [grp0, grp0 + ng) of each tile (codes[nt] / sb[nt]: the tile's block at
// group 0, plane 0): NT * GS * P 16-byte loads per lane in flight at once.
template <int BITS, int NT, int GS>
__device__ __forceinline__ void load_qset(QSet<BITS, NT, GS>& w, const uint32_t* const (&codes)[NT],
                                          const uint32_t* const (&sb)[NT], int grp0, int ng) {
  constexpr int P = BITS / 4;
  const int lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < GS; ++m)
#pragma unroll
      for (int p = 0; p < P; ++p)
        // Addresses are clamped to a valid group so a speculated load cannot fault.
        w.cw[nt][m][p] =
            m < ng ? ld_w16(codes[nt] + (size_t(grp0 + (m < ng ? m : 0)) * P + p) * kQBlockWords +
                            lane * 4)
                   : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < GS; ++m)
      w.sbv[nt][m] = m < ng ? ld_ro8(sb[nt] + size_t(grp0 + (m < ng ? m : 0)) * kQSbWords + 2 * g)
                            : make_uint2(0, 0);
}

// Group m of a loaded set against 8 tokens' B fragments X (elements 16 kb + 2t (+1), 16 kb + 2t + 8
// (+1) of token g): adds to y[nt][0..3] (rows g, g + 8 x tokens 2t, 2t + 1) the group's dot
// products, the offset removed with the tokens' group sums (one MMA with an all-ones A).
template <int BITS, int NT, int GS>
__device__ __forceinline__ void q_group_dot(const QSet<BITS, NT, GS>& w, int m,
                                            const uint32_t (&X)[4][2], float (&y)[NT][4]) {
  constexpr int P = BITS / 4;
  constexpr float kOffset = P == 1 ? 128.f : 2176.f;
  const uint32_t ones[4] = {kBf16x2One, kBf16x2One, kBf16x2One, kBf16x2One};
  float sx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) mma_bf16_16816(sx, ones, X[kb][0], X[kb][1]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float c[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p) c[p][0] = c[p][1] = c[p][2] = c[p][3] = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        const uint32_t wd = word_of(w.cw[nt][m][p], kb);
        const uint32_t a[4] = {magic128(wd), magic128(wd >> 4), magic128(wd >> 8),
                               magic128(wd >> 12)};
        mma_bf16_16816(c[p], a, X[kb][0], X[kb][1]);
      }
    const float s0 = bf16_lo(w.sbv[nt][m].x), b0 = bf16_hi(w.sbv[nt][m].x);  // row g
    const float s1 = bf16_lo(w.sbv[nt][m].y), b1 = bf16_hi(w.sbv[nt][m].y);  // row g + 8
    const float o0 = fmaf(-kOffset, s0, b0), o1 = fmaf(-kOffset, s1, b1);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float cc = P == 1 ? c[0][q] : fmaf(16.f, c[P - 1][q], c[0][q]);
      const float sc = q < 2 ? s0 : s1, o = q < 2 ? o0 : o1;
      y[nt][q] = fmaf(sc, cc, y[nt][q]);
      y[nt][q] = fmaf(o, sx[q], y[nt][q]);
    }
  }
}

// ---- prefill: C^T = W X^T with W dequantised in registers ------------------------------------
//
// A block of 8 warps computes a tile of 256 weight rows x 128 tokens; warp w owns two 16-row
// tiles of W (its "A" operands: 32 rows) and all 128 tokens (16 n8 tiles: 128 f32 accumulators
// per thread). X [tokens, K] bf16 is staged k-tile by k-tile (64 columns = one quantization
// group) through a 4-stage cp.async pipeline into the 128-byte-swizzled layout of gemm_tile.cuh
// and read with ldmatrix.x4 (the B operand, exactly as gemm's W operand). W comes straight from
// global memory into registers (two 16-byte code loads and one 8-byte scale/bias load per tile
// and k-tile, prefetched two k-tiles ahead), is dequantised to bf16 fragments per k16 step and
// used for 16 n-tiles (32 MMAs per 2 dequantised words): each weight is read and dequantised
// once per block, and no weight ever goes through shared memory.
constexpr int kQThreads = 256;
constexpr int kQWarps = 8;
constexpr int kQTokens = 128;  // tokens per block tile
constexpr int kQRows = 256;    // weight rows per block tile (8 warps x 2 tiles of 16)
constexpr int kQStages = 4;
constexpr int kQStageElems = kQTokens * tile::kBK;
constexpr int kQSmemBytes = kQStages * kQStageElems * 2;  // 64 KB

struct XCfg {
  static constexpr int ROW_STEP = kQThreads / 8;  // 32 token rows per pass of the block
  static constexpr int LOADS = kQTokens / ROW_STEP;
};
using XRows = tile::RowSet<XCfg::LOADS>;

// The weights of one k-tile (= one group) for a warp's two row tiles.
template <int P>
struct WTile {
  uint4 c[2][P];
  uint2 sb[2];
};

template <int P>
__device__ __forceinline__ void load_wtile(WTile<P>& w, const uint32_t* const (&codes)[2],
                                           const uint32_t* const (&sb)[2], int kt, bool ok) {
  const int lane = threadIdx.x & 31;
  kt = ok ? kt : 0;  // a valid address even when the load is not wanted
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int p = 0; p < P; ++p)
      w.c[r][p] = ok ? ld_w16(codes[r] + (size_t(kt) * P + p) * kQBlockWords + lane * 4)
                     : make_uint4(0, 0, 0, 0);
    w.sb[r] = ok ? ld_ro8(sb[r] + size_t(kt) * kQSbWords + 2 * (lane >> 2)) : make_uint2(0, 0);
  }
}

// bf16 A fragments (rows g, g + 8 of tile r; k16 block kb) of the weights w = s q + b.
template <int P>
__device__ __forceinline__ void dequant_frag(const WTile<P>& w, int r, int kb, uint32_t (&a)[4]) {
  // (s, s) and (b, b) of rows g (.x) and g + 8 (.y).
  const uint32_t s_lo = __byte_perm(w.sb[r].x, 0, 0x1010), b_lo = __byte_perm(w.sb[r].x, 0, 0x3232);
  const uint32_t s_hi = __byte_perm(w.sb[r].y, 0, 0x1010), b_hi = __byte_perm(w.sb[r].y, 0, 0x3232);
  const uint32_t w0 = word_of(w.c[r][0], kb);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t q = fma_bf16x2(magic128(w0 >> (4 * i)), kBf16x2One, kBf16x2Neg128);  // exact
    if constexpr (P == 2) {
      const uint32_t hi = fma_bf16x2(magic128(word_of(w.c[r][1], kb) >> (4 * i)), kBf16x2Sixteen,
                                     kBf16x2Neg2048);  // 16 hi, exact
      q = fma_bf16x2(q, kBf16x2One, hi);               // lo + 16 hi <= 255: exact
    }
    a[i] = (i & 1) ? fma_bf16x2(q, s_hi, b_hi) : fma_bf16x2(q, s_lo, b_lo);
  }
}

// acc[r][n][*] += W tile r (16 rows) x X tile (128 tokens) over K (a multiple of 64).
// codes[r] / sb[r]: tile r's (group 0) block (a valid tile even when the warp is inactive);
// warp_active false: the warp loads and computes nothing (its rows are past the matrix).
// Accumulator layout: acc[r][n][0..1]: row 16 r + g, tokens 8 n + 2t + {0, 1};
// acc[r][n][2..3]: row 16 r + g + 8, the same tokens. `smem`: kQSmemBytes, 1024-byte aligned.
// token_pairs (1..8, block-uniform): only tokens 0 .. 16 token_pairs - 1 hold data; the MMAs of
// the others are skipped and their accumulators stay 0. A grouped MoE tile of a short prompt
// holds ~8 tokens of its expert: without this it computes all 128 (16x the useful MMAs).
// Leaves no cp.async in flight and ends with a barrier (the smem may be reused afterwards).
template <int BITS>
__device__ __forceinline__ void q_gemm_mainloop(float (&acc)[2][16][4],
                                                const uint32_t* const (&codes)[2],
                                                const uint32_t* const (&sb)[2], bool warp_active,
                                                const XRows& xrows, int K, bf16* smem,
                                                int token_pairs = 8) {
  constexpr int P = BITS / 4;
  constexpr int S = kQStages;
  const uint32_t sX = tile::smem_u32(smem);
  const int KT = K / tile::kBK;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 16; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) tile::load_operand<XCfg>(xrows, sX + uint32_t(s * kQStageElems * 2), s, K);
    tile::cp_async_commit();
  }
  WTile<P> cur, nxt;
  load_wtile<P>(cur, codes, sb, 0, warp_active);
  load_wtile<P>(nxt, codes, sb, 1, warp_active && KT > 1);
  tile::cp_async_wait<S - 2>();
  __syncthreads();

  const int lane = threadIdx.x & 31;
  // ldmatrix.x4 of two n8 tiles (tokens 16 jj .. 16 jj + 15) at k16 block kb (gemm_tile.cuh's
  // B-operand addressing): lanes 0-7 rows 0-7 chunk 2kb, 8-15 rows 0-7 chunk 2kb + 1, 16-23 rows
  // 8-15 chunk 2kb, 24-31 rows 8-15 chunk 2kb + 1.
  const uint32_t b_row_off = uint32_t(((lane & 7) + ((lane >> 4) << 3)) * 128);
  const int b_hi = (lane >> 3) & 1;
  const int sw = lane & 7;

  int read_stage = 0, write_stage = S - 1;
  for (int kt = 0; kt < KT; ++kt) {
    if (kt + S - 1 < KT)
      tile::load_operand<XCfg>(xrows, sX + uint32_t(write_stage * kQStageElems * 2), kt + S - 1, K);
    tile::cp_async_commit();

    if (warp_active) {
      const uint32_t b_base = sX + uint32_t(read_stage * kQStageElems * 2) + b_row_off;
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t a[2][4];
        dequant_frag<P>(cur, 0, kb, a[0]);
        dequant_frag<P>(cur, 1, kb, a[1]);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          if (jj >= token_pairs) break;  // uniform over the block
          uint32_t bfr[4];
          tile::ldmatrix_x4(
              bfr, b_base + uint32_t(jj * 16 * 128) + uint32_t(((2 * kb + b_hi) ^ sw) << 4));
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            mma_bf16_16816(acc[r][2 * jj], a[r], bfr[0], bfr[1]);
            mma_bf16_16816(acc[r][2 * jj + 1], a[r], bfr[2], bfr[3]);
          }
        }
      }
    }
    cur = nxt;
    load_wtile<P>(nxt, codes, sb, kt + 2, warp_active && kt + 2 < KT);

    // Groups issued: tiles 0 .. kt + S - 1; S - 2 pending => tiles 0 .. kt + 1 landed.
    tile::cp_async_wait<S - 2>();
    __syncthreads();
    read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
  }
  tile::cp_async_wait<0>();
}

// ---- the 4-bit prefill GEMMs' block order and stores (q4_gemm.cu and q4_gemm_wgmma.cuh) -------

// Block bid -> (token tile tm, row tile tn), kGroupM token tiles per raster group, so that blocks
// running together share their token tiles and weight tiles in L2: the BF16 GEMM's order
// (gemm_tile.cuh).
using tile::raster;

// One output element in the GEMM's mode: bf16 store, f32 add, or f32 store.
template <GemmOut MODE>
__device__ __forceinline__ void store_one(void* C, size_t off, float v) {
  if constexpr (MODE == GemmOut::StoreBF16)
    static_cast<bf16*>(C)[off] = __float2bfloat16_rn(v);
  else if constexpr (MODE == GemmOut::AccumulateF32)
    static_cast<float*>(C)[off] += v;
  else
    static_cast<float*>(C)[off] = v;
}

}  // namespace lilac::cuda::qtile
