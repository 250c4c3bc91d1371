// Small device helpers shared by the bandwidth-bound kernels (norm, linear, moe_decode):
// bf16 pairs packed in 32-bit words, 16-byte streaming weight loads, an 8-element bf16 dot
// product with f32 accumulation, and launch-sizing queries. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/common.cuh"

namespace lilac::cuda {

// A 32-bit word holding two bf16: element 2j in the low half, 2j+1 in the high half (memory
// order on a little-endian machine). Widening is exact: bf16 is the top half of an f32.
__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

// Two floats -> a packed bf16 pair, round to nearest even (as f32_to_bf16 on the host).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// 16-byte load of weights that are read once per kernel: through the non-coherent path, without
// allocating in L1 (so the activations staged there stay), with a 256-byte L2 prefetch hint.
// Not volatile: the compiler may hoist and batch these loads (the data never changes in a kernel).
__device__ __forceinline__ uint4 ld_weights(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// acc + sum_{e<8} w[e] * x[e] for 8 bf16 packed in 16 bytes, f32 FMAs in element order. Products
// of two bf16 are exact in f32, so only the summation order differs from any other f32 dot.
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
  acc = fmaf(bf16_lo(w.x), bf16_lo(x.x), acc);
  acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
  acc = fmaf(bf16_lo(w.y), bf16_lo(x.y), acc);
  acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
  acc = fmaf(bf16_lo(w.z), bf16_lo(x.z), acc);
  acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
  acc = fmaf(bf16_lo(w.w), bf16_lo(x.w), acc);
  acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
  return acc;
}

// One step of a warp's dot products of R rows (wr[r]: the rows as 16-byte chunks) with x (xs,
// 16-byte chunks, usually in shared memory): this lane's chunks c, c + 32, ..., c + 32 (U - 1),
// all R * U weight loads issued before the first FMA. kCheck: the step may run past the end c1
// (those loads are predicated off and contribute zero); without it every chunk must be < c1.
template <int R, int U, bool kCheck>
__device__ __forceinline__ void gemv_step(const uint4* const (&wr)[R], const uint4* xs, int c,
                                          int c1, float (&acc)[R]) {
  uint4 wv[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = !kCheck || c + 32 * u < c1;
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[u][r] = ok ? ld_weights(wr[r] + c + 32 * u) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = !kCheck || c + 32 * u < c1;
    const uint4 xv = ok ? xs[c + 32 * u] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = dot8(wv[u][r], xv, acc[r]);
  }
}

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Multiprocessors of the current device (queried once; the engine uses one device).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    LILAC_CUDA_CHECK(cudaGetDevice(&dev));
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v > 0 ? v : 1;
  }();
  return n;
}

// Blocks of `threads` threads of `kernel` resident per multiprocessor (registers and static
// shared memory; the callers' dynamic shared memory is small). One query per kernel pointer
// value is cached by the caller in a function-local static.
template <typename Kernel>
int resident_blocks_per_sm(Kernel kernel, int threads) {
  int n = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return n > 0 ? n : 1;
}

}  // namespace lilac::cuda
