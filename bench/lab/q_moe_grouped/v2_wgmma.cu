// q_moe_grouped version 2: the grouped 4-bit expert GEMMs of prefill (q_moe_grouped_gate_up and
// q_moe_grouped_down, src/cuda/q4_moe_prefill.cu) on wgmma, with the main loop of the dense 4-bit
// wgmma GEMM (src/cuda/q4_gemm_wgmma.cu, Cfg128: read its file comment first). The stage copies,
// the shared-memory loads, the k-tile dequantisation and the n = 128 wgmma come from its header
// (q4_gemm_wgmma.cuh; the PTX of this file is the same as with the copies it first had); ktile_step
// and the loop are that file's with the wgmma n a template parameter (v3's n = 32 / 64); what is
// new here is the block -> (routing tile, weight rows) map, the gathered token rows and the two
// epilogues.
//
// Block: 256 threads = 2 warpgroups, 128 weight rows (8 row tiles of 16: warp w owns tile w) x
// one routing tile of moe_route (kMoeTileRows = 128 sorted rows of one expert e: rows [row0,
// min(row0 + 128, offsets[e + 1]))), so the wgmma is m64n128k16 (64 f32 accumulators per
// thread), 8 stages of 16 KB tokens + 4.5 KB weights = 164 KB + 1 KB of shared memory, 1 block
// per SM. Grid = max_tiles x column blocks; block b -> (tile b / n_cb, column block b % n_cb);
// blocks past num_tiles (read on the device) exit at once (as production).
//  * gate_up (K = H): column block cb (I / 64 of them) owns act columns [64 cb, 64 cb + 64):
//    warps 0-3 (warpgroup 0) take gate tiles 4 cb + w of expert e (weight row tiles
//    e 2P + 4 cb + w, P = I / 16), warps 4-7 (warpgroup 1) the up tiles e 2P + P + 4 cb + w - 4.
//    Thread tid of warpgroup 1 holds the up value of exactly the (act column, token) whose gate
//    value thread tid - 128 holds (same position in the m64n128 accumulator layout), so after the
//    main loop warpgroup 1 parks its 64 accumulators in shared memory ([i][tid - 128] f32, 32 KB,
//    conflict-free) and warpgroup 0 writes act = bf16(silu(g) * u) (production's expression).
//    Token rows: x[sorted_token[s]] gathered by the cp.async loads; rows of the tile past the
//    expert's end are zero-filled and not stored.
//  * down (K = I): column block cb (H / 128) owns y columns [128 cb, 128 cb + 128), warp w the
//    weight row tile e TH + 8 cb + w (TH = H / 16); token rows = the tile's act rows
//    (contiguous, stride I); y f32 in sorted order as production.
// Work per block and k-tile as Cfg128 of the dense kernel: 128 x 128 x 64 MACs = 512 tensor
// clocks; in version 2 a partial tile (the second tile of an expert with > 128 rows) costs a full
// one. Version 3 (ADAPT = true, mainloop_rows) runs the same loop at wgmma n = 32 or 64 when the
// tile has <= 32 or <= 64 rows.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "q_moe_grouped_lab.h"
#include "util/error.h"

