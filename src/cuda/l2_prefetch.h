// Weights requested into L2 ahead of the kernels that read them: a decode step is a chain of
// latency-bound kernels (each of the dense projections reads 0.5-14 MB in 4-6 us of which its
// bytes are ~1-3 us at DRAM bandwidth), and the next layer's dense weights do not depend on
// anything the step computes. l2_prefetch hands byte ranges to the bulk copy engine
// (cp.async.bulk.prefetch.L2 on sm_90: no data comes back, nothing is waited for), so that a
// later kernel's loads hit L2. The backend launches it on a side stream forked from the decode
// step (CudaOptions::l2_ahead): it overlaps the step instead of joining its chain.
// No numerical effect: with or without it every kernel reads the same bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lilac::cuda {

// Up to kMax byte ranges (device addresses). Each range is prefetched in whole chunks of 16 bytes
// from its start (the bulk copy engine's unit): a range's address is 16-byte aligned (every
// weight buffer is), a tail of fewer than 16 bytes is left out.
struct L2Ranges {
  static constexpr int kMax = 12;
  const void* ptr[kMax] = {};
  uint64_t bytes[kMax] = {};
  int n = 0;
  // Appends [p, p + bytes) (nothing when p is null or bytes < 16); fails past kMax.
  void add(const void* p, size_t bytes);
  uint64_t total() const;
};

// How the prefetched lines enter L2: with the default priority, or marked evict-last (an L2 cache
// policy hint: the lines streamed meanwhile, the experts' weights, are evicted before them).
enum class L2Hint { normal, evict_last };

// The chunks l2_prefetch splits the ranges into: chunk i of `chunk_bytes` (the last of a range
// shorter), in range order. Host and device share it (the kernel's threads take chunks i, i +
// threads, ...). Returns false past the last chunk.
struct L2Chunk {
  const void* ptr;
  uint32_t bytes;
};
#if defined(__CUDACC__)
#define LILAC_L2_HD __host__ __device__ __forceinline__
#else
#define LILAC_L2_HD inline
#endif
LILAC_L2_HD bool l2_chunk(const L2Ranges& r, uint64_t chunk_bytes, uint64_t i, L2Chunk& out) {
  for (int j = 0; j < r.n; ++j) {
    const uint64_t usable = r.bytes[j] & ~uint64_t(15);
    const uint64_t chunks = (usable + chunk_bytes - 1) / chunk_bytes;
    if (i < chunks) {
      const uint64_t off = i * chunk_bytes;
      const uint64_t left = usable - off;
      out.ptr = static_cast<const char*>(r.ptr[j]) + off;
      out.bytes = uint32_t(left < chunk_bytes ? left : chunk_bytes);
      return true;
    }
    i -= chunks;
  }
  return false;
}

constexpr uint64_t kL2ChunkBytes = 64 * 1024;

// Number of chunks of `r` at kL2ChunkBytes.
uint64_t l2_chunk_count(const L2Ranges& r);

// Requests every byte of `r` into L2 (sm_90: one cp.async.bulk.prefetch.L2 per 64 KB chunk,
// spread over 16 one-warp blocks; older devices: prefetch.global.L2 per 128-byte line). Returns
// before the data arrives. A plain launch (no PDL): it reads nothing another kernel writes.
void l2_prefetch(const L2Ranges& r, L2Hint hint, cudaStream_t stream);

}  // namespace lilac::cuda
