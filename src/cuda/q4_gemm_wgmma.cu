// q_gemm's 4-bit path on Hopper (the kernel lab's q_gemm version 3, production since s7; its main
// loop is version 2's, production in s6: in_proj at 4096 tokens 593 -> 354 us, 349 -> 585 TFLOP/s,
// faster than the BF16 wgmma GEMM's 377 us; bench/lab/q_gemm/README.md): the 4-bit prefill GEMM
// on wgmma, the weights dequantised in
// registers as wgmma's A operand (register-sourced "RS" form), the tokens as its n dimension from
// shared memory. C^T = W . A^T as in q4_gemm.cu, so the tiled layout's lane order (q4_layout.h:
// word kb of lane l = the m16n8k16 A fragment of rows g, g + 8 x columns [16 kb, 16 kb + 16)) is
// already the register layout wgmma's A wants: warp w of a warpgroup supplies rows [16 w, 16 w +
// 16) of the 64-row A tile in exactly the m16n8k16 fragment order (a0: row g, k 2t..2t+1; a1: row g
// + 8; a2: row g, k + 8; a3: row g + 8, k + 8). No weight ever goes to shared memory as bf16.
//
// Block: 256 threads = 2 warpgroups, 128 weight rows (8 row tiles of 16: warp w owns tile w) x
// BT tokens (256, or 128 for small M); warpgroup wg computes rows [64 wg, 64 wg + 64) x all BT
// tokens with wgmma.m64nBTk16 (BT / 2 f32 accumulators per thread). Per 64-deep k-tile (= one
// quantization group), one STAGES-deep cp.async pipeline stage holds:
//   X  [BT tokens][64] bf16, 128-byte swizzled (gemm_tile.cuh's layout; the wgmma B descriptor is
//      the BF16 kernel's W descriptor: sw128_desc, +2 per k16)      BT * 128 B (32 KB at 256)
//   codes of the 8 row tiles, [tile][lane][4 words] as in global     8 * 512 B = 4 KB
//   scale/bias of the 8 row tiles, [tile][16 slots]                  8 * 64 B = 512 B
// 36.5 KB per stage at BT = 256; 6 stages = 219 KB (1 block per SM, ~200 registers).
// Per k-tile every thread issues BT / 32 + 1 (+1 for threads < 32) 16-byte cp.async; each warp
// reads its tile's 16 bytes of codes per lane (ld.shared.v4, a contiguous 512 B per warp) and its
// rows' (scale, bias) pair (8 bytes, broadcast over the quad), dequantises the 4 k16 fragments
// (16 registers: per code word 3 SHF + 4 LOP3 + 8 HFMA2, q4_tile.cuh's exact two-FMA form, so
// w = RNE_bf16(s q + b) as q_gemm and its twin dequantize_row_bf16), then issues 4 wgmma (one
// commit group). The A registers are double-buffered (the loop is unrolled by two k-tiles):
// k-tile kt + 1 is dequantised while group kt runs; wgmma_wait<1> retires group kt - 1.
// Synchronisation is the BF16 wgmma main loop's (gemm_tile.cuh wgmma_mainloop): per k-tile wait
// for its copies, fence.proxy.async, one __syncthreads (which also proves both warpgroups retired
// the group that read the stage refilled next), refill PREFETCH = STAGES - 2 tiles ahead.
//
// Per k-tile at BT = 256 (2 M N K per block = 128 x 256 x 64 MACs = 1024 tensor clocks at the
// H200's 2048 bf16 MAC/clk/SM): L2 -> smem 36.5 KB (BF16 wgmma kernel: 48 KB); smem traffic
// ~105 KB (wgmma reads X once per warpgroup: 64 KB; BF16 kernel: ~128 KB); ALU ~75 instructions
// per thread, 2 warps per scheduler: ~150 issue slots of 1024.
// Tails: token rows past M are zero-filled by cp.async and not stored; row tiles past the matrix
// are zero-filled (codes and scale/bias 0: w = 0) and not stored; rows past N inside the last
// tile are the layout's zero padding.
//
// Version 3 (split-K and the epilogue; v2 was 24-40% of 790 TFLOP/s on the 2048-row projections
// out_proj / o_proj, N = 2048, K = 4096, y += at 512 .. 4096 tokens):
//  1. Split-K over a thread-block cluster: the S blocks (S = 1, 2 or 4; cluster dims (S, 1, 1),
//     consecutive blockIdx.x) of one output tile each run k-tiles [r KT / S, (r + 1) KT / S) of
//     the tile (rank r). M = 512 out_proj: 4 x 16 tiles of 128 tokens -> 128 blocks at S = 2
//     (v2: 64 blocks on 132 SMs). The launcher picks (BT, S) by estimated time (pick below):
//     out_proj M = 512 -> (256, 4) (or (128, 2) if 32 clusters of 4 do not fit), M = 1000 ->
//     (256, 2), M = 4096 -> (256, 1); in_proj / qkv -> S = 1, or since s36 whole tiles first and
//     the last part-empty wave split (in_proj at 512 tokens: 132 whole + 62 in pairs).
//  2. The epilogue through shared memory: each block writes its 128 x BT f32 partial tile into its
//     own (now idle) pipeline memory, token-major [BT][132] (132 floats per token: the 8 lanes of
//     a fragment row g and 4 of t hit 32 distinct banks), then (cluster barrier) rank r sums
//     tokens [r BT / S, (r + 1) BT / S) of the tile over ranks 0 .. S - 1 in rank order (f32,
//     deterministic, no atomics), reading the other ranks' tiles through distributed shared
//     memory, and writes C once: a warp per token, 16 bytes per lane (a token's 128 rows = 512
//     contiguous bytes), for y += the residual's 16-byte loads of up to 8 tokens issued before
//     any of their stores. (v2's epilogue stored from registers, 32-byte segments, and each `+=`
//     was a load the next store waited on.) When N % 4 != 0 or C is not 16-byte aligned the
//     same pass stores element by element.
// y += adds the reduced sum into y once: y = y + ((p_0 + p_1) + ...).
// Lab (s6 run 6, H200): out_proj (+=) M = 4096 217.4 -> 130.1 us, M = 512 44.9 -> 20.9 us, M = 1000
// 45.1 -> 31.9 us; o_proj M = 4096 119.1 us; in_proj as v2 (353.0 / 59.9 / 91.1 us).
// Shared memory: the pipeline (BT = 256: 6 stages, 219 KB + 1 KB; BT = 128: 8 stages, 168 KB +
// 1 KB) reused for the staged tile (BT x 132 x 4 = 132 KB / 66 KB).
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/cluster.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/persistent.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {

// A named namespace, not an anonymous one: in the compute_80 pass (LILAC_CUDA_PTX) the kernel
// body is empty and nvcc would warn about every unused internal function and member.
namespace qgemm_wgmma {

constexpr int kPad = 132;  // floats per token of the staged tile (128 rows + 4: no bank conflicts)

template <class C>
constexpr int stage_bytes() {
  return C::BT * kPad * 4;
}
static_assert(stage_bytes<Cfg256>() + 1024 <= Cfg256::SMEM_BYTES, "staged tile fits (BT 256)");
static_assert(stage_bytes<Cfg128>() + 1024 <= Cfg128::SMEM_BYTES, "staged tile fits (BT 128)");
static_assert(stage_bytes<Cfg64>() + 1024 <= Cfg64::SMEM_BYTES, "staged tile fits (BT 64)");
static_assert(stage_bytes<Cfg32>() + 1024 <= Cfg32::SMEM_BYTES, "staged tile fits (BT 32)");
static_assert(stage_bytes<Cfg16>() + 1024 <= Cfg16::SMEM_BYTES, "staged tile fits (BT 16)");

// 16 bytes of rank `rank`'s staged tile at this block's shared address `a` (S = 1: this block).
template <int S>
__device__ __forceinline__ float4 ld_part(uint32_t a, int rank) {
  float4 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (S > 1) {
    const uint32_t ra = cluster::map(a, uint32_t(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(ra)
                 : "memory");
    return v;
  }
#endif
  (void)rank;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a)
               : "memory");
  return v;
}

// Stages the block's accumulators as [BT tokens][kPad] f32 at shared address sX. acc[4 j + q]: row
// 16 warp + g + 8 (q >> 1) of the block, token 8 j + 2 t + (q & 1); for fixed (j, q) a warp's 32
// stores hit banks (8 t + g + const) mod 32 (2 kPad = 264 = 8 mod 32): all distinct.
template <class C>
__device__ __forceinline__ void stage_tile(const float (&acc)[C::NACC], unsigned char* smem,
                                           uint32_t sX, int warp, int lane) {
  float* part = reinterpret_cast<float*>(smem + (sX - tile::smem_u32(smem)));
  const int r0 = 16 * warp + (lane >> 2), k0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < C::BT / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      part[(8 * j + k0 + (q & 1)) * kPad + r0 + 8 * (q >> 1)] = acc[4 * j + q];
}

// The store pass over a staged tile (token tile m0, first row tile t0). Rank r writes tokens
// [r TPR, (r + 1) TPR) of the tile: warp `warp` token 8 p + warp of pass p, lane `lane` rows 4 lane
// .. 4 lane + 3: one 16-byte access when `vec` (N % 4 == 0: all four in or all out; C 16-byte
// aligned), else element by element. The value is the sum of the S ranks' staged tiles in rank
// order, then y += for AccumulateF32.
// Fewer than 8 tokens per rank (16 / 32-token blocks split 4-8 ways): warps >= TPR idle.
template <class C, int S, GemmOut MODE>
__device__ __forceinline__ void store_tile(int rank, int m0, int t0, int M, const QMatrix& W,
                                           void* __restrict__ out, bool vec, uint32_t sX, int warp,
                                           int lane) {
  constexpr int kBatch = 8;  // passes whose residual loads are issued together
  constexpr int TPR = C::BT / S, PASSES = TPR >= 8 ? TPR / 8 : 1;
  constexpr int BATCH = PASSES < kBatch ? PASSES : kBatch;
  static_assert(C::BT % S == 0 && (TPR % 8 == 0 || TPR < 8) && PASSES % BATCH == 0, "whole passes");
  const bool warp_ok = TPR >= 8 || warp < TPR;
  const int N = W.rows;
  const int row = t0 * kQTileRows + 4 * lane;
  const bool row_ok = row < N;
  const uint32_t pbase = sX + uint32_t(16 * lane);
#pragma unroll 1
  for (int b = 0; b < PASSES; b += BATCH) {
    float4 old[BATCH];
    if constexpr (MODE == GemmOut::AccumulateF32) {
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int tok = m0 + rank * TPR + 8 * (b + i) + warp;
        old[i] = vec && row_ok && warp_ok && tok < M
                     ? *reinterpret_cast<const float4*>(static_cast<const float*>(out) +
                                                        (size_t(tok) * size_t(N) + size_t(row)))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      if (!warp_ok) continue;
      const int tl = rank * TPR + 8 * (b + i) + warp, tok = m0 + tl;
      const uint32_t a = pbase + uint32_t(tl * kPad * 4);
      float4 v = ld_part<S>(a, 0);
#pragma unroll
      for (int r = 1; r < S; ++r) {
        const float4 p = ld_part<S>(a, r);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
      }
      if (!row_ok || tok >= M) continue;
      const size_t off = size_t(tok) * size_t(N) + size_t(row);
      if (!vec) {
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (row + c < N) store_one<MODE>(out, off + size_t(c), e[c]);
        continue;
      }
      if constexpr (MODE == GemmOut::StoreBF16) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<const uint32_t*>(&lo);
        u.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(static_cast<bf16*>(out) + off) = u;
      } else {
        if constexpr (MODE == GemmOut::AccumulateF32) {
          v.x = old[i].x + v.x;
          v.y = old[i].y + v.y;
          v.z = old[i].z + v.z;
          v.w = old[i].w + v.w;
        }
        *reinterpret_cast<float4*>(static_cast<float*>(out) + off) = v;
      }
    }
  }
}

