// The kernel lab's q_gemm version 2: production's 4-bit Hopper kernel from s6 until s7
// (src/cuda/q4_gemm_wgmma.cu had it; version 3, which replaced it, keeps its main loop and changes
// the split of K and the epilogue). The design is that file's comment: 256 threads = 2
// warpgroups, 128 weight rows (8 row tiles of 16, warp w owns tile w) x BT tokens (256 or 128),
// the weights dequantised in registers as wgmma's A operand, the tokens as B from 128-byte swizzled
// shared memory, a STAGES-deep cp.async pipeline (q4_gemm_wgmma.cuh: mainloop). Epilogue: per
// (n8 block j, q) a lane stores C[token][row] (store_one; for y += a load the store waits on); the
// 8 lanes of equal t write 8 consecutive rows (32-byte segments).
#include <cstdint>
#include <mutex>

#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "q_gemm_lab.h"
#include "util/error.h"

namespace lilac::lab {
using namespace cuda;

// Named (not anonymous): in a compute_80 pass the kernel body is empty (see q4_gemm_wgmma.cuh).
namespace qgemm_v2 {

using qgemm_wgmma::Cfg128;
using qgemm_wgmma::Cfg256;

template <class C, GemmOut MODE>
__global__ void __launch_bounds__(C::THREADS, 1)
    q_gemm_v2_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ out,
                     int tiles_m, int tiles_n) {
#if defined(LILAC_SM90A)
  using namespace qgemm_wgmma;
  extern __shared__ __align__(1024) unsigned char smem[];
  int tm, tn;
  raster(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * C::BT, t0 = tn * (C::BR / kQTileRows);  // first token, first row tile
  const int tid = threadIdx.x, n_tiles = W.tiles(), G = W.groups();

  tile::RowSet<C::X_LOADS> xr;
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < C::X_LOADS; ++i) {
    const int row = m0 + tile::load_row0() + i * C::ROW_STEP;
    const bool ok = row < M;
    xr.ptr[i] = A + size_t(ok ? row : 0) * size_t(K);
    xr.valid |= uint32_t(ok) << i;
  }
  WSrc w;
  {
    const int ct = t0 + (tid >> 5), st = t0 + ((tid & 31) >> 2);
    w.codes_ok = ct < n_tiles;
    w.sb_ok = st < n_tiles;
    // Clamped to a valid tile: the address must be valid even when nothing is read.
    w.codes = W.codes + size_t(min(ct, n_tiles - 1)) * size_t(G) * kQBlockWords + (tid & 31) * 4;
    w.sb = W.sb + size_t(min(st, n_tiles - 1)) * size_t(G) * kQSbWords + (tid & 3) * 4;
  }
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  float acc[C::NACC];
  mainloop<C>(acc, xr, w, K, sX, sW);

  // acc[4 j + q]: row 16 warp + g + 8 (q >> 1) of the block, token 8 j + 2 t + (q & 1).
  const int N = W.rows, lane = tid & 31;
  const int row0 = t0 * kQTileRows + 16 * (tid >> 5) + (lane >> 2);
  const int tok0 = m0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < C::BT / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = row0 + 8 * (q >> 1), tok = tok0 + 8 * j + (q & 1);
      if (row < N && tok < M)
        store_one<MODE>(out, size_t(tok) * size_t(N) + size_t(row), acc[4 * j + q]);
    }
#else
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n;
  __trap();
#endif
}

template <class C, GemmOut MODE>
void launch(const bf16* A, int M, const QMatrix& W, void* out, cudaStream_t stream) {
  auto kernel = q_gemm_v2_kernel<C, MODE>;
  static std::once_flag once;
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES));
  });
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t blocks = int64_t(tiles_m) * tiles_n;
  if (blocks > 0x7fffffff) fail("lab::q_gemm_v2: {} x {} needs {} blocks", M, W.rows, blocks);
  kernel<<<unsigned(blocks), C::THREADS, C::SMEM_BYTES, stream>>>(A, M, W.cols, W, out, tiles_m,
                                                                  tiles_n);
  LILAC_CUDA_LAUNCHED();
}

template <class C>
void dispatch(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, cudaStream_t s) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch<C, GemmOut::StoreF32>(A, M, W, out, s);
    case GemmOut::StoreBF16:
      return launch<C, GemmOut::StoreBF16>(A, M, W, out, s);
    case GemmOut::AccumulateF32:
      return launch<C, GemmOut::AccumulateF32>(A, M, W, out, s);
  }
}

// 256 tokens per block unless 128 finishes in fewer (tile-area weighted) waves (v2's rule: one
// block per SM, the 128-token tile taken as 15% less efficient).
int pick_tokens(int M, int N) {
  int dev = 0, sms = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t tn = ceil_div(N, 128);
  const int64_t w256 = ceil_div(int64_t(ceil_div(M, 256)) * tn, int64_t(sms));
  const int64_t w128 = ceil_div(int64_t(ceil_div(M, 128)) * tn, int64_t(sms));
  return double(w128) * 128 * 1.15 < double(w256) * 256 ? 128 : 256;
}

}  // namespace qgemm_v2

void q_gemm_v2(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream,
               int tokens_per_block) {
  if (!A || !C || !W || !W.sb) fail("lab::q_gemm_v2: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.bits != 4)
    fail("lab::q_gemm_v2: unsupported M {} W [{}, {}] at {} bits", M, W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("lab::q_gemm_v2: A must be 16-byte aligned");
  if (tokens_per_block == 0) tokens_per_block = qgemm_v2::pick_tokens(M, W.rows);
  if (tokens_per_block == 256)
    qgemm_v2::dispatch<qgemm_v2::Cfg256>(A, M, W, C, mode, stream);
  else if (tokens_per_block == 128)
    qgemm_v2::dispatch<qgemm_v2::Cfg128>(A, M, W, C, mode, stream);
  else
    fail("lab::q_gemm_v2: tokens_per_block {} (256, 128 or 0)", tokens_per_block);
}

}  // namespace lilac::lab
