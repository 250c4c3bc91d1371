// The kernel lab's q_gemv_rows version 2 (docs/kernels.md "Version 6"), production from 374e78d
// until s6, when version 3 (src/cuda/q4_gemv_rows.cu) replaced it; moved here unchanged but for the
// launcher's name (lab::q_gemv_rows_v2) and q_gemv_rows_available, which stayed in src/cuda.
// q_gemv_rows: the 4/8-bit dense projections of a batched decode step (and of short prompts, in
// 64-token slabs: proj_gemm), T <= 64 token rows at once, each weight read once for all rows
// (docs/kernels.md, version 6).
//
// Why not q_gemm: the prefill GEMM's 256-row x 128-token block tiles leave most of the GPU idle
// at small M (49 blocks for in_proj) and compute 128 tokens for a handful. Why not T q_gemv
// launches: the weights would be read T times.
//
// Version 5 (q_set_dot_tokens per warp, x read from L2 per 8-token chunk; now in the kernel lab,
// bench/lab/q_gemv_rows/v1_set_dot_tokens.cu) held a set's codes, its x chunk for 8 groups and 8
// chunks of accumulators in registers: 230-255 registers, one 8-warp block per SM, one L2 round
// trip per chunk: 10.5 ms of a 23.6 ms 64-row pass at ~0.1 TB/s.
//
// This version. The unit of work is a warp on one 16-row weight tile and one K-slice of the
// matrix (<= 8 slices: the slices of a row block form a thread-block cluster, grid y):
//  1. The warp issues its slice's weight loads (8 groups x 16 bytes per lane and plane, and the
//     scale/bias pairs) before waiting for the previous kernel (PDL): the DRAM round trip of the
//     weights overlaps that kernel's tail and the staging below.
//  2. The block stages the slice's x, T rows x 64 SL columns bf16 (64 rows x 512 columns = 65 KB
//     at the real shapes), in shared memory with cp.async (rows past T are zeros), and the
//     tokens' group sums Sx[group][token] in f32 once for all warps.
//  3. Per group, the warp rebuilds its A fragments once (four k16 blocks: the codes as 128 + q
//     for 4 bits, as q exactly for 8 bits: q4_tile.cuh) and runs them against every 8-token chunk,
//     B fragments by ldmatrix from the staged rows (rows 16 bytes apart modulo 128: no bank
//     conflicts); per (row, group) and token the f32 fix-up
//         sum_k (s q_k + b) x_k = s * sum_k (c + q_k) x_k + (b - c s) * Sx,   c = 128 or 0,
//     q_gemv's arithmetic per (row, group) but for the f32 order of the sums (at 8 bits q_gemv
//     keeps the two nibble planes apart; here q = lo + 16 hi is rebuilt exactly in bf16).
//  4. The slices meet in distributed shared memory: each block writes its partial sums into its
//     own shared memory (the staging area, no longer needed), the cluster barrier, then rank r
//     sums the r-th 1/S of the partials over ranks 0 .. S-1 in that order (deterministic: no
//     atomics) and stores them.
// Registers: the set's codes and scales (48), one chunk of accumulators per 8 tokens (32 at 64
// rows), the A fragments (16): <= 128 (two 8-warp blocks per SM).
// Bytes per launch: the weights once (0.5625 B/weight at 4 bits), x once per row block from L2.
#include <algorithm>
#include <atomic>

#include "cuda/cluster.cuh"
#include "cuda/q4_linear.h"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "q_gemv_rows_lab.h"
#include "util/error.h"

