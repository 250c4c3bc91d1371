// MoE prefill over 4/8-bit experts: grouped gate_up (+ the shared expert's, dense rows) and
// grouped down, on the routing tables of moe_route (moe_prefill.h); the combine and the routing
// are the BF16 path's kernels (they do not touch weights).
//
// Work per layer at T = 4096 tokens (P = T k = 32768 pairs, ~128 per expert, uniform router):
//   grouped gate_up  137 GFLOP, weights 256 x 1.18 MB = 302 MB (q4) + x gathered 17 MB + act 34 MB
//   grouped down      69 GFLOP, weights 151 MB + act 34 MB + y 268 MB (f32)
//   shared gate_up    17 GFLOP, 1.2 MB + 17 MB + 4 MB
// At T = 256 (2048 pairs, ~8 per expert) every expert's weights are still read once: 453 MB per
// layer in 4-bit = 105 us at 4.3 TB/s (vs 1.6 GB = 375 us in bf16): 4-bit prefill of short
// prompts is 3.5x less bound by weight bytes.
//
// 4-bit weights on Hopper take the wgmma kernels (q4_moe_prefill_wgmma.cu); the kernels here are
// the path for 8-bit weights and other GPUs (q_moe_grouped_*_mma).
//
// Design: the q_gemm engine (q4_tile.cuh: 8 warps, 256 weight rows x 128 tokens, weights
// dequantised in registers, tokens through a cp.async pipeline) with the tile table of moe_route:
// grid = max_tiles x column blocks, block -> (tile = bid / n_cb, column block = bid % n_cb);
// blocks past num_tiles (read on the device) exit at once.
//  * gate_up: warp w of column block cb owns output tile p = 8 cb + w (16 outputs) and takes the
//    gate rows 16 p .. and the up rows I + 16 p .. of its expert as its two weight tiles, so every
//    thread holds the gate and up accumulators of the same (token, output) and writes
//    act = bf16(silu(g) * u) directly (128 act columns per block). Tokens gathered through
//    sorted_token in the cp.async loads (or dense rows for the shared expert).
//  * down: 256 rows of down_e per block against the tile's act rows (contiguous), y f32 in
//    sorted order.
#include <algorithm>
#include <mutex>

#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using qtile::kQRows;
using qtile::kQSmemBytes;
using qtile::kQThreads;
using qtile::kQTokens;
using qtile::kQWarps;

static_assert(kQTokens == kMoeTileRows, "the routing tile table is built for 128-row tiles");

struct GroupArgs {
  const int32_t* sorted_token;  // null: dense rows (the shared expert)
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int dense_rows;
};

struct TileWork {
  int e, row0, row_end;
  // 16-token pairs of the tile that hold rows (1..8): the MMAs past them are skipped.
  __device__ int token_pairs() const { return max(1, min(8, (row_end - row0 + 15) / 16)); }
};

template <bool GROUPED>
__device__ __forceinline__ bool tile_work(int tile, const GroupArgs& g, TileWork& w) {
  if constexpr (GROUPED) {
    if (tile >= *g.num_tiles) return false;
    w.e = g.tile_expert[tile];
    w.row0 = g.tile_row0[tile];
    w.row_end = g.offsets[w.e + 1];
  } else {
    w.e = 0;
    w.row0 = tile * kQTokens;
    w.row_end = g.dense_rows;
  }
  return true;
}

// The token rows of the tile (sorted rows [row0, row_end)), each the row of x of token
// sorted_token[s] (or row s itself when sorted_token is null).
__device__ __forceinline__ qtile::XRows gather(const bf16* x, int ld, const int32_t* sorted_token,
                                               const TileWork& w) {
  qtile::XRows s;
  s.valid = 0;
#pragma unroll
  for (int i = 0; i < qtile::XCfg::LOADS; ++i) {
    const int row = w.row0 + tile::load_row0() + i * qtile::XCfg::ROW_STEP;
    const bool ok = row < w.row_end;
    const int src = ok ? (sorted_token ? sorted_token[row] : row) : 0;
    s.ptr[i] = x + size_t(src) * size_t(ld);
    s.valid |= uint32_t(ok) << i;
  }
  return s;
}