// The x rows and weight tiles of output tile (m0, t0) from k-tile g0 on (q4_gemm_wgmma.cuh's
// main-loop sources).
template <class C>
__device__ __forceinline__ void tile_sources(const bf16* __restrict__ A, int M, int K,
                                             const QMatrix& W, int m0, int t0, int g0,
                                             tile::RowSet<C::X_LOADS>& xr, WSrc& w) {
  const int tid = threadIdx.x, n_tiles = W.tiles(), G = W.groups();
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < C::X_LOADS; ++i) {
    const int row = m0 + tile::load_row0() + i * C::ROW_STEP;
    const bool ok = row < M;
    xr.ptr[i] = A + size_t(ok ? row : 0) * size_t(K) + size_t(g0) * tile::kBK;
    xr.valid |= uint32_t(ok) << i;
  }
  const int ct = t0 + (tid >> 5), st = t0 + ((tid & 31) >> 2);
  w.codes_ok = ct < n_tiles;
  w.sb_ok = st < n_tiles;
  // Clamped to a valid tile: the address must be valid even when nothing is read.
  w.codes = W.codes + (size_t(min(ct, n_tiles - 1)) * size_t(G) + size_t(g0)) * kQBlockWords +
            (tid & 31) * 4;
  w.sb = W.sb + (size_t(min(st, n_tiles - 1)) * size_t(G) + size_t(g0)) * kQSbWords + (tid & 3) * 4;
}

