// q_moe_small in the kernel lab (README.md here): the versions kept in this directory. Each takes
// q_moe_small_gate_up's arguments (src/cuda/q4_moe.h) and runs on production's grid, passes and x
// staging (src/cuda/q4_moe_small.cuh).
#pragma once

#include <cuda_runtime.h>

#include "cuda/moe_prefill.h"
#include "cuda/q4_gemm.h"

namespace lilac::lab {

// Version 3 (s22, v3_slots.cu), 4-bit only: the register gate_up kernel (version 1) with each
// warp's next set of weights copied by cp.async into a private shared-memory slot while it
// computes the current one; slots = 2 or 3 (1 or 2 sets in flight per warp).
void q_moe_small_gate_up_slots(int slots, const cuda::bf16* x, int T, int H,
                               const cuda::QMatrix& gate_up, int I,
                               const cuda::QMatrix& shared_gate_up, int Is,
                               const cuda::MoeRouting& r, cuda::bf16* act, cuda::bf16* shared_act,
                               cudaStream_t stream);

}  // namespace lilac::lab