namespace lilac::lab {

// Named (not anonymous): in a compute_80 pass the kernel bodies are empty (see q4_gemm_wgmma.cu).
namespace qmoe_wgmma {

using cuda::bf16;
using cuda::kQBlockWords;
using cuda::kQSbWords;
using cuda::kQTileRows;
using cuda::QMatrix;
namespace tile = cuda::tile;
namespace qtile = cuda::qtile;

// The shared pieces of the production kernel's main loop (src/cuda/q4_gemm_wgmma.cuh): the stage's
// copies (codes, scale/bias, the swizzled token tile), the shared-memory loads, the 4-bit
// dequantisation of a k-tile into wgmma's A fragments, the n = 128 wgmma.
using cuda::qgemm_wgmma::dequant_ktile;
using cuda::qgemm_wgmma::lds128;
using cuda::qgemm_wgmma::lds64;
using cuda::qgemm_wgmma::wgmma_rs_m64n128k16;

struct Cfg {
  static constexpr int BR = 128;  // weight rows per block: 8 row tiles, warp w owns tile w
  static constexpr int BT = 128;  // token rows per block (one routing tile): the wgmma n
  static constexpr int STAGES = 8, INFLIGHT = 1, PREFETCH = STAGES - 1 - INFLIGHT;
  static constexpr int THREADS = 256;
  static constexpr int ROW_STEP = THREADS / 8;  // token rows per pass (tile::load_operand)
  static constexpr int X_LOADS = BT / ROW_STEP;
  static constexpr int X_STAGE = BT * 128;                                // bytes: [BT][64] bf16
  static constexpr int C_BYTES = 8 * kQBlockWords * 4;                    // codes of 8 tiles: 4096
  static constexpr int W_STAGE = C_BYTES + 8 * kQSbWords * 4;             // + scale/bias: 4608
  static constexpr int SMEM_BYTES = STAGES * (X_STAGE + W_STAGE) + 1024;  // + alignment slack
  static constexpr int NACC = BT / 2;
  static_assert(BT == cuda::kMoeTileRows, "one routing tile per block");
  static_assert(PREFETCH >= 1, "at least one k-tile of prefetch");
  static_assert(X_STAGE % 1024 == 0, "X stages stay 1024-byte aligned (128B swizzle atoms)");
  static_assert(SMEM_BYTES <= 232448, "227 KB of dynamic shared memory per block");
  static_assert(NACC * 128 * 4 <= STAGES * X_STAGE, "the gate_up exchange fits the X stages");
};

// As wgmma_rs_m64n128k16 with n = 64: d[0, 32) of the 64 accumulators (tokens [0, 64)), the rest
// untouched.
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

// As wgmma_rs_m64n128k16 with n = 32: d[0, 16) of the 64 accumulators (tokens [0, 32)), the rest
// untouched.
__device__ __forceinline__ void wgmma_rs_m64n32k16(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (N == 128)
    wgmma_rs_m64n128k16(d, a, desc_b);
  else if constexpr (N == 64)
    wgmma_rs_m64n64k16(d, a, desc_b);
  else
    wgmma_rs_m64n32k16(d, a, desc_b);
}

using cuda::qgemm_wgmma::WSrc;
__device__ __forceinline__ void load_stage(const tile::RowSet<Cfg::X_LOADS>& xr, const WSrc& w,
                                           uint32_t sx, uint32_t sw, int kt, int K) {
  cuda::qgemm_wgmma::load_stage<Cfg>(xr, w, sx, sw, kt, K);
}

// One k-tile of the main loop (q4_gemm_wgmma.cu's ktile_step): `a` is this k-tile's A register
// buffer, the other buffer belongs to the group still in flight. N: the wgmma n (tokens computed).
template <int N>
__device__ __forceinline__ void ktile_step(float (&acc)[Cfg::NACC], uint32_t (&a)[4][4], int kt,
                                           int KT, int K, int& stage, int& fill, uint32_t sX,
                                           uint32_t sW, const tile::RowSet<Cfg::X_LOADS>& xr,
                                           const WSrc& w) {
  constexpr int S = Cfg::STAGES, P = Cfg::PREFETCH;
  // Groups committed: P + kt (tile g is group g); P - 1 pending at most => tile kt landed.
  tile::cp_async_wait<P - 1>();
  tile::fence_proxy_async_smem();
  __syncthreads();
  // Refill: tile kt + P into the stage of tile kt + P - S <= kt - 2, whose wgmma group both
  // warpgroups retired (wgmma_wait<1> in iteration kt - 1) and whose codes they read (iteration
  // kt - 2) before the barrier above.
  if (kt + P < KT)
    load_stage(xr, w, sX + uint32_t(fill * Cfg::X_STAGE), sW + uint32_t(fill * Cfg::W_STAGE),
               kt + P, K);
  tile::cp_async_commit();
  fill = fill + 1 == S ? 0 : fill + 1;

  dequant_ktile(sW + uint32_t(stage * Cfg::W_STAGE), a);
  const uint64_t db = tile::sw128_desc(sX + uint32_t(stage * Cfg::X_STAGE));
  // Pin the A registers here: the dequantisation must not sink between the wgmmas (ptxas would
  // then serialise every wgmma: C7513).
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[kk][i])::"memory");
  tile::wgmma_fence();  // the A registers were just written
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs<N>(acc, a[kk], db + uint64_t(2 * kk));
  tile::wgmma_commit();
  tile::wgmma_wait<Cfg::INFLIGHT>();
  tile::fence_operands(acc);
  stage = stage + 1 == S ? 0 : stage + 1;
}

