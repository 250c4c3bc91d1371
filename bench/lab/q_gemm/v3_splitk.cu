// The kernel lab's q_gemm version 3: v2 (cuda::q_gemm_wgmma, src/cuda/q4_gemm_wgmma.cu) for the
// 2048-row projections (GDN out_proj, attention o_proj: N = 2048, K = 4096, y += at M = 512 ..
// 4096 tokens), which v2 runs at 24-40% of 790 TFLOP/s (README.md here).
//
// Two changes, v2's main loop unchanged (the device code of q4_gemm_wgmma.cuh: same block of 128
// weight rows x BT tokens, same pipeline, same dequantisation and RS wgmma):
//  1. Split-K over a thread-block cluster: the S blocks (S = 1, 2 or 4; cluster dims (S, 1, 1),
//     consecutive blockIdx.x) of one output tile each run k-tiles [r KT / S, (r + 1) KT / S) of
//     the tile (rank r). M = 512 out_proj: 4 x 16 tiles of 128 tokens -> 128 blocks at S = 2
//     (v2: 64 blocks on 132 SMs). The launcher picks (BT, S) by estimated time (pick below):
//     out_proj M = 512 -> (256, 4) (or (128, 2) if 32 clusters of 4 do not fit), M = 1000 ->
//     (256, 2), M = 4096 -> (256, 1).
//  2. The epilogue through shared memory: each block writes its 128 x BT f32 partial tile into its
//     own (now idle) pipeline memory, token-major [BT][132] (132 floats per token: the 8 lanes of
//     a fragment row g and 4 of t hit 32 distinct banks), then (cluster barrier) rank r sums
//     tokens [r BT / S, (r + 1) BT / S) of the tile over ranks 0 .. S - 1 in rank order (f32,
//     deterministic, no atomics), reading the other ranks' tiles through distributed shared
//     memory, and writes C once: a warp per token, 16 bytes per lane (a token's 128 rows = 512
//     contiguous bytes), for y += the residual's 16-byte loads of up to 8 tokens issued before
//     any of their stores. v2's epilogue is scalar, 32-byte segments, and each `+=` is a load
//     the next store waits on: BT / 2 dependent L2/DRAM round trips per thread (at 256 tokens
//     ~128 x ~0.5 us if nothing overlapped them), suspected as most of out_proj's gap to in_proj
//     at M = 4096 (per k-tile 1.7 us vs 0.92 us).
// y += adds the reduced sum into y once: y = y + ((p_0 + p_1) + ...) (v2: y = y + acc).
//
// Shared memory: v2's pipeline (BT = 256: 6 stages, 219 KB + 1 KB; BT = 128: 8 stages, 168 KB +
// 1 KB) reused for the staged tile (BT x 132 x 4 = 132 KB / 66 KB). Registers: v2's main loop
// (216 / 128); the epilogue holds at most 8 float4 of the residual.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/cluster.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "q_gemm_lab.h"
#include "util/error.h"

