// Prefill matrix product over 4/8-bit weights (tiled layout, q4_layout.h):
// C[M, N] (=|+=) A[M, K] . W[N, K]^T with N = W.rows, K = W.cols, on tensor cores (mma.sync
// m16n8k16, bf16 x bf16 -> f32), W dequantised in registers to w = RNE_bf16(s q + b).
// Design and roofline numbers: q4_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/gemm.h"
#include "cuda/q4_layout.h"

namespace lilac::cuda {

// Any M >= 1; K = W.cols a positive multiple of 64; A bf16 [M, K] dense row-major, 16-byte
// aligned; C dense [M, W.rows] (f32, or bf16 for StoreBF16). Never synchronises or allocates.
// Twin: dequantize_row_bf16 + cpu::matmul (exactly the weights the kernel multiplies).
void q_gemm(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream);

}  // namespace lilac::cuda
