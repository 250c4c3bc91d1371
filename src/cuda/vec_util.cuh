// Small device helpers shared by the bandwidth-bound kernels (norm, linear, moe_decode, sampling):
// bf16 pairs packed in 32-bit words, 16-byte streaming weight loads, an 8-element bf16 dot
// product with f32 accumulation, the RMS norm of a row in the one summation order every fused
// consumer shares, programmatic dependent launch (PDL), and launch-sizing queries. Included by
// .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/launch.h"

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
// kEarly: the load is issued before pdl_wait() (a weight needs no wait) and must stay there:
// `asm volatile` keeps it in program order before the wait (a plain asm without memory operands
// could be sunk past it, towards its first use).
template <bool kEarly = false>
__device__ __forceinline__ uint4 ld_weights(const void* p) {
  uint4 v;
  if (kEarly)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
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

// One step of a warp's dot products of R rows (wr[r]: the rows as 16-byte chunks) with x (xs:
// 16-byte chunks, usually in shared memory), split in two so that the loads can be issued early
// (before x is staged, before pdl_wait) and the FMAs later: this lane's chunks c, c + 32, ...,
// c + 32 (U - 1) of each row, R * U independent loads. kCheck: the step may run past the end c1
// (those chunks are not loaded and add nothing); without it every chunk must be < c1.
template <int R, int U, bool kCheck, bool kEarly = false>
__device__ __forceinline__ void load_rows(const uint4* const (&wr)[R], int c, int c1,
                                          uint4 (&wv)[U][R]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = !kCheck || c + 32 * u < c1;
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[u][r] = ok ? ld_weights<kEarly>(wr[r] + c + 32 * u) : make_uint4(0, 0, 0, 0);
  }
}

template <int R, int U, bool kCheck>
__device__ __forceinline__ void dot_rows(const uint4 (&wv)[U][R], const uint4* xs, int c, int c1,
                                         float (&acc)[R]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = !kCheck || c + 32 * u < c1;
    const uint4 xv = ok ? xs[c + 32 * u] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = dot8(wv[u][r], xv, acc[r]);
  }
}

// Prefetches into L2 the 16-byte chunks [c, c + n) of `row` (weights whose loads follow later: they
// then hit L2). No registers are held and nothing is waited for. sm_90: one lane hands the whole
// range to the bulk copy engine (cp.async.bulk.prefetch.L2, exact byte count); older targets:
// prefetch.global.L2 per 32-byte sector, spread over the lanes.
__device__ __forceinline__ void prefetch_chunks_l2(const uint4* row, int c, int n, int lane) {
  if (n <= 0) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane == 0)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row + c), "r"(unsigned(n) * 16u)
                 : "memory");
#else
  for (int q = lane; 2 * q < n; q += 32)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + c + 2 * q));
#endif
}

// 16-byte asynchronous copy global -> shared (through L2, no registers), and the wait for all of
// this thread's outstanding copies. sm_80+.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Four floats from shared memory in one 16-byte load (p 16-byte aligned). A plain float4 read
// may reach PTX as four scalar loads: after full unrolling, where only the components are used,
// the compiler splits the vector load and does not merge it again (gdn_chunk's forward
// substitution: 2,200 ld.shared.f32 and no ld.shared.v4 in its PTX, docs/kernels.md s28 item 2),
// and on a broadcast read that is four shared-memory wavefronts instead of one. volatile and the
// memory clobber keep it where it is written (after the barrier that published the data; never
// hoisted out of a loop whose iterations rewrite it).
__device__ __forceinline__ float4 lds_f4(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p)))
               : "memory");
  return v;
}

// ---- programmatic dependent launch (launch.h) ------------------------------------------------

// Lets the next kernel in the stream (if launched with PDL) start scheduling its blocks. Safe
// anywhere: the next kernel still waits for this one to finish before reading what it writes.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Waits until the previous kernel in the stream has completed and its writes are visible (a
// no-op when this kernel was launched without PDL). Every kernel launched through launch_kernel
// with PDL must call it before its first read of data another kernel writes and before its first
// global store. The memory clobber keeps the compiler from moving loads or stores across it.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- RMS norm of one row, in the order every consumer shares ---------------------------------

// The block size of the row norm: rms_norm and the kernels that fuse it (gemv_rms, moe_router)
// all run it with exactly this many threads, so they sum in the same order and agree bit for bit.
constexpr int kRmsThreads = 256;

__device__ __forceinline__ float sumsq8(const float4& a, const float4& b, float s) {
  s = fmaf(a.x, a.x, s);
  s = fmaf(a.y, a.y, s);
  s = fmaf(a.z, a.z, s);
  s = fmaf(a.w, a.w, s);
  s = fmaf(b.x, b.x, s);
  s = fmaf(b.y, b.y, s);
  s = fmaf(b.z, b.z, s);
  s = fmaf(b.w, b.w, s);
  return s;
}

