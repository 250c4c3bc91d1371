// q_moe_grouped in the kernel lab (README.md here): the versions kept in this directory. Each takes
// q_moe_grouped_gate_up_wgmma's / q_moe_grouped_down_wgmma's arguments (src/cuda/q4_moe.h) and runs
// production's kernels (src/cuda/q4_moe_prefill_wgmma.cuh) at a block configuration or with a main
// loop production does not use.
#pragma once

#include <cuda_runtime.h>

#include "cuda/moe_prefill.h"
#include "cuda/q4_gemm.h"

namespace lilac::lab {

// Versions 4-10, 13, 14 (v6_rows32_configs.cu; s20, s21), 4-bit, compute capability 9.x, all with
// one k-tile per block barrier except v8:
//  4, 5: s20's rows64 (8 stages, 2 blocks per SM) and rows32 (8 stages, 3 blocks per SM);
//  6: passes of 32 rows at 12 stages and 2 blocks per SM (10 k-tiles of prefetch per block);
//  7: 6 stages at 4 blocks per SM (4 k-tiles per block, 32 warps per SM);
//  8: v6 with production's PairLoop since s21 (one wait and one block barrier per two k-tiles);
//  9: rows32's pipeline (8 stages) at 2 blocks per SM, where ptxas does not serialise the wgmmas
//     (C7512 at 3 blocks);
//  10: rows64's pipeline at 1 block per SM (not serialised; at 2 blocks it is).
//  13, 14 (s21): v6's configuration with 4 / 3 k-tiles per block barrier (GroupLoop<4> / <3>).
// Production's rows32 / rows64 since s21 (versions 11 / 12) are v5 / v4 with PairLoop. Other
// versions fail.
void q_moe_grouped_gate_up_lab(int version, const cuda::bf16* x, int H,
                               const cuda::QMatrix& gate_up, int I, const cuda::MoeRouting& r,
                               cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_lab(int version, const cuda::bf16* act, int I, const cuda::QMatrix& down,
                            int H, const cuda::MoeRouting& r, float* y, cudaStream_t stream);

// Versions 15-18 (v15_ws.cu, ws_gate_up.cuh; s40): rows32's gate_up with a producer warp (bulk
// copies of the weights, cp.async of the token rows, mbarriers; 2 blocks per SM): 10 stages and 1
// k-tile per wgmma wait, 10 and 2, 6 and 2, and 10 and 2 with the weights by cp.async (v18); other
// versions fail. Their down is production's rows32.
void q_moe_grouped_ws_lab(int version, const cuda::bf16* x, int H, const cuda::QMatrix& gate_up,
                          int I, const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);

}  // namespace lilac::lab