// acc = W_rows . X^T over k in [0, K) (q4_gemm_wgmma.cu's loop, K a multiple of 64). Leaves no
// wgmma or cp.async in flight; does not synchronise at the end. N < 128: only tokens [0, N) are
// computed (the others' accumulators stay 0).
template <int N>
__device__ __forceinline__ void mainloop(float (&acc)[Cfg::NACC],
                                         const tile::RowSet<Cfg::X_LOADS>& xr, const WSrc& w, int K,
                                         uint32_t sX, uint32_t sW) {
#pragma unroll
  for (int i = 0; i < Cfg::NACC; ++i) acc[i] = 0.f;
  const int KT = K / tile::kBK;
#pragma unroll
  for (int s = 0; s < Cfg::PREFETCH; ++s) {
    if (s < KT)
      load_stage(xr, w, sX + uint32_t(s * Cfg::X_STAGE), sW + uint32_t(s * Cfg::W_STAGE), s, K);
    tile::cp_async_commit();
  }
  tile::fence_operands(acc);
  int stage = 0, fill = Cfg::PREFETCH % Cfg::STAGES;
  uint32_t a0[4][4], a1[4][4];  // the A registers of even and odd k-tiles
  int kt = 0;
  for (; kt + 1 < KT; kt += 2) {
    ktile_step<N>(acc, a0, kt, KT, K, stage, fill, sX, sW, xr, w);
    ktile_step<N>(acc, a1, kt + 1, KT, K, stage, fill, sX, sW, xr, w);
  }
  if (kt < KT) ktile_step<N>(acc, a0, kt, KT, K, stage, fill, sX, sW, xr, w);
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
  tile::cp_async_wait<0>();
}

// The main loop at n = 128, or (ADAPT, version 3) at the smallest of n = 32, 64, 128 that covers
// the tile's `rows` token rows (uniform over the block).
template <bool ADAPT>
__device__ __forceinline__ void mainloop_rows(float (&acc)[Cfg::NACC],
                                              const tile::RowSet<Cfg::X_LOADS>& xr, const WSrc& w,
                                              int K, uint32_t sX, uint32_t sW, int rows) {
  if constexpr (ADAPT) {
    if (rows <= 32) return mainloop<32>(acc, xr, w, K, sX, sW);
    if (rows <= 64) return mainloop<64>(acc, xr, w, K, sX, sW);
  }
  mainloop<128>(acc, xr, w, K, sX, sW);
}

// moe_route's tile table (MoeRouting's device pointers).
struct Tiles {
  const int32_t* sorted_token;
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
};

// Sorted rows [row0, row_end) of routing tile `t` and its expert; false past num_tiles.
__device__ __forceinline__ bool tile_rows(const Tiles& tt, int t, int& e, int& row0, int& row_end) {
  if (t >= *tt.num_tiles) return false;
  e = tt.tile_expert[t];
  row0 = tt.tile_row0[t];
  row_end = min(row0 + Cfg::BT, tt.offsets[e + 1]);
  return true;
}

// The block's token rows: sorted rows row0 + load_row0() + 32 i (i < 4), each the row
// x[sorted_token[s]] (gather) or x[s] (sorted_token null), stride ld; rows >= row_end zero-filled.
__device__ __forceinline__ tile::RowSet<Cfg::X_LOADS> token_rows(const bf16* x, int ld,
                                                                 const int32_t* sorted_token,
                                                                 int row0, int row_end) {
  tile::RowSet<Cfg::X_LOADS> xr;
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < Cfg::X_LOADS; ++i) {
    const int row = row0 + tile::load_row0() + i * Cfg::ROW_STEP;
    const bool ok = row < row_end;
    const int src = ok ? (sorted_token ? sorted_token[row] : row) : 0;
    xr.ptr[i] = x + size_t(src) * size_t(ld);
    xr.valid |= uint32_t(ok) << i;
  }
  return xr;
}