// 8 values -> 8 bf16 (round to nearest even): bf16((v * r) * scale), the twin's order.
__device__ __forceinline__ uint4 rms_pack8(const float4& a, const float4& b, const float4& s0,
                                           const float4& s1, float r) {
  uint4 o;
  o.x = pack_bf16x2(__fmul_rn(__fmul_rn(a.x, r), s0.x), __fmul_rn(__fmul_rn(a.y, r), s0.y));
  o.y = pack_bf16x2(__fmul_rn(__fmul_rn(a.z, r), s0.z), __fmul_rn(__fmul_rn(a.w, r), s0.w));
  o.z = pack_bf16x2(__fmul_rn(__fmul_rn(b.x, r), s1.x), __fmul_rn(__fmul_rn(b.y, r), s1.y));
  o.w = pack_bf16x2(__fmul_rn(__fmul_rn(b.z, r), s1.z), __fmul_rn(__fmul_rn(b.w, r), s1.w));
  return o;
}

// dst[c] = the 8 bf16 of chunk c of bf16(h * rsqrt(mean(h^2) + eps) * scale), c < H / 8.
// Requirements: exactly kRmsThreads threads, all of them calling (it has barriers); H % 8 == 0;
// h, scale, dst 16-byte aligned. The sum of squares is fixed: thread t adds the squares of chunks
// t, t + 256, ... (elements in order, fmaf), then block_sum (a shuffle tree per warp, the warps'
// sums by a second tree). h is read through L2 (ld.global.cg): it may have been written by the
// previous kernel (PDL). dst may be shared or global memory; no barrier after the stores.
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ h,
                                             const float* __restrict__ scale, int H, float eps,
                                             uint4* dst, float* scratch) {
  const int nch = H >> 3;
  const float4* h4 = reinterpret_cast<const float4*>(h);
  const float4* s4 = reinterpret_cast<const float4*>(scale);
  float ss = 0.f;
  for (int i = threadIdx.x; i < nch; i += kRmsThreads)
    ss = sumsq8(__ldcg(h4 + 2 * i), __ldcg(h4 + 2 * i + 1), ss);
  const float r = rsqrtf(block_sum(ss, scratch) / float(H) + eps);
  for (int i = threadIdx.x; i < nch; i += kRmsThreads)
    dst[i] = rms_pack8(__ldcg(h4 + 2 * i), __ldcg(h4 + 2 * i + 1), __ldg(s4 + 2 * i),
                       __ldg(s4 + 2 * i + 1), r);
}

// The same arithmetic (same order, same functions: equal bit for bit) on a row and a scale
// already staged in shared memory (hs, ss_scale: f32 [H], 16-byte aligned; the caller's barrier
// made them visible). For the fused kernels: the row is fetched by cp.async without registers.
__device__ __forceinline__ void rms_norm_staged(const float* hs, const float* scale_s, int H,
                                                float eps, uint4* dst, float* scratch) {
  const int nch = H >> 3;
  const float4* h4 = reinterpret_cast<const float4*>(hs);
  const float4* s4 = reinterpret_cast<const float4*>(scale_s);
  float ss = 0.f;
  for (int i = threadIdx.x; i < nch; i += kRmsThreads) ss = sumsq8(h4[2 * i], h4[2 * i + 1], ss);
  const float r = rsqrtf(block_sum(ss, scratch) / float(H) + eps);
  for (int i = threadIdx.x; i < nch; i += kRmsThreads)
    dst[i] = rms_pack8(h4[2 * i], h4[2 * i + 1], s4[2 * i], s4[2 * i + 1], r);
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
int resident_blocks_per_sm(Kernel kernel, int threads, size_t dynamic_smem = 0) {
  int n = 0;
  LILAC_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, dynamic_smem));
  return n > 0 ? n : 1;
}

// The configuration of a launch of `kernel`: grid, block, dynamic shared memory and stream, with
// programmatic stream serialization when `pdl` is set and launch.h's pdl_for allows it for this
// kernel and stream; with `cluster`, in thread-block clusters of that shape (the attribute is set
// even at 1 x 1 x 1: cudaOccupancyMaxActiveClusters needs it). The returned config points into
// `attr`, which must outlive its use (a launch or an occupancy query).
template <typename Kernel>
cudaLaunchConfig_t launch_config(Kernel kernel, dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, const dim3* cluster, bool pdl,
                                 cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (cluster) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = cluster->x;
    attr[cfg.numAttrs].val.clusterDim.y = cluster->y;
    attr[cfg.numAttrs].val.clusterDim.z = cluster->z;
    ++cfg.numAttrs;
  }
  if (pdl && pdl_for(reinterpret_cast<const void*>(kernel), stream)) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  return cfg;
}

// The body of launch_kernel and launch_cluster_kernel below (cluster null: no clusters).
template <typename... Params, typename... Args>
void launch_with(const dim3* cluster, bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block,
                 size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      launch_config(kernel, grid, block, smem, stream, cluster, pdl, attr);
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  LILAC_CUDA_LAUNCHED();
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization
// when `pdl` is set and pdl_for allows it for this kernel and stream (the kernel must then call
// pdl_wait() before its first dependent access: see above). Checks the launch.
template <typename... Params, typename... Args>
void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_with(nullptr, pdl, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The same in thread-block clusters of `cluster` blocks.
template <typename... Params, typename... Args>
void launch_cluster_kernel(bool pdl, dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block,
                           size_t smem, cudaStream_t stream, Args&&... args) {
  launch_with(&cluster, pdl, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace lilac::cuda
