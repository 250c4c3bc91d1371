// q_gemv_rows version 1 in the lab = version 5 of docs/kernels.md's batched decode kernels, the
// set-dot-tokens kernel (lost to version 6, the staged-x cluster kernel of
// src/cuda/q4_gemv_rows.cu; numbers in README.md). Moved here unchanged from
// src/cuda/q4_gemv_rows.cu (as of 1507892): the kernel and launcher are the same code (the launcher
// renamed q_gemv_rows_v1, its messages to match), and so is the device helper it used,
// q_set_dot_tokens with its TokenRows, moved out of src/cuda/q4_tile.cuh (production no longer uses
// them; q4_moe_small.cu's set_dot_staged is the variant with x staged in shared memory). Only the
// namespace changed: lilac::lab, with the lilac::cuda and lilac::cuda::qtile names brought in, so
// the text reads as it did.
//
// As it was:
//
// q_gemv_rows: the 4/8-bit decode GEMV over T <= 64 token rows at once (the dense projections of a
// batched decode step), each weight read once for all rows.
//
// Why not q_gemm: the prefill GEMM's 128-token tiles make it compute-bound at any M (measured at
// M = 1..64 on the full model: ~7.5 ms of dense projections per batched pass, against ~0.25 ms of
// weight bytes). Why not T q_gemv launches: the weights would be read T times.
//
// Design: q_gemv's (q4_linear.cu) work units (a 16-row tile x a slice of its 8-group sets, S
// slices per tile meeting in shared memory) and its weight loads (a set's 8 x 16-byte code loads
// per lane in flight before the first MMA), but the tokens take the MMA's n dimension: for group
// m of the set, A = the tile's codes as (128 + q) (q4_tile.cuh), B = 8 tokens' x of that group
// (column n = token n), so C[row][token] is the group's partial dot and each lane owns rows g, g+8
// x tokens 2t, 2t+1. The group's offset is removed in f32 per (row, group) with the tokens' group
// sums Sx (one MMA with an all-ones A), as q_set_dot does:
//     sum_k (s q_k + b) x_k = s * sum_k (128 + q_k) x_k + (b - 128 s) * Sx.
// The T tokens are NCH chunks of 8 processed one after another with the set's codes and scales
// held in registers: each weight is read from DRAM once per launch. Per 8 tokens the MMA count
// equals q_gemv's for one token (q_gemv uses one B column of eight), so the tensor work per token
// drops 8x. x rows (bf16, 4-byte aligned) come through the non-coherent path (L1/L2 resident).
// The set product is q_set_dot_tokens (below; the small-M MoE kernels of q4_moe_small.cu began
// as a copy of it).
#include <algorithm>

#include "cuda/q4_linear.h"
#include "cuda/q4_tile.cuh"
#include "q_gemv_rows_lab.h"
#include "util/error.h"

namespace lilac::lab {
namespace {

using namespace cuda;         // the kernel as it was written, in lilac::cuda
using namespace cuda::qtile;  // QSet, load_qset, q_group_dot, ld_ro4 (still in q4_tile.cuh)

// ---- from src/cuda/q4_tile.cuh (as of 1507892), unchanged ------------------------------------
//
// The token rows: row r (0 <= r < count) of the operand is row ids[row0 + r] of x when ids is
// set (tokens gathered by expert), else row row0 + r. Chunks past `count` are skipped (their
// MMAs too: the branch is warp-uniform); rows past it read nothing and give zeros.
struct TokenRows {
  const int32_t* ids;
  int row0, count;
  __device__ __forceinline__ int row(int r) const { return ids ? ids[row0 + r] : row0 + r; }
};

// Adds to y[nt][ch][0..3] (row g / tokens 2t, 2t + 1, then row g + 8 / the same tokens, of tile
// nt and chunk ch) the dot products over the groups [GS set, GS set + GS) ∩ [0, G).
// codes[nt] / sb[nt]: the tile's block (group 0, plane 0) in codes and sb; x bf16 rows of ldx
// elements (4-byte aligned), read through the non-coherent path (L1/L2 resident).
// Latency: the set's weights are loaded at once, and so is a chunk's x for all GS groups (8 GS
// 4-byte loads per lane) before its MMAs: one memory round trip per set and one per chunk, not one
// per group (the dequantisation, a few integer instructions, is redone per chunk instead).
template <int BITS, int NT, int NCH, int GS = 8>
__device__ __forceinline__ void q_set_dot_tokens(const uint32_t* const (&codes)[NT],
                                                 const uint32_t* const (&sb)[NT], int G, int set,
                                                 const bf16* __restrict__ x, int ldx,
                                                 const TokenRows& rows, float (&y)[NT][NCH][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int grp0 = set * GS;
  const int ng = min(GS, G - grp0);
  QSet<BITS, NT, GS> w;
  load_qset(w, codes, sb, grp0, ng);
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) {
    if (ch * 8 >= rows.count) continue;  // warp-uniform: chunks past the tokens
    // This lane's B column is token 8 ch + g: its words of every group of the set, in flight
    // together (elements 16 kb + 2t (+1) and 16 kb + 2t + 8 (+1): words 8 kb + t, 8 kb + t + 4).
    const int tok = ch * 8 + g;
    const bool has = tok < rows.count;
    const uint32_t* xr =
        reinterpret_cast<const uint32_t*>(x + size_t(has ? rows.row(tok) : 0) * size_t(ldx)) +
        size_t(grp0) * 32;
    uint32_t X[GS][4][2];
#pragma unroll
    for (int m = 0; m < GS; ++m)
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        const bool ok = has && m < ng;
        X[m][kb][0] = ok ? ld_ro4(xr + m * 32 + 8 * kb + t) : 0u;
        X[m][kb][1] = ok ? ld_ro4(xr + m * 32 + 8 * kb + t + 4) : 0u;
      }
    float yc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) yc[nt][q] = y[nt][ch][q];
#pragma unroll
    for (int m = 0; m < GS; ++m)
      if (m < ng) q_group_dot(w, m, X[m], yc);  // warp-uniform
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) y[nt][ch][q] = yc[nt][q];
  }
}

