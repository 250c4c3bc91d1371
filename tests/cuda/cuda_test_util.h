// Helpers for the GPU tests (label gpu): random data, host<->device copies, poisoned outputs and
// element-wise comparison with the CPU twin that names the first offending element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "util/half.h"

namespace lilac::test {

// A GPU test that finds no GPU fails: a run that was meant to test the kernels must not report
// success without running them. LILAC_ALLOW_NO_GPU=1 in the environment excludes them explicitly
// (they are then skipped, and the run says so).
#define LILAC_REQUIRE_GPU()                                                                     \
  do {                                                                                          \
    if (::lilac::cuda::device_count() == 0) {                                                   \
      const char* allow = std::getenv("LILAC_ALLOW_NO_GPU");                                    \
      if (allow && std::string(allow) == "1") GTEST_SKIP() << "no CUDA device (allowed)";       \
      FAIL() << "no CUDA device: GPU tests need one (LILAC_ALLOW_NO_GPU=1 to skip explicitly)"; \
    }                                                                                           \
  } while (0)

inline std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
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

// Every element within atol + rtol * |want|; reports the count and the worst element.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, double atol,
                                            double rtol, const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = atol + rtol * std::fabs(double(want[i]));
    double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= tol)) {  // NaN fails
      ++bad;
      double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err - tol;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at ["
         << worst << "]: gpu " << got[worst] << " vs cpu " << want[worst] << " (atol " << atol
         << ", rtol " << rtol << ")";
}

}  // namespace lilac::test
