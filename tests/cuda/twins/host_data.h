// The host side of a GPU check, without GoogleTest (tests/cuda/twins: shared by the conformance
// registry, tests/cuda/conformance, and the kernel lab, bench/lab): reproducible random inputs,
// host <-> device copies, bf16 rounding, poisoned outputs, and the thread pool the CPU twins run
// on. The comparisons with EXPECT_* stay in cuda_test_util.h and kernel_check.h, which include
// this.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::test {

// The f32 unit roundoff (2^-24).
constexpr double kU = 5.9604644775390625e-8;

// A per-element tolerance: atol + rtol |want|.
struct AtolRtol {
  double atol, rtol;
};

// n floats ~ N(0, scale^2), reproducible from `seed`.
inline std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale), from (seed, index) alone: any element is reproducible.
inline float hash_uniform(uint64_t seed, uint64_t i, float scale) {
  const uint64_t h = splitmix64(seed * 0x632be59bd9b4e019ull + i);
  return scale * (float(int64_t(h >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23));
}

// Rounds to bf16 in place (what the GPU will read) and returns the bf16 bits.
inline std::vector<uint16_t> to_bf16_rounding(std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    b[i] = f32_to_bf16(v[i]);
    v[i] = bf16_to_f32(b[i]);
  }
  return b;
}

// A copy rounded to bf16 (the values a bf16 store keeps), as f32.
inline std::vector<float> bf16_round(std::vector<float> v) {
  for (auto& x : v) x = round_to_bf16(x);
  return v;
}

inline double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / double(v.empty() ? 1 : v.size()));
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

template <typename T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& host) {
  cuda::DeviceBuffer<T> d(host.size());
  LILAC_CUDA_CHECK(
      cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

inline cuda::DeviceBuffer<cuda::bf16> upload_bf16(const std::vector<uint16_t>& bits) {
  cuda::DeviceBuffer<cuda::bf16> d(bits.size());
  LILAC_CUDA_CHECK(cudaMemcpy(d.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  LILAC_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// n elements from a device pointer (a buffer's part, or a pointer into a workspace).
template <typename T>
std::vector<T> download_n(const T* d, size_t n) {
  std::vector<T> h(n);
  LILAC_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

inline std::vector<float> download_bf16_as_f32(const cuda::DeviceBuffer<cuda::bf16>& d) {
  std::vector<uint16_t> bits(d.size());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  LILAC_CUDA_CHECK(cudaMemcpy(bits.data(), d.get(), d.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

// Fills a device buffer with NaN bytes so any element the kernel fails to write fails the check.
template <typename T>
void poison(cuda::DeviceBuffer<T>& d) {
  LILAC_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.bytes()));
}

// The pool the CPU twins run on (all hardware threads).
inline ThreadPool& twin_pool() {
  static ThreadPool p(0);
  return p;
}

}  // namespace lilac::test
