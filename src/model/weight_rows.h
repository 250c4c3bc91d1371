// A weight matrix's rows as numbers: plain BF16 / F16 / F32 widened to f32, MLX affine 4/8-bit
// codes dequantised, FP8 E4M3 times its block scales. Shared numerics: the CPU backend multiplies
// these rows (cpu/linear.h), `lilac quantize` and in-memory quantization read them (io/quantize),
// and the CUDA loader rounds them to the bf16 values it uploads (cuda/device_model.cpp); each
// function gives the same bits wherever it runs.
#pragma once

#include <cstdint>

#include "model/dtype.h"
#include "model/weights.h"

namespace lilac {

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
// exact value is computed in double (scale and bias have 8 significant bits, q <= 255: exact, or,
// where one term is ~40 binades below the other, the lost part kept by TwoSum to break a bf16
// tie), then rounded once. Equals f32_to_bf16(dequantize_row's value) except when that f32 value
// lies exactly on a bf16 tie the exact value does not (a double rounding), e.g. scale 1.0078125, q
// 3, bias -2^-40.
void dequantize_row_bf16(const void* codes, const uint16_t* scales, const uint16_t* biases,
                         int bits, int group_size, int64_t n, uint16_t* dst);

// RNE of a double to bf16 bits with one rounding (no double rounding through f32). Finite input.
uint16_t double_to_bf16(double v);

// True when any matrix of `w` is quantized.
bool has_quantized_weights(const ModelWeights& w);

}  // namespace lilac
