// The grouped 4-bit expert GEMMs of prefill on wgmma (q_moe_grouped_gate_up_wgmma /
// q_moe_grouped_down_wgmma, q4_moe.h; the kernel lab's q_moe_grouped version 3, production since
// s7: 1,089 -> 742 us per layer at 4096 tokens, bench/lab/q_moe_grouped/README.md). The main loop
// is the dense 4-bit wgmma GEMM's (q4_gemm_wgmma.cuh, Cfg128: read q4_gemm_wgmma.cu's file
// comment first); what is new here is the block -> (routing tile, weight rows) map, the gathered
// token rows, the wgmma n chosen per tile, and the two epilogues.
//
// Block: 256 threads = 2 warpgroups, 128 weight rows (8 row tiles of 16: warp w owns tile w) x
// one routing tile of moe_route (kMoeTileRows = 128 sorted rows of one expert e: rows [row0,
// min(row0 + 128, offsets[e + 1]))), 8 stages of 16 KB tokens + 4.5 KB weights = 164 KB + 1 KB of
// shared memory, 1 block per SM. The wgmma is m64nNk16 with N the smallest of 32, 64, 128 that
// covers the tile's rows (the loop instantiated three times, chosen per block: an expert's short
// second tile costs ~0.3 of a full one); the accumulators are the same 64 per thread (d[4 j + q]
// does not depend on N; the ones past N stay 0 and their rows are not stored), and the cp.async
// fills all 128 token rows (zeros past the tile). Grid = max_tiles x column blocks; block b ->
// (tile b / n_cb, column block b % n_cb); blocks past num_tiles (read on the device) exit at once.
//  * gate_up (K = H): column block cb (I / 64 of them) owns act columns [64 cb, 64 cb + 64):
//    warps 0-3 (warpgroup 0) take gate tiles 4 cb + w of expert e (weight row tiles
//    e 2P + 4 cb + w, P = I / 16), warps 4-7 (warpgroup 1) the up tiles e 2P + P + 4 cb + w - 4.
//    Thread tid of warpgroup 1 holds the up value of exactly the (act column, token) whose gate
//    value thread tid - 128 holds (same position in the accumulator layout), so after the main
//    loop warpgroup 1 parks its 64 accumulators in shared memory ([i][tid - 128] f32, 32 KB,
//    conflict-free) and warpgroup 0 writes act = bf16(silu(g) * u) (the mma.sync kernel's
//    expression). Token rows: x[sorted_token[s]] gathered by the cp.async loads.
//  * down (K = I): column block cb (H / 128) owns y columns [128 cb, 128 cb + 128), warp w the
//    weight row tile e TH + 8 cb + w (TH = H / 16); token rows = the tile's act rows
//    (contiguous, stride I); y f32 in sorted order.
// Work per block and k-tile at N = 128: 128 x 128 x 64 MACs = 512 tensor clocks. Lab (s6 run 6,
// H200, T = 4096 uniform): gate_up 486 us + down 255 us per layer (278 TFLOP/s on the real MACs;
// the mma.sync kernels: 690 + 399); T = 512: 386 us (446); skewed T = 1000: 413 us (525).
// Resources (sm_90a): gate_up 150 registers, down 141, no spills.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {

// Named (not anonymous): in a compute_80 pass the kernel bodies are empty (see q4_gemm_wgmma.cu).
namespace qmoe_wgmma {

using Cfg = qgemm_wgmma::Cfg128;  // 128 weight rows x 128 tokens, 8 stages (165 KB)
using qgemm_wgmma::WSrc;
static_assert(Cfg::BT == kMoeTileRows, "one routing tile per block");
static_assert(Cfg::NACC * 128 * 4 <= Cfg::STAGES * Cfg::X_STAGE, "the gate_up exchange fits");

// The main loop at the smallest wgmma n of 32, 64, 128 that covers the tile's `rows` token rows
// (uniform over the block); ADAPT false: always 128 (the kernel lab's version 2).
template <bool ADAPT>
__device__ __forceinline__ void mainloop_rows(float (&acc)[Cfg::NACC],
                                              const tile::RowSet<Cfg::X_LOADS>& xr, const WSrc& w,
                                              int K, uint32_t sX, uint32_t sW, int rows) {
  if constexpr (ADAPT) {
    if (rows <= 32) return qgemm_wgmma::mainloop<Cfg, 32>(acc, xr, w, K, sX, sW);
    if (rows <= 64) return qgemm_wgmma::mainloop<Cfg, 64>(acc, xr, w, K, sX, sW);
  }
  qgemm_wgmma::mainloop<Cfg, 128>(acc, xr, w, K, sX, sW);
}

// moe_route's tile table (MoeRouting's device pointers), or (dense_rows > 0) dense_rows token rows
// of one "expert" in 128-row tiles: the shared expert's gate_up.
struct Tiles {
  const int32_t* sorted_token;
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int dense_rows;
};

// Sorted rows [row0, row_end) of routing tile `t` and its expert; false past num_tiles.
__device__ __forceinline__ bool tile_rows(const Tiles& tt, int t, int& e, int& row0, int& row_end) {
  if (tt.dense_rows > 0) {
    e = 0;
    row0 = t * Cfg::BT;
    row_end = min(row0 + Cfg::BT, tt.dense_rows);
    return row0 < tt.dense_rows;
  }
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
        act[size_t(s) * size_t(I) + col] = __float2bfloat16_rn(silu(gv) * uv);
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

Tiles tiles_of(const MoeRouting& r) {
  return {r.sorted_token, r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles, 0};
}

template <class Kernel>
void prepare(Kernel kernel, std::once_flag& once) {
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES));
  });
}

