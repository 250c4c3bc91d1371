// Linear layers on the CPU: y = W x for a batch of T input rows, W [rows, cols] read in place from
// the checkpoint (BF16 / F16 / F32, or MLX affine 4/8-bit codes dequantised on the fly), f32
// arithmetic.
#pragma once

#include <cstdint>

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

// Widens n elements of a plain (BF16 / F16 / F32) weight row to f32.
void widen_row(const void* src, DType dtype, int64_t n, float* dst);

// Row r of W as f32, W.cols values, whatever its storage (plain, MLX quantized, or FP8 with
// block scales).
void widen_row(const Matrix& W, int64_t r, float* dst);

// Dequantises n elements (whole groups) of one MLX affine-quantized row (layout in weights.h):
//   dst[k] = fma(bf16(scales[g]), float(q_k), bf16(biases[g])),  g = k / group_size,
// one f32 rounding per element, so the AVX2 path, the scalar path and a GPU kernel using fmaf all
// give the same bits. bits is 4 or 8; group_size a multiple of 8.
void dequantize_row(const void* codes, const uint16_t* scales, const uint16_t* biases, int bits,
                    int group_size, int64_t n, float* dst);
// The portable path of dequantize_row (the tests check the vector path against it bit for bit).
void dequantize_row_scalar(const void* codes, const uint16_t* scales, const uint16_t* biases,
                           int bits, int group_size, int64_t n, float* dst);
// True when dequantize_row uses its AVX2/FMA path on this CPU.
bool dequantize_row_vectorised();

// The weights the GPU's 4-bit prefill kernels multiply (twin of their fma.rn.bf16x2
// dequantisation): dst[k] = RNE_bf16(scale * q + bias) of the exact value, as bf16 bits. The
// exact value is computed in double (scale and bias have 8 significant bits, q <= 255: it is
// exact, or so far from a bf16 rounding boundary that double's rounding cannot matter), then
// rounded once. Equals f32_to_bf16(dequantize_row's value) except when that f32 value lies
// exactly on a bf16 tie the exact value does not (a double rounding), e.g. scale 1.0078125,
// q 3, bias -2^-40.
void dequantize_row_bf16(const void* codes, const uint16_t* scales, const uint16_t* biases,
                         int bits, int group_size, int64_t n, uint16_t* dst);

// RNE of a double to bf16 bits with one rounding (no double rounding through f32). Finite input.
uint16_t double_to_bf16(double v);

}  // namespace lilac::cpu
