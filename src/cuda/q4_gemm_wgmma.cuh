// The device code of q_gemm_wgmma (q4_gemm_wgmma.cu; the file comment there explains the design),
// shared with the grouped expert GEMMs of prefill (q4_moe_prefill_wgmma.cu): the block
// configuration, one pipeline stage's copies,
// the dequantisation of a k-tile into A fragments, one k-tile of the main loop and the loop, the
// raster and the scalar store.
#pragma once

#include <cstdint>

#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"

namespace lilac::cuda {

// A named namespace, not an anonymous one: in the compute_80 pass (LILAC_CUDA_PTX) the kernel
// body is empty and nvcc would warn about every unused internal function and member.
namespace qgemm_wgmma {

// MIN_BLOCKS_: blocks per SM the launch bounds ask for (registers <= 65536 / (256 MIN_BLOCKS)).
// ONE_FMA_: dequant_ktile's one-FMA form (only for matrices with QMatrix::small_scales; OneFma).
template <int BT_, int STAGES_, int MIN_BLOCKS_ = 1, bool ONE_FMA_ = false>
struct QGemmV2Cfg {
  static constexpr int BR = 128;  // weight rows per block: 8 row tiles, warp w owns tile w
  static constexpr int BT = BT_;  // tokens per block: the wgmma n
  static constexpr int STAGES = STAGES_, INFLIGHT = 1, PREFETCH = STAGES - 1 - INFLIGHT;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr bool ONE_FMA = ONE_FMA_;
  static constexpr int THREADS = 256;
  static constexpr int ROW_STEP = THREADS / 8;  // token rows per pass (tile::load_operand)
  // BT < ROW_STEP (16 tokens): one pass, and only the threads of rows < BT copy (X_PARTIAL).
  static constexpr bool X_PARTIAL = BT < ROW_STEP;
  static constexpr int X_LOADS = X_PARTIAL ? 1 : BT / ROW_STEP;
  static constexpr int X_STAGE = BT * 128;                                // bytes: [BT][64] bf16
  static constexpr int C_BYTES = 8 * kQBlockWords * 4;                    // codes of 8 tiles: 4096
  static constexpr int W_STAGE = C_BYTES + 8 * kQSbWords * 4;             // + scale/bias: 4608
  static constexpr int SMEM_BYTES = STAGES * (X_STAGE + W_STAGE) + 1024;  // + alignment slack
  static constexpr int NACC = BT / 2;
  static_assert(BT == 16 || BT == 32 || BT == 64 || BT == 128 || BT == 256, "wgmma n");
  static_assert(PREFETCH >= 1, "at least one k-tile of prefetch");
  static_assert(X_STAGE % 1024 == 0, "X stages stay 1024-byte aligned (128B swizzle atoms)");
  static_assert(SMEM_BYTES <= 232448, "227 KB of dynamic shared memory per block");
  // Blocks per SM by shared memory (228 KB per SM, 1 KB of it reserved per block).
  static_assert(MIN_BLOCKS * (SMEM_BYTES + 1024) <= 233472, "MIN_BLOCKS blocks fit in an SM");
};

using Cfg256 = QGemmV2Cfg<256, 6>;  // 219 KB + 1 KB
using Cfg128 = QGemmV2Cfg<128, 8>;  // 168 KB + 1 KB
// The small-M form (M <= 64, the batched decode step's projections; s18): 64 tokens per block
// (the wgmma n is 16, 32 or 64 by M), 8 stages of 12.5 KB = 101 KB + 1 KB, so 2 blocks per SM
// (<= 128 registers) and K split up to 8 ways: twice the warps per SM of the 128-token narrow form
// and a fraction of its k-tiles per block (its blocks are latency-bound: s17 ncu, in_proj at 64
// rows 16.6 us for 32 k-tiles per block).
using Cfg64 = QGemmV2Cfg<64, 8, 2>;
// The narrow-stage forms (s22) for M <= 16 / <= 32: a stage holds only the tokens the wgmma reads
// (16 x 128 B / 32 x 128 B of x instead of 64 x 128 B), 8 stages of 6.5 / 8.5 KB = 53 / 69 KB, so
// three blocks per SM (<= 85 registers): 24 warps per SM instead of 16, and the K split one step
// finer at the same waves (in_proj at 16 rows: 388 blocks of 8 k-tiles in one wave of 3 per SM,
// instead of 194 of 16 k-tiles on 62 SMs x 2 + 70 SMs x 1; s22 ncu of the 64-token form: the SMs
// with two blocks issue-limited, 12 warps per SM on average).
using Cfg16 = QGemmV2Cfg<16, 8, 3>;
using Cfg32 = QGemmV2Cfg<32, 8, 3>;
// The same block dequantising in one FMA per pair (dequant_ktile). A compile-time form, not a
// flag: s49's uniform branch between the forms in every k-tile left the one-FMA form no faster
// than main's two-FMA kernels; as separate instantiations it is +2.3% at 256 tokens (s50, H100).
template <class C>
using OneFma = QGemmV2Cfg<C::BT, C::STAGES, C::MIN_BLOCKS, true>;

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

// The register-sourced wgmma forms (wgmma.cuh) under their names here.
using tile::wgmma_rs;
using tile::wgmma_rs_m64n128k16;
using tile::wgmma_rs_m64n16k16;
using tile::wgmma_rs_m64n256k16;
using tile::wgmma_rs_m64n32k16;
using tile::wgmma_rs_m64n64k16;

// This thread's share of one stage's weight copies: codes chunk (tid & 31) of row tile tid >> 5
// (16 bytes; smem offset 16 tid), and for tid < 32 scale/bias chunk (tid & 3) of tile tid >> 2
// (smem offset C_BYTES + 16 tid). Pointers at group 0; a k-tile adds kt blocks.
struct WSrc {
  const uint32_t* codes;
  const uint32_t* sb;
  bool codes_ok, sb_ok;
};

// One stage's copies (k-tile kt): this thread's x chunks (tile::load_operand's geometry: chunk
// tid & 7 of token rows tid >> 3 + ROW_STEP i, swizzled), then its weight chunks (WSrc). Not
// load_operand itself: K is a multiple of 64 here, so a k-tile kt < K / 64 never needs its k < K
// test, and an invalid row's pointer is row 0's (a valid address: the callers clamp it), so the
// source needs no select either; s22: ~10 fewer instructions per thread and k-tile.
template <class C>
__device__ __forceinline__ void load_stage_x(const tile::RowSet<C::X_LOADS>& xr, uint32_t sx,
                                             int kt) {
  const int c = tile::load_chunk(), r0 = tile::load_row0();
  // X_PARTIAL: threads of rows >= BT would copy into the next stage; they skip (not zero-fill).
  if (!C::X_PARTIAL || r0 < C::BT) {
    const uint32_t dst0 = sx + uint32_t(r0 * 128 + ((c ^ (r0 & 7)) << 4));
    const int k = kt * tile::kBK + c * 8;
#pragma unroll
    for (int i = 0; i < C::X_LOADS; ++i)
      tile::cp_async_16(dst0 + uint32_t(i * C::ROW_STEP * 128), xr.ptr[i] + k,
                        (xr.valid >> i) & 1u);
  }
}
template <class C>
__device__ __forceinline__ void load_stage_w(const WSrc& w, uint32_t sw, int kt) {
  const int tid = threadIdx.x;
  tile::cp_async_16(sw + uint32_t(tid * 16), w.codes + size_t(kt) * kQBlockWords, w.codes_ok);
  if (tid < 32)
    tile::cp_async_16(sw + uint32_t(C::C_BYTES + tid * 16), w.sb + size_t(kt) * kQSbWords, w.sb_ok);
}
template <class C>
__device__ __forceinline__ void load_stage(const tile::RowSet<C::X_LOADS>& xr, const WSrc& w,
                                           uint32_t sx, uint32_t sw, int kt) {
  load_stage_x<C>(xr, sx, kt);
  load_stage_w<C>(w, sw, kt);
}

// The 4 k16 A fragments of this warp's row tile for one k-tile, from the stage's codes and
// scale/bias: a[kb][i] = bf16x2 of (row g + 8 (i & 1), columns 16 kb + 2t + 8 (i >> 1) + {0, 1}),
// w = RNE_bf16(s q + b) (q4_tile.cuh dequant_frag, 4-bit). Two ways to the same bits:
//  * ONE_FMA (the matrix's every |s| < 1/2, QMatrix::small_scales): one FMA per pair. A
//    nibble masked into bits [4, 8) of a bf16 is the number 16 q 2^-133 = q 2^-129 (exponent
//    field 0 or 1: bf16's subnormals and first binade are one linear scale of the low 8 bits), so
//    fma(q 2^-129, s 2^129, b) = RNE(s q + b) with one rounding, where s 2^129 is s times 2^64
//    then 2^65 (both exact; finite for |s| < 1/2, hence the condition). fma.rn.bf16x2 keeps
//    subnormal operands (PTX has no .ftz for bf16). Per k-tile: 16 LOP3 + 16 HFMA2 + 12 SHF +
//    4 HMUL2 against the other way's 16 LOP3 + 32 HFMA2 + 12 SHF (s30: the dequantisation was
//    ~2/3 of rows32's main loop instructions).
//  * otherwise: 128 + q by the magic OR, 128 taken off exactly, then fma(q, s, b).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
constexpr uint32_t kBf16x2Two64 = 0x5F805F80u;  // (2^64, 2^64)
constexpr uint32_t kBf16x2Two65 = 0x60006000u;  // (2^65, 2^65)

template <bool ONE_FMA>
__device__ __forceinline__ void dequant_ktile(uint32_t sw, uint32_t (&a)[4][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint4 c = lds128(sw + uint32_t(warp * 512 + lane * 16));
  const uint2 sb = lds64(sw + uint32_t(8 * kQBlockWords * 4 + warp * 64 + (lane >> 2) * 8));
  uint32_t s_lo = __byte_perm(sb.x, 0, 0x1010), b_lo = __byte_perm(sb.x, 0, 0x3232);
  uint32_t s_hi = __byte_perm(sb.y, 0, 0x1010), b_hi = __byte_perm(sb.y, 0, 0x3232);
  const uint32_t words[4] = {c.x, c.y, c.z, c.w};
  if constexpr (ONE_FMA) {
    s_lo = mul_bf16x2(mul_bf16x2(s_lo, kBf16x2Two64), kBf16x2Two65);  // s 2^129, exact
    s_hi = mul_bf16x2(mul_bf16x2(s_hi, kBf16x2Two64), kBf16x2Two65);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Nibble pair i (bits 4i and 16 + 4i) into bits [4, 8) and [20, 24).
        const uint32_t w = i == 0 ? words[kb] << 4 : words[kb] >> (4 * (i - 1));
        const uint32_t q = w & 0x00F000F0u;  // (q 2^-129, q' 2^-129)
        a[kb][i] = (i & 1) ? qtile::fma_bf16x2(q, s_hi, b_hi) : qtile::fma_bf16x2(q, s_lo, b_lo);
      }
  } else {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t q = qtile::fma_bf16x2(qtile::magic128(words[kb] >> (4 * i)),
                                             qtile::kBf16x2One, qtile::kBf16x2Neg128);  // exact
        a[kb][i] = (i & 1) ? qtile::fma_bf16x2(q, s_hi, b_hi) : qtile::fma_bf16x2(q, s_lo, b_lo);
      }
  }
}

// One group's compute: the PARTS k-tiles of weights in W stages w0 .. w0 + PARTS - 1 dequantised
// into the A registers a[0 .. PARTS), then their 4 PARTS wgmmas against x stages x0 .. x0 + PARTS
// - 1 as one wgmma group, waited for (a group left in flight across the next block barrier makes
// ptxas serialise the wgmmas: C7512).
template <class C, int G, int PARTS, int N>
__device__ __forceinline__ void group_mma(float (&acc)[C::NACC], uint32_t (&a)[G][4][4],
                                          uint32_t sX, uint32_t sW, int w0, int x0) {
#pragma unroll
  for (int h = 0; h < PARTS; ++h)
    dequant_ktile<C::ONE_FMA>(sW + uint32_t((w0 + h) * C::W_STAGE), a[h]);
    // Pin the A registers (ktile_step: no dequantisation between the wgmmas).
#pragma unroll
  for (int h = 0; h < PARTS; ++h)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[h][kk][i])::"memory");
  tile::wgmma_fence();
