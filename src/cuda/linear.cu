// Decode GEMV: y = W x for one token, W bf16 [rows, cols] row-major, x bf16 [cols], y f32 or bf16.
//
// Bytes and FLOPs at the real model's shapes (H = 2048); FLOPs = 2 * rows * cols are negligible
// (0.5 FLOP per byte), so the floor is the bytes of W over the 4.3 TB/s copy bandwidth:
//   GDN in_proj      12352 x 2048   50.6 MB   11.8 us
//   attention qkv     9216 x 2048   37.7 MB    8.8 us
//   out_proj/o_proj   2048 x 4096   16.8 MB    3.9 us
//   MoE router         257 x 2048    1.1 MB    0.24 us (latency-bound: ~2-3 us)
//   lm_head         248320 x 2048   1017 MB  236 us
// Per decode token these are 3.6 GB of the bf16 model's bytes (30 GDN + 10 attention layers +
// lm_head), so this kernel must run near the copy bandwidth: target >= 85-90% for W >= 16 MB.
//
// Design. A block is 256 threads = 8 warps. A warp computes the dot products of R consecutive rows
// over a slice of the columns: the row's 16-byte chunks (8 bf16) are split into `splits` equal
// slices (splits in {1, 2, 4, 8}), and the block's 8 warps form 8 / splits row groups x splits
// slices. In a step, lane l loads chunks base + l + 32u (u < U) of each of its R rows (R*U = 8
// independent 16-byte loads in flight per lane, coalesced: a warp reads 512 contiguous bytes per
// (row, u)), with the non-allocating streaming load, and FMAs them against x staged once per block
// in shared memory (bf16, conflict-free 16-byte reads). Each lane's f32 partial is reduced by a
// warp shuffle tree; with splits > 1 the slices' sums meet in shared memory and are added in slice
// order (deterministic). Blocks loop over "items" of 8 / splits * R rows (grid-stride, the grid
// capped at the resident block count so x is staged once per block, not once per item).
// The host picks R and splits from the shape:
//   R = 1 (U = 8) for rows of >= 256 chunks (cols >= 2048), 2 (U = 4) for >= 128, 4 (U = 2) for
//   >= 64, else 8 (U = 1): a step covers 256 / R chunks of each of R rows.
//   splits doubles while each slice keeps >= 256 chunks (long rows: out_proj gets 2), and then
//   while the warps are fewer than 4 blocks' worth per SM and each slice keeps >= 32 chunks (few
//   rows: the router gets 8), so small matrices still spread over every SM.
// Rows past the end (the last item) are clamped to the last row for loading and not stored.
#include "cuda/linear.h"

#include <algorithm>

#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCols = 16384;  // x staged in <= 32 KB of shared memory

enum : int { kOutF32 = 0, kOutAddF32 = 1, kOutBf16 = 2 };

template <int kMode>
__device__ __forceinline__ void store_out(void* y, int row, float v) {
  if (kMode == kOutF32)
    static_cast<float*>(y)[row] = v;
  else if (kMode == kOutAddF32)
    static_cast<float*>(y)[row] += v;
  else
    static_cast<bf16*>(y)[row] = __float2bfloat16_rn(v);
}