namespace lilac::lab {
using namespace cuda;
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // row tiles per block
constexpr int kTok = 8;                // tokens per MMA (the n dimension)
constexpr int kSetGroups = 8;          // groups whose codes a warp holds at once
constexpr int kMaxSlices = 8;          // portable cluster size
constexpr int kXPad = 8;               // bf16 past a staged row (rows 16 bytes apart mod 128)
constexpr size_t kMaxSmem = 227 * 1024;

// Shared memory of a launch: the staged x [R][64 SL + kXPad] bf16 and Sx [SL][R] f32, or the
// partial sums [kWarps][NCH][4][32] f32 that reuse it, whichever is larger (R = 8 NCH rows).
size_t smem_bytes(int nch, int SL) {
  const size_t R = size_t(kTok) * nch;
  const size_t staged = R * size_t(64 * SL + kXPad) * 2 + size_t(SL) * R * 4;
  const size_t partial = size_t(kWarps) * nch * 4 * 32 * 4;
  return std::max(staged, partial);
}

template <int BITS, int NCH, bool kAdd>
__global__ void __launch_bounds__(kThreads, 2)
    q_gemv_rows_kernel(QMatrix W, const bf16* __restrict__ x, int T, float* __restrict__ y,
                       int SL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int P = BITS / 4;
  constexpr int R = kTok * NCH;       // staged token rows
  constexpr int GS = kSetGroups / P;  // groups per register set (8 bits: two planes, half as many)
  // 4 bits: A = 128 + q (no conversion), offset 128; 8 bits: A = q rebuilt exactly, offset 0.
  constexpr float kOffset = P == 1 ? 128.f : 0.f;
  pdl_launch_dependents();  // PDL (launch.h): x is the previous kernel's output
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int G = W.groups(), tiles = W.tiles();
  const int S = int(gridDim.y);
  const int s = S > 1 ? int(cluster::ctarank()) : 0;  // this block's K-slice
  const int grp0 = s * SL, ngs = min(SL, G - grp0);   // the slice's groups (>= 1: host plan)
  const int tile = int(blockIdx.x) * kWarps + warp;
  const bool active = tile < tiles;  // warp-uniform
  const int tc = active ? tile : tiles - 1;
  const uint32_t* const codes[1] = {W.codes + size_t(tc) * G * P * kQBlockWords};
  const uint32_t* const sb[1] = {W.sb + size_t(tc) * G * kQSbWords};

  // 1. The first set's weights, before the wait.
  qtile::QSet<BITS, 1, GS> w;
  if (active) qtile::load_qset(w, codes, sb, grp0, min(GS, ngs));

  // 2. Stage x[:, slice] and the group sums.
  const int ldxs = 64 * SL + kXPad;  // bf16 per staged row
  bf16* xs = reinterpret_cast<bf16*>(smem);
  float* sxs = reinterpret_cast<float*>(smem + size_t(R) * ldxs * 2);  // [SL][R]
  pdl_wait();
  {
    // A warp per staged row, lanes along its 16-byte pieces (no index division).
    const int pieces = ngs * 8;
    const bf16* src = x + size_t(grp0) * 64;
    for (int r = warp; r < R; r += kWarps) {
      bf16* dst = xs + size_t(r) * ldxs;
      const bf16* from = src + size_t(r) * W.cols;
      for (int v = lane; v < pieces; v += 32) {
        if (r < T)
          cp_async16(dst + v * 8, from + v * 8);
        else
          *reinterpret_cast<uint4*>(dst + v * 8) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_wait_all();
    __syncthreads();
    for (int i = threadIdx.x; i < ngs * R; i += kThreads) {
      const int m = i / R, r = i - m * R;
      const uint4* p = reinterpret_cast<const uint4*>(xs + size_t(r) * ldxs + m * 64);
      float sum = 0.f;
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const uint4 q = p[v];
        sum += (bf16_lo(q.x) + bf16_hi(q.x)) + (bf16_lo(q.y) + bf16_hi(q.y)) +
               ((bf16_lo(q.z) + bf16_hi(q.z)) + (bf16_lo(q.w) + bf16_hi(q.w)));
      }
      sxs[m * R + r] = sum;
    }
    __syncthreads();
  }

  // 3. The MMAs: per group, the A fragments once, then every chunk of 8 tokens.
  float acc[NCH][4];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  if (active) {
    // ldmatrix.x4 rows: lane supplies token row (lane & 7) of matrix j = lane / 8, which is k16
    // block 2 pair + j / 2, half j % 2 (8 columns): the four registers are the (b0, b1) pairs of
    // two k16 blocks (b0: k 2t, 2t + 1 of token g; b1: k 2t + 8, 2t + 9).
    const int j = lane >> 3;
    const uint32_t lane_addr =
        tile::smem_u32(xs + size_t(lane & 7) * ldxs + (j >> 1) * 16 + (j & 1) * 8);
    for (int set0 = 0; set0 < ngs; set0 += GS) {
      const int ng = min(GS, ngs - set0);
      if (set0 > 0) qtile::load_qset(w, codes, sb, grp0 + set0, ng);
#pragma unroll
      for (int m = 0; m < GS; ++m) {
        if (m >= ng) break;  // warp-uniform
        const int mm = set0 + m;
        uint32_t a[4][4];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          const uint32_t lo = qtile::word_of(w.cw[0][m][0], kb);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if constexpr (P == 1) {
              a[kb][i] = qtile::magic128(lo >> (4 * i));
            } else {
              const uint32_t hi = qtile::word_of(w.cw[0][m][P - 1], kb);
              const uint32_t ql = qtile::fma_bf16x2(qtile::magic128(lo >> (4 * i)),
                                                    qtile::kBf16x2One, qtile::kBf16x2Neg128);
              const uint32_t qh = qtile::fma_bf16x2(qtile::magic128(hi >> (4 * i)),
                                                    qtile::kBf16x2Sixteen, qtile::kBf16x2Neg2048);
              a[kb][i] = qtile::fma_bf16x2(ql, qtile::kBf16x2One, qh);  // lo + 16 hi: exact
            }
          }
        }
        const float s0 = bf16_lo(w.sbv[0][m].x), b0 = bf16_hi(w.sbv[0][m].x);  // row g
        const float s1 = bf16_lo(w.sbv[0][m].y), b1 = bf16_hi(w.sbv[0][m].y);  // row g + 8
        const float o0 = fmaf(-kOffset, s0, b0), o1 = fmaf(-kOffset, s1, b1);
        const float* sxm = sxs + mm * R + 2 * t;
#pragma unroll
        for (int ch = 0; ch < NCH; ++ch) {
          if (ch * kTok >= T) break;  // warp-uniform
          uint32_t b[2][4];
          const uint32_t addr = lane_addr + uint32_t((ch * kTok * ldxs + mm * 64) * 2);
          tile::ldmatrix_x4(b[0], addr);
          tile::ldmatrix_x4(b[1], addr + 64);  // k16 blocks 2, 3 (+32 columns)
          float c[4] = {0.f, 0.f, 0.f, 0.f};
          qtile::mma_bf16_16816(c, a[0], b[0][0], b[0][1]);
          qtile::mma_bf16_16816(c, a[1], b[0][2], b[0][3]);
          qtile::mma_bf16_16816(c, a[2], b[1][0], b[1][1]);
          qtile::mma_bf16_16816(c, a[3], b[1][2], b[1][3]);
          const float2 sx = *reinterpret_cast<const float2*>(sxm + ch * kTok);  // tokens 2t, 2t+1
          acc[ch][0] = fmaf(o0, sx.x, fmaf(s0, c[0], acc[ch][0]));
          acc[ch][1] = fmaf(o0, sx.y, fmaf(s0, c[1], acc[ch][1]));
          acc[ch][2] = fmaf(o1, sx.x, fmaf(s1, c[2], acc[ch][2]));
          acc[ch][3] = fmaf(o1, sx.y, fmaf(s1, c[3], acc[ch][3]));
        }
      }
    }
  }