// NW: the wgmma n, the tokens the main loop computes (C::BT; 64 for the narrow form at M <= 64,
// whose accumulators past token 64 stay 0 and are not stored).
// whole (s36; a multiple of S, 0 with S = 1): blocks [0, whole) each compute tile blockIdx.x alone
// over all of K, as the S = 1 kernel does (a cluster of them: S independent tiles), and the blocks
// after them split tiles whole, whole + 1, ... S ways. The launcher fills the full waves with whole
// tiles and splits only the last, part-empty wave's tiles (pick below).
template <class C, int S, GemmOut MODE, int NW = C::BT>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    q_gemm_wgmma_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ out,
                        int tiles_m, int tiles_n, bool vec, int whole) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int b = int(blockIdx.x);
  const bool alone = S == 1 || b < whole;  // a cluster is all alone or all split (whole % S == 0)
  const int rank = alone ? 0 : int(cluster::ctarank());  // == blockIdx.x % S
  int tm, tn;
  raster(alone ? b : whole + (b - whole) / S, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * C::BT, t0 = tn * (C::BR / kQTileRows);  // first token, first row tile
  // This rank's K range: groups [g0, g0 + KT) (the launcher checks (K / 64) % S == 0).
  const int KT = K / tile::kBK / (alone ? 1 : S), g0 = rank * KT, Kl = KT * tile::kBK;
  tile::RowSet<C::X_LOADS> xr;
  WSrc w;
  tile_sources<C>(A, M, K, W, m0, t0, g0, xr, w);

  // The main loop (q4_gemm_wgmma.cuh) over this rank's KT k-tiles.
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  float acc[C::NACC];
  // The small-M forms (wgmma n <= 64: the tensor work per k-tile is small, the per k-tile
  // bookkeeping is not; s22 ncu, in_proj at 16 rows: ~132 instructions per warp and k-tile, 60
  // of them the dequantisation) pay the barrier and the wgmma wait once per pair of k-tiles.
  // The small-M forms run under PDL (q4_gemm_pdl below): the prologue's weight copies are issued
  // before the wait, and the next kernel may start scheduling once the main loop is done.
  if constexpr (C::BT <= 64) {
    GroupLoop<2>::run<C, NW, true>(acc, xr, w, Kl, sX, sW);
    pdl_launch_dependents();
  } else {
    mainloop<C, NW>(acc, xr, w, Kl, sX, sW);
  }
  __syncthreads();  // both warpgroups' wgmmas retired, every copy landed: the stages are free

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  stage_tile<C>(acc, smem, sX, warp, lane);
  // (A cluster of whole tiles reads no other block's memory: its blocks synchronise alone.)
  if (S > 1 && !alone)
    cluster::sync();  // every rank's tile staged and visible to the cluster
  else
    __syncthreads();
  if (alone)
    store_tile<C, 1, MODE>(0, m0, t0, M, W, out, vec, sX, warp, lane);
  else
    store_tile<C, S, MODE>(rank, m0, t0, M, W, out, vec, sX, warp, lane);
  if (S > 1 && !alone) cluster::sync();  // no block leaves while another still reads its tile
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n, (void)whole;
  __trap();
#endif
}

