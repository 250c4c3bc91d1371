// The tensor-core tile engine shared by the dense prefill GEMM (gemm.cu) and the grouped MoE GEMMs
// (moe_prefill.cu): one thread block computes a BM x BN tile of C = A . B^T where both operands
// are "K-major" (A [rows, K] row-major, B [rows, K] row-major: the checkpoint layout of weights),
// with mma.sync.m16n8k16 (bf16 in, f32 accumulate), ldmatrix from XOR-swizzled shared memory and a
// STAGES-deep cp.async pipeline. Device code only; included by .cu files.
//
// Shared memory per stage: A tile [BM][64] and B tile [BN][64] bf16, rows of 128 bytes = 8 chunks
// of 16 bytes; chunk c of row r is stored at chunk position (c ^ (r & 7)). ldmatrix reads 8 rows
// at one logical chunk: the 8 physical chunks are distinct, so the 8 x 16 bytes cover all 32
// banks (conflict-free); the cp.async writes (8 consecutive threads = one row) are too. This is
// also the "128-byte swizzle" layout that wgmma descriptors describe (rows of 128 bytes, 8-row
// atoms of 1024 bytes), which the sm_90a path of gemm.cu relies on.
//
// Warps: (BM / WM) x (BN / 64); each computes a WM x 64 sub-tile (WM = 64 or 32) as MT = WM / 16
// m16 tiles times 8 n8 tiles, MT * 8 * 4 f32 accumulators per thread.
//
// Loads: the tile's rows are described per thread by pointers (so callers can gather rows, or remap
// weight rows, e.g. interleave gate and up rows); rows outside the problem and k beyond K are
// zero-filled by cp.async's src-size operand (K is a multiple of 8, so a 16-byte chunk is either
// wholly inside or wholly outside).
#pragma once

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/wgmma.cuh"