  // 4. Store (one slice) or reduce over the cluster's slices.
  const int row0 = int(blockIdx.x) * kWarps * kQTileRows;
  if (S == 1) {
    if (!active) return;
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = tile * kQTileRows + g + (q < 2 ? 0 : 8);
        const int tok = ch * kTok + 2 * t + (q & 1);
        if (row >= W.rows || tok >= T) continue;
        float* dst = y + size_t(tok) * W.rows + row;
        *dst = kAdd ? *dst + acc[ch][q] : acc[ch][q];
      }
    return;
  }
  __syncthreads();                               // every warp is done with the staged x
  float* part = reinterpret_cast<float*>(smem);  // [kWarps][NCH][4][32]
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
    for (int q = 0; q < 4; ++q) part[((warp * NCH + ch) * 4 + q) * 32 + lane] = acc[ch][q];
  cluster::sync();
  // Rank s sums the partials [s per, (s + 1) per) over the ranks, reading them in their own order
  // (consecutive threads, consecutive words of every rank's shared memory).
  constexpr int kPart = kWarps * NCH * 4 * 32;
  const int per = (kPart + S - 1) / S;
  const int i1 = min(kPart, (s + 1) * per);
  uint32_t base[kMaxSlices];
#pragma unroll
  for (int r = 0; r < kMaxSlices; ++r)
    base[r] = r < S ? cluster::map(tile::smem_u32(part), uint32_t(r)) : 0u;
  for (int i = s * per + int(threadIdx.x); i < i1; i += kThreads) {
    // Partial i = ((warp wp * NCH + chunk ch) * 4 + register q) * 32 + lane (gg, tq): row
    // 16 wp + gg + 8 (q >= 2), token 8 ch + 2 tq + (q & 1).
    const int ln = i & 31, q = (i >> 5) & 3, wc = i >> 7;
    const int ch = wc % NCH, wp = wc / NCH;
    const int row = row0 + wp * kQTileRows + (ln >> 2) + (q >> 1) * 8;
    const int tok = ch * kTok + 2 * (ln & 3) + (q & 1);
    if (tok >= T) continue;
    // All ranks' loads in flight before the sum (in rank order: deterministic).
    float pv[kMaxSlices];
#pragma unroll
    for (int r = 0; r < kMaxSlices; ++r) pv[r] = r < S ? cluster::ld_f32(base[r] + 4u * i) : 0.f;
    float v = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxSlices; ++r) v += r < S ? pv[r] : 0.f;
    if (row < W.rows) {
      float* dst = y + size_t(tok) * W.rows + row;
      *dst = kAdd ? *dst + v : v;
    }
  }
  cluster::sync();  // no block leaves while another still reads its partials
