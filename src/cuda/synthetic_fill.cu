#include "cuda/common.cuh"
#include "cuda/synthetic.h"
#include "cuda/synthetic_fill.h"

namespace lilac::cuda {

namespace {

// Grid-stride fill; the value of element i depends only on (key, i), not on the launch shape.
__global__ void fill_bf16_kernel(bf16* p, size_t n, uint64_t key, float centre, float a) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(synthetic::value(key, i, centre, a));
}

__global__ void fill_f32_kernel(float* p, size_t n, uint64_t key, float centre, float a) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = synthetic::value(key, i, centre, a);
}

__global__ void fill_bf16_rows_kernel(bf16* p, size_t n, size_t cols, uint64_t key, float centre,
                                      const float* row_a) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(synthetic::value(key, i, centre, row_a[i / cols]));
}

int fill_blocks(size_t n) {
  return int(std::min<size_t>((n + 255) / 256, 132 * 32));
}

}  // namespace

void fill_synthetic_bf16(bf16* p, size_t n, uint64_t key, float centre, float a,
                         cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, key, centre, a);
  LILAC_CUDA_LAUNCHED();
}

void fill_synthetic_f32(float* p, size_t n, uint64_t key, float centre, float a,
                        cudaStream_t stream) {
  if (n == 0) return;
  fill_f32_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, key, centre, a);
  LILAC_CUDA_LAUNCHED();
}

void fill_synthetic_bf16_rows(bf16* p, int64_t cols, uint64_t key, float centre,
                              const std::vector<float>& row_a, cudaStream_t stream) {
  const size_t n = row_a.size() * size_t(cols);
  if (n == 0) return;
  DeviceBuffer<float> amplitudes(row_a.size());
  LILAC_CUDA_CHECK(cudaMemcpyAsync(amplitudes.get(), row_a.data(), row_a.size() * 4,
                                   cudaMemcpyHostToDevice, stream));
  fill_bf16_rows_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, size_t(cols), key, centre,
                                                            amplitudes.get());
  LILAC_CUDA_LAUNCHED();
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace lilac::cuda
