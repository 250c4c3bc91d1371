// The shared-memory layout and wgmma forms a wgmma attention prefill would use (docs/kernels.md,
// "A plan for attention_prefill version 2"), checked on the GPU before any kernel rests on them:
// a tile of R rows x C columns (C a multiple of 64) kept as C / 64 slabs of [R][64] bf16 in the
// 128-byte swizzle (the 16-byte chunk c of row r at chunk c ^ (r % 8)), which is what
// wgmma.cuh's sw128_desc describes for a K-major operand. Two products at attention's shapes:
//  (1) S = Q K^T: SS wgmma m64n128k16 (wgmma.cuh's) over 256 columns (16 k-steps crossing
//      four slabs), Q (64 x 256) and K (128 keys x 256) both K-major in slabs;
//  (2) O = P V: RS wgmma m64n128k16 (wgmma.cuh's, TRANS_B = 1), P (64 x 64) from registers,
//      V (64 keys x 128) in the same slabs read as an MN-major B operand (the transpose bit set;
//      sw128_mn_desc: the leading byte offset steps from one 64-column slab to the next, the
//      stride byte offset from one 8-key group to the next).
// Each against double-precision sums on the host (bf16 products are exact in f32; the bound allows
// the f32 accumulation), every output written.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/common.h"
#include "cuda/gemm_tile.cuh"
#include "cuda/wgmma.cuh"
#include "cuda_test_util.h"

