// Device fills of synthetic weights (values from synthetic.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lilac::cuda {

void fill_synthetic_bf16(__nv_bfloat16* p, size_t n, uint64_t key, float centre, float a,
                         cudaStream_t stream);
void fill_synthetic_f32(float* p, size_t n, uint64_t key, float centre, float a,
                        cudaStream_t stream);
// `row_a.size()` rows of `cols` values, row r with amplitude row_a[r] (synthetic_row_amplitudes:
// the zipf router); element i is synthetic::value(key, i, centre, row_a[i / cols]) as on the
// host. Uploads row_a and synchronises `stream` before returning.
void fill_synthetic_bf16_rows(__nv_bfloat16* p, int64_t cols, uint64_t key, float centre,
                              const std::vector<float>& row_a, cudaStream_t stream);

}  // namespace lilac::cuda
