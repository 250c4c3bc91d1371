// What the Gated DeltaNet prefill's two state-pass forms share: the chunk length, the columns a
// state block carries, the 3xTF32 tensor-core helpers, and the overlapped form's launcher
// (gated_deltanet_prefill_overlap.cu; the one-pass form and the other three launches live in
// gated_deltanet_prefill.cu, whose header comment gives the chunked maths).
//
// mma.sync m16n8k8 tf32 (f32 accumulation). Every product runs as 3xTF32: x = hi + lo with
// hi = tf32(x), lo = tf32(x - hi), and A B ~ A_lo B_hi + A_hi B_lo + A_hi B_hi (the dropped
// lo*lo term is ~2^-22 relative): f32-level accuracy, which the state needs (it is carried through
// the whole sequence; the tests hold it to 1e-4 of its scale against the token recurrence).
// Fragments (lane = 4 g + t):  A (16x8): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4],
// a3 = A[g+8][t+4];  B (8x8): b0 = B[t][g], b1 = B[t+4][g];  C (16x8): c0 = C[g][2t],
// c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1].
// The reduction index of a product may be permuted freely if A and B agree. Taking logical k = t
// to be physical 2t and k = t + 4 to be 2t + 1 (within each group of 8), an accumulator tile
// (c0, c2, c1, c3) IS an A operand tile over its column index (a_from_acc): S^T and U^T stay in
// registers as accumulators and feed the next products with no shared-memory round trip (B then
// reads physical rows/columns 2t and 2t + 1: one float2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda::gdn_chunked {

constexpr int kBT = 64;     // chunk length
constexpr int kColsB = 32;  // value columns per state block

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = tf32_bits(x);
  lo = tf32_bits(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A operand (hi, lo) from an accumulator tile c[4] under the permutation above.
__device__ __forceinline__ void a_from_acc(const float (&c)[4], uint32_t (&hi)[4],
                                           uint32_t (&lo)[4]) {
  split_tf32(c[0], hi[0], lo[0]);
  split_tf32(c[2], hi[1], lo[1]);
  split_tf32(c[1], hi[2], lo[2]);
  split_tf32(c[3], hi[3], lo[3]);
}
// A operand (hi, lo) in the plain layout from a row-major [m][k] array at `a` (this lane's
// element (g, t) already applied), row stride `stride` floats.
__device__ __forceinline__ void a_from_smem(const float* a, int stride, uint32_t (&hi)[4],
                                            uint32_t (&lo)[4]) {
  split_tf32(a[0], hi[0], lo[0]);
  split_tf32(a[8 * stride], hi[1], lo[1]);
  split_tf32(a[4], hi[2], lo[2]);
  split_tf32(a[8 * stride + 4], hi[3], lo[3]);
}
// d += A B in 3xTF32, B given as its two f32 values.
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4],
                                     const uint32_t (&al)[4], float b0, float b1) {
  uint32_t bh0, bl0, bh1, bl1;
  split_tf32(b0, bh0, bl0);
  split_tf32(b1, bh1, bl1);
  mma_tf32(d, al, bh0, bh1);
  mma_tf32(d, ah, bl0, bl1);
  mma_tf32(d, ah, bh0, bh1);
}

// The overlapped state pass (gated_deltanet_prefill_overlap.cu): the same contract as the
// one-pass gdn_state_kernel. Reads q, k [T, Hk, Dk], W [T, Hv, Dk], P [Hv, chunks, 64, 64],
// G [Hv, 64 * chunks] and U~ in vb [T, Hv, Dv]; writes O over vb and the state after token T-1.
// Dk in {32, 64, 128}, Dv a multiple of kColsB (the caller checks).
// With `norm`, it writes gdn_out's gated RMS norm of O instead (bf16 into norm->out [T, Hv Dv],
// from z = proj[t, C + v Dv + j] and norm_w), and leaves vb as it was (U~): the caller's gdn_out
// then only shifts the conv state. overlapped_norm_supported says where that form runs (compute
// capability 9.0, at most 8 column blocks per value head, 16-byte aligned z rows); the launcher
// throws lilac::Error elsewhere.
struct OverlapNorm {
  const float* proj;  // [T, C + Hv Dv + 2 Hv] the in_proj rows
  int C;              // z's first column
  const float* norm_w;
  float eps;
  bf16* out;
};
bool overlapped_norm_supported(int Hv, int Dv, int C);
void launch_state_overlapped(const float* qn, const float* kn, const float* W, const float* P,
                             const float* Gc, float* vb, float* state, int T, int Hk, int Hv,
                             int Dk, int Dv, const OverlapNorm* norm, cudaStream_t stream);
void launch_state_overlapped(const float* qn, const float* kn, const float* W, const float* P,
                             const float* Gc, float* vb, bf16* state, int T, int Hk, int Hv, int Dk,
                             int Dv, const OverlapNorm* norm, cudaStream_t stream);

}  // namespace lilac::cuda::gdn_chunked
