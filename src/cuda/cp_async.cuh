// cp.async (sm_80+): 16-byte global -> shared copies that bypass L1 and registers, completed in
// per-thread groups. Device code only; included by .cu files. (The GEMM tile engine and the
// attention kernels keep their own zero-filling forms: gemm_tile.cuh, attention_mma.cuh.)
#pragma once

#include <cstdint>

namespace lilac::cuda::async {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void copy16(void* dst_smem, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst_smem)), "l"(src)
               : "memory");
}
// Closes the thread's current group of copies (an empty group is allowed and completes at once).
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace lilac::cuda::async
