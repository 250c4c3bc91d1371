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

}  // namespace lilac::cuda
