// Small element-wise ops of the forward pass that belong to no larger family.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lilac::cuda {

// out[t, i] = bf16(silu(gu[t, i]) * gu[t, n + i]) for gu f32 [T, 2n] (gate columns, then up).
// Twin: the swiglu step of cpu::moe_forward.
void swiglu(const float* gu, int T, int n, __nv_bfloat16* out, cudaStream_t stream);

// *d_pos += n (the sequence's position counter lives on the device: graph replays read it).
void advance_position(int32_t* d_pos, int n, cudaStream_t stream);

}  // namespace lilac::cuda
