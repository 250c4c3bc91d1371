// Hopper's bulk copy engine and shared-memory barriers (sm_90): a producer thread asks the copy
// engine to move contiguous global bytes into shared memory (`cp.async.bulk`), and the bytes'
// arrival completes a phase of an mbarrier that the consumers wait on. The bytes in flight are then
// bounded by shared memory, not by the registers a load has to land in (the limit of the
// register-streaming small-M kernels, docs/kernels.md "Eighth session").
//
// Protocol of a ring slot (one `full` and one `empty` barrier per slot):
//   producer: wait empty (parity of the previous round) -> expect_tx(full, bytes) -> copies;
//   consumers: wait full (parity of this round) -> read the slot -> arrive empty.
// A barrier's phase parity starts at 0; round r of a slot waits for parity r & 1.
// sm_90 only: on older targets (the compute_80 PTX) every function traps, and the kernels that use
// them are never launched there (their launchers check the compute capability).
#pragma once

#include <cstdint>

namespace lilac::cuda::bulk {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initialises a barrier that completes a phase after `arrivals` arrivals (and, for barriers armed
// with expect_tx, the expected bytes). Make it visible with fence_init() and a block barrier.
__device__ __forceinline__ void init(uint64_t* bar, unsigned arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// One arrival that also expects `bytes` of copies to complete on this phase.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

// Spins until the phase with parity `parity` has completed.
__device__ __forceinline__ void wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

// An L2 policy for data read once (streamed weights): evict first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#else
  __trap();
#endif
  return policy;
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared
// `dst`; their arrival counts against `bar`'s expected bytes.
__device__ __forceinline__ void copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();
#endif
}

// The same with an L2 cache policy (evict_first_policy()).
__device__ __forceinline__ void copy(void* dst, const void* src, unsigned bytes, uint64_t* bar,
                                     uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
#else
  __trap();
#endif
}

// Copies the box at coordinates {c0, c1, c2} (elements) of the tensor `tensor_map` describes
// (a __grid_constant__ CUtensorMap kernel parameter's address; tensor_map.h) to shared memory at
// byte address `dst` (1024-byte aligned for the 128-byte swizzle); the box's bytes, zeros outside
// the tensor included, count against the barrier at shared address `bar`.
__device__ __forceinline__ void copy_tensor_3d(uint32_t dst, const void* tensor_map, int c0, int c1,
                                               int c2, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}

// Warp specialisation's register split (setmaxnreg; every warp of a warpgroup executes the same
// one): a producer warpgroup gives registers back, the consumers take them. N: a multiple of 8 in
// 24..256.
template <int N>
__device__ __forceinline__ void release_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#else
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void claim_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#else
  __trap();
#endif
}

}  // namespace lilac::cuda::bulk