template <int BITS, bool GROUPED>
__global__ void __launch_bounds__(kQThreads, 1)
    q_moe_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I, GroupArgs ga,
                         bf16* __restrict__ act) {
  extern __shared__ __align__(1024) unsigned char smem[];
  constexpr int COLS = kQWarps * kQTileRows;  // act columns per block
  const int n_cb = (I + COLS - 1) / COLS;
  const int tile = blockIdx.x / n_cb, cb = blockIdx.x % n_cb;
  TileWork w;
  if (!tile_work<GROUPED>(tile, ga, w)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int P = I / kQTileRows, G = gate_up.groups();
  const int p = cb * kQWarps + warp;
  const bool active = p < P;
  const int gate_tile = w.e * 2 * P + (active ? p : 0);
  constexpr int PL = BITS / 4;
  const uint32_t* const codes[2] = {gate_up.codes + size_t(gate_tile) * G * PL * kQBlockWords,
                                    gate_up.codes + size_t(gate_tile + P) * G * PL * kQBlockWords};
  const uint32_t* const sb[2] = {gate_up.sb + size_t(gate_tile) * G * kQSbWords,
                                 gate_up.sb + size_t(gate_tile + P) * G * kQSbWords};
  const qtile::XRows xr = gather(x, H, ga.sorted_token, w);
  float acc[2][16][4];
  qtile::q_gemm_mainloop<BITS>(acc, codes, sb, active, xr, H, reinterpret_cast<bf16*>(smem),
                               w.token_pairs());
  if (!active) return;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = p * kQTileRows + g + 8 * (q >> 1);
      const int s = w.row0 + 8 * n + 2 * t + (q & 1);
      if (s < w.row_end) {
        const float gv = acc[0][n][q], uv = acc[1][n][q];
        act[size_t(s) * size_t(I) + i] = __float2bfloat16_rn(silu(gv) * uv);
      }
    }
}

template <int BITS>
__global__ void __launch_bounds__(kQThreads, 1)
    q_moe_down_kernel(const bf16* __restrict__ act, int I, QMatrix down, int H, GroupArgs ga,
                      float* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_cb = (H + kQRows - 1) / kQRows;
  const int tile = blockIdx.x / n_cb, cb = blockIdx.x % n_cb;
  TileWork w;
  if (!tile_work<true>(tile, ga, w)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int TH = H / kQTileRows, G = down.groups();
  const int t0 = cb * (kQRows / kQTileRows) + 2 * warp;  // tile within the expert
  const bool active = t0 < TH;
  constexpr int PL = BITS / 4;
  const uint32_t* codes[2];
  const uint32_t* sb[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int mt = w.e * TH + min(t0 + r, TH - 1);
    codes[r] = down.codes + size_t(mt) * G * PL * kQBlockWords;
    sb[r] = down.sb + size_t(mt) * G * kQSbWords;
  }
  const uint32_t* const cc[2] = {codes[0], codes[1]};
  const uint32_t* const ss[2] = {sb[0], sb[1]};
  const qtile::XRows xr = gather(act, I, nullptr, w);
  float acc[2][16][4];
  qtile::q_gemm_mainloop<BITS>(acc, cc, ss, active, xr, I, reinterpret_cast<bf16*>(smem),
                               w.token_pairs());
  if (!active) return;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int c = (t0 + r) * kQTileRows + g + 8 * (q >> 1);
        const int s = w.row0 + 8 * n + 2 * t + (q & 1);
        if (s < w.row_end && c < H) y[size_t(s) * size_t(H) + c] = acc[r][n][q];
      }
}

template <class Kernel>
void prepare(Kernel kernel, std::once_flag& once, int64_t blocks, const char* what) {
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSmemBytes));
  });
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
}

template <int BITS, bool GROUPED>
void launch_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const GroupArgs& g,
                    int tiles, bf16* act, cudaStream_t stream) {
  auto kernel = q_moe_gate_up_kernel<BITS, GROUPED>;
  static std::once_flag once;
  const int64_t blocks = int64_t(tiles) * ceil_div(I, kQWarps * kQTileRows);
  prepare(kernel, once, blocks, "q_moe gate_up");
  kernel<<<unsigned(blocks), kQThreads, kQSmemBytes, stream>>>(x, H, gate_up, I, g, act);
  LILAC_CUDA_LAUNCHED();
}

template <int BITS>
void launch_down(const bf16* act, int I, const QMatrix& down, int H, const GroupArgs& g, int tiles,
                 float* y, cudaStream_t stream) {
  auto kernel = q_moe_down_kernel<BITS>;
  static std::once_flag once;
  const int64_t blocks = int64_t(tiles) * ceil_div(H, kQRows);
  prepare(kernel, once, blocks, "q_moe down");
  kernel<<<unsigned(blocks), kQThreads, kQSmemBytes, stream>>>(act, I, down, H, g, y);
  LILAC_CUDA_LAUNCHED();
}