#pragma unroll
  for (int h = 0; h < PARTS; ++h) {
    const uint64_t db = tile::sw128_desc(sX + uint32_t((x0 + h) * C::X_STAGE));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<N>(acc, a[h][kk], db + uint64_t(2 * kk));
  }
  tile::wgmma_commit();
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
}

// One k-tile of the main loop (see the file comment): `a` is this k-tile's A register buffer,
// the other buffer belongs to the group still in flight. N: the wgmma n, the tokens computed
// (C::BT, or fewer for a short tile whose other rows are zeros: q4_moe_prefill_wgmma.cu).
template <class C, int N = C::BT>
__device__ __forceinline__ void ktile_step(float (&acc)[C::NACC], uint32_t (&a)[4][4], int kt,
                                           int KT, int& stage, int& fill, uint32_t sX, uint32_t sW,
                                           const tile::RowSet<C::X_LOADS>& xr, const WSrc& w) {
  constexpr int S = C::STAGES, P = C::PREFETCH;
  // Groups committed: P + kt (tile g is group g); P - 1 pending at most => tile kt landed.
  tile::cp_async_wait<P - 1>();
  tile::fence_proxy_async_smem();
  __syncthreads();
  // Refill: tile kt + P into the stage of tile kt + P - S <= kt - 2, whose wgmma group both
  // warpgroups retired (wgmma_wait<1> in iteration kt - 1) and whose codes they read (iteration
  // kt - 2) before the barrier above.
  if (kt + P < KT)
    load_stage<C>(xr, w, sX + uint32_t(fill * C::X_STAGE), sW + uint32_t(fill * C::W_STAGE),
                  kt + P);
  tile::cp_async_commit();
  fill = fill + 1 == S ? 0 : fill + 1;

  dequant_ktile<C::ONE_FMA>(sW + uint32_t(stage * C::W_STAGE), a);
  const uint64_t db = tile::sw128_desc(sX + uint32_t(stage * C::X_STAGE));
  // Pin the A registers here: the dequantisation must not sink between the wgmmas (ptxas would
  // then serialise every wgmma: C7513, "non wgmma instructions defining input registers").
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[kk][i])::"memory");
  tile::wgmma_fence();  // the A registers were just written
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs<N>(acc, a[kk], db + uint64_t(2 * kk));
  tile::wgmma_commit();
  tile::wgmma_wait<C::INFLIGHT>();
  tile::fence_operands(acc);
  stage = stage + 1 == S ? 0 : stage + 1;
}

