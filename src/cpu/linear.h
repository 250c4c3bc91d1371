// Linear layers on the CPU: y = W x for a batch of T input rows, W [rows, cols] read in place from
// the checkpoint (BF16 / F16 / F32, or MLX affine 4/8-bit codes dequantised on the fly), f32
// arithmetic.
#pragma once

#include <cstdint>

#include "model/weight_rows.h"
#include "model/weights.h"
#include "util/thread_pool.h"

namespace lilac::cpu {

// y[t * y_stride + r] = sum_j W[r, j] * x[t * x_stride + j] for t < T, r < W.rows.
// Threaded across blocks of rows; each block of W is widened (or dequantised) to f32 once and
// reused for all T rows.
void matmul(const Matrix& W, const float* x, int64_t T, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool& pool);

// Same over a sub-range of W's rows [row_begin, row_end) writing y[t * y_stride + (r - row_begin)].
void matmul_rows(const Matrix& W, int64_t row_begin, int64_t row_end, const float* x, int64_t T,
                 int64_t x_stride, float* y, int64_t y_stride, ThreadPool& pool);

// f32 dot product of n elements (16 independent lanes; vectorised where the CPU allows).
float dot(const float* a, const float* b, int64_t n);
}  // namespace lilac::cpu
