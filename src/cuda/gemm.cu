// Prefill GEMM: C[M, N] (=|+=) A[M, K] . W[N, K]^T, bf16 operands, f32 accumulation.
//
// Work at the model's shapes (H = 2048), per chunk of M = 8192 tokens (2 M N K FLOPs; bytes = A
// once + W once + C written, or read and written for the residual add):
//   shape (N x K)            GFLOP   bytes (A + W + C)          compute @790 TF/s   bytes @4.3 TB/s
//   GDN in_proj 12352x2048    414    34 + 51 + 405 MB (f32)     524 us              114 us
//   qkv_proj     9216x2048    309    34 + 38 + 302 MB (f32)     391 us               87 us
//   out/o_proj   2048x4096    137    67 + 17 + 134 MB (+=)      174 us               51 us
//   router        257x2048    8.6    34 + 1 + 8 MB (f32)         11 us               10 us
//   shared g/u   1024x2048     34    34 + 4 + 17 MB (bf16)       44 us               13 us
//   shared down  2048x512      17    8 + 2 + 67 MB (f32)         22 us               18 us
//   lm_head    248320x2048   8330    34 + 1017 + 8136 MB (f32) 10.5 ms              2.1 ms
// Every shape but the tiny-N ones is compute-bound by 3-5x at M = 8192; at M = 512 the weight
// bytes start to matter (in_proj: 26 GFLOP = 33 us vs 51 MB = 12 us). Target: >= 60% of 790.
//
// Design: one thread block per C tile, block ids rasterised in groups of 8 tile rows (consecutive
// blocks share the A row-panel and sweep 8 W panels, so both stay in L2). Two engines:
//  * mma.sync (all targets; gemm_tile.cuh): warps of 64 x 64 (or 32 x 64) sub-tiles, m16n8k16
//    bf16 MMAs fed by ldmatrix.x4 from 128-byte-swizzled shared memory, a 3-4 stage cp.async.cg
//    pipeline with one barrier per 64-deep k-tile. Tiles 128x256 (8 warps, 4 stages, 192 KB,
//    1 block/SM), 128x128 (4 warps, 3 stages, 96 KB, 2 blocks/SM), 64x128 (4 warps of 32x64,
//    3 stages, 72 KB, 3 blocks/SM). Per 64-deep k-tile a 64x64 warp issues 8 ldmatrix.x4 per 32
//    MMAs (shared-memory traffic 1/4 of the MMA operand bytes).
//  * wgmma (sm_90a only): 128 x 256 (or 128 x 128) tile, two warpgroups of 64 x BN each, the same
//    cp.async pipeline into the same swizzled layout, described to wgmma by 128B-swizzle
//    descriptors; one wgmma group (4 x k16) per k-tile left in flight.
// Tails: rows past M or N are zero-filled on load and not stored; K tails (K % 64 != 0, K % 8 ==
// 0) are zero-filled 16-byte chunks. The epilogue writes straight from the accumulators (each
// quad of lanes writes 32 contiguous bytes of a row: whole 32-byte sectors), with float2 /
// bf16x2 stores when N is even and scalar stores otherwise (N = 257 for the router).
#include "cuda/gemm.h"

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/gemm_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using tile::Config;
using tile::RowSet;
using tile::WgConfig;

using CfgL = Config<128, 256, 64, 4, 1>;  // 8 warps
using CfgM = Config<128, 128, 64, 3, 2>;  // 4 warps
using CfgS = Config<64, 128, 32, 3, 3>;   // 4 warps of 32 x 64
using CfgW = WgConfig<256, 4, 1, 1>;      // 2 warpgroups, 192 KB + 1 KB

using tile::raster;

// Rows [first, first + LOADS * STEP) of a [rows, K] operand as this thread loads them.
template <class Cfg, int LOADS>
__device__ __forceinline__ RowSet<LOADS> dense_rows(const bf16* base, int first, int rows, int K) {
  RowSet<LOADS> s;
  s.valid = 0;
  const int r0 = first + tile::load_row0();
#pragma unroll
  for (int i = 0; i < LOADS; ++i) {
    const int r = r0 + i * Cfg::ROW_STEP;
    const bool ok = r < rows;
    s.ptr[i] = base + size_t(ok ? r : 0) * size_t(K);
    s.valid |= uint32_t(ok) << i;
  }
  return s;
}

