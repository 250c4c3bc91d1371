// Helpers for the bandwidth-kernel GPU tests (norm, linear, moe_decode, sampling): fast random
// bf16 data for large matrices, the dot-product tolerance model, and the guard-band check. The
// comparison itself is within() (cuda_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "model/weights.h"
#include "util/half.h"

namespace lilac::test {

// n bf16 values uniform in [-a, a), from a splitmix64 stream (fast enough for 10^9 elements).
inline std::vector<uint16_t> random_bf16(size_t n, float a, uint64_t seed) {
  std::vector<uint16_t> b(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(uint32_t(z >> 40)) * (1.0f / 16777216.0f);
    b[i] = f32_to_bf16(a * (2.f * u - 1.f));
  }
  return b;
}

inline std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// Root mean square of the first `limit` values (a sample is enough for a tolerance scale).
inline double rms_bf16(const std::vector<uint16_t>& b, size_t limit = 1u << 20) {
  const size_t n = std::min(b.size(), limit);
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(bf16_to_f32(b[i])) * bf16_to_f32(b[i]);
  return std::sqrt(s / double(n ? n : 1));
}

// A bf16 weight matrix view over host bits, as the CPU twins read it.
inline Matrix bf16_matrix(const uint16_t* bits, int64_t rows, int64_t cols) {
  return Matrix{bits, DType::BF16, rows, cols, "test"};
}

// Tolerance of an f32 dot product of n bf16 products whose terms have rms `term_rms`, computed
// twice in different summation orders (GPU and CPU twin) and compared. Each sum's error is
// sum_k delta_k S_k with |delta_k| <= u over its n - 1 additions, S_k its partial sums; with
// |S_k| <= 4 sqrt(n) term_rms (a 4-sigma bound on any partial sum of random terms), one sum is
// off by at most 4 u n^1.5 term_rms, the difference of two by 8 u n^1.5 term_rms. For n = 2048
// that is 0.044 term_rms against typical outputs of sqrt(n) term_rms = 45 term_rms: ~1e-3 of the
// output scale, while one dropped or doubled chunk (8 terms) moves an output by ~3 term_rms.
inline double dot_tolerance(double n, double term_rms) {
  return 8 * kU * std::pow(n, 1.5) * term_rms;
}

// Checks that a guard band past the output (poisoned with 0xff bytes) was not written.
template <typename T>
::testing::AssertionResult guard_untouched(const std::vector<T>& all, size_t from,
                                           const std::string& what) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(all.data());
  for (size_t i = from * sizeof(T); i < all.size() * sizeof(T); ++i)
    if (p[i] != 0xff)
      return ::testing::AssertionFailure() << what << ": element " << i / sizeof(T)
                                           << " past the end (" << from << ") was written";
  return ::testing::AssertionSuccess();
}

}  // namespace lilac::test
