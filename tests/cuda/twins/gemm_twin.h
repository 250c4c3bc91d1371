// The dense GEMM's check helpers, without GoogleTest (shared by the prefill GEMM / MoE tests and
// the kernel lab): fast reproducible random bf16 data (hundreds of millions of elements for the
// real lm_head and expert weights), row norms for tolerances, and the dot-product tolerance of a
// GEMM.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "host_data.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::test {

// n bf16 values uniform in [-scale, scale) (variance scale^2 / 3), generated in parallel.
inline std::vector<uint16_t> random_bf16_bits(size_t n, float scale, uint64_t seed) {
  std::vector<uint16_t> v(n);
  ThreadPool::global().parallel_for(
      n,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) v[i] = f32_to_bf16(hash_uniform(seed, i, scale));
      },
      1 << 16);
  return v;
}

inline std::vector<float> widen(const uint16_t* bits, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

// Euclidean norms of the rows of a bf16 [rows, cols] matrix.
inline std::vector<double> row_norms(const uint16_t* bits, int64_t rows, int64_t cols) {
  std::vector<double> n(size_t(rows), 0.0);
  ThreadPool::global().parallel_for(size_t(rows), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      double s = 0;
      const uint16_t* row = bits + r * size_t(cols);
      for (int64_t j = 0; j < cols; ++j) {
        const double x = bf16_to_f32(row[j]);
        s += x * x;
      }
      n[r] = std::sqrt(s);
    }
  });
  return n;
}

// Bound on |gpu - cpu| for a dot product of K bf16 products (exact in f32) summed in f32 in two
// different orders, relative to ||a|| ||b|| (>= sum |a_i b_i|, Cauchy-Schwarz). Each side's
// rounding error is at most (number of sequential additions a term passes through) * u * sum|a b|
// (u = 2^-24): the CPU sums 16 lanes of K/16 terms then the lanes (K/16 + 16 additions), the GPU
// adds one k16 MMA result per step into its accumulator (K/16 additions, plus the MMA's internal
// sum, which may truncate rather than round: count 2u per addition). Total <= (3K/16 + 48) u;
// doubled for margin: (K/8 + 96) * 2^-23. At K = 2048 that is 3.5e-5 ||a|| ||b||, 1.6e-3 of a
// typical |a . b| for random data, yet 14x smaller than one product |a_k b_k| of such data, so a
// dropped or doubled k-chunk cannot pass.
inline double dot_tolerance(int64_t K) {
  return (double(K) / 8.0 + 96.0) * std::ldexp(1.0, -23);
}

}  // namespace lilac::test
