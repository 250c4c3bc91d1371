#include "cpu/linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lilac::cpu {

// Lanes are summed separately and reduced at the end: the compiler vectorises the lane loop
// without needing -ffast-math, and the result does not depend on the thread count.
__attribute__((target_clones("arch=haswell", "default"))) float dot(const float* a, const float* b,
                                                                    int64_t n) {
  constexpr int L = 16;
  float acc[L] = {};
  int64_t j = 0;
  for (; j + L <= n; j += L)
    for (int l = 0; l < L; ++l) acc[l] += a[j + l] * b[j + l];
  float tail = 0.f;
  for (; j < n; ++j) tail += a[j] * b[j];
  float s = 0.f;
  for (int l = 0; l < L; ++l) s += acc[l];
  return s + tail;
}

void matmul_rows(const Matrix& W, int64_t row_begin, int64_t row_end, const float* x, int64_t T,
                 int64_t x_stride, float* y, int64_t y_stride, ThreadPool& pool) {
  constexpr int64_t kRowBlock = 8;
  const int64_t n_rows = row_end - row_begin;
  const int64_t n_blocks = (n_rows + kRowBlock - 1) / kRowBlock;
  const int64_t cols = W.cols;
  pool.parallel_for(size_t(n_blocks), [&](size_t b0, size_t b1) {
    thread_local std::vector<float> wbuf;
    wbuf.resize(size_t(kRowBlock * cols));
    for (size_t b = b0; b < b1; ++b) {
      int64_t r0 = row_begin + int64_t(b) * kRowBlock;
      int64_t r1 = std::min(row_end, r0 + kRowBlock);
      for (int64_t r = r0; r < r1; ++r) widen_row(W, r, &wbuf[size_t((r - r0) * cols)]);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * x_stride;
        float* yt = y + t * y_stride + (r0 - row_begin);
        for (int64_t r = r0; r < r1; ++r)
          yt[r - r0] = dot(&wbuf[size_t((r - r0) * cols)], xt, cols);
      }
    }
  });
}

void matmul(const Matrix& W, const float* x, int64_t T, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool& pool) {
  matmul_rows(W, 0, W.rows, x, T, x_stride, y, y_stride, pool);
}

}  // namespace lilac::cpu
