// Device pieces of the rows kernel (q4_gemv_rows.cu: the 4/8-bit projections over a batch's token
// rows), over q4_tile.cuh's register sets. Included by .cu files only.
#pragma once

#include <cstdint>

#include "cuda/q4_tile.cuh"

namespace lilac::cuda::qtile {

// Group `grp` of a tile into slot m of a one-tile register set (codes: the tile's block at group 0,
// plane 0; sb: its scale/bias block). Volatile: issued where written (before pdl_wait for a
// kernel's first set, in the middle of the previous set for the others), not sunk towards the
// first use. The rows kernel's (q4_gemv_rows.cu) way to load.
template <int BITS, int GS>
__device__ __forceinline__ void load_group(QSet<BITS, 1, GS>& w, int m, const uint32_t* codes,
                                           const uint32_t* sb, int grp) {
  constexpr int P = BITS / 4;
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int p = 0; p < P; ++p)
    w.cw[0][m][p] = ld_weights<true>(codes + (size_t(grp) * P + p) * kQBlockWords + lane * 4);
  const uint32_t* q = sb + size_t(grp) * kQSbWords + 2 * (lane >> 2);
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];"
               : "=r"(w.sbv[0][m].x), "=r"(w.sbv[0][m].y)
               : "l"(q));
}

// A warp's 16-row tile of W: its code blocks (group 0, plane 0) and scale/bias blocks.
template <int BITS>
struct TileRef {
  const uint32_t* codes;
  const uint32_t* sb;
  __device__ __forceinline__ TileRef(const QMatrix& W, int tile)
      : codes(W.codes + size_t(tile) * W.groups() * (BITS / 4) * kQBlockWords),
        sb(W.sb + size_t(tile) * W.groups() * kQSbWords) {}
};

// Groups [g0, g0 + ng) of a tile into slots 0 .. ng - 1 of a register set (ng <= GS), all
// requested at once (a kernel's first set, before its wait).
template <int BITS, int GS>
__device__ __forceinline__ void load_set(QSet<BITS, 1, GS>& w, const TileRef<BITS>& t, int g0,
                                         int ng) {
#pragma unroll
  for (int m = 0; m < GS; ++m)
    if (m < ng) load_group(w, m, t.codes, t.sb, g0 + m);
}

// ---- the group step
//
// One group of a warp's 16-row tile against chunks of 8 tokens whose x rows (bf16) sit in shared
// memory, read by ldmatrix.x4: the A fragments rebuilt once per group, then per chunk four product
// MMAs and, where the caller takes the group sums from MMAs, four with an all-ones A.

// The offset the rows kernel removes per group with the tokens' group sums: the 4-bit A is 128 + q
// (no conversion), the 8-bit A is q itself.
template <int BITS>
constexpr float kRowsOffset = BITS == 4 ? 128.f : 0.f;

// A fragments (4 k16 blocks x 4 registers) of one group from this lane's code words (BITS / 4
// planes of 16 bytes): 4 bits 128 + q as the magic OR gives it; 8 bits q = lo + 16 hi rebuilt
// exactly in bf16 (<= 255).
template <int BITS>
__device__ __forceinline__ void rows_group_a(const uint4 (&cw)[BITS / 4], uint32_t (&a)[4][4]) {
  constexpr int P = BITS / 4;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    const uint32_t lo = word_of(cw[0], kb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (P == 1) {
        a[kb][i] = magic128(lo >> (4 * i));
      } else {
        const uint32_t hi = word_of(cw[P - 1], kb);
        const uint32_t ql = fma_bf16x2(magic128(lo >> (4 * i)), kBf16x2One, kBf16x2Neg128);
        const uint32_t qh = fma_bf16x2(magic128(hi >> (4 * i)), kBf16x2Sixteen, kBf16x2Neg2048);
        a[kb][i] = fma_bf16x2(ql, kBf16x2One, qh);  // lo + 16 hi: exact
      }
    }
  }
}

// One chunk of 8 tokens: c += A B over the group's 64 columns (addr: this lane's ldmatrix.x4
// address of the chunk's k16 blocks 0-1; blocks 2-3 are 64 bytes on) and, with kSums, d += the
// tokens' group sums (an all-ones A: every row of D is the column sums of B, i.e. each token's sum
// of the group's 64 x values, as q_group_dot takes them).
template <bool kSums>
__device__ __forceinline__ void rows_group_mma(const uint32_t (&a)[4][4], uint32_t addr,
                                               float (&c)[4], float (&d)[4]) {
  uint32_t b[2][4];
  tile::ldmatrix_x4(b[0], addr);
  tile::ldmatrix_x4(b[1], addr + 64);  // k16 blocks 2, 3 (+32 columns)
  mma_bf16_16816(c, a[0], b[0][0], b[0][1]);
  mma_bf16_16816(c, a[1], b[0][2], b[0][3]);
  mma_bf16_16816(c, a[2], b[1][0], b[1][1]);
  mma_bf16_16816(c, a[3], b[1][2], b[1][3]);
  if constexpr (kSums) {
    const uint32_t ones[4] = {kBf16x2One, kBf16x2One, kBf16x2One, kBf16x2One};
    mma_bf16_16816(d, ones, b[0][0], b[0][1]);
    mma_bf16_16816(d, ones, b[0][2], b[0][3]);
    mma_bf16_16816(d, ones, b[1][0], b[1][1]);
    mma_bf16_16816(d, ones, b[1][2], b[1][3]);
  }
}

}  // namespace lilac::cuda::qtile