namespace lilac::test {
namespace {

using cuda::tile::fence_operands;
using cuda::tile::fence_proxy_async_smem;
using cuda::tile::sw128_desc;
using cuda::tile::sw128_mn_desc;
using cuda::tile::wgmma_commit;
using cuda::tile::wgmma_fence;
using cuda::tile::wgmma_m64n128k16;
using cuda::tile::wgmma_rs_m64n128k16;
using cuda::tile::wgmma_wait;

// Byte offset of element (r, c) of an R-row tile in 64-column slabs with the 128-byte swizzle.
__host__ __device__ inline uint32_t slab_offset(int R, int r, int c) {
  return uint32_t((c / 64) * R * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2);
}

// Copies a row-major bf16 tile [R][C] from global memory into slabs at s (generic stores).
__device__ void to_slabs(const uint16_t* src, int R, int C, unsigned char* s) {
  for (int i = int(threadIdx.x); i < R * C; i += int(blockDim.x))
    *reinterpret_cast<uint16_t*>(s + slab_offset(R, i / C, i % C)) = src[i];
}

// One warpgroup: s = q k^T, q [64][256], k [128][256] bf16 bits; s [64][128] f32.
// The dynamic shared memory's first 1024-byte boundary (the swizzle's atoms are 1024 bytes, so a
// slab must start on one; launches ask for 1 KiB more than they use).
__device__ unsigned char* aligned_smem() {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t a = cuda::tile::smem_u32(smem_raw);
  return smem_raw + (((a + 1023u) & ~1023u) - a);
}

__global__ void qk_kernel(const uint16_t* q, const uint16_t* k, float* s) {
  unsigned char* sq = aligned_smem();  // 32 KiB: 4 slabs of [64][64]
  unsigned char* sk = sq + 64 * 512;   // 64 KiB: 4 slabs of [128][64]
  to_slabs(q, 64, 256, sq);
  to_slabs(k, 128, 256, sk);
  fence_proxy_async_smem();
  __syncthreads();
  float d[64];
  for (float& x : d) x = 0.f;
  const uint32_t aq = cuda::tile::smem_u32(sq), ak = cuda::tile::smem_u32(sk);
  for (int ks = 0; ks < 16; ++ks) {  // k-step ks: slab ks / 4, 32 bytes per step inside it
    const uint32_t col = uint32_t((ks % 4) * 32);
    wgmma_fence();
    wgmma_m64n128k16(d, sw128_desc(aq + uint32_t((ks / 4) * 64 * 128) + col),
                     sw128_desc(ak + uint32_t((ks / 4) * 128 * 128) + col));
    wgmma_commit();
  }
  wgmma_wait<0>();
  fence_operands(d);
  // d[4 j + q]: row 16 warp + g + 8 (q >> 1), column 8 j + 2 t + (q & 1).
  const int warp = int(threadIdx.x) >> 5, g = (int(threadIdx.x) & 31) >> 2, t = threadIdx.x & 3;
  for (int j = 0; j < 16; ++j)
    for (int e = 0; e < 4; ++e)
      s[(16 * warp + g + 8 * (e >> 1)) * 128 + 8 * j + 2 * t + (e & 1)] = d[4 * j + e];
}

// One warpgroup: o = p v, p [64][64] bf16 bits (A from registers), v [64 keys][128] bf16 bits
// (B from slabs, MN-major); o [64][128] f32.
__global__ void pv_kernel(const uint16_t* p, const uint16_t* v, float* o) {
  unsigned char* smem = aligned_smem();
  to_slabs(v, 64, 128, smem);  // 16 KiB: 2 slabs of [64 keys][64]
  fence_proxy_async_smem();
  __syncthreads();
  const int warp = int(threadIdx.x) >> 5, g = (int(threadIdx.x) & 31) >> 2, t = threadIdx.x & 3;
  auto pair = [&](int r, int c) {  // P[r][c], P[r][c + 1] as a bf16x2 (the lower column low)
    return uint32_t(p[r * 64 + c]) | (uint32_t(p[r * 64 + c + 1]) << 16);
  };
  float d[64];
  for (float& x : d) x = 0.f;
  const uint32_t av = cuda::tile::smem_u32(smem);
  for (int ks = 0; ks < 4; ++ks) {
    const int r = 16 * warp + g, c = 16 * ks + 2 * t;
    const uint32_t a[4] = {pair(r, c), pair(r + 8, c), pair(r, c + 8), pair(r + 8, c + 8)};
    wgmma_fence();
    wgmma_rs_m64n128k16<64, 1>(d, a, sw128_mn_desc(av + uint32_t(ks * 16 * 128), 64 * 128, 1024));
    wgmma_commit();
    wgmma_wait<0>();
  }
  fence_operands(d);
  for (int j = 0; j < 16; ++j)
    for (int e = 0; e < 4; ++e)
      o[(16 * warp + g + 8 * (e >> 1)) * 128 + 8 * j + 2 * t + (e & 1)] = d[4 * j + e];
}

bool wgmma_device() {
  int major = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  return major == 9;
}

// got [M][N] against sum_k a[m][k] b(k, n) in double; bound 1e-4 of sum_k |a b| (f32 sums of
// K <= 256 exact products stay within K 2^-24 = 1.5e-5 of it; a wrong layout is off by O(1)).
template <class B>
void expect_product(const std::vector<float>& got, const std::vector<uint16_t>& a, int M, int K,
                    int N, B b, const char* what) {
  int bad = 0;
  double worst = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double x = double(bf16_to_f32(a[size_t(m) * K + k])) * b(k, n);
        ref += x;
        mag += std::fabs(x);
      }
      const double err = std::fabs(double(got[size_t(m) * N + n]) - ref);
      worst = std::max(worst, err / (mag + 1e-30));
      if (!(err <= 1e-4 * mag + 1e-30)) ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": outputs off (worst relative to sum |a b|: " << worst << ")";
}

std::vector<uint16_t> random_bits(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  const std::vector<float> f = random_floats(n, 1.f, seed);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

TEST(WgmmaLayout, QKTransposeOverSwizzledSlabs) {
  LILAC_REQUIRE_GPU();
  if (!wgmma_device()) GTEST_SKIP() << "wgmma needs a compute capability 9.x GPU";
  const auto q = random_bits(64 * 256, 1), k = random_bits(128 * 256, 2);
  cuda::DeviceBuffer<uint16_t> dq(q.size()), dk(k.size());
  LILAC_CUDA_CHECK(cudaMemcpy(dq.get(), q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemcpy(dk.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  cuda::DeviceBuffer<float> ds(64 * 128);
  poison(ds);
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(qk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 97 * 1024));
  qk_kernel<<<1, 128, 97 * 1024>>>(dq.get(), dk.get(), ds.get());
  LILAC_CUDA_CHECK(cudaGetLastError());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  expect_product(
      download(ds), q, 64, 256, 128,
      [&](int kk, int n) { return double(bf16_to_f32(k[size_t(n) * 256 + kk])); }, "S = Q K^T");
}

TEST(WgmmaLayout, PVWithTheTransposedOperandOverSwizzledSlabs) {
  LILAC_REQUIRE_GPU();
  if (!wgmma_device()) GTEST_SKIP() << "wgmma needs a compute capability 9.x GPU";
  const auto p = random_bits(64 * 64, 3), v = random_bits(64 * 128, 4);
  cuda::DeviceBuffer<uint16_t> dp(p.size()), dv(v.size());
  LILAC_CUDA_CHECK(cudaMemcpy(dp.get(), p.data(), p.size() * 2, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemcpy(dv.get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  cuda::DeviceBuffer<float> dout(64 * 128);
  poison(dout);
  pv_kernel<<<1, 128, 17 * 1024>>>(dp.get(), dv.get(), dout.get());
  LILAC_CUDA_CHECK(cudaGetLastError());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  expect_product(
      download(dout), p, 64, 64, 128,
      [&](int kk, int n) { return double(bf16_to_f32(v[size_t(kk) * 128 + n])); }, "O = P V");
}

}  // namespace
}  // namespace lilac::test