void check(const char* what, const QMatrix& m, int rows_multiple, int cols, int H, int I) {
  if (!m || !m.sb) fail("cuda::{}: null weights", what);
  if (H < 64 || H % 64 || I < 64 || I % 64)
    fail("cuda::{}: H {} and I {} must be positive multiples of 64", what, H, I);
  if (m.cols != cols || m.rows < rows_multiple || m.rows % rows_multiple != 0 ||
      (m.bits != 4 && m.bits != 8))
    fail("cuda::{}: weights [{}, {}] at {} bits (rows a multiple of {}, {} columns)", what, m.rows,
         m.cols, m.bits, rows_multiple, cols);
}

void check_routing(const MoeRouting& r, const char* what) {
  if (!r.topk_idx || r.T < 1) fail("{}: routing workspace not laid out", what);
}

GroupArgs group_args(const MoeRouting& r) {
  return {r.sorted_token, r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles, 0};
}

}  // namespace

void q_moe_grouped_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const MoeRouting& r,
                           bf16* act, cudaStream_t stream, QMoeWgmmaTile tile) {
  if (gate_up.bits == 4 && q_moe_grouped_wgmma_available())
    q_moe_grouped_gate_up_wgmma(x, H, gate_up, I, r, act, stream, tile);
  else
    q_moe_grouped_gate_up_mma(x, H, gate_up, I, r, act, stream);
}

void q_moe_grouped_down(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r,
                        float* y, cudaStream_t stream, QMoeWgmmaTile tile) {
  if (down.bits == 4 && q_moe_grouped_wgmma_available())
    q_moe_grouped_down_wgmma(act, I, down, H, r, y, stream, tile);
  else
    q_moe_grouped_down_mma(act, I, down, H, r, y, stream);
}

void q_moe_grouped_gate_up_mma(const bf16* x, int H, const QMatrix& gate_up, int I,
                               const MoeRouting& r, bf16* act, cudaStream_t stream) {
  check_routing(r, "q_moe_grouped_gate_up");
  check("q_moe_grouped_gate_up", gate_up, 2 * I, H, H, I);
  if (!x || !act) fail("cuda::q_moe_grouped_gate_up: null pointer");
  const GroupArgs g = group_args(r);
  if (gate_up.bits == 4)
    launch_gate_up<4, true>(x, H, gate_up, I, g, r.max_tiles, act, stream);
  else
    launch_gate_up<8, true>(x, H, gate_up, I, g, r.max_tiles, act, stream);
}

void q_moe_shared_gate_up(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                          bf16* act, cudaStream_t stream, QMoeWgmmaTile tile) {
  if (shared_gate_up.bits == 4 && q_moe_grouped_wgmma_available())
    q_moe_shared_gate_up_wgmma(x, T, H, shared_gate_up, Is, act, stream, tile);
  else
    q_moe_shared_gate_up_mma(x, T, H, shared_gate_up, Is, act, stream);
}

void q_moe_shared_gate_up_mma(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                              bf16* act, cudaStream_t stream) {
  check("q_moe_shared_gate_up", shared_gate_up, 2 * Is, H, H, Is);
  if (shared_gate_up.rows != 2 * Is)
    fail("cuda::q_moe_shared_gate_up: {} rows", shared_gate_up.rows);
  if (!x || !act || T < 1) fail("cuda::q_moe_shared_gate_up: bad arguments (T {})", T);
  const GroupArgs g{nullptr, nullptr, nullptr, nullptr, nullptr, T};
  const int tiles = ceil_div(T, kQTokens);
  if (shared_gate_up.bits == 4)
    launch_gate_up<4, false>(x, H, shared_gate_up, Is, g, tiles, act, stream);
  else
    launch_gate_up<8, false>(x, H, shared_gate_up, Is, g, tiles, act, stream);
}

void q_moe_grouped_down_mma(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r,
                            float* y, cudaStream_t stream) {
  check_routing(r, "q_moe_grouped_down");
  check("q_moe_grouped_down", down, H, I, H, I);
  if (!act || !y) fail("cuda::q_moe_grouped_down: null pointer");
  const GroupArgs g = group_args(r);
  if (down.bits == 4)
    launch_down<4>(act, I, down, H, g, r.max_tiles, y, stream);
  else
    launch_down<8>(act, I, down, H, g, r.max_tiles, y, stream);
}

}  // namespace lilac::cuda