void check(const char* what, const MoeRouting* r, const QMatrix& m, int rows_multiple, int cols,
           int H, int I, const void* in, const void* out) {
  if (r && (!r->topk_idx || r->T < 1)) fail("{}: routing workspace not laid out", what);
  if (!m || !m.sb || !in || !out) fail("{}: null pointer", what);
  if (H < 64 || H % 64 || I < 64 || I % 64)
    fail("{}: H {} and I {} must be positive multiples of 64", what, H, I);
  if (m.bits != 4 || m.cols != cols || m.rows < rows_multiple || m.rows % rows_multiple != 0)
    fail("{}: weights [{}, {}] at {} bits (4-bit, rows a multiple of {}, {} columns)", what, m.rows,
         m.cols, m.bits, rows_multiple, cols);
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0) fail("{}: input must be 16-byte aligned", what);
}

template <bool ADAPT>
void launch_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const MoeRouting& r,
                    bf16* act, cudaStream_t stream) {
  check("q_moe_grouped_gate_up (wgmma)", &r, gate_up, 2 * I, H, H, I, x, act);
  auto kernel = gate_up_kernel<ADAPT>;
  static std::once_flag once;
  prepare(kernel, once);
  const int64_t blocks = int64_t(r.max_tiles) * (I / 64);
  if (blocks < 1 || blocks > 0x7fffffff) fail("q_moe_grouped_gate_up (wgmma): {} blocks", blocks);
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(x, H, gate_up, I, tiles_of(r),
                                                                      act);
  LILAC_CUDA_LAUNCHED();
}

template <bool ADAPT>
void launch_down(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r, float* y,
                 cudaStream_t stream) {
  check("q_moe_grouped_down (wgmma)", &r, down, H, I, H, I, act, y);
  auto kernel = down_kernel<ADAPT>;
  static std::once_flag once;
  prepare(kernel, once);
  const int64_t blocks = int64_t(r.max_tiles) * ((H + Cfg::BR - 1) / Cfg::BR);
  if (blocks < 1 || blocks > 0x7fffffff) fail("q_moe_grouped_down (wgmma): {} blocks", blocks);
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(act, I, down, H, tiles_of(r),
                                                                      y);
  LILAC_CUDA_LAUNCHED();
}

void launch_shared_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int Is, bf16* act,
                           cudaStream_t stream) {
  check("q_moe_shared_gate_up (wgmma)", nullptr, gate_up, 2 * Is, H, H, Is, x, act);
  if (gate_up.rows != 2 * Is || T < 1)
    fail("q_moe_shared_gate_up (wgmma): {} rows for Is {}, T {}", gate_up.rows, Is, T);
  auto kernel = gate_up_kernel<true>;
  static std::once_flag once;
  prepare(kernel, once);
  const int64_t blocks = int64_t(ceil_div(T, Cfg::BT)) * (Is / 64);
  if (blocks > 0x7fffffff) fail("q_moe_shared_gate_up (wgmma): {} blocks", blocks);
  const Tiles dense{nullptr, nullptr, nullptr, nullptr, nullptr, T};
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(x, H, gate_up, Is, dense,
                                                                      act);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace qmoe_wgmma

bool q_moe_grouped_wgmma_available() {
  return q_gemm_wgmma_available();
}

void q_moe_grouped_gate_up_wgmma(const bf16* x, int H, const QMatrix& gate_up, int I,
                                 const MoeRouting& r, bf16* act, cudaStream_t stream,
                                 bool adapt_n) {
  if (adapt_n)
    qmoe_wgmma::launch_gate_up<true>(x, H, gate_up, I, r, act, stream);
  else
    qmoe_wgmma::launch_gate_up<false>(x, H, gate_up, I, r, act, stream);
}

void q_moe_shared_gate_up_wgmma(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                                bf16* act, cudaStream_t stream) {
  qmoe_wgmma::launch_shared_gate_up(x, T, H, shared_gate_up, Is, act, stream);
}

void q_moe_grouped_down_wgmma(const bf16* act, int I, const QMatrix& down, int H,
                              const MoeRouting& r, float* y, cudaStream_t stream, bool adapt_n) {
  if (adapt_n)
    qmoe_wgmma::launch_down<true>(act, I, down, H, r, y, stream);
  else
    qmoe_wgmma::launch_down<false>(act, I, down, H, r, y, stream);
}

}  // namespace lilac::cuda
