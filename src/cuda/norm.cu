// RMS norm (f32 residual -> bf16 normed activations) and the embedding lookup.
//
// rms_norm, at the real shape (T = 1, H = 2048): reads 8 KB of h and 8 KB of scale, writes 4 KB:
// 20 KB, 5 ns at 4.3 TB/s; 3 FLOP per element. The kernel is pure latency (launch, two dependent
// global round trips, one block reduction): v1 measured 2.0 us in a graph. Decode no longer
// launches it: the GEMVs that consume the norm compute it in their prologue (gemv_rms, moe_router)
// with the same device function, so the results are identical; prefill (T = 8192: 164 MB, ~40 us)
// and the tests still use it.
// Design: one block of 256 threads per row t. Vector path (H % 8 == 0, 16-byte aligned rows):
// vec_util.cuh rms_norm_row, the shared order: thread i sums the squares of chunks (8 floats) i,
// i + 256, ... with fmaf, block_sum gives the total; then bf16((h * r) * scale) per element with
// r = rsqrt(total / H + eps), stored 16 bytes per chunk. Scalar path otherwise (any H).
//
// embed, at the real shape (T = 1, H = 2048): 4 KB read, 8 KB written: latency only (v1: 1.57 us).
// Design: one block of 256 threads per token; 16-byte loads of 8 bf16 -> two float4 stores when
// H % 8 == 0 and aligned, scalar otherwise. Widening bf16 -> f32 is exact. It starts the decode
// graph (no kernel before it to overlap with), so it is launched without PDL.
#include "cuda/norm.h"

#include <cstdint>

#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kNormThreads = 256;

bool aligned(const void* p, uintptr_t a) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

static_assert(kNormThreads == kRmsThreads, "rms_norm must sum in rms_norm_row's order");

template <bool kVec>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* __restrict__ h, const float* __restrict__ scale,
                    bf16* __restrict__ out, int H, float eps) {
  __shared__ float scratch[32];
  const float* row = h + size_t(blockIdx.x) * H;
  bf16* orow = out + size_t(blockIdx.x) * H;
  pdl_launch_dependents();
  if (kVec) {
    pdl_wait();
    rms_norm_row(row, scale, H, eps, reinterpret_cast<uint4*>(orow), scratch);
  } else {
    pdl_wait();
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
      const float v = __ldcg(row + i);
      ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss, scratch) / float(H) + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
      orow[i] = __float2bfloat16_rn(__ldcg(row + i) * r * scale[i]);
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kNormThreads)
    embed_kernel(const int32_t* __restrict__ ids, const bf16* __restrict__ table,
                 float* __restrict__ h, int H) {
  pdl_launch_dependents();
  pdl_wait();
  const int32_t id = __ldcg(ids + blockIdx.x);
  const bf16* src = table + size_t(id) * H;
  float* dst = h + size_t(blockIdx.x) * H;
  if (kVec) {
    const uint4* s8 = reinterpret_cast<const uint4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x) {
      uint4 w = s8[i];
      d4[2 * i] = make_float4(bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y));
      d4[2 * i + 1] = make_float4(bf16_lo(w.z), bf16_hi(w.z), bf16_lo(w.w), bf16_hi(w.w));
    }
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
  }
}

}  // namespace

void rms_norm(const float* h, const float* scale, bf16* out, int T, int H, float eps,
              cudaStream_t stream) {
  if (T < 1 || H < 1) fail("cuda::rms_norm: bad shape T={} H={}", T, H);
  const bool vec = H % 8 == 0 && aligned(h, 16) && aligned(scale, 16) && aligned(out, 16);
  launch_kernel(true, vec ? rms_norm_kernel<true> : rms_norm_kernel<false>, dim3(T),
                dim3(kNormThreads), 0, stream, h, scale, out, H, eps);
}

void embed(const int32_t* ids, const bf16* table, float* h, int T, int H, cudaStream_t stream) {
  if (T < 1 || H < 1) fail("cuda::embed: bad shape T={} H={}", T, H);
  const bool vec = H % 8 == 0 && aligned(table, 16) && aligned(h, 16);
  if (vec)
    embed_kernel<true><<<T, kNormThreads, 0, stream>>>(ids, table, h, H);
  else
    embed_kernel<false><<<T, kNormThreads, 0, stream>>>(ids, table, h, H);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
