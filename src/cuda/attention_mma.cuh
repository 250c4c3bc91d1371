// Tensor-core and async-copy primitives for the attention kernels (family-private; device code
// only, included by attention_*.cu). mma.sync / ldmatrix / cp.async run on sm_80 and sm_90.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace lilac::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes = 0 writes 16 zero bytes and reads
// nothing (used for rows past the end of a range).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, register m receives
// matrix m (thread l: row l/4, columns 2(l%4), 2(l%4)+1; with .trans the transpose).
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                        uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                              uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A B + D, m16n8k16, bf16 inputs, f32 accumulators. Lane = 4 g + t:
//   a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   d0, d1 = D[g][2t], D[g][2t+1];  d2, d3 = D[g+8][2t], D[g+8][2t+1]
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with rows 8..15 of A zero and their results discarded: only D rows 0..7 (d0, d1) are
// kept, so a product with at most 8 useful rows holds no dead accumulators.
__device__ __forceinline__ void mma_16816_top(float& d0, float& d1, uint32_t a0, uint32_t a2,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "{\n.reg .f32 j0, j1;\n.reg .b32 z;\nmov.b32 z, 0;\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,j0,j1}, {%2,z,%3,z}, {%4,%5}, "
      "{%0,%1,z,z};\n}\n"
      : "+f"(d0), "+f"(d1)
      : "r"(a0), "r"(a2), "r"(b0), "r"(b1));
}

// Two floats to a bf16 pair (lo in the low half: the lower k / column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of rows of `row_chunks` chunks,
// XOR-swizzled so that the 8 rows an ldmatrix reads at one logical chunk hit 8 distinct bank
// groups (row_chunks >= 8).
__device__ __forceinline__ uint32_t swz(int row, int chunk, int row_chunks) {
  return uint32_t((row * row_chunks + (chunk ^ (row & 7))) * 16);
}

}  // namespace lilac::cuda::attn
