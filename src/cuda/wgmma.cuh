// Hopper's warpgroup MMA (wgmma, sm_90a) as device functions, shared by every wgmma kernel: the
// dense prefill GEMM (gemm.cu through gemm_tile.cuh), the 4-bit GEMMs and grouped expert GEMMs
// (q4_gemm_wgmma.cuh and its users), attention prefill versions 2 and 3
// (attention_prefill_wgmma.cu). Device code only.
//
// What is here: the compile guard (LILAC_SM90A), shared-memory descriptors of the 128-byte
// swizzle (K-major and MN-major operands), the fences and group commit / wait, and the
// instruction forms m64nNk16 (bf16 in, f32 accumulate): both operands from shared memory (SS: n =
// 256, 128, 64) and A from registers (RS: n = 256 .. 16). Accumulator layout of every form:
// d[4 j + q] of thread (warp, lane) of a warpgroup is row 16 (warp % 4) + (lane >> 2) + 8 (q >> 1),
// column 8 j + 2 (lane & 3) + (q & 1). Each form is one asm statement whose operand list names
// every accumulator register (PTX has no array operands).
#pragma once

#include <cstdint>

namespace lilac::cuda::tile {

// Compiled only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); in the compute_80 PTX the kernels
// that use these are empty and the host never launches them there (it checks the device's compute
// capability). gemm_tile.cuh's shared-memory layout is what these descriptors describe: with each
// operand stage 1024-byte aligned, its XOR swizzle (chunk ^ (row & 7)) is exactly the 128-byte
// swizzle pattern (the address bits [4, 7) XOR bits [7, 10)).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LILAC_SM90A 1
#endif

// Shared-memory matrix descriptor of a K-major operand in the 128-byte-swizzled layout: start
// address (bits 0-13, >> 4), leading byte offset (bits 16-29; unused for swizzled K-major, 1),
// stride byte offset = 1024 bytes between 8-row groups (bits 32-45, >> 4), swizzle mode 1 =
// 128 bytes (bits 62-63); base offset 0 (every stage is 1024-byte aligned). Advancing k by 16
// elements inside the 64-element row adds 32 bytes (2 in the encoded address).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  uint64_t d = uint64_t((smem_addr & 0x3FFFFu) >> 4);
  d |= uint64_t(1) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

// The same swizzle read as an MN-major operand (a B operand with wgmma's transpose bit: rows of
// 64 N-contiguous elements, one per k): leading byte offset = the step from one 64-column slab
// to the next along N, stride byte offset = the step from one group of 8 k rows to the next
// (both multiples of 16). Checked on the GPU by tests/cuda/wgmma_layout_test.cu (s32).
__device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t smem_addr, uint32_t lead_bytes,
                                                  uint32_t stride_bytes) {
  uint64_t d = uint64_t((smem_addr & 0x3FFFFu) >> 4);
  d |= uint64_t((lead_bytes >> 4) & 0x3FFFu) << 16;
  d |= uint64_t((stride_bytes >> 4) & 0x3FFFu) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(LILAC_SM90A)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(LILAC_SM90A)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(LILAC_SM90A)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes (cp.async, st.shared) -> visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(LILAC_SM90A)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Pins the accumulators at this point of the program: wgmma writes them asynchronously, so reads
// for the epilogue must not be hoisted above the wait (volatile asm statements keep their order).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- the instruction forms ------------------------------------------------------------------
// Each form is one asm statement naming every accumulator register: LILAC_WGMMA_REGSn is the text
// "%0, %1, .., %n-1" of the first n operands, LILAC_WGMMA_ACCn(d) their "+f" constraints on d[0,
// n). The inputs follow them (their operand numbers are written out in each form); the scale-d
// predicate is set from an "r"(1) input (accumulate); the two immediates after it are the A and B
// scales (1: not negated), then for the SS forms the A and B transpose bits, for the RS forms B's.
#define LILAC_WGMMA_REGS_0_7 "%0, %1, %2, %3, %4, %5, %6, %7"
#define LILAC_WGMMA_REGS_8_15 "%8, %9, %10, %11, %12, %13, %14, %15"
#define LILAC_WGMMA_REGS_16_23 "%16, %17, %18, %19, %20, %21, %22, %23"
#define LILAC_WGMMA_REGS_24_31 "%24, %25, %26, %27, %28, %29, %30, %31"
#define LILAC_WGMMA_REGS_32_39 "%32, %33, %34, %35, %36, %37, %38, %39"
#define LILAC_WGMMA_REGS_40_47 "%40, %41, %42, %43, %44, %45, %46, %47"
#define LILAC_WGMMA_REGS_48_55 "%48, %49, %50, %51, %52, %53, %54, %55"
#define LILAC_WGMMA_REGS_56_63 "%56, %57, %58, %59, %60, %61, %62, %63"
#define LILAC_WGMMA_REGS_64_71 "%64, %65, %66, %67, %68, %69, %70, %71"
#define LILAC_WGMMA_REGS_72_79 "%72, %73, %74, %75, %76, %77, %78, %79"
#define LILAC_WGMMA_REGS_80_87 "%80, %81, %82, %83, %84, %85, %86, %87"
#define LILAC_WGMMA_REGS_88_95 "%88, %89, %90, %91, %92, %93, %94, %95"
#define LILAC_WGMMA_REGS_96_103 "%96, %97, %98, %99, %100, %101, %102, %103"
#define LILAC_WGMMA_REGS_104_111 "%104, %105, %106, %107, %108, %109, %110, %111"
#define LILAC_WGMMA_REGS_112_119 "%112, %113, %114, %115, %116, %117, %118, %119"
#define LILAC_WGMMA_REGS_120_127 "%120, %121, %122, %123, %124, %125, %126, %127"
#define LILAC_WGMMA_REGS8 LILAC_WGMMA_REGS_0_7
#define LILAC_WGMMA_REGS16 LILAC_WGMMA_REGS8 ", " LILAC_WGMMA_REGS_8_15
#define LILAC_WGMMA_REGS32 \
  LILAC_WGMMA_REGS16 ", " LILAC_WGMMA_REGS_16_23 ", " LILAC_WGMMA_REGS_24_31
#define LILAC_WGMMA_REGS64                                                   \
  LILAC_WGMMA_REGS32 ", " LILAC_WGMMA_REGS_32_39 ", " LILAC_WGMMA_REGS_40_47 \
                     ", " LILAC_WGMMA_REGS_48_55 ", " LILAC_WGMMA_REGS_56_63
#define LILAC_WGMMA_REGS128                                                     \
  LILAC_WGMMA_REGS64 ", " LILAC_WGMMA_REGS_64_71 ", " LILAC_WGMMA_REGS_72_79    \
                     ", " LILAC_WGMMA_REGS_80_87 ", " LILAC_WGMMA_REGS_88_95    \
                     ", " LILAC_WGMMA_REGS_96_103 ", " LILAC_WGMMA_REGS_104_111 \
                     ", " LILAC_WGMMA_REGS_112_119 ", " LILAC_WGMMA_REGS_120_127
#define LILAC_WGMMA_ACC8_AT(d, i)                                                             \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define LILAC_WGMMA_ACC16_AT(d, i) LILAC_WGMMA_ACC8_AT(d, i), LILAC_WGMMA_ACC8_AT(d, i + 8)
#define LILAC_WGMMA_ACC32_AT(d, i) LILAC_WGMMA_ACC16_AT(d, i), LILAC_WGMMA_ACC16_AT(d, i + 16)
#define LILAC_WGMMA_ACC8(d) LILAC_WGMMA_ACC8_AT(d, 0)
#define LILAC_WGMMA_ACC16(d) LILAC_WGMMA_ACC16_AT(d, 0)
#define LILAC_WGMMA_ACC32(d) LILAC_WGMMA_ACC32_AT(d, 0)
#define LILAC_WGMMA_ACC64(d) LILAC_WGMMA_ACC32_AT(d, 0), LILAC_WGMMA_ACC32_AT(d, 32)
#define LILAC_WGMMA_ACC128(d)                                                           \
  LILAC_WGMMA_ACC32_AT(d, 0), LILAC_WGMMA_ACC32_AT(d, 32), LILAC_WGMMA_ACC32_AT(d, 64), \
      LILAC_WGMMA_ACC32_AT(d, 96)

// D (64 x N, f32) += A (64 x 16, smem desc) . B (N x 16, smem desc)^T; both operands K-major.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a,
                                                 uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS128
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : LILAC_WGMMA_ACC128(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
#endif
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS64
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : LILAC_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
#endif
}

// The n = 64 form (attention's S = Q K^T over 64-key tiles): d[4 j + q] as above, j < 8.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS32
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : LILAC_WGMMA_ACC32(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
#endif
}

template <int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (BN == 256)
    wgmma_m64n256k16(d, desc_a, desc_b);
  else
    wgmma_m64n128k16(d, desc_a, desc_b);
}

