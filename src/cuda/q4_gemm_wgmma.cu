// q_gemm's 4-bit path on Hopper (version 2 of the kernel lab's q_gemm, production since s6: in_proj
// at 4096 tokens 593 -> 354 us, 349 -> 585 TFLOP/s, faster than the BF16 wgmma GEMM's 377 us;
// bench/lab/q_gemm/README.md): the 4-bit prefill GEMM on wgmma, the weights dequantised in
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
// tile are the layout's zero padding. Epilogue as q4_gemm.cu: per (n8 block j, q) a lane stores
// C[token][row]; the 8 lanes of equal t write 8 consecutive rows (32-byte segments).
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {

// A named namespace, not an anonymous one: in the compute_80 pass (LILAC_CUDA_PTX) the kernel
// body is empty and nvcc would warn about every unused internal function and member.
namespace qgemm_wgmma {

template <class C, GemmOut MODE>
__global__ void __launch_bounds__(C::THREADS, 1)
    q_gemm_wgmma_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ out,
                        int tiles_m, int tiles_n) {
#if defined(LILAC_SM90A)
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

  float acc[C::NACC];
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  const int KT = K / tile::kBK;
#pragma unroll
  for (int s = 0; s < C::PREFETCH; ++s) {
    if (s < KT)
      load_stage<C>(xr, w, sX + uint32_t(s * C::X_STAGE), sW + uint32_t(s * C::W_STAGE), s, K);
    tile::cp_async_commit();
  }
  tile::fence_operands(acc);
  int stage = 0, fill = C::PREFETCH % C::STAGES;
  uint32_t a0[4][4], a1[4][4];  // the A registers of even and odd k-tiles
  // Unrolled by two k-tiles so each buffer is a fixed set of registers; every path into a step
  // comes from the other buffer's step (no path redefines a buffer whose group may be in flight,
  // else ptxas serialises the wgmmas: C7513).
  int kt = 0;
  for (; kt + 1 < KT; kt += 2) {
    ktile_step<C>(acc, a0, kt, KT, K, stage, fill, sX, sW, xr, w);
    ktile_step<C>(acc, a1, kt + 1, KT, K, stage, fill, sX, sW, xr, w);
  }
  if (kt < KT) ktile_step<C>(acc, a0, kt, KT, K, stage, fill, sX, sW, xr, w);
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
  tile::cp_async_wait<0>();

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
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n;
  __trap();
#endif
}

template <class C, GemmOut MODE>
void launch(const bf16* A, int M, const QMatrix& W, void* out, cudaStream_t stream) {
  auto kernel = q_gemm_wgmma_kernel<C, MODE>;
  static std::once_flag once;
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES));
  });
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t blocks = int64_t(tiles_m) * tiles_n;
  if (blocks > 0x7fffffff) fail("q_gemm_wgmma: {} x {} needs {} blocks", M, W.rows, blocks);
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

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    LILAC_CUDA_CHECK(cudaGetDevice(&dev));
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

// 256 tokens per block unless 128 finishes in fewer (tile-area weighted) waves: with one block
// per SM the time is ~ waves x tile area; the 128-token tile is taken as 15% less efficient (half
// the MMAs per dequantised weight and per barrier).
int pick_tokens(int M, int N) {
  const int64_t sms = sm_count(), tn = ceil_div(N, 128);
  const int64_t w256 = ceil_div(int64_t(ceil_div(M, 256)) * tn, sms);
  const int64_t w128 = ceil_div(int64_t(ceil_div(M, 128)) * tn, sms);
  return double(w128) * 128 * 1.15 < double(w256) * 256 ? 128 : 256;
}

}  // namespace qgemm_wgmma

bool q_gemm_wgmma_available() {
  return device_compute_capability() / 10 == 9;
}

void q_gemm_wgmma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode,
                  cudaStream_t stream, int tokens_per_block) {
  if (!A || !C || !W || !W.sb) fail("q_gemm_wgmma: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.bits != 4)
    fail(
        "q_gemm_wgmma: unsupported M {} W [{}, {}] at {} bits (4-bit, K a positive multiple of 64)",
        M, W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("q_gemm_wgmma: A must be 16-byte aligned");
  if (tokens_per_block == 0) tokens_per_block = qgemm_wgmma::pick_tokens(M, W.rows);
  if (tokens_per_block == 256)
    qgemm_wgmma::dispatch<qgemm_wgmma::Cfg256>(A, M, W, C, mode, stream);
  else if (tokens_per_block == 128)
    qgemm_wgmma::dispatch<qgemm_wgmma::Cfg128>(A, M, W, C, mode, stream);
  else
    fail("q_gemm_wgmma: tokens_per_block {} (256, 128 or 0)", tokens_per_block);
}

}  // namespace lilac::cuda