template <bool ADAPT>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix W, int I, Tiles tt,
                   bf16* __restrict__ act) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_cb = I / 64;
  const int cb = int(blockIdx.x) % n_cb;
  int e, row0, row_end;
  if (!tile_rows(tt, int(blockIdx.x) / n_cb, e, row0, row_end)) return;
  const int tid = threadIdx.x, P = I / kQTileRows, G = W.groups();
  const tile::RowSet<Cfg::X_LOADS> xr = token_rows(x, H, tt.sorted_token, row0, row_end);
  // Warp v's row tile: gate tile 4 cb + v (v < 4) or up tile 4 cb + v - 4 of expert e.
  auto tile_of = [&](int v) { return e * 2 * P + (v >> 2) * P + 4 * cb + (v & 3); };
  WSrc w;
  w.codes_ok = w.sb_ok = true;  // I % 64 == 0: every warp's tile exists
  w.codes = W.codes + size_t(tile_of(tid >> 5)) * size_t(G) * kQBlockWords + (tid & 31) * 4;
  w.sb = W.sb + size_t(tile_of((tid & 31) >> 2)) * size_t(G) * kQSbWords + (tid & 3) * 4;
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(Cfg::STAGES * Cfg::X_STAGE);
  float acc[Cfg::NACC];
  mainloop_rows<ADAPT>(acc, xr, w, H, sX, sW, row_end - row0);

  // Warpgroup 1 (up) -> shared memory -> warpgroup 0 (gate). The stages are free once every warp
  // is past its main loop (its last wgmma retired, its copies landed).
  __syncthreads();
  float* xch = reinterpret_cast<float*>(smem);  // [NACC][128] f32
  const int wt = tid & 127;
  if (tid >= 128) {
#pragma unroll
    for (int i = 0; i < Cfg::NACC; ++i) xch[i * 128 + wt] = acc[i];
  }
  __syncthreads();
  if (tid >= 128) return;
  // acc[4 j + q]: gate row (= act column) 16 warp + g + 8 (q >> 1) of the block's 64, token
  // 8 j + 2 t + (q & 1) of the tile.
  const int lane = tid & 31;
  const int col0 = 64 * cb + 16 * (tid >> 5) + (lane >> 2);
  const int s0 = row0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::BT / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = col0 + 8 * (q >> 1), s = s0 + 8 * j + (q & 1);
      if (s < row_end) {
        const float gv = acc[4 * j + q], uv = xch[(4 * j + q) * 128 + wt];
        act[size_t(s) * size_t(I) + col] = __float2bfloat16_rn(cuda::silu(gv) * uv);
      }
    }
#else
  (void)x, (void)H, (void)W, (void)I, (void)tt, (void)act;
  __trap();
#endif
}

template <bool ADAPT>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    down_kernel(const bf16* __restrict__ act, int I, QMatrix W, int H, Tiles tt,
                float* __restrict__ y) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_cb = (H + Cfg::BR - 1) / Cfg::BR;
  const int cb = int(blockIdx.x) % n_cb;
  int e, row0, row_end;
  if (!tile_rows(tt, int(blockIdx.x) / n_cb, e, row0, row_end)) return;
  const int tid = threadIdx.x, TH = H / kQTileRows, G = W.groups();
  const tile::RowSet<Cfg::X_LOADS> xr = token_rows(act, I, nullptr, row0, row_end);
  // Warp v's row tile: 8 cb + v of expert e (clamped: the address stays valid when it is past).
  WSrc w;
  {
    const int ct = 8 * cb + (tid >> 5), st = 8 * cb + ((tid & 31) >> 2);
    w.codes_ok = ct < TH;
    w.sb_ok = st < TH;
    w.codes =
        W.codes + size_t(e * TH + min(ct, TH - 1)) * size_t(G) * kQBlockWords + (tid & 31) * 4;
    w.sb = W.sb + size_t(e * TH + min(st, TH - 1)) * size_t(G) * kQSbWords + (tid & 3) * 4;
  }
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(Cfg::STAGES * Cfg::X_STAGE);
  float acc[Cfg::NACC];
  mainloop_rows<ADAPT>(acc, xr, w, I, sX, sW, row_end - row0);

  // acc[4 j + q]: y column 128 cb + 16 warp + g + 8 (q >> 1), token 8 j + 2 t + (q & 1).
  const int lane = tid & 31;
  const int c0 = Cfg::BR * cb + 16 * (tid >> 5) + (lane >> 2);
  const int s0 = row0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::BT / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int c = c0 + 8 * (q >> 1), s = s0 + 8 * j + (q & 1);
      if (s < row_end && c < H) y[size_t(s) * size_t(H) + c] = acc[4 * j + q];
    }
