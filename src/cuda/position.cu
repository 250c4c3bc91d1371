#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/position.h"

namespace lilac::cuda {

namespace {
__global__ void advance_kernel(int32_t* d_pos, int n) {
  *d_pos += n;
}
__global__ void finish_batch_kernel(const DecodeBatchRow* rows, int B) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < B) *rows[b].d_pos = rows[b].pos + 1;
}
}  // namespace

void advance_position(int32_t* d_pos, int n, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(d_pos, n);
  LILAC_CUDA_LAUNCHED();
}

void finish_decode_batch(const DecodeBatchRow* rows, int B, cudaStream_t stream) {
  finish_batch_kernel<<<ceil_div(B, 64), 64, 0, stream>>>(rows, B);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
