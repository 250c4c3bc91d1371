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
// The set product is q4_tile.cuh's q_set_dot_tokens (shared with the small-M MoE kernels).
#include <algorithm>

#include "cuda/q4_linear.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

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
    const qtile::TokenRows rows{nullptr, 0, T};
    const int s1 = min(sets, (slice + 1) * sets_per_slice);
    for (int set = slice * sets_per_slice; set < s1; ++set)
      qtile::q_set_dot_tokens<BITS, 1, NCH>(codes, sb, G, set, x, W.cols, rows, acc1);
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

void q_gemv_rows(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                 cudaStream_t stream) {
  if (!W || !W.sb || !x || !y) fail("cuda::q_gemv_rows: null pointer");
  if (T < 1 || T > kQGemvRowsMax)
    fail("cuda::q_gemv_rows: T = {} outside [1, {}]", T, kQGemvRowsMax);
  if (W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.cols > 65536 ||
      (W.bits != 4 && W.bits != 8))
    fail("cuda::q_gemv_rows: unsupported [{}, {}] at {} bits", W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(x) % 4 != 0) fail("cuda::q_gemv_rows: x must be 4-byte aligned");
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

}  // namespace lilac::cuda
