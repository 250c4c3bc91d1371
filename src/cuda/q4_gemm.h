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

// Device scratch for q_gemm_wgmma's stream-K form (q4_gemm_wgmma.cu): q_gemm_scratch_bytes()
// bytes, 16-byte aligned, zeroed once before the first use (each launch leaves it reusable), used
// by one stream at a time. Without it (ptr null) the form is never chosen.
struct QGemmScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};
// 0 where q_gemm_wgmma is not available.
size_t q_gemm_scratch_bytes();
// Whether q_gemm's automatic choice may take the stream-K form (LILAC_Q4_GEMM_STREAMK=auto; off by
// default: measured slower at 256-512 tokens, s35): the backend allocates a scratch only then.
bool q_gemm_streamk_auto();
// Whether a stream-K launch on this scratch gave up waiting for a block (synchronises; tests).
bool q_gemm_scratch_failed(const QGemmScratch& scratch);

// Any M >= 1; K = W.cols a positive multiple of 64; A bf16 [M, K] dense row-major, 16-byte
// aligned; C dense [M, W.rows] (f32, or bf16 for StoreBF16). Never synchronises or allocates.
// Twin: dequantize_row_bf16 + cpu::matmul (exactly the weights the kernel multiplies).
// 4-bit weights on a compute capability 9.x GPU take q_gemm_wgmma, the rest q_gemm_mma.
void q_gemm(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream,
            const QGemmScratch& scratch = {});

// The mma.sync kernel (q4_gemm.cu; 256 rows x 128 tokens per block, 1 block per SM): q_gemm's path
// for 8-bit weights (the router) and off Hopper; for 4-bit too until s6 (the kernel lab's q_gemm
// v1). Same contract as q_gemm.
void q_gemm_mma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode, cudaStream_t stream);

// The wgmma kernel (q4_gemm_wgmma.cu; the weights dequantised in registers as wgmma's A operand,
// 128 rows x 256 or 128 tokens per block, K split over a cluster of 1, 2 or 4 blocks; up to 64
// tokens, 64 per block, 2 blocks per SM, K split up to 8 ways; up to 16 / 32 tokens, that many per
// block, 3 per SM): q_gemm's path for 4-bit weights on compute capability 9.x
// (q_gemm_wgmma_available), and the batched decode step's 4-bit projections. q_gemm's contract
// restricted to 4 bits. tokens_per_block 256, 128 (at M <= 64: s7's narrow form), 64, 32 or 16
// (M <= that only) and splits 1, 2 or 4 (8 with 64 / 32 / 16) ((K / 64) % splits == 0); both 0
// picks by estimated time (the kernel lab times every choice); one 0: 256 tokens, 1 split. The
// split sums are added in rank order (deterministic). splits -1 (256-token tiles, `scratch`
// given): the stream-K form, persistent blocks sharing the (tile, k-tile) iterations evenly, each
// tile's pieces added in k order (deterministic); with q_gemm_streamk_auto() and a scratch the
// automatic choice takes it where the tiles leave SMs idle (M > 64).
// whole_tiles (s36; with splits > 1, a multiple of splits): the first whole_tiles tiles computed
// each by one block over all of K, the rest split; the automatic choice takes this where full waves
// of whole tiles leave a part-empty last wave whose tiles, split, fit the GPU at once (in_proj and
// qkv at 512 tokens).
void q_gemm_wgmma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode,
                  cudaStream_t stream, int tokens_per_block = 0, int splits = 0,
                  const QGemmScratch& scratch = {}, int whole_tiles = 0);
bool q_gemm_wgmma_available();
// Clusters of (tokens_per_block, splits) blocks resident at once on this device (0: such a launch
// cannot run; cudaOccupancyMaxActiveClusters).
int q_gemm_wgmma_max_clusters(int tokens_per_block, int splits);
// The small-M forms' placement (s45): whether an un-clustered launch of at most one block per SM
// takes an SM per block (LILAC_Q4_SMALL_SPREAD, on by default), and how many blocks of that launch
// (tokens_per_block 16, 32 or 64) fit one SM at the shared memory it asks for: 1 under the spread,
// 2-3 without (0: no such form, or none fits).
bool q_gemm_wgmma_small_spread();
int q_gemm_wgmma_small_blocks_per_sm(int tokens_per_block);

}  // namespace lilac::cuda