// ---- Stream-K (s35) ---------------------------------------------------------------------------
//
// Why: at a few hundred tokens the wide projections have too few output tiles for the GPU. In_proj
// at 256 tokens is 97 tiles of 256 tokens x 128 rows on 132 SMs (one Cfg256 block per SM): 35 SMs
// idle for the whole 32 k-tiles (s35 run 1, H100: 30.5 us per call); qkv 72 tiles; at 512 tokens
// 194 and 144 tiles, two waves of which the second is part-empty (54.5 us). The cluster split
// (S = 2, 4) cuts the k-tiles per block but not the waves' quantisation.
// Measured (s35, H100): slower, 36.8 us per call at 256 tokens and 59.1 at 512 (-2.1% / -1.0%
// prefill), so the automatic choice takes it only under LILAC_Q4_GEMM_STREAMK=auto (pick). The
// premise held (ncu, s35 run 6: the one-block form's in_proj at 256 tokens leaves 35 SMs idle,
// L2 at 26%, the busy SMs' tensor pipes ~63% full). Its own cost (s36 run 1, ncu of the form):
// the k-tiles run at the one-block form's rate, but a block's second segment start and the two
// epilogues (a 128 KB f32 partial written, fenced, read back and added) cost what the idle SMs
// give, and ~20% of the time SMs wait for the slowest: with 256 x 128 tiles and ~1.4 blocks per
// tile the form cannot win (docs/kernels.md, s36). The last part-empty wave is split instead (the
// `whole` parameter of q_gemm_wgmma_kernel).
//
// The form: P = (blocks resident per SM) x SMs persistent blocks share the U = tiles x KT
// (tile, k-tile) iterations evenly, block b taking [U b / P, U (b + 1) / P) in order (U >= P: no
// empty range). Its range cuts into segments, one per tile it touches: the main loop runs over
// the segment's k-tiles, then
//  * a segment that starts at k-tile 0 owns its tile: if it ends before k-tile KT, the blocks
//    b + 1, b + 2, ... whose ranges start inside the tile ("contributors") hold the rest of it,
//    each as its block's first segment. The owner stages its own partial tile, waits for each
//    contributor's flag, and stores own + contributor b + 1 + contributor b + 2 + ... (k order:
//    deterministic; a different f32 summation order from the one-block form's, within the same
//    tolerance of the twin), then zeroes the flags it consumed (each launch leaves them zero);
//  * a segment that starts past k-tile 0 (only a block's first) writes its partial tile to its
//    block's slot of the scratch ([P][BT][128] f32) and raises its flag (persistent.cuh's
//    release / acquire pattern; the owner reads the slot past L1).
// A contributor's segment is at the start of its range and the owner's at the end of its own, so
// the owner finds the partials ready rather than waiting. All P blocks are resident at once, so
// an owner never waits on a block that cannot start (two stream-K launches on two streams at once
// could starve each other: the backend runs one stream; the scratch belongs to one stream).
// A wait that exceeds its spin limit sets the scratch's error word and stores anyway.
struct StreamK {
  float* parts;     // [P][BT][128] partial tiles, slot b = block b's first segment
  unsigned* flags;  // [P]: 1 while slot b holds an unread partial
  unsigned* error;  // set on a wait that gave up
};

template <class C, GemmOut MODE>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    q_gemm_wgmma_streamk_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W,
                                void* __restrict__ out, int tiles_m, int tiles_n, bool vec,
                                StreamK sk) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  constexpr int kSlot = C::BT * C::BR;  // floats per partial tile
  const int KT = K / tile::kBK, P = int(gridDim.x), b = int(blockIdx.x);
  const int64_t U = int64_t(tiles_m) * tiles_n * KT;
  auto start_of = [&](int blk) { return U * blk / P; };
  const int64_t end = start_of(b + 1);
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t it = start_of(b); it < end;) {
    const int tile_id = int(it / KT), kb = int(it % KT);
    const int ke = int(min(int64_t(KT), int64_t(kb) + (end - it)));
    int tm, tn;
    raster(tile_id, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * C::BT, t0 = tn * (C::BR / kQTileRows);
    tile::RowSet<C::X_LOADS> xr;
    WSrc w;
    tile_sources<C>(A, M, K, W, m0, t0, kb, xr, w);
    float acc[C::NACC];
    mainloop<C, C::BT>(acc, xr, w, (ke - kb) * tile::kBK, sX, sW);
    __syncthreads();  // both warpgroups' wgmmas retired, every copy landed: the stages are free
    stage_tile<C>(acc, smem, sX, warp, lane);
    __syncthreads();
    if (kb > 0) {
      // A contributor: the staged tile to slot b ([BT][128], a token's 128 rows contiguous).
      const float* part = reinterpret_cast<const float*>(smem + (sX - tile::smem_u32(smem)));
      float4* slot = reinterpret_cast<float4*>(sk.parts + size_t(b) * kSlot);
      for (int i = int(threadIdx.x); i < kSlot / 4; i += C::THREADS) {
        const int tl = i / (C::BR / 4), r = 4 * (i % (C::BR / 4));
        slot[i] = *reinterpret_cast<const float4*>(part + tl * kPad + r);
      }
      persistent::signal<true>(sk.flags + b);
    } else {
      // The owner: contributors b + 1 .. b + nc (their ranges start inside this tile). Their
      // partials are added into the staged tile in k order, 16 loads in flight per thread (s35 run
      // 2: added inside the store pass, one L2 round trip per token and contributor, the form took
      // 49 us per call at 256 tokens against the one-block form's 30), then the usual store pass.
      int nc = 0;
      if (ke < KT) {
        const int64_t tile_end = int64_t(tile_id + 1) * KT;
        while (b + 1 + nc < P && start_of(b + 1 + nc) < tile_end) ++nc;
        for (int c = 0; c < nc; ++c) persistent::wait(sk.flags + b + 1 + c, 1u, sk.error);
      }
      float* part = reinterpret_cast<float*>(smem + (sX - tile::smem_u32(smem)));
      constexpr int kBatch = 16, kPer = kSlot / 4 / C::THREADS;
      static_assert(kPer % kBatch == 0, "whole batches of loads");
      for (int c = 0; c < nc; ++c) {
        const float4* slot = reinterpret_cast<const float4*>(sk.parts + size_t(b + 1 + c) * kSlot);
#pragma unroll 1
        for (int j0 = 0; j0 < kPer; j0 += kBatch) {
          float4 p[kBatch];
#pragma unroll
          for (int j = 0; j < kBatch; ++j)
            p[j] = __ldcg(slot + (j0 + j) * C::THREADS + threadIdx.x);
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            const int i = (j0 + j) * C::THREADS + int(threadIdx.x);
            float4* d =
                reinterpret_cast<float4*>(part + (i / (C::BR / 4)) * kPad + 4 * (i % (C::BR / 4)));
            float4 v = *d;
            v.x += p[j].x;
            v.y += p[j].y;
            v.z += p[j].z;
            v.w += p[j].w;
            *d = v;
          }
        }
      }
      if (nc > 0) __syncthreads();
      store_tile<C, 1, MODE>(0, m0, t0, M, W, out, vec, sX, warp, lane);
      if (threadIdx.x < nc) sk.flags[b + 1 + threadIdx.x] = 0u;  // read: the next launch's
    }
    __syncthreads();  // the staged tile read before the next segment's copies land on it
    it += ke - kb;
  }