namespace lilac::lab {
using namespace cuda;

// Named (not anonymous): in a compute_80 pass the kernel body is empty (see q4_gemm_wgmma.cuh).
namespace qgemm_v3 {

using qgemm_wgmma::Cfg128;
using qgemm_wgmma::Cfg256;

constexpr int kPad = 132;  // floats per token of the staged tile (128 rows + 4: no bank conflicts)

template <class C>
constexpr int stage_bytes() {
  return C::BT * kPad * 4;
}
static_assert(stage_bytes<Cfg256>() + 1024 <= Cfg256::SMEM_BYTES, "staged tile fits (BT 256)");
static_assert(stage_bytes<Cfg128>() + 1024 <= Cfg128::SMEM_BYTES, "staged tile fits (BT 128)");

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

template <class C, int S, GemmOut MODE>
__global__ void __launch_bounds__(C::THREADS, 1)
    q_gemm_v3_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ out,
                     int tiles_m, int tiles_n) {
#if defined(LILAC_SM90A)
  using namespace qgemm_wgmma;
  extern __shared__ __align__(1024) unsigned char smem[];
  const int rank = S > 1 ? int(cluster::ctarank()) : 0;  // == blockIdx.x % S
  int tm, tn;
  raster(int(blockIdx.x) / S, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * C::BT, t0 = tn * (C::BR / kQTileRows);  // first token, first row tile
  const int tid = threadIdx.x, n_tiles = W.tiles(), G = W.groups();
  // This rank's K range: groups [g0, g0 + KT) (the launcher checks (K / 64) % S == 0).
  const int KT = K / tile::kBK / S, g0 = rank * KT, Kl = KT * tile::kBK;

  tile::RowSet<C::X_LOADS> xr;
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < C::X_LOADS; ++i) {
    const int row = m0 + tile::load_row0() + i * C::ROW_STEP;
    const bool ok = row < M;
    xr.ptr[i] = A + size_t(ok ? row : 0) * size_t(K) + size_t(g0) * tile::kBK;
    xr.valid |= uint32_t(ok) << i;
  }
  WSrc w;
  {
    const int ct = t0 + (tid >> 5), st = t0 + ((tid & 31) >> 2);
    w.codes_ok = ct < n_tiles;
    w.sb_ok = st < n_tiles;
    // Clamped to a valid tile: the address must be valid even when nothing is read.
    w.codes = W.codes + (size_t(min(ct, n_tiles - 1)) * size_t(G) + size_t(g0)) * kQBlockWords +
              (tid & 31) * 4;
    w.sb =
        W.sb + (size_t(min(st, n_tiles - 1)) * size_t(G) + size_t(g0)) * kQSbWords + (tid & 3) * 4;
  }

  // v2's main loop (q4_gemm_wgmma.cu) over this rank's KT k-tiles.
  float acc[C::NACC];
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
#pragma unroll
  for (int s = 0; s < C::PREFETCH; ++s) {
    if (s < KT)
      load_stage<C>(xr, w, sX + uint32_t(s * C::X_STAGE), sW + uint32_t(s * C::W_STAGE), s, Kl);
    tile::cp_async_commit();
  }
  tile::fence_operands(acc);
  int stage = 0, fill = C::PREFETCH % C::STAGES;
  uint32_t a0[4][4], a1[4][4];  // the A registers of even and odd k-tiles
  int kt = 0;
  for (; kt + 1 < KT; kt += 2) {
    ktile_step<C>(acc, a0, kt, KT, Kl, stage, fill, sX, sW, xr, w);
    ktile_step<C>(acc, a1, kt + 1, KT, Kl, stage, fill, sX, sW, xr, w);
  }
  if (kt < KT) ktile_step<C>(acc, a0, kt, KT, Kl, stage, fill, sX, sW, xr, w);
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
  tile::cp_async_wait<0>();
  __syncthreads();  // both warpgroups' wgmmas retired, every copy landed: the stages are free

  // Stage the partial tile, [BT tokens][kPad] f32 at sX. acc[4 j + q]: row 16 warp + g + 8 (q >>
  // 1) of the block, token 8 j + 2 t + (q & 1); for fixed (j, q) a warp's 32 stores hit banks
  // (8 t + g + const) mod 32 (2 kPad = 264 = 8 mod 32): all distinct.
  const int warp = tid >> 5, lane = tid & 31;
  {
    float* part = reinterpret_cast<float*>(smem + (sX - tile::smem_u32(smem)));
    const int r0 = 16 * warp + (lane >> 2), k0 = 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < C::BT / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        part[(8 * j + k0 + (q & 1)) * kPad + r0 + 8 * (q >> 1)] = acc[4 * j + q];
  }
  if constexpr (S > 1)
    cluster::sync();  // every rank's tile staged and visible to the cluster
  else
    __syncthreads();

  // Rank r writes tokens [r TPR, (r + 1) TPR) of the tile: warp `warp` token 8 p + warp of pass p,
  // lane `lane` rows 4 lane .. 4 lane + 3 (N % 4 == 0: all four in or all out).
  constexpr int kBatch = 8;  // passes whose residual loads are issued together
  constexpr int TPR = C::BT / S, PASSES = TPR / 8, BATCH = PASSES < kBatch ? PASSES : kBatch;
  static_assert(TPR % 8 == 0 && PASSES % BATCH == 0, "whole passes");
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
        old[i] = row_ok && tok < M
                     ? *reinterpret_cast<const float4*>(static_cast<const float*>(out) +
                                                        (size_t(tok) * size_t(N) + size_t(row)))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
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
  if constexpr (S > 1) cluster::sync();  // no block leaves while another still reads its tile
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n;
  __trap();
#endif
}

template <class C, int S, GemmOut MODE>
void set_smem() {
  static std::once_flag once;
  std::call_once(once, [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(
        q_gemm_v3_kernel<C, S, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES));
  });
}

template <class C, int S, GemmOut MODE>
void launch(const bf16* A, int M, const QMatrix& W, void* out, cudaStream_t stream) {
  set_smem<C, S, MODE>();
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t blocks = int64_t(tiles_m) * tiles_n * S;
  if (blocks > 0x7fffffff) fail("lab::q_gemm_v3: {} x {} needs {} blocks", M, W.rows, blocks);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(C::THREADS);
  cfg.dynamicSmemBytes = C::SMEM_BYTES;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(S);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = S > 1 ? 1u : 0u;
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, q_gemm_v3_kernel<C, S, MODE>, A, M, W.cols, W, out,
                                      tiles_m, tiles_n));
  LILAC_CUDA_LAUNCHED();
}

template <class C, int S>
void dispatch_mode(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode,
                   cudaStream_t s) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch<C, S, GemmOut::StoreF32>(A, M, W, out, s);
    case GemmOut::StoreBF16:
      return launch<C, S, GemmOut::StoreBF16>(A, M, W, out, s);
    case GemmOut::AccumulateF32:
      return launch<C, S, GemmOut::AccumulateF32>(A, M, W, out, s);
  }
}