// acc = W_rows . X^T over k in [0, K) (K a multiple of 64): the prologue (PREFETCH stages in
// flight), the k-tiles two at a time (each A register buffer a fixed set of registers; every path
// into a step comes from the other buffer's step, so no path redefines a buffer whose group may be
// in flight, else ptxas serialises the wgmmas: C7513), and the drain. Leaves no wgmma or cp.async
// in flight; does not synchronise the block at the end. N < C::BT: only tokens [0, N) computed.
template <class C, int N = C::BT>
__device__ __forceinline__ void mainloop(float (&acc)[C::NACC], const tile::RowSet<C::X_LOADS>& xr,
                                         const WSrc& w, int K, uint32_t sX, uint32_t sW) {
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
  const int KT = K / tile::kBK;
#pragma unroll
  for (int s = 0; s < C::PREFETCH; ++s) {
    if (s < KT)
      load_stage<C>(xr, w, sX + uint32_t(s * C::X_STAGE), sW + uint32_t(s * C::W_STAGE), s);
    tile::cp_async_commit();
  }
  tile::fence_operands(acc);
  int stage = 0, fill = C::PREFETCH % C::STAGES;
  uint32_t a0[4][4], a1[4][4];  // the A registers of even and odd k-tiles
  int kt = 0;
  for (; kt + 1 < KT; kt += 2) {
    ktile_step<C, N>(acc, a0, kt, KT, stage, fill, sX, sW, xr, w);
    ktile_step<C, N>(acc, a1, kt + 1, KT, stage, fill, sX, sW, xr, w);
  }
  if (kt < KT) ktile_step<C, N>(acc, a0, kt, KT, stage, fill, sX, sW, xr, w);
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
  tile::cp_async_wait<0>();
}

