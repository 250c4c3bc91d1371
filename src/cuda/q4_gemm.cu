// Prefill GEMM over 4/8-bit weights: C[M, N] (=|+=) A[M, K] . W[N, K]^T, computed as
// C^T = W . A^T so the weights are the MMA's A operand (16-row fragments straight from the tiled
// layout, q4_layout.h) and the activations the B operand (ldmatrix from swizzled shared memory).
//
// Work at the model's shapes, per chunk of M = 4096 tokens (2 M N K FLOPs; weight bytes at 4.5
// bits; A read once per weight row block from L2; C written):
//   shape (N x K)             GFLOP  W (q4)   C          @790 TF/s  mma.sync ~420 TF/s (pred.)
//   GDN in_proj 12352 x 2048   207   14.2 MB  202 MB f32  262 us     490 us
//   qkv_proj     9216 x 2048   155   10.6 MB  151 MB f32  196 us     370 us
//   out/o_proj   2048 x 4096    69    4.7 MB   34 MB +=    87 us     165 us
//   router        257 x 2048  4.3    0.6 MB    4 MB f32    5 us      15 us (8-bit)
//   shared down  2048 x 512     8.6   0.6 MB   34 MB f32   11 us      25 us
// Compute-bound from M ~ 256 up (in_proj at M = 256: 13 GFLOP = 31 us vs 14 MB = 3.3 us).
// The dequantisation is 15 ALU instructions (3 SHF, 4 LOP3, 8 HFMA2.BF16) per 8 weights per
// block, against 128 tokens x 8 weights of MMA work: ~1 ALU instruction per HMMA issued.
//
// Design (q4_tile.cuh, q_gemm_mainloop): block = 8 warps = 256 weight rows x 128 tokens; warp w
// owns weight rows [32 w, 32 w + 32) of the block (two 16-row tiles) against all 128 tokens
// (128 f32 accumulators per thread). Per 64-column k-tile (one quantization group): the A tile
// [128 tokens x 64] bf16 comes through a 4-stage cp.async pipeline (64 KB of shared memory, one
// barrier per k-tile), each warp's weights (2 x 16 bytes of codes + 8 bytes of scales per lane
// and tile) through registers, two k-tiles ahead. Per k16 step a warp dequantises 2 words into
// two A fragments and issues 8 ldmatrix.x4 + 32 MMAs. 1 block per SM (~210 registers).
// Block ids are rasterised in groups of 8 token tiles (consecutive blocks share a weight row
// block, and the group's A tiles stay in L2). Tails: token rows past M are zero-filled by
// cp.async and not stored; weight rows past N are in the zero-padded last tile, or belong to
// warps past the matrix, which skip their MMAs; rows past N are not stored.
// The epilogue stores C^T fragments: per (tile, n8 tile) a lane writes C[token][row] for 2
// tokens x 2 rows; the 8 lanes of equal t write 8 consecutive rows (32-byte segments).
#include "cuda/q4_gemm.h"

#include <algorithm>
#include <mutex>

#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using qtile::kQRows;
using qtile::kQSmemBytes;
using qtile::kQThreads;
using qtile::kQTokens;

using qtile::raster;
using qtile::store_one;

template <int BITS, GemmOut MODE>
__global__ void __launch_bounds__(kQThreads, 1)
    q_gemm_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ C,
                  int tiles_m, int tiles_n) {
  extern __shared__ __align__(1024) unsigned char smem[];
  int tm, tn;
  raster(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * kQTokens;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_tiles = W.tiles(), G = W.groups();
  const int t0 = tn * (kQRows / kQTileRows) + 2 * warp;  // the warp's first 16-row tile
  const bool active = t0 < n_tiles;
  constexpr int PL = BITS / 4;
  const uint32_t* codes[2];
  const uint32_t* sb[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = min(t0 + r, n_tiles - 1);
    codes[r] = W.codes + size_t(t) * G * PL * kQBlockWords;
    sb[r] = W.sb + size_t(t) * G * kQSbWords;
  }
  qtile::XRows xr;
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < qtile::XCfg::LOADS; ++i) {
    const int row = m0 + tile::load_row0() + i * qtile::XCfg::ROW_STEP;
    const bool ok = row < M;
    xr.ptr[i] = A + size_t(ok ? row : 0) * size_t(K);
    xr.valid |= uint32_t(ok) << i;
  }
  float acc[2][16][4];
  const uint32_t* const cc[2] = {codes[0], codes[1]};
  const uint32_t* const ss[2] = {sb[0], sb[1]};
  qtile::q_gemm_mainloop<BITS>(acc, cc, ss, active, xr, K, reinterpret_cast<bf16*>(smem));
  if (!active) return;

  const int N = W.rows;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = (t0 + r) * kQTileRows + g + 8 * (q >> 1);
        const int tok = m0 + 8 * n + 2 * t + (q & 1);
        if (row < N && tok < M)
          store_one<MODE>(C, size_t(tok) * size_t(N) + size_t(row), acc[r][n][q]);
      }
}

template <int BITS, GemmOut MODE>
void launch(const bf16* A, int M, const QMatrix& W, void* C, cudaStream_t stream) {
  auto kernel = q_gemm_kernel<BITS, MODE>;
  static std::once_flag once;
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSmemBytes));
  });
  const int tiles_m = ceil_div(M, kQTokens), tiles_n = ceil_div(W.rows, kQRows);
  const int64_t blocks = int64_t(tiles_m) * tiles_n;
  if (blocks > 0x7fffffff) fail("q_gemm: {} x {} needs {} blocks", M, W.rows, blocks);
  kernel<<<unsigned(blocks), kQThreads, kQSmemBytes, stream>>>(A, M, W.cols, W, C, tiles_m,
                                                               tiles_n);
  LILAC_CUDA_LAUNCHED();
}

template <int BITS>
void dispatch(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch<BITS, GemmOut::StoreF32>(A, M, W, C, stream);
    case GemmOut::StoreBF16:
      return launch<BITS, GemmOut::StoreBF16>(A, M, W, C, stream);
    case GemmOut::AccumulateF32:
      return launch<BITS, GemmOut::AccumulateF32>(A, M, W, C, stream);
  }
}

}  // namespace

void q_gemm(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream,
            const QGemmScratch& scratch) {
  if (W.bits == 4 && q_gemm_wgmma_available())
    q_gemm_wgmma(A, M, W, C, mode, stream, 0, 0, scratch);
  else
    q_gemm_mma(A, M, W, C, mode, stream);
}

void q_gemm_mma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode,
                cudaStream_t stream) {
  if (!A || !C || !W || !W.sb) fail("q_gemm: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 ||
      (W.bits != 4 && W.bits != 8))
    fail("q_gemm: unsupported M {} W [{}, {}] at {} bits (K a positive multiple of 64)", M, W.rows,
         W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("q_gemm: A must be 16-byte aligned");
  if (W.bits == 4)
    dispatch<4>(A, M, W, C, mode, stream);
  else
    dispatch<8>(A, M, W, C, mode, stream);
}

}  // namespace lilac::cuda
