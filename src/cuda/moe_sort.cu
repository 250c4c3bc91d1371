// moe_sort_pairs: the (token, slot) pairs of a batched decode step's routing sorted by expert, for
// the sorted q_moe_gate_up_gemv (q4_moe.h). n <= 2048 pairs (B * k <= 64 * 31): one block ranks
// every pair against all others in shared memory (n^2 / threads compares: ~1 us at n = 512).
#include "cuda/common.cuh"
#include "cuda/moe_decode.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kMaxPairs = 2048;
constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads)
    moe_sort_pairs_kernel(const int32_t* __restrict__ idx, int n, int32_t* __restrict__ order) {
  __shared__ int32_t e[kMaxPairs];
  for (int i = threadIdx.x; i < n; i += kThreads) e[i] = idx[i];
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kThreads) {
    const int32_t ep = e[p];
    int rank = 0;
    for (int q = 0; q < n; ++q) {
      const int32_t eq = e[q];
      rank += (eq < ep || (eq == ep && q < p)) ? 1 : 0;
    }
    order[rank] = p;
  }
}

}  // namespace

void moe_sort_pairs(const int32_t* idx, int n, int32_t* order, cudaStream_t stream) {
  if (!idx || !order) fail("cuda::moe_sort_pairs: null pointer");
  if (n < 1 || n > kMaxPairs) fail("cuda::moe_sort_pairs: n = {} outside [1, {}]", n, kMaxPairs);
  moe_sort_pairs_kernel<<<1, kThreads, 0, stream>>>(idx, n, order);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
