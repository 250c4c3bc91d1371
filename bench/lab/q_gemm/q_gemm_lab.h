// q_gemm in the kernel lab (README.md here): the versions kept in this directory. Every version
// takes q_gemm's arguments (src/cuda/q4_gemm.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/q4_gemm.h"

namespace lilac::lab {

// Version 3 (v3_splitk.cu): v2's main loop on 1/S of K per block, the S blocks of an output tile
// a thread-block cluster reducing through distributed shared memory (deterministic, rank order),
// and an epilogue through shared memory (coalesced 16-byte rows, the residual's loads batched).
// 4-bit weights, compute capability 9.x; C 16-byte aligned and W.rows % 4 == 0, else it calls
// v2 (cuda::q_gemm_wgmma). tokens_per_block 0 (auto), 256 or 128; splits 0 (auto), 1, 2 or 4
// ((K / 64) % splits == 0).
void q_gemm_v3(const cuda::bf16* A, int M, const cuda::QMatrix& W, void* C, cuda::GemmOut mode,
               cudaStream_t stream, int tokens_per_block = 0, int splits = 0);
// How many clusters of (tokens_per_block, splits) blocks can be resident at once on this device
// (cudaOccupancyMaxActiveClusters; 0: such a launch cannot run).
int q_gemm_v3_max_clusters(int tokens_per_block, int splits);

}  // namespace lilac::lab