#else
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n, (void)vec, (void)sk;
  __trap();
#endif
}

template <class C, int S, GemmOut MODE, int NW = C::BT>
void set_smem() {
  static std::once_flag once;
  std::call_once(once, [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(q_gemm_wgmma_kernel<C, S, MODE, NW>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          C::SMEM_BYTES));
  });
}

// A launch of `blocks` blocks of config C in clusters of S along x (no cluster attribute at S = 1);
// `attr` holds the attribute cfg points to.
template <class C>
cudaLaunchConfig_t cluster_config(int S, int64_t blocks, cudaStream_t stream,
                                  cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(C::THREADS);
  cfg.dynamicSmemBytes = C::SMEM_BYTES;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(S);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = S > 1 ? 1u : 0u;
  return cfg;
}

// Programmatic dependent launch for the small-M forms (the batched decode step's projections,
// ~80 launches per step): their blocks may become resident while the previous kernel finishes and
// start their weight copies before griddepcontrol.wait (GroupLoop's PDL_WAIT prologue). On with
// the process-wide PDL setting (launch.h); LILAC_Q4_GEMM_PDL=off launches them as before (A/B).
// The wide forms (prefill: one launch per tens of microseconds) do not wait and never use it.
bool q4_gemm_pdl() {
  static const bool on = env_enum<bool>("LILAC_Q4_GEMM_PDL", true, {{"on", true}, {"off", false}});
  return on;
}

// whole: the tiles computed alone before the split ones (the kernel's parameter; a multiple of S).
template <class C, int S, GemmOut MODE, int NW>
void launch(const bf16* A, int M, const QMatrix& W, void* out, bool vec, int whole,
            cudaStream_t stream) {
  set_smem<C, S, MODE, NW>();
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t tiles = int64_t(tiles_m) * tiles_n;
  if (S == 1) whole = 0;
  if (whole < 0 || whole % S != 0 || whole > tiles)
    fail("q_gemm_wgmma: {} whole tiles of {} at splits {}", whole, tiles, S);
  const int64_t blocks = whole + (tiles - whole) * S;
  if (blocks > 0x7fffffff) fail("q_gemm_wgmma: {} x {} needs {} blocks", M, W.rows, blocks);
  const dim3 cluster(unsigned(S), 1, 1);
  launch_with(S > 1 ? &cluster : nullptr, C::BT <= 64 && q4_gemm_pdl(),
              q_gemm_wgmma_kernel<C, S, MODE, NW>, dim3(unsigned(blocks)), dim3(C::THREADS),
              size_t(C::SMEM_BYTES), stream, A, M, W.cols, W, out, tiles_m, tiles_n, vec, whole);
}

// ---- the stream-K form's host side ----

using SkCfg = Cfg256;  // the form's block: the prefill projections' 256-token tile

// Stream-K blocks resident at once: the kernel's occupancy (one Cfg256 block per SM) x the SMs.
int streamk_blocks() {
  static const int n = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(q_gemm_wgmma_streamk_kernel<SkCfg, GemmOut::StoreF32>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          SkCfg::SMEM_BYTES));
    int c = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &c, q_gemm_wgmma_streamk_kernel<SkCfg, GemmOut::StoreF32>, SkCfg::THREADS,
            SkCfg::SMEM_BYTES) != cudaSuccess) {
      (void)cudaGetLastError();
      c = 0;
    }
    return c * sm_count();
  }();
  return n;
}

