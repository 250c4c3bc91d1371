// l2_prefetch (l2_prefetch.h): the next layer's weights requested into L2 from a side stream.
#include "cuda/common.cuh"
#include "cuda/l2_prefetch.h"
#include "util/error.h"

namespace lilac::cuda {

void L2Ranges::add(const void* p, size_t b) {
  if (!p || b < 16) return;
  if (n == kMax) fail("l2_prefetch: more than {} ranges", kMax);
  ptr[n] = p;
  bytes[n] = b;
  ++n;
}

uint64_t L2Ranges::total() const {
  uint64_t t = 0;
  for (int j = 0; j < n; ++j) t += bytes[j];
  return t;
}

uint64_t l2_chunk_count(const L2Ranges& r) {
  uint64_t c = 0;
  for (int j = 0; j < r.n; ++j)
    c += ((r.bytes[j] & ~uint64_t(15)) + kL2ChunkBytes - 1) / kL2ChunkBytes;
  return c;
}

namespace {

constexpr int kBlocks = 16, kThreads = 32;

template <bool kEvictLast>
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2Ranges r) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t policy = 0;
  if constexpr (kEvictLast)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  L2Chunk c;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       l2_chunk(r, kL2ChunkBytes, i, c); i += stride) {
    if constexpr (kEvictLast)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(c.ptr),
                   "r"(c.bytes), "l"(policy)
                   : "memory");
    else
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c.ptr), "r"(c.bytes)
                   : "memory");
  }
#else
  L2Chunk c;
  for (uint64_t i = blockIdx.x; l2_chunk(r, kL2ChunkBytes, i, c); i += gridDim.x)
    for (uint32_t o = threadIdx.x * 128u; o < c.bytes; o += blockDim.x * 128u)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(c.ptr) + o));
#endif
}

}  // namespace

void l2_prefetch(const L2Ranges& r, L2Hint hint, cudaStream_t stream) {
  if (r.n == 0) return;
  if (hint == L2Hint::evict_last)
    l2_prefetch_kernel<true><<<kBlocks, kThreads, 0, stream>>>(r);
  else
    l2_prefetch_kernel<false><<<kBlocks, kThreads, 0, stream>>>(r);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
