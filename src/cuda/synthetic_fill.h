// Device fills of synthetic weights (values from synthetic.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lilac::cuda {

void fill_synthetic_bf16(__nv_bfloat16* p, size_t n, uint64_t key, float centre, float a,
                         cudaStream_t stream);
void fill_synthetic_f32(float* p, size_t n, uint64_t key, float centre, float a,
                        cudaStream_t stream);

}  // namespace lilac::cuda
