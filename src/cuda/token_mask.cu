#include "cuda/token_mask.h"

#include <cmath>

#include "cuda/common.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kMaskThreads = 256;

__global__ void __launch_bounds__(kMaskThreads)
    mask_logits_kernel(float* __restrict__ logits, int n, const uint32_t* __restrict__ allowed) {
  const int t = int(blockIdx.x) * kMaskThreads + int(threadIdx.x);
  if (t < n && !((allowed[t >> 5] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

}  // namespace

void mask_logits(float* logits, int n, const uint32_t* allowed, cudaStream_t stream) {
  if (!logits || !allowed) fail("cuda::mask_logits: null pointer");
  if (n < 1) fail("cuda::mask_logits: n = {}", n);
  mask_logits_kernel<<<unsigned(ceil_div(n, kMaskThreads)), kMaskThreads, 0, stream>>>(logits, n,
                                                                                       allowed);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
