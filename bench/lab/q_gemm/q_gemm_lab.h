// q_gemm in the kernel lab (README.md here): the versions kept in this directory. Every version
// takes q_gemm's arguments (src/cuda/q4_gemm.h). Version 1 is production's q_gemm_mma, version 3
// production's q_gemm_wgmma (since s7).
#pragma once

#include <cuda_runtime.h>

#include "cuda/q4_gemm.h"

namespace lilac::lab {

// Version 2 (v2_scalar_epilogue.cu; production for 4-bit on Hopper in s6): one block per (128
// weight rows, BT tokens) tile over all of K, the accumulators stored straight from registers.
// 4-bit weights, compute capability 9.x; tokens_per_block 0 (auto), 256 or 128.
void q_gemm_v2(const cuda::bf16* A, int M, const cuda::QMatrix& W, void* C, cuda::GemmOut mode,
               cudaStream_t stream, int tokens_per_block = 0);

}  // namespace lilac::lab
