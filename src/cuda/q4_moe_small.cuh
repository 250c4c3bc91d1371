// The grid, passes and x staging of the small-M expert kernels (q4_moe_small.cu's file comment):
// shared by its register and streamed forms and by the kernel lab's versions
// (bench/lab/q_moe_small). .cu files only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/common.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"
#include "cuda/vec_util.cuh"

namespace lilac::cuda {

// Named (not anonymous): the lab's translation units include it too.
namespace qmoe_small {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPassTokens = 8;  // one MMA n-chunk of tokens per pass (x staged in shared memory)
constexpr int kXPad = 8;        // bf16 per staged x row past K: rows 4 banks apart (no conflicts)
// Groups per set: the registers a set holds (its codes and scales) bound the warps an SM keeps
// in flight; the x of the pass is in shared memory, not in registers.
constexpr int kGateUpSet = 4;  // two tiles per warp: 2 x 4 x 16-byte code loads per lane

struct Segment {
  int row0, count;  // the pass's first sorted row (or token) and its tokens (<= kPassTokens)
};

// The routing tables a block reads: the tile table (routed tile i: expert tile_expert[i], sorted
// rows [tile_row0[i], min(tile_row0[i] + kMoeTileRows, offsets[e + 1])), i < *num_tiles).
struct Tiles {
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int max_tiles;
};

inline Tiles tiles_of(const MoeRouting& r) {
  return Tiles{r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles, r.max_tiles};
}

// The passes of block (blockIdx.x, blockIdx.z), one after another: the block of routed tile
// x < max_tiles takes passes z, z + Z, z + 2Z, ... (Z = gridDim.z) of the tile's rows until they
// end (none when x >= num_tiles); the shared expert (e = E, every token) has its own x-blocks
// max_tiles, max_tiles + 1, ..., one pass each ((x - max_tiles) Z + z). PT: tokens per pass.
template <int PT = kPassTokens>
struct PassIterT {
  int e = 0, row0 = 0, m = 0, pass = 0, step = 0;
  __device__ __forceinline__ PassIterT(const Tiles& t, int E, int T)
      : PassIterT(t, E, T, int(blockIdx.x), int(blockIdx.z), int(gridDim.z)) {}
  // The same for the block at grid position (x, z) of Z (the chained kernels take their blocks in
  // another order than the hardware's).
  __device__ __forceinline__ PassIterT(const Tiles& t, int E, int T, int x, int z, int Z) {
    if (x < t.max_tiles) {
      if (x < *t.num_tiles) {
        e = t.tile_expert[x];
        row0 = t.tile_row0[x];
        m = min(kMoeTileRows, t.offsets[e + 1] - row0);
      }  // else an unused tile: m = 0, no passes
      pass = z;
      step = Z;
    } else {
      e = E, m = T;
      pass = (x - t.max_tiles) * Z + z;
      step = 1 << 24;  // one pass: pass * 8 stays far above T (<= 2^19) and far below 2^31
    }
  }
  // The tokens of the current pass (sorted rows of a routed tile, or tokens of the shared
  // expert); false when the pass is past them.
  __device__ __forceinline__ bool segment(Segment& s) const {
    const int base = pass * PT;
    if (base >= m) return false;
    s.row0 = row0 + base;
    s.count = min(PT, m - base);
    return true;
  }
};
using PassIter = PassIterT<>;  // 8 tokens per pass

// Issues the copies of the pass's token rows (K bf16 each; row r is x row ids[row0 + r], or
// row0 + r) into xs [count, K + kXPad]: 16-byte asynchronous copies by the whole block.
__device__ __forceinline__ void issue_x(const bf16* __restrict__ x, int K,
                                        const int32_t* __restrict__ ids, const Segment& seg,
                                        bf16* xs) {
  const int pieces = K / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < seg.count * pieces; i += kThreads) {
    const int r = i / pieces, v = i - r * pieces;
    const int src = ids ? ids[seg.row0 + r] : seg.row0 + r;
    cp_async16(xs + size_t(r) * (K + kXPad) + v * 8, x + size_t(src) * size_t(K) + v * 8);
  }
}

// issue_x, then waits for the copies (every one this thread has in flight) and the block.
__device__ __forceinline__ void stage_x(const bf16* __restrict__ x, int K,
                                        const int32_t* __restrict__ ids, const Segment& seg,
                                        bf16* xs) {
  issue_x(x, K, ids, seg, xs);
  cp_async_wait_all();
  __syncthreads();
}

__host__ __device__ inline size_t staged_x_bytes(int K) {
  return size_t(kPassTokens) * size_t(K + kXPad) * sizeof(bf16);
}

// Passes per tile in the grid (its z): three times the mean tokens per expert, at least 2 passes,
// at most a tile's (16) or the tokens' (T / 8). Run 1 of 2026-12-02 measured a 256-token chunk's
// grid of 32 passes (263,000 blocks of the down kernel, nearly all exiting at once) at 9.1 ms per
// 40 layers; the routed blocks loop over the passes past z, and the shared expert (every token)
// has ceil(passes / Z) x-blocks of its own, one pass each. Up to s6 a batch of at most 64 rows
// took every pass (8 at 64 rows, for ~2 tokens per expert); now 2 (an expert with more than 16 of
// the rows loops).
// Batches of up to 32 rows take at least 1 (s8 run 8): at 16 rows an expert sees ~1.25 tokens,
// and the second z-slice of 2 was blocks that exit at once (half of a 2,064-block grid): the
// 16-row down kernel 1.10 -> 1.01 ms per pass, engine c=16 2,755 -> 2,837 tok/s. At 64 rows one
// slice was slower (gate_up 3.23 -> 3.53 ms: experts of 9-16 rows loop), so 33-64 rows keep 2.
inline int grid_passes(int T, int E, int k) {
  const int all = std::min(ceil_div(T, kPassTokens), ceil_div(kMoeTileRows, kPassTokens));
  const int least = T <= 32 ? 1 : 2;
  return std::min(all, std::max(least, ceil_div(3 * T * k, E * kPassTokens)));
}

// Routed tiles (max_tiles), then the shared expert's blocks (its passes in groups of Z).
inline unsigned grid_x(const MoeRouting& r, int Z) {
  return unsigned(r.max_tiles + ceil_div(ceil_div(r.T, kPassTokens), Z));
}

}  // namespace qmoe_small

}  // namespace lilac::cuda
