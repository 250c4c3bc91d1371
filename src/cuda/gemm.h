// Prefill matrix product on tensor cores: C[M, N] = A[M, K] . W[N, K]^T (an "NT" GEMM: both
// operands K-major, W in the checkpoint layout [out, in]), bf16 inputs, f32 accumulation.
// Design, tilings and the roofline numbers: the comment block at the top of gemm.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common.h"

namespace lilac::cuda {

enum class GemmOut {
  StoreF32,       // C is float [M, N]: C = A . W^T
  StoreBF16,      // C is bf16 [M, N]: C = bf16(A . W^T)
  AccumulateF32,  // C is float [M, N]: C += A . W^T (residual add)
};

// Tile configurations (block tile M x N). Auto picks one from the shape (fewest estimated SM-time
// units after wave quantisation); the others exist so tests cover every kernel and the benchmark
// can compare them. Wgmma128x256 is the sm_90a warpgroup-MMA kernel: on a device that is not
// compute capability 9.x it falls back to Mma128x256.
enum class GemmTile { Auto, Mma128x256, Mma128x128, Mma64x128, Wgmma128x256 };

// C[M, N] (=|+=) A[M, K] . W[N, K]^T. Any M >= 1 and N >= 1; K a multiple of 8 (16-byte rows).
// A, W and C are dense row-major (leading dimensions K, K and N); A and W 16-byte aligned.
// Never synchronises or allocates; graph-capturable.
void gemm(const bf16* A, int M, int K, const bf16* W, int N, void* C, GemmOut mode,
          cudaStream_t stream, GemmTile tile = GemmTile::Auto);

// The configuration gemm(..., GemmTile::Auto) would run for this shape on the current device.
GemmTile gemm_auto_tile(int M, int N, int K);
const char* gemm_tile_name(GemmTile tile);

}  // namespace lilac::cuda