// The scratch's layout for P blocks: parts [P][BT][128] f32, flags [P], error [1].
constexpr size_t kSkSlotFloats = size_t(SkCfg::BT) * SkCfg::BR;
size_t streamk_bytes(int P) {
  return size_t(P) * kSkSlotFloats * 4 + (size_t(P) + 1) * 4;
}
StreamK streamk_of(const QGemmScratch& s, int P) {
  auto* base = static_cast<unsigned char*>(s.ptr);
  StreamK sk;
  sk.parts = reinterpret_cast<float*>(base);
  sk.flags = reinterpret_cast<unsigned*>(base + size_t(P) * kSkSlotFloats * 4);
  sk.error = sk.flags + P;
  return sk;
}

}  // namespace qgemm_wgmma

// LILAC_Q4_GEMM_STREAMK=auto lets the automatic choice take the stream-K form (A/B); off by
// default since s35: measured slower than the one-block form where it was meant to win (pick).
bool q_gemm_streamk_auto() {
  static const bool on =
      env_enum<bool>("LILAC_Q4_GEMM_STREAMK", false, {{"auto", true}, {"off", false}});
  return on;
}

namespace qgemm_wgmma {

template <GemmOut MODE>
void launch_streamk(const bf16* A, int M, const QMatrix& W, void* out, bool vec,
                    const QGemmScratch& scratch, cudaStream_t stream) {
  using C = SkCfg;
  static std::once_flag once;
  std::call_once(once, [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(q_gemm_wgmma_streamk_kernel<C, MODE>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          C::SMEM_BYTES));
  });
  if (!scratch.ptr) fail("q_gemm_wgmma: the stream-K form (splits -1) needs a scratch");
  if (reinterpret_cast<uintptr_t>(scratch.ptr) % 16 != 0)
    fail("q_gemm_wgmma: the stream-K scratch must be 16-byte aligned");
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t U = int64_t(tiles_m) * tiles_n * (W.cols / kQGroup);
  const int P = int(std::min<int64_t>(streamk_blocks(), U));
  if (P < 1) fail("q_gemm_wgmma: the stream-K form cannot run on this GPU");
  if (scratch.bytes < streamk_bytes(P))
    fail("q_gemm_wgmma: the stream-K form needs {} bytes of scratch, given {}", streamk_bytes(P),
         scratch.bytes);
  launch_with(nullptr, false, q_gemm_wgmma_streamk_kernel<C, MODE>, dim3(unsigned(P)),
              dim3(C::THREADS), size_t(C::SMEM_BYTES), stream, A, M, W.cols, W, out, tiles_m,
              tiles_n, vec, streamk_of(scratch, P));
}

void dispatch_streamk(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                      const QGemmScratch& scratch, cudaStream_t s) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch_streamk<GemmOut::StoreF32>(A, M, W, out, vec, scratch, s);
    case GemmOut::StoreBF16:
      return launch_streamk<GemmOut::StoreBF16>(A, M, W, out, vec, scratch, s);
    case GemmOut::AccumulateF32:
      return launch_streamk<GemmOut::AccumulateF32>(A, M, W, out, vec, scratch, s);
  }
}

template <class C, int S, int NW>
void dispatch_mode(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                   int whole, cudaStream_t s) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch<C, S, GemmOut::StoreF32, NW>(A, M, W, out, vec, whole, s);
    case GemmOut::StoreBF16:
      return launch<C, S, GemmOut::StoreBF16, NW>(A, M, W, out, vec, whole, s);
    case GemmOut::AccumulateF32:
      return launch<C, S, GemmOut::AccumulateF32, NW>(A, M, W, out, vec, whole, s);
  }
}

template <class C, int NW = C::BT>
void dispatch_splits(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                     int S, cudaStream_t s, int whole = 0) {
  switch (S) {
    case 1:
      return dispatch_mode<C, 1, NW>(A, M, W, out, mode, vec, 0, s);
    case 2:
      return dispatch_mode<C, 2, NW>(A, M, W, out, mode, vec, whole, s);
    case 4:
      return dispatch_mode<C, 4, NW>(A, M, W, out, mode, vec, whole, s);
    case 8:
      // Only the small-M forms: their blocks (2-3 per SM) make clusters of 8 that fit a GPC (s36:
      // of Cfg256's one-per-SM blocks, too few clusters of 8 fit an H100 for out_proj's 16 tiles
      // at 256 tokens to run in one wave).
      if constexpr (C::BT <= 64) return dispatch_mode<C, 8, NW>(A, M, W, out, mode, vec, whole, s);
      [[fallthrough]];
    default:
      fail("q_gemm_wgmma: splits {} (1, 2 or 4; 8 with 16-64 tokens per block)", S);
  }
}

// The small-M forms (M <= 64). bt 64: s18's 64-token stages, the wgmma n the tokens rounded up to
// 16, 32 or 64; bt 16 / 32: stages of exactly that many tokens (M <= bt).
void dispatch_small(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                    int bt, int S, cudaStream_t s) {
  if (bt == 16) return dispatch_splits<Cfg16>(A, M, W, out, mode, vec, S, s);
  if (bt == 32) return dispatch_splits<Cfg32>(A, M, W, out, mode, vec, S, s);
  if (M <= 16) return dispatch_splits<Cfg64, 16>(A, M, W, out, mode, vec, S, s);
  if (M <= 32) return dispatch_splits<Cfg64, 32>(A, M, W, out, mode, vec, S, s);
  return dispatch_splits<Cfg64, 64>(A, M, W, out, mode, vec, S, s);
}

