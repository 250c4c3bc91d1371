// q_moe_grouped in the kernel lab (README.md here): the versions kept in this directory. Each takes
// q_moe_grouped_gate_up_wgmma's / q_moe_grouped_down_wgmma's arguments (src/cuda/q4_moe.h) and runs
// production's kernels (src/cuda/q4_moe_prefill_wgmma.cuh) at a block configuration production
// does not instantiate.
#pragma once

#include <cuda_runtime.h>

#include "cuda/moe_prefill.h"
#include "cuda/q4_gemm.h"

namespace lilac::lab {

// Version 6 (v6_rows32_configs.cu, s20, not run yet): passes of 32 rows at 12 stages and 2 blocks
// per SM (10 k-tiles of prefetch per block); version 7: 6 stages at 4 blocks per SM (4 k-tiles per
// block, 32 warps per SM). Production's rows32 is 8 stages at 3 blocks. 4-bit, compute capability
// 9.x.
void q_moe_grouped_gate_up_v6(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v6(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);
void q_moe_grouped_gate_up_v7(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v7(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);

// Version 8 (v8_pair_loop.cu, s20, not run yet): v6's configuration with a main loop over pairs of
// k-tiles (one wait and one block barrier per two k-tiles).
void q_moe_grouped_gate_up_v8(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v8(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);

// Version 9 (v6_rows32_configs.cu, s20, not run yet): production's rows32 pipeline (8 stages) at 2
// blocks per SM, where ptxas does not serialise the wgmmas (C7512 at 3 blocks).
void q_moe_grouped_gate_up_v9(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v9(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);

// Version 10 (v6_rows32_configs.cu, s20, not run yet): production's rows64 pipeline at 1 block per
// SM (not serialised; rows64 at 2 blocks is: C7512).
void q_moe_grouped_gate_up_v10(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                               const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v10(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                            const cuda::MoeRouting& r, float* y, cudaStream_t stream);

}  // namespace lilac::lab
