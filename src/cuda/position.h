// The sequence's position counter lives on the device: decode graph replays read it, so the
// host never passes the position by value inside a step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lilac::cuda {

// *d_pos += n.
void advance_position(int32_t* d_pos, int n, cudaStream_t stream);

}  // namespace lilac::cuda