// ---- the kernel and its launcher (src/cuda/q4_gemv_rows.cu as of 1507892) ------------------

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTok = 8;  // tokens per MMA (the n dimension)

template <int BITS, int NCH, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    q_gemv_rows_kernel(QMatrix W, const bf16* __restrict__ x, int T, float* __restrict__ y, int S,
                       int sets_per_slice) {
  __shared__ float part[kWarps][NCH][4][32];
  pdl_launch_dependents();  // PDL (launch.h): x is the previous kernel's output
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = W.tiles(), G = W.groups(), sets = (G + 7) / 8;
  const int tile = blockIdx.x * (kWarps / S) + warp / S;
  const int slice = warp % S;
  float acc1[1][NCH][4];
  float(&acc)[NCH][4] = acc1[0];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  if (tile < tiles) {  // warp-uniform
    const uint32_t* const codes[1] = {W.codes + size_t(tile) * G * (BITS / 4) * kQBlockWords};
    const uint32_t* const sb[1] = {W.sb + size_t(tile) * G * kQSbWords};
    const TokenRows rows{nullptr, 0, T};
    const int s1 = min(sets, (slice + 1) * sets_per_slice);
    for (int set = slice * sets_per_slice; set < s1; ++set)
      q_set_dot_tokens<BITS, 1, NCH>(codes, sb, G, set, x, W.cols, rows, acc1);
  }
  if (S > 1) {
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) part[warp][ch][q][lane] = acc[ch][q];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float v = 0.f;
        for (int s = 0; s < S; ++s) v += part[warp + s][ch][q][lane];  // slice order
        acc[ch][q] = v;
      }
  }
  if (tile >= tiles) return;
  const int g = lane >> 2, t = lane & 3;
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
}

template <int BITS, bool kAdd>
void launch_bits(int nch, const QMatrix& W, const bf16* x, int T, float* y, int S, int sps,
                 int grid, cudaStream_t stream) {
  const dim3 g(grid), b(kThreads);
  switch (nch) {
    case 1:
      launch_kernel(true, q_gemv_rows_kernel<BITS, 1, kAdd>, g, b, 0, stream, W, x, T, y, S, sps);
      break;
    case 2:
      launch_kernel(true, q_gemv_rows_kernel<BITS, 2, kAdd>, g, b, 0, stream, W, x, T, y, S, sps);
      break;
    case 4:
      launch_kernel(true, q_gemv_rows_kernel<BITS, 4, kAdd>, g, b, 0, stream, W, x, T, y, S, sps);
      break;
    default:
      launch_kernel(true, q_gemv_rows_kernel<BITS, 8, kAdd>, g, b, 0, stream, W, x, T, y, S, sps);
      break;
  }
}

}  // namespace

void q_gemv_rows_v1(const cuda::QMatrix& W, const cuda::bf16* x, int T, float* y,
                    cuda::GemvOut mode, cudaStream_t stream) {
  using namespace cuda;
  if (!W || !W.sb || !x || !y) fail("lab::q_gemv_rows_v1: null pointer");
  if (T < 1 || T > kQGemvRowsMax)
    fail("lab::q_gemv_rows_v1: T = {} outside [1, {}]", T, kQGemvRowsMax);
  if (W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.cols > 65536 ||
      (W.bits != 4 && W.bits != 8))
    fail("lab::q_gemv_rows_v1: unsupported [{}, {}] at {} bits", W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(x) % 4 != 0)
    fail("lab::q_gemv_rows_v1: x must be 4-byte aligned");
  const int chunks = (T + kTok - 1) / kTok;
  const int nch = chunks <= 1 ? 1 : chunks <= 2 ? 2 : chunks <= 4 ? 4 : 8;
  const int tiles = W.tiles(), sets = (W.groups() + 7) / 8;
  const long long target = 16LL * sm_count();
  int S = 1;
  while (S < kWarps && S < sets && (long long)tiles * S < target) S *= 2;
  const int sps = (sets + S - 1) / S;
  const int grid = ceil_div(tiles, kWarps / S);
  const bool add = mode == GemvOut::Accumulate;
  if (W.bits == 4)
    add ? launch_bits<4, true>(nch, W, x, T, y, S, sps, grid, stream)
        : launch_bits<4, false>(nch, W, x, T, y, S, sps, grid, stream);
  else
    add ? launch_bits<8, true>(nch, W, x, T, y, S, sps, grid, stream)
        : launch_bits<8, false>(nch, W, x, T, y, S, sps, grid, stream);
}

}  // namespace lilac::lab