// The main loops as types with one contract (Loop::run<C, N>: acc = W_rows . X^T over [0, K),
// tokens [0, N); no wgmma or cp.async left in flight), for the kernels and the kernel lab to pass
// around. KtileLoop: mainloop above, one k-tile per block barrier (the wide forms: its wgmma group
// kt stays in flight while k-tile kt + 1 is dequantised, which a large n needs).
struct KtileLoop {
  template <class C, int N>
  static __device__ __forceinline__ void run(float (&acc)[C::NACC],
                                             const tile::RowSet<C::X_LOADS>& xr, const WSrc& w,
                                             int K, uint32_t sX, uint32_t sW) {
    mainloop<C, N>(acc, xr, w, K, sX, sW);
  }
};

// GroupLoop<G>: G k-tiles per block barrier and wgmma wait (s21: the grouped expert kernels' short
// forms at G = 2, kernel lab q_moe_grouped v8, v11, v12; s22: q_gemm_wgmma's small-M forms). ncu
// (s21 run 2, T = 256) found the short-tile kernels issue-bound, not waiting on DRAM: ~152
// instructions per warp and k-tile (63 of them the dequantisation), IPC 2.85, 68% of the issue
// slots, DRAM at 37%; the rest is per k-tile bookkeeping (the cp.async wait, fence and block
// barrier, the copies' addresses, the wgmma group's fence / commit / wait), which a group of G
// k-tiles pays once: lab, gate_up + down per layer, rows32 T = 256 203.7 -> 180.1 us, T = 512 218.7
// -> 198.4; rows64 T = 4096 714.7 -> 663.8 (s21 run 4). G = 3 and 4 lost there (s22 run 1: rows32 T
// = 256 183.6 -> 190.4 / 192.2 us, the down kernel slower). Pipeline: the STAGES stages are STAGES
// / G group slots; group p (k-tiles G p .. G p + G - 1) lives in slot p % (STAGES / G), committed
// as one cp.async group, with STAGES / G - 1 groups in flight ahead of the one computed. Step p
// waits for group p, passes the barrier, refills the slot of group p - 1 (its codes read and its
// wgmma group retired in step p - 1, before this barrier), dequantises its k-tiles into G A
// register sets, issues their 4 G wgmmas as one group and waits for it (a group left in flight
// across the barrier makes ptxas serialise the wgmmas: C7512). When G does not divide K / 64 the
// last group is partial.
template <int G>
struct GroupLoop {
  static_assert(G >= 2, "one k-tile per barrier is KtileLoop");