#else
  (void)act, (void)I, (void)W, (void)H, (void)tt, (void)y;
  __trap();
#endif
}

Tiles tiles_of(const cuda::MoeRouting& r) {
  return {r.sorted_token, r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles};
}

template <class Kernel>
void prepare(Kernel kernel, std::once_flag& once) {
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES));
  });
}

void check(const char* what, const cuda::MoeRouting& r, const QMatrix& m, int rows_multiple,
           int cols, int H, int I, const void* in, const void* out) {
  if (!r.topk_idx || r.T < 1) fail("{}: routing workspace not laid out", what);
  if (!m || !m.sb || !in || !out) fail("{}: null pointer", what);
  if (H < 64 || H % 64 || I < 64 || I % 64)
    fail("{}: H {} and I {} must be positive multiples of 64", what, H, I);
  if (m.bits != 4 || m.cols != cols || m.rows < rows_multiple || m.rows % rows_multiple != 0)
    fail("{}: weights [{}, {}] at {} bits (4-bit, rows a multiple of {}, {} columns)", what, m.rows,
         m.cols, m.bits, rows_multiple, cols);
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0) fail("{}: input must be 16-byte aligned", what);
}

template <bool ADAPT>
void launch_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const cuda::MoeRouting& r,
                    bf16* act, cudaStream_t stream) {
  check("q_moe_grouped_gate_up (lab)", r, gate_up, 2 * I, H, H, I, x, act);
  auto kernel = gate_up_kernel<ADAPT>;
  static std::once_flag once;
  prepare(kernel, once);
  const int64_t blocks = int64_t(r.max_tiles) * (I / 64);
  if (blocks < 1 || blocks > 0x7fffffff) fail("q_moe_grouped_gate_up (lab): {} blocks", blocks);
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(x, H, gate_up, I, tiles_of(r),
                                                                      act);
  LILAC_CUDA_LAUNCHED();
}

template <bool ADAPT>
void launch_down(const bf16* act, int I, const QMatrix& down, int H, const cuda::MoeRouting& r,
                 float* y, cudaStream_t stream) {
  check("q_moe_grouped_down (lab)", r, down, H, I, H, I, act, y);
  auto kernel = down_kernel<ADAPT>;
  static std::once_flag once;
  prepare(kernel, once);
  const int64_t blocks = int64_t(r.max_tiles) * ((H + Cfg::BR - 1) / Cfg::BR);
  if (blocks < 1 || blocks > 0x7fffffff) fail("q_moe_grouped_down (lab): {} blocks", blocks);
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(act, I, down, H, tiles_of(r),
                                                                      y);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace qmoe_wgmma

bool q_moe_grouped_v2_available() {
  return cuda::q_gemm_wgmma_available();
}

void q_moe_grouped_gate_up_v2(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream) {
  qmoe_wgmma::launch_gate_up<false>(x, H, gate_up, I, r, act, stream);
}
void q_moe_grouped_down_v2(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream) {
  qmoe_wgmma::launch_down<false>(act, I, down, H, r, y, stream);
}
void q_moe_grouped_gate_up_v3(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream) {
  qmoe_wgmma::launch_gate_up<true>(x, H, gate_up, I, r, act, stream);
}
void q_moe_grouped_down_v3(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream) {
  qmoe_wgmma::launch_down<true>(act, I, down, H, r, y, stream);
}

}  // namespace lilac::lab
