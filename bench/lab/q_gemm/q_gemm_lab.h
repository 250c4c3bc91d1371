// q_gemm in the kernel lab (README.md here): the versions kept in this directory (version 1 is
// the production q_gemm of src/cuda/q4_gemm.cu, called through its launcher).
#pragma once

#include <cuda_runtime.h>

#include "cuda/gemm.h"
#include "cuda/q4_layout.h"

namespace lilac::lab {

// Version 2 (v2_wgmma_dequant.cu): C[M, N] (=|+=) A[M, K] . W[N, K]^T with the weights dequantised
// in registers as the A operand of wgmma (sm_90a) and the tokens as its n dimension. The contract
// of cuda::q_gemm (src/cuda/q4_gemm.h) restricted to 4-bit W: any M >= 1, K = W.cols a positive
// multiple of 64, A bf16 [M, K] 16-byte aligned, C dense [M, N] (f32, or bf16 for StoreBF16).
// tokens_per_block: 256 or 128 (wgmma n); 0 picks by the wave count. Needs compute capability 9.0
// (q_gemm_v2_available()).
void q_gemm_v2(const cuda::bf16* A, int M, const cuda::QMatrix& W, void* C, cuda::GemmOut mode,
               cudaStream_t stream, int tokens_per_block = 0);
bool q_gemm_v2_available();

}  // namespace lilac::lab