namespace lilac::cuda::tile {

constexpr int kBK = 64;  // k elements per pipeline stage (one 128-byte smem row)

template <int BM_, int BN_, int WM_, int STAGES_, int MIN_BLOCKS_>
struct Config {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = 64, STAGES = STAGES_,
                       MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int MT = WM / 16;  // m16 tiles per warp
  static constexpr int NT = WN / 8;   // n8 tiles per warp (8)
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int A_STAGE = BM * kBK, B_STAGE = BN * kBK;  // elements per stage
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 2;
  static constexpr int ROW_STEP = THREADS / 8;   // rows covered by one pass of the block's threads
  static constexpr int A_LOADS = BM / ROW_STEP;  // 16-byte chunks per thread per stage
  static constexpr int B_LOADS = BN / ROW_STEP;
  static_assert(WM == 64 || WM == 32, "warp tile is 64 or 32 rows by 64 columns");
  static_assert(BM % WM == 0 && BN % WN == 0, "block tile must be a multiple of the warp tile");
  static_assert(ROW_STEP % 8 == 0, "the swizzle phase of a thread's rows must be fixed");
  static_assert(BM % ROW_STEP == 0 && BN % ROW_STEP == 0, "whole passes of rows");
  static_assert(A_LOADS <= 32 && B_LOADS <= 32, "row masks are 32 bits");
};

// ---- PTX wrappers ------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when !pred, zero-fills the 16 bytes (src-size 0, nothing read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A . B + D, m16n8k16, A row-major (4 regs), B column-major (2 regs), f32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- operand row descriptions ------------------------------------------------------------------

// The rows of one operand tile as this thread loads them: LOADS rows, row i = first_row + i *
// ROW_STEP, each a pointer to element k = 0 of that row (row stride K), and a validity mask.
template <int LOADS>
struct RowSet {
  const bf16* ptr[LOADS];
  uint32_t valid;  // bit i: row i exists (else zero-filled)
};

// Thread-fixed geometry of the cp.async loads: chunk (tid & 7) of rows (tid >> 3) + i * ROW_STEP.
__device__ __forceinline__ int load_chunk() {
  return threadIdx.x & 7;
}
__device__ __forceinline__ int load_row0() {
  return threadIdx.x >> 3;
}

// Issues the cp.async copies of k-tile kt of one operand into a stage buffer (element offset).
template <class Cfg, int LOADS>
__device__ __forceinline__ void load_operand(const RowSet<LOADS>& rows, uint32_t stage_base, int kt,
                                             int K) {
  const int c = load_chunk();
  const int r0 = load_row0();
  const int k = kt * kBK + c * 8;
  const bool k_in = k < K;
  // Swizzled destination of row r0 + i * ROW_STEP: (r0 + i*STEP) * 128 + ((c ^ (r0 & 7)) * 16)
  // bytes, because ROW_STEP is a multiple of 8 ((r0 + i*STEP) & 7 == r0 & 7).
  const uint32_t dst0 = stage_base + uint32_t(r0 * 128 + ((c ^ (r0 & 7)) << 4));
#pragma unroll
  for (int i = 0; i < LOADS; ++i) {
    const bool ok = k_in && ((rows.valid >> i) & 1u);
    // When !ok nothing is read, but the address must still be a valid global address.
    const bf16* src = ok ? rows.ptr[i] + k : rows.ptr[i];
    cp_async_16(dst0 + uint32_t(i * Cfg::ROW_STEP * 128), src, ok);
  }
}

// The main loop: acc (+)= A_tile . B_tile^T over k in [0, K). `smem` holds STAGES * (A + B) stages,
// 1024-byte aligned. Leaves no cp.async in flight; does not synchronise at the end (the caller's
// epilogue does not touch shared memory).
template <class Cfg>
__device__ __forceinline__ void mainloop(float (&acc)[Cfg::MT][Cfg::NT][4],
                                         const RowSet<Cfg::A_LOADS>& a_rows,
                                         const RowSet<Cfg::B_LOADS>& b_rows, int K, bf16* smem) {
  constexpr int S = Cfg::STAGES;
  const uint32_t sA = smem_u32(smem);
  const uint32_t sB = sA + uint32_t(S * Cfg::A_STAGE * 2);
  const int KT = (K + kBK - 1) / kBK;

#pragma unroll
  for (int i = 0; i < Cfg::MT; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::NT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

        // Prologue: k-tiles 0 .. S-2 into stages 0 .. S-2, one commit group each (empty past KT, so
        // the group count stays uniform: after issuing group g, tile g is group g).
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) {
      load_operand<Cfg>(a_rows, sA + uint32_t(s * Cfg::A_STAGE * 2), s, K);
      load_operand<Cfg>(b_rows, sB + uint32_t(s * Cfg::B_STAGE * 2), s, K);
    }
    cp_async_commit();
  }
  cp_async_wait<S - 2>();  // tile 0 landed (this thread's part) ...
  __syncthreads();         // ... and every thread's part is visible

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  // ldmatrix row addresses (stage-relative bytes). A x4: lanes 0-15 rows 0-15 at chunk 2kk, lanes
  // 16-31 rows 0-15 at chunk 2kk+1 -> a0..a3 of the m16n8k16 A fragment. B x4 (two n8 tiles):
  // lanes 0-7 rows n 0-7 chunk 2kk, 8-15 rows 0-7 chunk 2kk+1, 16-23 rows 8-15 chunk 2kk, 24-31
  // rows 8-15 chunk 2kk+1 -> (b0, b1) of n-tile 2jj, then of n-tile 2jj+1.
  const uint32_t a_row_off = uint32_t((wm * Cfg::WM + (lane & 15)) * 128);
  const int a_hi = lane >> 4;
  const uint32_t b_row_off = uint32_t((wn * Cfg::WN + (lane & 7) + ((lane >> 4) << 3)) * 128);
  const int b_hi = (lane >> 3) & 1;
  const int sw = lane & 7;  // row & 7 of every row this lane addresses