template <class C>
void dispatch_splits(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, int S,
                     cudaStream_t s) {
  switch (S) {
    case 1:
      return dispatch_mode<C, 1>(A, M, W, out, mode, s);
    case 2:
      return dispatch_mode<C, 2>(A, M, W, out, mode, s);
    case 4:
      return dispatch_mode<C, 4>(A, M, W, out, mode, s);
    default:
      fail("lab::q_gemm_v3: splits {} (1, 2 or 4)", S);
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

// Clusters of S blocks resident at once (one block per SM: 1 thread block of ~200 KB / 256
// threads x 216 registers). S = 1: the SM count; else the runtime's answer (the GPCs decide: a
// cluster's blocks share one), 0 if it has none.
template <class C, int S>
int max_clusters() {
  static const int n = [] {
    if (S == 1) return sm_count();
    set_smem<C, S, GemmOut::StoreF32>();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(S * 64));
    cfg.blockDim = dim3(C::THREADS);
    cfg.dynamicSmemBytes = C::SMEM_BYTES;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(S);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int c = 0;
    if (cudaOccupancyMaxActiveClusters(&c, q_gemm_v3_kernel<C, S, GemmOut::StoreF32>, &cfg) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // clear it: treated as "cannot run"
      c = 0;
    }
    return c;
  }();
  return n;
}

int max_clusters_of(int bt, int S) {
  if (bt == 256)
    return S == 1   ? max_clusters<Cfg256, 1>()
           : S == 2 ? max_clusters<Cfg256, 2>()
           : S == 4 ? max_clusters<Cfg256, 4>()
                    : 0;
  if (bt == 128)
    return S == 1   ? max_clusters<Cfg128, 1>()
           : S == 2 ? max_clusters<Cfg128, 2>()
           : S == 4 ? max_clusters<Cfg128, 4>()
                    : 0;
  return 0;
}

// (BT, S) of the least estimated time, in 0.1 us: waves x (k-tiles per block x the cost of one +
// a fixed 3 us for the prologue and the epilogue, 4 us with a cluster reduction). A k-tile taken
// as 0.9 us at 256 tokens and 0.6 us at 128: v2's per-block rates (in_proj at M = 4096: 1552
// blocks of 256 tokens, 12 waves of 32 k-tiles in 354 us, 0.92 us each with the C stores; at M =
// 512: 388 blocks of 128, 3 waves in 62.6 us, 0.65 us). Candidates in order of preference on a
// tie (smaller clusters first).
void pick(int M, int N, int KT, int& bt, int& S) {
  constexpr int kCand[][2] = {{256, 1}, {128, 1}, {256, 2}, {128, 2}, {256, 4}};
  int64_t best = INT64_MAX;
  bt = 256;
  S = 1;
  for (const auto& c : kCand) {
    const int b = c[0], s = c[1];
    if (KT % s != 0) continue;
    const int64_t maxc = max_clusters_of(b, s);
    if (maxc <= 0) continue;
    const int64_t tiles = int64_t(ceil_div(M, b)) * ceil_div(N, 128);
    const int64_t waves = ceil_div(tiles, maxc);
    const int64_t cost = waves * (int64_t(KT / s) * (b == 256 ? 9 : 6) + (s > 1 ? 40 : 30));
    if (cost < best) {
      best = cost;
      bt = b;
      S = s;
    }
  }
}

}  // namespace qgemm_v3

int q_gemm_v3_max_clusters(int tokens_per_block, int splits) {
  return qgemm_v3::max_clusters_of(tokens_per_block, splits);
}

void q_gemm_v3(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream,
               int tokens_per_block, int splits) {
  if (!A || !C || !W || !W.sb) fail("lab::q_gemm_v3: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.bits != 4)
    fail(
        "lab::q_gemm_v3: unsupported M {} W [{}, {}] at {} bits (4-bit, K a positive multiple "
        "of 64)",
        M, W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("lab::q_gemm_v3: A must be 16-byte aligned");
  // The vector epilogue needs whole 16-byte groups of rows; else v2.
  if (W.rows % 4 != 0 || reinterpret_cast<uintptr_t>(C) % 16 != 0)
    return q_gemm_wgmma(A, M, W, C, mode, stream, tokens_per_block);
  const int KT = W.cols / kQGroup;
  int bt = tokens_per_block, S = splits;
  if (bt == 0 && S == 0) {
    qgemm_v3::pick(M, W.rows, KT, bt, S);
  } else {
    if (bt == 0) bt = 256;
    if (S == 0) S = 1;
  }
  if (KT % S != 0) fail("lab::q_gemm_v3: {} k-tiles do not split {} ways", KT, S);
  if (bt == 256)
    qgemm_v3::dispatch_splits<qgemm_v3::Cfg256>(A, M, W, C, mode, S, stream);
  else if (bt == 128)
    qgemm_v3::dispatch_splits<qgemm_v3::Cfg128>(A, M, W, C, mode, S, stream);
  else
    fail("lab::q_gemm_v3: tokens_per_block {} (256, 128 or 0)", bt);
}

}  // namespace lilac::lab
