// q_gemm_wgmma's stream-K form (s35; splits -1, LILAC_Q4_GEMM_STREAMK=auto, off by default): the
// kernel, its scratch and its launch. Design, measurements and why it lost: the comment below and
// docs/kernels.md, s35 and s36. The main loop and the epilogue are q_gemm_wgmma's
// (q4_gemm_wgmma.cuh, q4_gemm_wgmma_store.cuh).
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/persistent.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma_store.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {

// Named (not anonymous): see q4_gemm_wgmma_store.cuh.
namespace qgemm_wgmma {

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

}  // namespace qgemm_wgmma

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

}  // namespace lilac::cuda