template <int R, int U, int kMode>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const bf16* __restrict__ W, int rows, int cols, const bf16* __restrict__ x,
                void* __restrict__ y, int splits, int items) {
  extern __shared__ uint4 xs[];  // [cols / 8]
  __shared__ float part[kWarps][R];
  const int nch = cols >> 3;
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  for (int i = threadIdx.x; i < nch; i += kThreads) xs[i] = x4[i];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = kWarps / splits;  // row groups per item
  const int g = warp / splits, s = warp - g * splits;
  const int per = (nch + splits - 1) / splits;
  const int c0 = min(nch, s * per), c1 = min(nch, c0 + per);

  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int r0 = (item * groups + g) * R;
    const uint4* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      wr[r] = reinterpret_cast<const uint4*>(W + size_t(min(r0 + r, rows - 1)) * cols);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;

    // Full steps: unconditional loads, all R * U issued before the first FMA. Then one
    // predicated step for the slice's tail.
    int base = c0;
    for (; base + 32 * U <= c1; base += 32 * U)
      gemv_step<R, U, false>(wr, xs, base + lane, c1, acc);
    if (base < c1) gemv_step<R, U, true>(wr, xs, base + lane, c1, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);

    if (splits > 1) {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
      }
      __syncthreads();
      if (s == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v = 0.f;
          for (int j = 0; j < splits; ++j) v += part[warp + j][r];
          acc[r] = v;
        }
      }
      __syncthreads();  // part is rewritten by the next item
    }
    if (s == 0 && lane < R) {
      float v = acc[0];
#pragma unroll
      for (int r = 1; r < R; ++r)
        v = lane == r ? acc[r] : v;  // constant indices: acc stays in registers
      const int row = r0 + lane;
      if (row < rows) store_out<kMode>(y, row, v);
    }
  }
}

template <int R, int kMode>
void launch(const bf16* W, int rows, int cols, const bf16* x, void* y, int splits,
            cudaStream_t stream) {
  constexpr int U = 8 / R;
  static const int per_sm = resident_blocks_per_sm(gemv_kernel<R, U, kMode>, kThreads);
  const int items = ceil_div(ceil_div(rows, R), kWarps / splits);
  const int grid = std::min(items, per_sm * sm_count());
  gemv_kernel<R, U, kMode>
      <<<grid, kThreads, size_t(cols) * 2, stream>>>(W, rows, cols, x, y, splits, items);
  LILAC_CUDA_LAUNCHED();
}

template <int kMode>
void dispatch(const char* what, const bf16* W, int rows, int cols, const bf16* x, void* y,
              cudaStream_t stream) {
  if (!W || !x || !y) fail("cuda::{}: null pointer", what);
  if (rows < 1 || cols < 8 || cols % 8 != 0 || cols > kMaxCols)
    fail("cuda::{}: unsupported shape [{}, {}] (rows >= 1, cols a multiple of 8 in [8, {}])", what,
         rows, cols, kMaxCols);
  if (!is_aligned(W, 16) || !is_aligned(x, 16))
    fail("cuda::{}: W and x must be 16-byte aligned", what);
  const int nch = cols / 8;
  const int R = nch >= 256 ? 1 : nch >= 128 ? 2 : nch >= 64 ? 4 : 8;
  int splits = 1;
  while (splits < kWarps && nch / (2 * splits) >= 256) splits *= 2;
  const long long target_warps = 4LL * kWarps * sm_count();
  while (splits < kWarps && (long long)ceil_div(rows, R) * splits < target_warps &&
         nch / (2 * splits) >= 32)
    splits *= 2;
  switch (R) {
    case 1:
      launch<1, kMode>(W, rows, cols, x, y, splits, stream);
      break;
    case 2:
      launch<2, kMode>(W, rows, cols, x, y, splits, stream);
      break;
    case 4:
      launch<4, kMode>(W, rows, cols, x, y, splits, stream);
      break;
    default:
      launch<8, kMode>(W, rows, cols, x, y, splits, stream);
      break;
  }
}

}  // namespace

void gemv(const bf16* W, int rows, int cols, const bf16* x, float* y, GemvOut mode,
          cudaStream_t stream) {
  if (mode == GemvOut::Store)
    dispatch<kOutF32>("gemv", W, rows, cols, x, y, stream);
  else
    dispatch<kOutAddF32>("gemv", W, rows, cols, x, y, stream);
}

void gemv_bf16out(const bf16* W, int rows, int cols, const bf16* x, bf16* y, cudaStream_t stream) {
  dispatch<kOutBf16>("gemv_bf16out", W, rows, cols, x, y, stream);
}

}  // namespace lilac::cuda