  int read_stage = 0, write_stage = S - 1;
  for (int kt = 0; kt < KT; ++kt) {
    // Refill the stage consumed in iteration kt-1 (every warp passed the barrier after reading it).
    if (kt + S - 1 < KT) {
      load_operand<Cfg>(a_rows, sA + uint32_t(write_stage * Cfg::A_STAGE * 2), kt + S - 1, K);
      load_operand<Cfg>(b_rows, sB + uint32_t(write_stage * Cfg::B_STAGE * 2), kt + S - 1, K);
    }
    cp_async_commit();

    const uint32_t a_base = sA + uint32_t(read_stage * Cfg::A_STAGE * 2) + a_row_off;
    const uint32_t b_base = sB + uint32_t(read_stage * Cfg::B_STAGE * 2) + b_row_off;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[Cfg::MT][4];
      uint32_t bfr[Cfg::NT / 2][4];
#pragma unroll
      for (int i = 0; i < Cfg::MT; ++i)
        ldmatrix_x4(af[i], a_base + uint32_t(i * 16 * 128) + uint32_t(((2 * kk + a_hi) ^ sw) << 4));
#pragma unroll
      for (int jj = 0; jj < Cfg::NT / 2; ++jj)
        ldmatrix_x4(bfr[jj],
                    b_base + uint32_t(jj * 16 * 128) + uint32_t(((2 * kk + b_hi) ^ sw) << 4));
#pragma unroll
      for (int i = 0; i < Cfg::MT; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::NT; ++j)
          mma_bf16_16816(acc[i][j], af[i], bfr[j >> 1][(j & 1) * 2], bfr[j >> 1][(j & 1) * 2 + 1]);
    }

    // Groups issued: tiles 0 .. kt+S-1; allowing S-2 pending means tiles 0 .. kt+1 have landed.
    cp_async_wait<S - 2>();
    __syncthreads();
    read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();
}

// Accumulator layout (m16n8 C fragment): acc[i][j][0..1] at row (lane >> 2), columns
// 2 * (lane & 3) + {0, 1}; acc[i][j][2..3] at row (lane >> 2) + 8; of m-tile i, n-tile j of the
// warp's WM x 64 sub-tile, whose origin in the block tile is (wm * WM, wn * 64).
struct WarpOrigin {
  int row, col;
};
template <class Cfg>
__device__ __forceinline__ WarpOrigin warp_origin() {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return {(warp / Cfg::WARPS_N) * Cfg::WM + (lane >> 2),
          (warp % Cfg::WARPS_N) * Cfg::WN + 2 * (lane & 3)};
}

// ---- sm_90a: warpgroup MMA (wgmma; the primitives are in wgmma.cuh) ----------------------

// Block 128 x BN, two warpgroups (256 threads); warpgroup w computes rows [64w, 64w + 64) x all BN
// columns with wgmma.m64nBNk16 (both operands from shared memory): BN / 2 f32 accumulators per
// thread. INFLIGHT: k-tiles of wgmma left in flight while the next is issued (0 or 1); the copy
// engine then runs PREFETCH = STAGES - 1 - INFLIGHT k-tiles ahead.
template <int BN_, int STAGES_, int INFLIGHT_, int MIN_BLOCKS_>
struct WgConfig {
  static constexpr int BM = 128, BN = BN_, STAGES = STAGES_, INFLIGHT = INFLIGHT_,
                       MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = 256, ROW_STEP = THREADS / 8;
  static constexpr int A_LOADS = BM / ROW_STEP, B_LOADS = BN / ROW_STEP;
  static constexpr int A_STAGE = BM * kBK, B_STAGE = BN * kBK;
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 2 + 1024;  // + alignment slack
  static constexpr int NACC = BN / 2;
  static constexpr int PREFETCH = STAGES - 1 - INFLIGHT;
  static_assert(BN == 128 || BN == 256, "wgmma tile width");
  static_assert(INFLIGHT == 0 || INFLIGHT == 1, "in-flight wgmma groups");
  static_assert(PREFETCH >= 1, "at least one k-tile of prefetch");
};