// C[row, col .. col+1] (=|+=) (v0, v1), clipped to M x N. VEC: N is even and C suitably aligned,
// so a pair starting at an even column is whole and can be one 8-byte (4-byte for bf16) access.
template <GemmOut MODE, bool VEC>
__device__ __forceinline__ void store_pair(void* C, int M, int N, int row, int col, float v0,
                                           float v1) {
  if (row >= M || col >= N) return;
  const size_t off = size_t(row) * size_t(N) + size_t(col);
  if constexpr (MODE == GemmOut::StoreBF16) {
    bf16* c = static_cast<bf16*>(C) + off;
    if constexpr (VEC) {
      *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(v0, v1);
    } else {
      c[0] = __float2bfloat16_rn(v0);
      if (col + 1 < N) c[1] = __float2bfloat16_rn(v1);
    }
  } else {
    float* c = static_cast<float*>(C) + off;
    if constexpr (VEC) {
      float2 o = make_float2(v0, v1);
      if constexpr (MODE == GemmOut::AccumulateF32) {
        const float2 p = *reinterpret_cast<const float2*>(c);
        o.x += p.x;
        o.y += p.y;
      }
      *reinterpret_cast<float2*>(c) = o;
    } else {
      if constexpr (MODE == GemmOut::AccumulateF32) {
        c[0] += v0;
        if (col + 1 < N) c[1] += v1;
      } else {
        c[0] = v0;
        if (col + 1 < N) c[1] = v1;
      }
    }
  }
}

template <class Cfg, GemmOut MODE, bool VEC>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    gemm_mma_kernel(const bf16* __restrict__ A, const bf16* __restrict__ W, void* __restrict__ C,
                    int M, int N, int K, int tiles_m, int tiles_n) {
  extern __shared__ __align__(1024) unsigned char smem[];
  int tm, tn;
  raster(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * Cfg::BM, n0 = tn * Cfg::BN;
  const auto a_rows = dense_rows<Cfg, Cfg::A_LOADS>(A, m0, M, K);
  const auto b_rows = dense_rows<Cfg, Cfg::B_LOADS>(W, n0, N, K);
  float acc[Cfg::MT][Cfg::NT][4];
  tile::mainloop<Cfg>(acc, a_rows, b_rows, K, reinterpret_cast<bf16*>(smem));

  const tile::WarpOrigin o = tile::warp_origin<Cfg>();
#pragma unroll
  for (int i = 0; i < Cfg::MT; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::NT; ++j) {
      const int row = m0 + o.row + i * 16, col = n0 + o.col + j * 8;
      store_pair<MODE, VEC>(C, M, N, row, col, acc[i][j][0], acc[i][j][1]);
      store_pair<MODE, VEC>(C, M, N, row + 8, col, acc[i][j][2], acc[i][j][3]);
    }
}

template <class Cfg, GemmOut MODE, bool VEC>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    gemm_wgmma_kernel(const bf16* __restrict__ A, const bf16* __restrict__ W, void* __restrict__ C,
                      int M, int N, int K, int tiles_m, int tiles_n) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  int tm, tn;
  raster(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * Cfg::BM, n0 = tn * Cfg::BN;
  const auto a_rows = dense_rows<Cfg, Cfg::A_LOADS>(A, m0, M, K);
  const auto b_rows = dense_rows<Cfg, Cfg::B_LOADS>(W, n0, N, K);
  float acc[Cfg::NACC];
  tile::wgmma_mainloop<Cfg>(acc, a_rows, b_rows, K, smem);

  const tile::WarpOrigin o = tile::wgmma_origin();
  const int row = m0 + o.row;
#pragma unroll
  for (int j = 0; j < Cfg::BN / 8; ++j) {
    const int col = n0 + o.col + j * 8;
    store_pair<MODE, VEC>(C, M, N, row, col, acc[4 * j + 0], acc[4 * j + 1]);
    store_pair<MODE, VEC>(C, M, N, row + 8, col, acc[4 * j + 2], acc[4 * j + 3]);
  }
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)A, (void)W, (void)C, (void)M, (void)N, (void)K, (void)tiles_m, (void)tiles_n;
  __trap();
#endif
}

// ---- host side ----------------------------------------------------------------------------------

struct DeviceInfo {
  int sms = 132;
  bool sm90 = false;
};

const DeviceInfo& device_info() {
  static DeviceInfo cache[16];
  static bool filled[16] = {};
  static std::mutex mu;
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 0 || dev >= 16) fail("gemm: device index {} out of range", dev);
  if (!filled[dev]) {
    int sms = 0, major = 0;
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cache[dev].sms = sms;
    cache[dev].sm90 = major == 9;
    filled[dev] = true;
  }
  return cache[dev];
}

// Raises a kernel's dynamic shared-memory limit once (per process; the engine uses one device).
template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class Cfg, GemmOut MODE, bool VEC, bool WGMMA>
void launch(const bf16* A, int M, int K, const bf16* W, int N, void* C, cudaStream_t stream) {
  auto kernel = [] {
    if constexpr (WGMMA)
      return gemm_wgmma_kernel<Cfg, MODE, VEC>;
    else
      return gemm_mma_kernel<Cfg, MODE, VEC>;
  }();
  static std::once_flag once;
  std::call_once(once, [&] { allow_smem(kernel, Cfg::SMEM_BYTES); });
  const int tiles_m = ceil_div(M, Cfg::BM), tiles_n = ceil_div(N, Cfg::BN);
  const int64_t blocks = int64_t(tiles_m) * tiles_n;
  if (blocks > 0x7fffffff) fail("gemm: {} x {} needs {} blocks", M, N, blocks);
  kernel<<<unsigned(blocks), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(A, W, C, M, N, K, tiles_m,
                                                                      tiles_n);
  LILAC_CUDA_LAUNCHED();
}

