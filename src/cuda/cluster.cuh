// Thread-block cluster primitives (PTX ISA 7.8, sm_90): ranks, distributed shared memory (a
// block's shared address as seen from another block of the cluster) and the cluster barrier.
// Included by .cu files only; every use sits under `#if __CUDA_ARCH__ >= 900` (the compute_80 PTX
// of the fat binary has no clusters).
#pragma once

#include <cstdint>

namespace lilac::cuda::cluster {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// This block's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Shared-window address `a` (of this block) mapped into the shared memory of cluster rank `rank`.
__device__ __forceinline__ uint32_t map(uint32_t a, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(rank));
  return d;
}
__device__ __forceinline__ void st_f32(uint32_t a, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
// The split barrier: arrive (relaxed: orders nothing) now, wait later.
__device__ __forceinline__ void arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float ld_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ int32_t ld_s32(uint32_t a) {
  int32_t v;
  asm volatile("ld.shared::cluster.s32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
// The split barrier's arrive (relaxed) once `dep` is computed: the asm takes it as an operand, so
// the arrive is issued after every load `dep` depends on has returned.
__device__ __forceinline__ void arrive_relaxed_after(int dep) {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::"r"(dep) : "memory");
}
// Full cluster barrier: shared-memory writes (local or remote) before it are visible after it.
__device__ __forceinline__ void sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
#endif

}  // namespace lilac::cuda::cluster