  template <class C>
  static __device__ __forceinline__ void load_group(const tile::RowSet<C::X_LOADS>& xr,
                                                    const WSrc& w, uint32_t sX, uint32_t sW,
                                                    int group, int KT) {
    constexpr int SG = C::STAGES / G;
    const int s0 = G * (group % SG);
#pragma unroll
    for (int h = 0; h < G; ++h)
      if (G * group + h < KT)
        load_stage<C>(xr, w, sX + uint32_t((s0 + h) * C::X_STAGE),
                      sW + uint32_t((s0 + h) * C::W_STAGE), G * group + h);
    tile::cp_async_commit();
  }

  // Group `group`'s first PARTS k-tiles (G, or fewer for the last group of a K / 64 that G does
  // not divide).
  template <class C, int N, int PARTS>
  static __device__ __forceinline__ void group_step(float (&acc)[C::NACC], uint32_t (&a)[G][4][4],
                                                    int group, int KT, uint32_t sX, uint32_t sW,
                                                    const tile::RowSet<C::X_LOADS>& xr,
                                                    const WSrc& w) {
    constexpr int SG = C::STAGES / G, PG = SG - 1;
    tile::cp_async_wait<PG - 1>();  // PG + group groups committed: group `group` landed
    tile::fence_proxy_async_smem();
    __syncthreads();
    load_group<C>(xr, w, sX, sW, group + PG, KT);
    const int s0 = G * (group % SG);
    group_mma<C, G, PARTS, N>(acc, a, sX, sW, s0, s0);
  }