// The wgmma main loop: acc = A_tile . B_tile^T over k in [0, K); `smem_raw` holds SMEM_BYTES
// (aligned up to 1024 here). Per k-tile: wait for its copies, make them visible to the async
// proxy, one barrier (which also proves every warpgroup retired the wgmma groups that read the
// stage about to be refilled), refill, then 4 wgmma (k16 each) as one group.
template <class Cfg>
__device__ __forceinline__ void wgmma_mainloop(float (&acc)[Cfg::NACC],
                                               const RowSet<Cfg::A_LOADS>& a_rows,
                                               const RowSet<Cfg::B_LOADS>& b_rows, int K,
                                               unsigned char* smem_raw) {
#pragma unroll
  for (int i = 0; i < Cfg::NACC; ++i) acc[i] = 0.f;
#if defined(LILAC_SM90A)
  constexpr int S = Cfg::STAGES, P = Cfg::PREFETCH;
  const uint32_t sA = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sB = sA + uint32_t(S * Cfg::A_STAGE * 2);  // stages are multiples of 1024 bytes
  const int KT = (K + kBK - 1) / kBK;
  const int wg = threadIdx.x >> 7;

#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (s < KT) {
      load_operand<Cfg>(a_rows, sA + uint32_t(s * Cfg::A_STAGE * 2), s, K);
      load_operand<Cfg>(b_rows, sB + uint32_t(s * Cfg::B_STAGE * 2), s, K);
    }
    cp_async_commit();
  }
  fence_operands(acc);
  int stage = 0, fill = P % S;
  for (int kt = 0; kt < KT; ++kt) {
    // Groups committed: P + kt (tile g is group g); P - 1 pending at most => tile kt landed.
    cp_async_wait<P - 1>();
    fence_proxy_async_smem();
    __syncthreads();
    // Refill: tile kt + P into the stage of tile kt + P - S <= kt - 1 - INFLIGHT, which every
    // warpgroup retired (wgmma_wait<INFLIGHT> in iteration kt - 1, before the barrier above).
    if (kt + P < KT) {
      load_operand<Cfg>(a_rows, sA + uint32_t(fill * Cfg::A_STAGE * 2), kt + P, K);
      load_operand<Cfg>(b_rows, sB + uint32_t(fill * Cfg::B_STAGE * 2), kt + P, K);
    }
    cp_async_commit();
    fill = fill + 1 == S ? 0 : fill + 1;

    const uint64_t da = sw128_desc(sA + uint32_t(stage * Cfg::A_STAGE * 2 + wg * 64 * 128));
    const uint64_t db = sw128_desc(sB + uint32_t(stage * Cfg::B_STAGE * 2));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma_tile<Cfg::BN>(acc, da + uint64_t(2 * kk), db + uint64_t(2 * kk));
    wgmma_commit();
    wgmma_wait<Cfg::INFLIGHT>();
    fence_operands(acc);
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  wgmma_wait<0>();
  fence_operands(acc);
  cp_async_wait<0>();
#else
  (void)a_rows;
  (void)b_rows;
  (void)K;
  (void)smem_raw;
#endif
}

// wgmma accumulator layout: acc[4j + q] of thread (warp, lane) is at row (warp / 4) * 64 +
// (warp % 4) * 16 + (lane >> 2) + 8 * (q >> 1), column 8j + 2 * (lane & 3) + (q & 1).
__device__ __forceinline__ WarpOrigin wgmma_origin() {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return {(warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2), 2 * (lane & 3)};
}

// The GEMMs' block order (gemm.cu, q4_gemm.cu, q4_gemm_wgmma.cu): block id -> (tile row tm, tile
// column tn) in groups of kGroupM tile rows, column-major inside a group, so that blocks running
// together share their A and W tiles in L2.
constexpr int kGroupM = 8;
__device__ __forceinline__ void raster(int bid, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int width = kGroupM * tiles_n;
  const int group = bid / width;
  const int first_m = group * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = bid - group * width;
  tm = first_m + in_group % group_m;
  tn = in_group / group_m;
}

}  // namespace lilac::cuda::tile