#else
  __trap();  // thread-block clusters need sm_90 (the host refuses older devices)
#endif
}

template <int BITS, int NCH, bool kAdd>
void launch(const QMatrix& W, const bf16* x, int T, float* y, int S, int SL, int grid,
            cudaStream_t stream) {
  auto kernel = q_gemv_rows_kernel<BITS, NCH, kAdd>;
  const size_t smem = smem_bytes(NCH, SL);
  if (smem > kMaxSmem) fail("lab::q_gemv_rows_v2: {} bytes of staged x", smem);
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cuda::launch_cluster_kernel(true, dim3(1, unsigned(S), 1), kernel,
                              dim3(unsigned(grid), unsigned(S)), dim3(kThreads), smem, stream, W, x,
                              T, y, SL);
}

template <int BITS, bool kAdd>
void launch_nch(int nch, const QMatrix& W, const bf16* x, int T, float* y, int S, int SL, int grid,
                cudaStream_t stream) {
  switch (nch) {
    case 1:
      return launch<BITS, 1, kAdd>(W, x, T, y, S, SL, grid, stream);
    case 2:
      return launch<BITS, 2, kAdd>(W, x, T, y, S, SL, grid, stream);
    case 4:
      return launch<BITS, 4, kAdd>(W, x, T, y, S, SL, grid, stream);
    default:
      return launch<BITS, 8, kAdd>(W, x, T, y, S, SL, grid, stream);
  }
}

}  // namespace

void q_gemv_rows_v2(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                    cudaStream_t stream) {
  if (!W || !W.sb || !x || !y) fail("lab::q_gemv_rows_v2: null pointer");
  if (T < 1 || T > kQGemvRowsMax)
    fail("lab::q_gemv_rows_v2: T = {} outside [1, {}]", T, kQGemvRowsMax);
  if (W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.cols > 65536 ||
      (W.bits != 4 && W.bits != 8))
    fail("lab::q_gemv_rows_v2: unsupported [{}, {}] at {} bits", W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    fail("lab::q_gemv_rows_v2: x must be 16-byte aligned");
  if (!q_gemv_rows_available()) fail("lab::q_gemv_rows_v2: needs thread-block clusters (sm_90)");
  const int chunks = (T + kTok - 1) / kTok;
  const int nch = chunks <= 1 ? 1 : chunks <= 2 ? 2 : chunks <= 4 ? 4 : 8;
  // K-slices: one register set each (8 groups at 4 bits, 4 at 8 bits) where there are at most 8
  // sets (every matrix of the model), else 8 slices of several sets. One set per warp keeps one
  // DRAM round trip per warp (the 8-bit router: 0.56 MB in 8 slices, not 4 of two round trips).
  const int G = W.groups(), GS = kSetGroups / (W.bits / 4);
  int S = std::min(kMaxSlices, (G + GS - 1) / GS);
  const int SL = (G + S - 1) / S;
  S = (G + SL - 1) / SL;  // every slice non-empty
  const int grid = ceil_div(W.tiles(), kWarps);
  const bool add = mode == GemvOut::Accumulate;
  if (W.bits == 4)
    add ? launch_nch<4, true>(nch, W, x, T, y, S, SL, grid, stream)
        : launch_nch<4, false>(nch, W, x, T, y, S, SL, grid, stream);
  else
    add ? launch_nch<8, true>(nch, W, x, T, y, S, SL, grid, stream)
        : launch_nch<8, false>(nch, W, x, T, y, S, SL, grid, stream);
}

}  // namespace lilac::lab