// D (64 x N, f32) += A (64 x 16, registers: this warp's m16n8k16 A fragment of rows 16 (warp % 4)
// .. + 15) . B (N x 16, smem descriptor, K-major)^T. TRANS_B = 1: B is MN-major instead (see the
// n = 128 form below).
template <int TRANS_B = 0>
__device__ __forceinline__ void wgmma_rs_m64n256k16(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t desc_b) {
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
      : LILAC_WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TRANS_B));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

// The n = 128 / 64 / 32 / 16 forms write d[0, n / 2) of an accumulator array of NA >= n / 2 (the
// d[4 j + q] layout does not depend on n: a narrower wgmma computes the first n tokens of the same
// tile, the other accumulators are left as they are). TRANS_B = 1: B is MN-major (wgmma's
// transpose bit; sw128_mn_desc above), as attention's P V reads V (s32's layout test).
template <int NA, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[NA], const uint32_t (&a)[4],
                                                    uint64_t desc_b) {
  static_assert(NA >= 64, "64 accumulators");
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : LILAC_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TRANS_B));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

template <int NA>
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[NA], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  static_assert(NA >= 32, "32 accumulators");
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS32
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : LILAC_WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

template <int NA>
__device__ __forceinline__ void wgmma_rs_m64n32k16(float (&d)[NA], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  static_assert(NA >= 16, "16 accumulators");
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS16
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : LILAC_WGMMA_ACC16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

template <int NA>
__device__ __forceinline__ void wgmma_rs_m64n16k16(float (&d)[NA], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  static_assert(NA >= 8, "8 accumulators");
#if defined(LILAC_SM90A)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {" LILAC_WGMMA_REGS8
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : LILAC_WGMMA_ACC8(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc_b;
#endif
}

// wgmma m64nNk16 (N = 256, 128, 64, 32 or 16) into the first N / 2 of NA accumulators.
template <int N, int NA>
__device__ __forceinline__ void wgmma_rs(float (&d)[NA], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(2 * NA >= N, "N / 2 accumulators");
  if constexpr (N == 256)
    wgmma_rs_m64n256k16(d, a, desc_b);
  else if constexpr (N == 128)
    wgmma_rs_m64n128k16(d, a, desc_b);
  else if constexpr (N == 64)
    wgmma_rs_m64n64k16(d, a, desc_b);
  else if constexpr (N == 32)
    wgmma_rs_m64n32k16(d, a, desc_b);
  else
    wgmma_rs_m64n16k16(d, a, desc_b);
}

}  // namespace lilac::cuda::tile

#undef LILAC_WGMMA_REGS_0_7
#undef LILAC_WGMMA_REGS_8_15
#undef LILAC_WGMMA_REGS_16_23
#undef LILAC_WGMMA_REGS_24_31
#undef LILAC_WGMMA_REGS_32_39
#undef LILAC_WGMMA_REGS_40_47
#undef LILAC_WGMMA_REGS_48_55
#undef LILAC_WGMMA_REGS_56_63
#undef LILAC_WGMMA_REGS_64_71
#undef LILAC_WGMMA_REGS_72_79
#undef LILAC_WGMMA_REGS_80_87
#undef LILAC_WGMMA_REGS_88_95
#undef LILAC_WGMMA_REGS_96_103
#undef LILAC_WGMMA_REGS_104_111
#undef LILAC_WGMMA_REGS_112_119
#undef LILAC_WGMMA_REGS_120_127
#undef LILAC_WGMMA_REGS8
#undef LILAC_WGMMA_REGS16
#undef LILAC_WGMMA_REGS32
#undef LILAC_WGMMA_REGS64
#undef LILAC_WGMMA_REGS128
#undef LILAC_WGMMA_ACC8_AT
#undef LILAC_WGMMA_ACC16_AT
#undef LILAC_WGMMA_ACC32_AT
#undef LILAC_WGMMA_ACC8
#undef LILAC_WGMMA_ACC16
#undef LILAC_WGMMA_ACC32
#undef LILAC_WGMMA_ACC64
#undef LILAC_WGMMA_ACC128