// Clusters of S blocks resident at once (Cfg256 / Cfg128: one block per SM, ~200 KB / 256 threads
// x 216 registers; Cfg64: two). S = 1: the occupancy query's blocks per SM x the SM count; else the
// runtime's answer (the GPCs decide: a cluster's blocks share one), 0 if it has none.
template <class C, int S>
int max_clusters() {
  static const int n = [] {
    set_smem<C, S, GemmOut::StoreF32>();
    int c = 0;
    if (S == 1) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &c, q_gemm_wgmma_kernel<C, S, GemmOut::StoreF32>, C::THREADS, C::SMEM_BYTES) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        c = 0;
      }
      return c * sm_count();
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config<C>(S, int64_t(S) * 64, nullptr, attr);
    if (cudaOccupancyMaxActiveClusters(&c, q_gemm_wgmma_kernel<C, S, GemmOut::StoreF32>, &cfg) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // clear it: treated as "cannot run"
      c = 0;
    }
    return c;
  }();
  return n;
}

// max_clusters at a runtime split (1, 2, 4; 8 for the small-M forms only), 0 for any other.
template <class C>
int max_clusters_at(int S) {
  switch (S) {
    case 1:
      return max_clusters<C, 1>();
    case 2:
      return max_clusters<C, 2>();
    case 4:
      return max_clusters<C, 4>();
    case 8:
      if constexpr (C::BT <= 64) return max_clusters<C, 8>();
      return 0;
    default:
      return 0;
  }
}

int max_clusters_of(int bt, int S) {
  switch (bt) {
    case 16:
      return max_clusters_at<Cfg16>(S);
    case 32:
      return max_clusters_at<Cfg32>(S);
    case 64:
      return max_clusters_at<Cfg64>(S);
    case 128:
      return max_clusters_at<Cfg128>(S);
    case 256:
      return max_clusters_at<Cfg256>(S);
    default:
      return 0;
  }
}

// (BT, S) of the least estimated time, in 0.1 us: waves x (k-tiles per block x the cost of one +
// a fixed 3 us for the prologue and the epilogue, 4 us with a cluster reduction). A k-tile taken
// as 0.9 us at 256 tokens and 0.6 us at 128: the lab's v2 per-block rates (in_proj at M = 4096:
// 1552 blocks of 256 tokens, 12 waves of 32 k-tiles in 354 us, 0.92 us each with the C stores; at M
// = 512: 388 blocks of 128, 3 waves in 62.6 us, 0.65 us). Candidates in order of preference on a
// tie (smaller clusters first). M <= 64: the small-M form (64-token blocks, 2 per SM) at S = 1, 2,
// 4 or 8, a k-tile taken as 0.5 us (s17 ncu: the 128-token narrow form's in_proj at 64 rows, 16.6
// us for 32 k-tiles) and the fixed part as 3 us + 1 us per doubling of the cluster (the reduce
// reads S partial tiles). M <= 16 / <= 32 take the narrow-stage forms (16 / 32-token blocks, 3 per
// SM) with the same estimate; LILAC_Q4_SMALL_TOKENS=64 keeps them on the 64-token form (A/B).
bool narrow_stages() {
  static const bool on = env_choice("LILAC_Q4_SMALL_TOKENS", {64}) != 64;
  return on;
}

void pick(int M, int N, int KT, bool streamk_ok, int& bt, int& S, int& whole) {
  whole = 0;
  int64_t best = INT64_MAX;
  const int64_t row_blocks = ceil_div(N, 128);
  if (M <= 64) {
    bt = M <= 16 && narrow_stages() ? 16 : M <= 32 && narrow_stages() ? 32 : 64;
    S = 1;
    for (int s = 1, lg = 0; s <= 8; s *= 2, ++lg) {
      if (KT % s != 0) continue;
      const int64_t maxc = max_clusters_of(bt, s);
      if (maxc <= 0) continue;
      const int64_t cost = ceil_div(row_blocks, maxc) * (int64_t(KT / s) * 5 + 30 + 10 * lg);
      if (cost < best) {
        best = cost;
        S = s;
      }
    }
    return;
  }
  constexpr int kCand[][2] = {{256, 1}, {128, 1}, {256, 2}, {128, 2}, {256, 4}, {128, 4}};
  bt = 256;
  S = 1;
  for (const auto& c : kCand) {
    const int b = c[0], s = c[1];
    if (KT % s != 0) continue;
    const int64_t maxc = max_clusters_of(b, s);
    if (maxc <= 0) continue;
    const int64_t tiles = int64_t(ceil_div(M, b)) * row_blocks;
    const int64_t waves = ceil_div(tiles, maxc);
    const int64_t ktile = b == 256 ? 9 : 6, fixed = s > 1 ? 40 : 30;
    const int64_t cost = waves * (int64_t(KT / s) * ktile + fixed);
    if (cost < best) {
      best = cost;
      bt = b;
      S = s;
      whole = 0;
    }
    // s36: the full waves' tiles whole and only the last, part-empty wave's split s ways (one
    // launch, the kernel's `whole`), when that wave's split tiles fit the GPU at once: in_proj at
    // 512 tokens, 194 tiles, = 132 whole + 62 split 2 ways (124 blocks): 32 + 16 k-tiles per SM
    // instead of 32 + 32 (the plain split: 3 waves of 16); qkv there, 144 tiles, = a wave of
    // whole tiles (as many as the clusters of 4 that fit the GPCs hold) + the rest split 4 ways.
    if (s > 1) {
      const int64_t per_wave = maxc * s, full = tiles / per_wave, rest = tiles - full * per_wave;
      const int64_t hybrid = full * (int64_t(KT) * ktile + 30) + int64_t(KT / s) * ktile + fixed;
      if (full >= 1 && rest > 0 && rest * s <= per_wave && hybrid < best) {
        best = hybrid;
        bt = b;
        S = s;
        whole = int(full * per_wave);
      }
    }
  }
  // The stream-K form (S = -1; only with LILAC_Q4_GEMM_STREAMK=auto): every block ~U / P k-tiles
  // in ~U / P / KT + 1 segments (1.5 us of prologue and staging each), a partial tile written per
  // contributor and read by its owner (~1 us per 128 KB tile); taken when its estimate beats the
  // best by 10%: in_proj / qkv at 256 and 512 tokens (predicted 27.1 / 21.8 and 48.3 / 36.5 us
  // against 31.8 and 63.6), not out_proj at 256 (KT 64 over 16 tiles: ~10 segments per tile)
  // nor 1,024 and above (waves of 2.9 and 11.8). Measured (s35 runs 2-3, H100, the chunks'
  // timelines): 36.8 us per call at 256 tokens against the one-block form's 30.5, 59.1 at 512
  // against 54.5; prefill -2.1% / -1.0% at 256 / 512, even at 1,024; where the ~12-15 us per
  // call go is not yet profiled (docs/kernels.md, s35).
  if (!streamk_ok || !q_gemm_streamk_auto()) return;
  const int64_t P = streamk_blocks();
  const int64_t U = int64_t(ceil_div(M, 256)) * row_blocks * KT;
  if (P < 1 || U < P) return;
  const int64_t per = U / P, L = ceil_div(U, P), segs = L / KT + 2;
  const int64_t contributors = ceil_div(int64_t(KT), per);
  const int64_t cost = L * 9 + 15 * segs + 10 * contributors + 5;
  if (10 * cost < 9 * best) {
    bt = 256;
    S = -1;
  }
}

}  // namespace qgemm_wgmma