  // The last, partial group: `left` (1 .. G - 1) k-tiles, PARTS tried from 1 up (the last
  // candidate, G - 1, without a test).
  template <class C, int N, int PARTS = 1>
  static __device__ __forceinline__ void tail(float (&acc)[C::NACC], uint32_t (&a)[G][4][4],
                                              int group, int left, int KT, uint32_t sX, uint32_t sW,
                                              const tile::RowSet<C::X_LOADS>& xr, const WSrc& w) {
    if constexpr (PARTS + 1 == G) {
      group_step<C, N, PARTS>(acc, a, group, KT, sX, sW, xr, w);
    } else {
      if (left == PARTS) return group_step<C, N, PARTS>(acc, a, group, KT, sX, sW, xr, w);
      tail<C, N, PARTS + 1>(acc, a, group, left, KT, sX, sW, xr, w);
    }
  }

  // The prologue's k-tiles kt = G p + h < KT of groups p < PG, each into slot G (p % (PG + 1)) + h
  // (load(slot, kt)), with group_end() after each group's.
  template <int PG, class Load, class GroupEnd>
  static __device__ __forceinline__ void prologue(int KT, Load load, GroupEnd group_end) {
#pragma unroll
    for (int p = 0; p < PG; ++p) {
      const int s0 = G * (p % (PG + 1));
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (G * p + h < KT) load(s0 + h, G * p + h);
      group_end();
    }
  }

  // PDL_WAIT: the kernel may run under programmatic dependent launch (x is the previous
  // kernel's output): the prologue waits for it between the weights' copies and x's.
  template <class C, int N, bool PDL_WAIT = false>
  static __device__ __forceinline__ void run(float (&acc)[C::NACC],
                                             const tile::RowSet<C::X_LOADS>& xr, const WSrc& w,
                                             int K, uint32_t sX, uint32_t sW) {
    static_assert(C::STAGES % G == 0 && C::STAGES >= 2 * G, "group slots, >= 1 group ahead");
    constexpr int PG = C::STAGES / G - 1;
    const int KT = K / tile::kBK;
#pragma unroll
    for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
    if constexpr (PDL_WAIT) {
      // The weights' copies of the PG groups first (no kernel writes them), then wait for the
      // previous kernel (griddepcontrol.wait: a no-op when this kernel was launched without PDL),
      // then the x copies, one commit per group. Group 0 also holds the later groups' weights:
      // waiting for it waits for more than it needs, never less.
      prologue<PG>(
          KT, [&](int slot, int kt) { load_stage_w<C>(w, sW + uint32_t(slot * C::W_STAGE), kt); },
          [] {});
      pdl_wait();
      prologue<PG>(
          KT, [&](int slot, int kt) { load_stage_x<C>(xr, sX + uint32_t(slot * C::X_STAGE), kt); },
          [] { tile::cp_async_commit(); });
    } else {
#pragma unroll
      for (int p = 0; p < PG; ++p) load_group<C>(xr, w, sX, sW, p, KT);
    }
    tile::fence_operands(acc);
    uint32_t a[G][4][4];  // the group's A registers (its wgmmas retire before the next group)
    int p = 0;
    for (; G * p + G - 1 < KT; ++p) group_step<C, N, G>(acc, a, p, KT, sX, sW, xr, w);
    if (G * p < KT) tail<C, N>(acc, a, p, KT - G * p, KT, sX, sW, xr, w);
    tile::cp_async_wait<0>();
  }
};

using qtile::raster;
using qtile::store_one;

}  // namespace qgemm_wgmma

}  // namespace lilac::cuda
