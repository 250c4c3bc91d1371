// q_moe_grouped in the kernel lab (README.md here): the versions kept in this directory (version 1
// is production's q_moe_grouped_gate_up / q_moe_grouped_down, src/cuda/q4_moe_prefill.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"

namespace lilac::lab {

// Version 2 (v2_wgmma.cu): the contracts of q_moe_grouped_gate_up / q_moe_grouped_down
// (src/cuda/q4_moe.h) for 4-bit weights on sm_90 (wgmma): act [T*k, I] bf16 sorted rows =
// bf16(silu(x gate_e^T) * (x up_e^T)); y [T*k, H] f32 sorted rows = act down_e^T.
// H, I multiples of 64; 16-byte aligned x and act.
bool q_moe_grouped_v2_available();
void q_moe_grouped_gate_up_v2(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v2(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);
// Version 3 (v2_wgmma.cu): version 2 with the wgmma n per block the smallest of 32, 64, 128
// covering the routing tile's rows (a short tile, e.g. an expert's second, costs less).
void q_moe_grouped_gate_up_v3(const cuda::bf16* x, int H, const cuda::QMatrix& gate_up, int I,
                              const cuda::MoeRouting& r, cuda::bf16* act, cudaStream_t stream);
void q_moe_grouped_down_v3(const cuda::bf16* act, int I, const cuda::QMatrix& down, int H,
                           const cuda::MoeRouting& r, float* y, cudaStream_t stream);

}  // namespace lilac::lab
