// The GDN prefill's 3xTF32 split (cuda/gated_deltanet_prefill.cuh) on the GPU: since s29 it rounds
// to tf32 with two integer operations instead of cvt.rna.tf32.f32 and passes lo to the mma with its
// 13 low bits left in. Both rest on facts about the hardware, checked here: (1) for every finite
// f32 (all 2^32 bit patterns are tried) tf32_bits(x) is cvt.rna's result and lo's tf32 bits are
// cvt.rna(x - hi)'s; (2) mma.sync .tf32 reads only the tf32 bits of its operands: the same
// product with the low bits of A and B set at random and cleared gives the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/common.h"
#include "cuda/gated_deltanet_prefill.cuh"
#include "cuda_test_util.h"

namespace lilac::test {
namespace {

namespace gc = cuda::gdn_chunked;

__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// out[0]: finite patterns whose hi differs from cvt.rna; out[1]: whose lo's tf32 bits differ;
// out[2] / out[3]: the first such pattern of each (0xffffffff: none); out[4]: finite patterns seen.
__global__ void split_sweep_kernel(unsigned long long* out) {
  unsigned long long bad_hi = 0, bad_lo = 0, seen = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t u = uint32_t(i);
    const float x = __uint_as_float(u);
    if (!isfinite(x)) continue;
    ++seen;
    uint32_t hi, lo;
    gc::split_tf32(x, hi, lo);
    const uint32_t want_hi = cvt_rna_tf32(x) & 0xffffe000u;
    const uint32_t want_lo = cvt_rna_tf32(x - __uint_as_float(want_hi)) & 0xffffe000u;
    if (hi != want_hi) {
      ++bad_hi;
      atomicMin(&out[2], static_cast<unsigned long long>(u));
    }
    if ((lo & 0xffffe000u) != want_lo) {
      ++bad_lo;
      atomicMin(&out[3], static_cast<unsigned long long>(u));
    }
  }
  atomicAdd(&out[0], bad_hi);
  atomicAdd(&out[1], bad_lo);
  atomicAdd(&out[4], seen);
}

// One warp, `trials` products of A (16x8) and B (8x8) fragments: d_raw with the operands as
// given, d_masked with their 13 low bits cleared (a[trial][lane][4], b[trial][lane][2]).
__global__ void mma_low_bits_kernel(const uint32_t* a, const uint32_t* b, int trials, float* d_raw,
                                    float* d_masked) {
  const int lane = threadIdx.x;
  for (int t = 0; t < trials; ++t) {
    uint32_t ar[4], am[4];
    for (int i = 0; i < 4; ++i) {
      ar[i] = a[(size_t(t) * 32 + lane) * 4 + i];
      am[i] = ar[i] & 0xffffe000u;
    }
    const uint32_t b0 = b[(size_t(t) * 32 + lane) * 2], b1 = b[(size_t(t) * 32 + lane) * 2 + 1];
    float dr[4] = {0.f, 0.f, 0.f, 0.f}, dm[4] = {0.f, 0.f, 0.f, 0.f};
    gc::mma_tf32(dr, ar, b0, b1);
    gc::mma_tf32(dm, am, b0 & 0xffffe000u, b1 & 0xffffe000u);
    for (int i = 0; i < 4; ++i) {
      d_raw[(size_t(t) * 32 + lane) * 4 + i] = dr[i];
      d_masked[(size_t(t) * 32 + lane) * 4 + i] = dm[i];
    }
  }
}

TEST(Tf32Split, MatchesCvtRnaForEveryFiniteFloat) {
  LILAC_REQUIRE_GPU();
  cuda::DeviceBuffer<unsigned long long> out(5);
  const unsigned long long init[5] = {0, 0, ~0ull, ~0ull, 0};
  LILAC_CUDA_CHECK(cudaMemcpy(out.get(), init, sizeof(init), cudaMemcpyHostToDevice));
  split_sweep_kernel<<<1024, 256>>>(out.get());
  LILAC_CUDA_LAUNCHED();
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long got[5];
  LILAC_CUDA_CHECK(cudaMemcpy(got, out.get(), sizeof(got), cudaMemcpyDeviceToHost));
  // 2^32 patterns less the 2^24 with an all-ones exponent (infinities and NaNs).
  EXPECT_EQ(got[4], (1ull << 32) - (1ull << 24));
  EXPECT_EQ(got[0], 0u) << "hi differs from cvt.rna.tf32.f32, first at bit pattern 0x" << std::hex
                        << got[2];
  EXPECT_EQ(got[1], 0u) << "lo's tf32 bits differ from cvt.rna.tf32.f32(x - hi), first at 0x"
                        << std::hex << got[3];
}

TEST(Tf32Split, MmaReadsOnlyTheTf32BitsOfItsOperands) {
  LILAC_REQUIRE_GPU();
  constexpr int kTrials = 64;
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<uint32_t> low(0, 0x1fffu);
  auto pattern = [&](int t) {
    // Mixed magnitudes (a trial's scale 2^-20 .. 2^20), random low 13 bits.
    const float v = std::ldexp(nd(rng), (t % 41) - 20);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return (u & 0xffffe000u) | low(rng);
  };
  std::vector<uint32_t> a(size_t(kTrials) * 32 * 4), b(size_t(kTrials) * 32 * 2);
  for (int t = 0; t < kTrials; ++t) {
    for (int i = 0; i < 32 * 4; ++i) a[size_t(t) * 32 * 4 + i] = pattern(t);
    for (int i = 0; i < 32 * 2; ++i) b[size_t(t) * 32 * 2 + i] = pattern(t + 7);
  }
  cuda::DeviceBuffer<uint32_t> da(a.size()), db(b.size());
  cuda::DeviceBuffer<float> raw(size_t(kTrials) * 32 * 4), masked(size_t(kTrials) * 32 * 4);
  LILAC_CUDA_CHECK(cudaMemcpy(da.get(), a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemcpy(db.get(), b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  mma_low_bits_kernel<<<1, 32>>>(da.get(), db.get(), kTrials, raw.get(), masked.get());
  LILAC_CUDA_LAUNCHED();
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> r(raw.size()), m(masked.size());
  LILAC_CUDA_CHECK(cudaMemcpy(r.data(), raw.get(), r.size() * 4, cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(cudaMemcpy(m.data(), masked.get(), m.size() * 4, cudaMemcpyDeviceToHost));
  size_t differ = 0, first = r.size();
  for (size_t i = 0; i < r.size(); ++i)
    if (std::memcmp(&r[i], &m[i], 4) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << "the mma's result depends on its operands' low 13 bits (first at "
                        << first << ": " << r[first] << " against " << m[first] << ")";
  // The test can fail: the products are not all zero.
  size_t nonzero = 0;
  for (const float v : m) nonzero += v != 0.f;
  EXPECT_GT(nonzero, m.size() / 2);
}

}  // namespace
}  // namespace lilac::test
