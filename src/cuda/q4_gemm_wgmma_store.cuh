// The staged epilogue of q_gemm_wgmma (q4_gemm_wgmma.cu's file comment, version 3 item 2): a
// block's accumulators staged in shared memory, the store pass summing a cluster's ranks, and a
// tile's main-loop sources; shared by the split-K kernel (q4_gemm_wgmma.cu) and the stream-K form
// (q4_gemm_wgmma_streamk.cu), whose host entry points are declared at the end. .cu files only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/cluster.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"

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

// ---- the stream-K form's host side (q4_gemm_wgmma_streamk.cu), for the pick and the dispatch

// Stream-K blocks resident at once on this device (one Cfg256 block per SM x the SMs).
int streamk_blocks();
// Scratch bytes the form needs for P blocks.
size_t streamk_bytes(int P);
// A stream-K launch (splits -1) of C = A W^T in `mode` on `scratch`.
void dispatch_streamk(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                      const QGemmScratch& scratch, cudaStream_t s);

}  // namespace qgemm_wgmma

}  // namespace lilac::cuda