template <class Cfg, bool WGMMA>
void dispatch(const bf16* A, int M, int K, const bf16* W, int N, void* C, GemmOut mode, bool vec,
              cudaStream_t stream) {
  switch (mode) {
    case GemmOut::StoreF32:
      return vec ? launch<Cfg, GemmOut::StoreF32, true, WGMMA>(A, M, K, W, N, C, stream)
                 : launch<Cfg, GemmOut::StoreF32, false, WGMMA>(A, M, K, W, N, C, stream);
    case GemmOut::StoreBF16:
      return vec ? launch<Cfg, GemmOut::StoreBF16, true, WGMMA>(A, M, K, W, N, C, stream)
                 : launch<Cfg, GemmOut::StoreBF16, false, WGMMA>(A, M, K, W, N, C, stream);
    case GemmOut::AccumulateF32:
      return vec ? launch<Cfg, GemmOut::AccumulateF32, true, WGMMA>(A, M, K, W, N, C, stream)
                 : launch<Cfg, GemmOut::AccumulateF32, false, WGMMA>(A, M, K, W, N, C, stream);
  }
}

// Estimated time of a tiling, in units of (tile elements / SM throughput): every SM must run
// ceil(tiles / SMs) blocks, `resident` of them at once, and a block configuration with c blocks
// resident reaches the fraction eff[c - 1] of the SM's tensor rate. The efficiencies are
// estimates (mma.sync on Hopper peaks near 2/3 of wgmma; a lone 4-warp block hides less latency);
// the benchmark reports every tiling so they can be refitted.
struct TileModel {
  GemmTile tile;
  int bm, bn, max_resident;
  float eff[3];
};
constexpr TileModel kModels[] = {
    {GemmTile::Wgmma128x256, 128, 256, 1, {1.45f, 0.f, 0.f}},
    {GemmTile::Mma128x256, 128, 256, 1, {1.00f, 0.f, 0.f}},
    {GemmTile::Mma128x128, 128, 128, 2, {0.70f, 0.92f, 0.f}},
    {GemmTile::Mma64x128, 64, 128, 3, {0.50f, 0.72f, 0.78f}},
};

GemmTile choose(int M, int N, const DeviceInfo& dev) {
  double best = 1e300;
  GemmTile pick = GemmTile::Mma128x128;
  for (const TileModel& m : kModels) {
    if (m.tile == GemmTile::Wgmma128x256 && !dev.sm90) continue;
    const int64_t tiles = int64_t(ceil_div(M, m.bm)) * ceil_div(N, m.bn);
    const int64_t per_sm = ceil_div(tiles, int64_t(dev.sms));
    const int resident = int(std::min<int64_t>(per_sm, m.max_resident));
    const int64_t rounds = ceil_div(per_sm, int64_t(m.max_resident));
    const double t = double(rounds) * m.bm * m.bn * resident / m.eff[resident - 1];
    if (t < best) best = t, pick = m.tile;
  }
  return pick;
}

}  // namespace

const char* gemm_tile_name(GemmTile tile) {
  switch (tile) {
    case GemmTile::Auto:
      return "auto";
    case GemmTile::Mma128x256:
      return "mma128x256";
    case GemmTile::Mma128x128:
      return "mma128x128";
    case GemmTile::Mma64x128:
      return "mma64x128";
    case GemmTile::Wgmma128x256:
      return "wgmma128x256";
  }
  return "?";
}

GemmTile gemm_auto_tile(int M, int N, int /*K*/) {
  return choose(M, N, device_info());
}

void gemm(const bf16* A, int M, int K, const bf16* W, int N, void* C, GemmOut mode,
          cudaStream_t stream, GemmTile tile) {
  if (M < 1 || N < 1 || K < 8 || K % 8 != 0)
    fail("gemm: bad shape M {} N {} K {} (M, N >= 1; K a positive multiple of 8)", M, N, K);
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(W)) % 16 != 0)
    fail("gemm: A and W must be 16-byte aligned");
  const DeviceInfo& dev = device_info();
  if (tile == GemmTile::Auto) tile = choose(M, N, dev);
  if (tile == GemmTile::Wgmma128x256 && !dev.sm90) tile = GemmTile::Mma128x256;
  const uintptr_t need = mode == GemmOut::StoreBF16 ? 4 : 8;
  const bool vec = N % 2 == 0 && reinterpret_cast<uintptr_t>(C) % need == 0;
  switch (tile) {
    case GemmTile::Wgmma128x256:
      return dispatch<CfgW, true>(A, M, K, W, N, C, mode, vec, stream);
    case GemmTile::Mma128x256:
      return dispatch<CfgL, false>(A, M, K, W, N, C, mode, vec, stream);
    case GemmTile::Mma128x128:
      return dispatch<CfgM, false>(A, M, K, W, N, C, mode, vec, stream);
    case GemmTile::Mma64x128:
    case GemmTile::Auto:
      return dispatch<CfgS, false>(A, M, K, W, N, C, mode, vec, stream);
  }
}

}  // namespace lilac::cuda