bool q_gemm_wgmma_available() {
  return device_compute_capability() / 10 == 9;
}

int q_gemm_wgmma_max_clusters(int tokens_per_block, int splits) {
  return qgemm_wgmma::max_clusters_of(tokens_per_block, splits);
}

size_t q_gemm_scratch_bytes() {
  if (!q_gemm_wgmma_available()) return 0;
  return qgemm_wgmma::streamk_bytes(qgemm_wgmma::streamk_blocks());
}

bool q_gemm_scratch_failed(const QGemmScratch& scratch) {
  const int P = qgemm_wgmma::streamk_blocks();
  if (!scratch.ptr || scratch.bytes < qgemm_wgmma::streamk_bytes(P)) return false;
  unsigned e = 0;
  LILAC_CUDA_CHECK(
      cudaMemcpy(&e, qgemm_wgmma::streamk_of(scratch, P).error, 4, cudaMemcpyDeviceToHost));
  return e != 0;
}

void q_gemm_wgmma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode,
                  cudaStream_t stream, int tokens_per_block, int splits,
                  const QGemmScratch& scratch, int whole_tiles) {
  if (!A || !C || !W || !W.sb) fail("q_gemm_wgmma: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.bits != 4)
    fail(
        "q_gemm_wgmma: unsupported M {} W [{}, {}] at {} bits (4-bit, K a positive multiple of 64)",
        M, W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("q_gemm_wgmma: A must be 16-byte aligned");
  // The 16-byte epilogue needs whole groups of 4 rows and an aligned C; else element stores.
  const bool vec = W.rows % 4 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0;
  const int KT = W.cols / kQGroup;
  int bt = tokens_per_block, S = splits, whole = whole_tiles;
  if (whole_tiles != 0 &&
      (splits < 2 || (bt != 256 && bt != 128) || whole_tiles < 0 || whole_tiles % splits != 0 ||
       int64_t(whole_tiles) > int64_t(ceil_div(M, bt)) * ceil_div(W.rows, 128)))
    fail(
        "q_gemm_wgmma: {} whole tiles (a multiple of splits {} >= 2, at most the tiles of 256 or "
        "128 tokens per block, {} here)",
        whole_tiles, splits, bt);
  const bool streamk_ok = scratch.ptr != nullptr && M > 64;
  if (bt == 0 && S == 0) {
    qgemm_wgmma::pick(M, W.rows, KT, streamk_ok, bt, S, whole);
  } else {
    if (bt == 0) bt = 256;
    if (S == 0) S = 1;
  }
  if (S == -1) {
    if (bt != 256) fail("q_gemm_wgmma: the stream-K form (splits -1) has 256-token tiles");
    return qgemm_wgmma::dispatch_streamk(A, M, W, C, mode, vec, scratch, stream);
  }
  if (S < 1 || KT % S != 0) fail("q_gemm_wgmma: {} k-tiles do not split {} ways", KT, S);
  if (bt == 256)
    qgemm_wgmma::dispatch_splits<qgemm_wgmma::Cfg256>(A, M, W, C, mode, vec, S, stream, whole);
  else if (bt == 128 && M <= 64)  // s7's narrow form: wgmma n = 64 (kept for the lab's A/B)
    qgemm_wgmma::dispatch_splits<qgemm_wgmma::Cfg128, 64>(A, M, W, C, mode, vec, S, stream);
  else if (bt == 128)
    qgemm_wgmma::dispatch_splits<qgemm_wgmma::Cfg128>(A, M, W, C, mode, vec, S, stream, whole);
  else if ((bt == 64 && M <= 64) || (bt == 32 && M <= 32) || (bt == 16 && M <= 16))
    qgemm_wgmma::dispatch_small(A, M, W, C, mode, vec, bt, S, stream);
  else
    fail("q_gemm_wgmma: tokens_per_block {} (256, 128; 64 / 32 / 16 up to that many tokens; or 0)",
         bt);
}

}  // namespace lilac::cuda
