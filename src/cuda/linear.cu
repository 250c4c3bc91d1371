// Decode GEMV: y = W x for one token, W bf16 [rows, cols] row-major, x bf16 [cols] (or the RMS
// norm of an f32 row h, fused), y f32 or bf16. The kernel is gemv_kernel in gemv.cuh (shared with
// moe_decode.cu's router).
//
// Bytes and FLOPs at the real model's shapes (H = 2048); FLOPs = 2 * rows * cols are negligible
// (0.5 FLOP per byte), so the floor is the bytes of W over the 4.3 TB/s copy bandwidth:
//   GDN in_proj      12352 x 2048   50.6 MB   11.8 us   measured v1 14.55 us (81%)
//   attention qkv     9216 x 2048   37.7 MB    8.8 us   v1 11.30 us (78%)
//   out_proj/o_proj   2048 x 4096   16.8 MB    3.9 us   v1  9.08 us (43%)
//   MoE router         257 x 2048    1.1 MB    0.24 us  (latency-bound: v1 3.16 us)
//   lm_head         248320 x 2048   1017 MB  236 us     v1 244.7 us (97%)
// Per decode token these are 3.6 GB of the bf16 model's bytes (30 GDN + 10 attention layers +
// lm_head), so this kernel must run near the copy bandwidth.
//
// Design (version 2). A block is 256 threads = 8 warps. A warp computes the dot products of R
// consecutive rows over a slice of the columns: the row's 16-byte chunks (8 bf16) are split into
// `splits` equal slices (1, 2, 4, 8), and the 8 warps form 8 / splits row groups x splits slices.
// In a step, lane l loads chunks c + l + 32u (u < U) of each of its R rows (R * U = 8 independent
// 16-byte loads in flight per lane; a warp reads 512 contiguous bytes per (row, u)) with the
// non-allocating streaming load, then FMAs them against x staged in shared memory. Each lane's f32
// partial is reduced by a shuffle tree; with splits > 1 the slices' sums meet in shared memory and
// are added in slice order (deterministic). Blocks loop over items of 8 / splits * R rows.
// Version 1 -> 2 (from the first H200 measurements: the fixed cost per launch, ~2.5 us, decided
// the small shapes, and out_proj ran 1.55 waves of items):
//   - The first item's weight lines are prefetched into L2 before anything else: before pdl_wait
//     (they do not depend on the previous kernel) and before x is staged (cp.async, no registers),
//     so the launch ramp, the x round trip and the fused norm overlap the first DRAM round trip;
//     the first loads then hit L2. Launched with PDL (launch.h): the next GEMV's blocks start
//     prefetching while the previous kernel drains. (Holding the first step in registers instead
//     was tried: ptxas then double-buffers the step, 80-100 registers, half the resident blocks.)
//   - The split count minimises serial load rounds (gemv.cuh choose_splits): out_proj now runs
//     2 splits = 512 blocks of one full step (all 16.8 MB requested at once, one wave) instead of
//     4 splits = 1024 half-empty items over 660 resident blocks.
//   - gemv_rms: the RMS norm fused into the prologue (vec_util.cuh rms_norm_row; each block reads
//     h and the scale, 16 KB, from L2), bit-identical to rms_norm + gemv; saves the 2 us norm
//     launch before in_proj / qkv / lm_head.
// R = 1 (U = 8) for rows of >= 256 chunks (cols >= 2048), 2 (U = 4) for >= 128, 4 (U = 2) for
// >= 64, else 8 (U = 1). Rows past the end (the last item) are clamped to the last row for loading
// and not stored.
#include "cuda/linear.h"

#include "cuda/gemv.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using namespace gemv_detail;

void check_shape(const char* what, const bf16* W, int rows, int cols, const void* x,
                 const void* y) {
  if (!W || !x || !y) fail("cuda::{}: null pointer", what);
  if (rows < 1 || cols < 8 || cols % 8 != 0 || cols > kMaxCols)
    fail("cuda::{}: unsupported shape [{}, {}] (rows >= 1, cols a multiple of 8 in [8, {}])", what,
         rows, cols, kMaxCols);
  if (!is_aligned(W, 16) || !is_aligned(x, 16))
    fail("cuda::{}: W and x must be 16-byte aligned", what);
}

}  // namespace

void gemv(const bf16* W, int rows, int cols, const bf16* x, float* y, GemvOut mode,
          cudaStream_t stream) {
  check_shape("gemv", W, rows, cols, x, y);
  Params p;
  p.W = W;
  p.rows = rows;
  p.cols = cols;
  p.x = x;
  p.y = y;
  if (mode == GemvOut::Store)
    dispatch_gemv<kOutF32, false, kEpiNone>(p, stream);
  else
    dispatch_gemv<kOutAddF32, false, kEpiNone>(p, stream);
}

void gemv_bf16out(const bf16* W, int rows, int cols, const bf16* x, bf16* y, cudaStream_t stream) {
  check_shape("gemv_bf16out", W, rows, cols, x, y);
  Params p;
  p.W = W;
  p.rows = rows;
  p.cols = cols;
  p.x = x;
  p.y = y;
  dispatch_gemv<kOutBf16, false, kEpiNone>(p, stream);
}

void gemv_rms(const bf16* W, int rows, int cols, const float* h, const float* scale, float eps,
              float* y, GemvOut mode, cudaStream_t stream) {
  check_shape("gemv_rms", W, rows, cols, h, y);
  if (!scale) fail("cuda::gemv_rms: null pointer");
  if (!is_aligned(scale, 16)) fail("cuda::gemv_rms: h and scale must be 16-byte aligned");
  Params p;
  p.W = W;
  p.rows = rows;
  p.cols = cols;
  p.h = h;
  p.scale = scale;
  p.eps = eps;
  p.y = y;
  if (mode == GemvOut::Store)
    dispatch_gemv<kOutF32, true, kEpiNone>(p, stream);
  else
    dispatch_gemv<kOutAddF32, true, kEpiNone>(p, stream);
}

}  // namespace lilac::cuda
