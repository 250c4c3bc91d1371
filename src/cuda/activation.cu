#include "cuda/activation.h"
#include "cuda/common.cuh"

namespace lilac::cuda {

namespace {

__global__ void swiglu_kernel(const float* gu, int T, int n, bf16* out) {
  const int64_t total = int64_t(T) * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / n, c = i % n;
    const float g = gu[t * 2 * n + c], u = gu[t * 2 * n + n + c];
    out[i] = __float2bfloat16_rn(silu(g) * u);
  }
}

__global__ void advance_kernel(int32_t* d_pos, int n) { *d_pos += n; }

}  // namespace

void swiglu(const float* gu, int T, int n, bf16* out, cudaStream_t stream) {
  const int64_t total = int64_t(T) * n;
  if (total == 0) return;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 132 * 16));
  swiglu_kernel<<<blocks, 256, 0, stream>>>(gu, T, n, out);
  LILAC_CUDA_LAUNCHED();
}

void advance_position(int32_t* d_pos, int n, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(d_pos, n);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
