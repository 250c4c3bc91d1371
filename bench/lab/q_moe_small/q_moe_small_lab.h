// q_moe_small in the kernel lab (README.md here): the versions kept in this directory. Each takes
// q_moe_small_gate_up's arguments (src/cuda/q4_moe.h) and runs on production's grid, passes and x
// staging (src/cuda/q4_moe_small.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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

// Version 5 (s22, v3_slots.cu), 4-bit only, K <= 512: production's register down kernel with
// J = 4 output tiles per warp, tile j + 1's weights copied by cp.async into the warp's second
// shared-memory slot while tile j is computed (4 blocks per SM).
void q_moe_small_down_slots(const cuda::bf16* act, int I, const cuda::bf16* shared_act, int Is,
                            const cuda::QMatrix& down, const cuda::QMatrix& shared_down, int H,
                            const cuda::MoeRouting& r, float* y, float* shared_out,
                            cudaStream_t stream);

// Version 6 (s41, v6_stamps.cu), 4-bit only: production's register gate_up and down kernels
// (version 1) with a time stamp per block: stamps[4 b .. 4 b + 3] = start ns, end ns
// (%globaltimer), SM, passes run, for block b = x + X (y + Y z) (sized by the return value: the
// grid's blocks).
size_t q_moe_small_gate_up_stamped(const cuda::bf16* x, int T, int H, const cuda::QMatrix& gate_up,
                                   int I, const cuda::QMatrix& shared_gate_up, int Is,
                                   const cuda::MoeRouting& r, cuda::bf16* act,
                                   cuda::bf16* shared_act, unsigned long long* stamps,
                                   cudaStream_t stream);
size_t q_moe_small_down_stamped(const cuda::bf16* act, int I, const cuda::bf16* shared_act, int Is,
                                const cuda::QMatrix& down, const cuda::QMatrix& shared_down, int H,
                                const cuda::MoeRouting& r, float* y, float* shared_out,
                                unsigned long long* stamps, cudaStream_t stream);

// Version 7 (s44, v7_persistent.cu), 4-bit only: version 1's gate_up and down as one persistent
// launch (what fits at once, 4 blocks per SM) whose blocks take production's blocks of both grids
// as units from a counter, gate_up's first, a down unit waiting for its tile's gate_up units:
// act, shared_act, y and shared_out as versions 1 and 6 write them. `counters`: kPairCounters
// int32, zeroed once, left at zero by every launch. Returns the blocks launched.
constexpr int kPairCounters = 4096;
size_t q_moe_small_pair_persistent(const cuda::bf16* x, int T, int H, const cuda::QMatrix& gate_up,
                                   int I, const cuda::QMatrix& shared_gate_up, int Is,
                                   const cuda::QMatrix& down, const cuda::QMatrix& shared_down,
                                   const cuda::MoeRouting& r, cuda::bf16* act,
                                   cuda::bf16* shared_act, float* y, float* shared_out,
                                   int32_t* counters, cudaStream_t stream);

}  // namespace lilac::lab
