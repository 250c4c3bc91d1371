#include "cuda/common.cuh"
#include "cuda/position.h"

namespace lilac::cuda {

namespace {
__global__ void advance_kernel(int32_t* d_pos, int n) {
  *d_pos += n;
}
}  // namespace

void advance_position(int32_t* d_pos, int n, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(d_pos, n);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
