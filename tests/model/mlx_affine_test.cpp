// MLX affine quantization: known-answer vectors worked out by hand (codes, words, scales, biases),
// the error bounds of MLX's algorithm on random groups, and the CPU dequantisation / matmul paths.
#include "model/mlx_affine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/linear.h"
#include "util/half.h"

namespace lilac::test {
namespace {

struct Quantized {
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
};

Quantized quantize(const std::vector<float>& w, int bits) {
  Quantized q;
  q.codes.resize(w.size() * size_t(bits) / 32);
  q.scales.resize(w.size() / 64);
  q.biases.resize(w.size() / 64);
  mlx_quantize_row(w.data(), int64_t(w.size()), bits, 64, q.codes.data(), q.scales.data(),
                   q.biases.data());
  return q;
}

std::vector<float> dequantize(const Quantized& q, int bits, size_t n) {
  std::vector<float> out(n);
  dequantize_row(q.codes.data(), q.scales.data(), q.biases.data(), bits, 64, int64_t(n),
                 out.data());
  return out;
}

// Group A: values -1 + q/8 with q = k % 16: on the grid, min -1 has the larger magnitude, so the
// scale is positive: scale = (0.875 - -1) / 15 = 0.125, edge = -1, q0 = rint(-1 / 0.125) = -8,
// scale = -1 / -8 = 0.125, bias = -1, codes q. Word j holds elements 8j..8j+7, element 8j+i in
// bits [4i, 4i+4): q = 0..7 -> 0x76543210, q = 8..15 -> 0xFEDCBA98.
TEST(MlxAffine, FourBitGroupOnTheGridWithPositiveScale) {
  std::vector<float> w(64);
  for (int k = 0; k < 64; ++k) w[size_t(k)] = -1.0f + 0.125f * float(k % 16);
  Quantized q = quantize(w, 4);
  ASSERT_EQ(q.codes.size(), 8u);
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(q.codes[size_t(j)], j % 2 ? 0xFEDCBA98u : 0x76543210u) << "word " << j;
  EXPECT_EQ(q.scales[0], 0x3E00);      // bf16(0.125)
  EXPECT_EQ(q.biases[0], 0xBF80);      // bf16(-1)
  EXPECT_EQ(dequantize(q, 4, 64), w);  // exact: the values lie on the grid
}

// Group B: values 3 - q/4 with q = 15 - k % 16: max 3 has the larger magnitude, so MLX negates
// the scale: scale = -(3 - -0.75) / 15 = -0.25, edge = 3, q0 = rint(3 / -0.25) = -12,
// scale = 3 / -12 = -0.25, bias = 3 (q = 0 is the max). Codes 15..8 -> 0x89ABCDEF, 7..0 ->
// 0x01234567.
TEST(MlxAffine, FourBitGroupWithNegativeScale) {
  std::vector<float> w(64);
  for (int k = 0; k < 64; ++k) w[size_t(k)] = 3.0f - 0.25f * float(15 - k % 16);
  Quantized q = quantize(w, 4);
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(q.codes[size_t(j)], j % 2 ? 0x01234567u : 0x89ABCDEFu) << "word " << j;
  EXPECT_EQ(q.scales[0], 0xBE80);  // bf16(-0.25)
  EXPECT_EQ(q.biases[0], 0x4040);  // bf16(3)
  EXPECT_EQ(dequantize(q, 4, 64), w);
}

// Group C: the grid of group A (bias -1, scale 1/8) with values half-way between grid points.
// rint rounds halves to even, as MLX's CPU kernel does: 2.5 -> 2, 3.5 -> 4, 0.5 -> 0, 14.5 -> 14;
// zeros sit at (0 + 1) * 8 = 8. Codes 0, 15, 2, 4, 0, 14, 8, 8 -> word 0x88E042F0, then 0x88888888.
// Group D in the same row: all zeros, the max == min edge case: scale = -max(0, 1e-7), q0 = 0,
// so bias = 0 and every code 0; it dequantises to exact zeros.
TEST(MlxAffine, FourBitRoundingHalfToEvenAndTheZeroGroup) {
  std::vector<float> w(128, 0.0f);
  const float c[6] = {
      -1.0f, 0.875f, -1.0f + 2.5f / 8, -1.0f + 3.5f / 8, -1.0f + 0.5f / 8, -1.0f + 14.5f / 8};
  for (int k = 0; k < 6; ++k) w[size_t(k)] = c[k];
  Quantized q = quantize(w, 4);
  ASSERT_EQ(q.codes.size(), 16u);
  EXPECT_EQ(q.codes[0], 0x88E042F0u);
  for (int j = 1; j < 8; ++j) EXPECT_EQ(q.codes[size_t(j)], 0x88888888u) << "word " << j;
  EXPECT_EQ(q.scales[0], 0x3E00);
  EXPECT_EQ(q.biases[0], 0xBF80);
  for (int j = 8; j < 16; ++j) EXPECT_EQ(q.codes[size_t(j)], 0u);
  EXPECT_EQ(q.scales[1], f32_to_bf16(-1e-7f));
  EXPECT_LT(bf16_to_f32(q.scales[1]), 0.0f);
  EXPECT_EQ(q.biases[1], 0x0000);
  auto d = dequantize(q, 4, 128);
  const float want[6] = {-1.0f, 0.875f, -0.75f, -0.5f, -1.0f, 0.75f};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(d[size_t(k)], want[k]) << "element " << k;
  for (int k = 6; k < 128; ++k) EXPECT_EQ(d[size_t(k)], 0.0f) << "element " << k;
}

// A constant group (max == min == 0.5): scale -1e-7, edge 0.5, q0 = rint(0.5 / -1e-7) != 0, so
// bias = 0.5 and the codes are 0: the value comes back exactly. An all-negative group keeps its
// own max (MLX's CPU kernel; the Metal kernel starts its max at 0): -2 + q/16, q = k % 16 gives
// scale 1/16, bias -2.
TEST(MlxAffine, ConstantAndAllNegativeGroups) {
  std::vector<float> w(128);
  for (int k = 0; k < 64; ++k) w[size_t(k)] = 0.5f;
  for (int k = 64; k < 128; ++k) w[size_t(k)] = -2.0f + 0.0625f * float(k % 16);
  Quantized q = quantize(w, 4);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(q.codes[size_t(j)], 0u);
  EXPECT_EQ(q.biases[0], 0x3F00);  // bf16(0.5)
  EXPECT_LT(bf16_to_f32(q.scales[0]), 0.0f);
  EXPECT_GT(bf16_to_f32(q.scales[0]), -2e-7f);
  for (int j = 8; j < 16; ++j) EXPECT_EQ(q.codes[size_t(j)], j % 2 ? 0xFEDCBA98u : 0x76543210u);
  EXPECT_EQ(q.scales[1], 0x3D80);  // bf16(0.0625)
  EXPECT_EQ(q.biases[1], 0xC000);  // bf16(-2)
  EXPECT_EQ(dequantize(q, 4, 128), w);
}

// 8-bit: four codes per word, byte i of word j is element 4j+i. Values -1 + q/128 with
// q = 0, 255, 1, 2, ..., 62: scale = (255/128) / 255 = 1/128, q0 = rint(-128) = -128, bias -1.
TEST(MlxAffine, EightBitGroup) {
  std::vector<float> w(64);
  std::vector<int> codes = {0, 255};
  for (int k = 1; k <= 62; ++k) codes.push_back(k);
  for (int k = 0; k < 64; ++k) w[size_t(k)] = -1.0f + float(codes[size_t(k)]) / 128.0f;
  Quantized q = quantize(w, 8);
  ASSERT_EQ(q.codes.size(), 16u);
  EXPECT_EQ(q.codes[0], 0x0201FF00u);
  EXPECT_EQ(q.codes[1], 0x06050403u);
  EXPECT_EQ(q.codes[15], 0x3E3D3C3Bu);  // q = 59, 60, 61, 62
  EXPECT_EQ(q.scales[0], 0x3C00);       // bf16(1/128)
  EXPECT_EQ(q.biases[0], 0xBF80);
  EXPECT_EQ(dequantize(q, 8, 64), w);
}

// Random groups (normal, uniform, one-sided, outliers): MLX snaps the edge value (and with it 0)
// onto the grid by shrinking or stretching the scale to edge / q0, so:
//  - a value inside the grid's span [bias, bias + (2^bits - 1) * scale] comes back within half a
//    step (|scale| / 2) of itself;
//  - a value beyond it (only possible at the far end, opposite the edge, when the scale shrank)
//    is clipped to the last code: within one step, because |q0| >= 2^(bits-1) bounds the shrink.
// Both bounds are for the f32 scale and bias; the stored bf16 ones add at most
// q * |scale - bf16(scale)| + |bias - bf16(bias)| <= (n_bins * |scale| + |bias|) * 2^-9.
TEST(MlxAffine, RandomGroupsStayWithinTheirBounds) {
  std::mt19937 rng(7);
  for (int bits : {4, 8}) {
    const float n_bins = float((1 << bits) - 1);
    double worst_inside = 0, worst_clipped = 0;
    int clipped = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<float> w(64 * 4);
      std::normal_distribution<float> normal(0.f, 0.02f);
      std::uniform_real_distribution<float> uni(-1.f, 3.f);
      for (size_t i = 0; i < w.size(); ++i) {
        float v = trial % 4 == 0   ? normal(rng)
                  : trial % 4 == 1 ? uni(rng)
                  : trial % 4 == 2 ? std::fabs(normal(rng)) + 1
                                   : normal(rng);
        if (trial % 4 == 3 && i % 61 == 0) v *= 40;  // outliers
        w[i] = round_to_bf16(v);
      }
      Quantized q = quantize(w, bits);
      auto d = dequantize(q, bits, w.size());
      for (size_t g = 0; g < w.size() / 64; ++g) {
        const float s = bf16_to_f32(q.scales[g]), b = bf16_to_f32(q.biases[g]);
        const float slack = (n_bins * std::fabs(s) + std::fabs(b)) * 0x1p-8f;
        const float lo = std::min(b, b + n_bins * s), hi = std::max(b, b + n_bins * s);
        for (size_t k = g * 64; k < g * 64 + 64; ++k) {
          const double err = std::fabs(double(d[k]) - double(w[k]));
          if (w[k] >= lo - slack && w[k] <= hi + slack) {
            EXPECT_LE(err, 0.5 * std::fabs(s) + slack)
                << bits << "-bit trial " << trial << " element " << k;
            worst_inside = std::max(worst_inside, err / std::fabs(s));
          } else {
            ++clipped;
            // Clipped values lie beyond the far end, never beyond the bias (the edge is on the
            // grid).
            EXPECT_TRUE(s > 0 ? w[k] > hi : w[k] < lo)
                << bits << "-bit trial " << trial << " element " << k;
            EXPECT_LE(err, std::fabs(s) + slack)
                << bits << "-bit trial " << trial << " element " << k;
            worst_clipped = std::max(worst_clipped, err / std::fabs(s));
          }
        }
      }
    }
    if (bits == 4) {  // (8-bit's bf16 slack, up to about a step, hides most of both cases)
      EXPECT_GT(worst_inside, 0.45) << "the half-step bound is nearly reached on random data";
      EXPECT_GT(clipped, 0) << "the far-edge clipping case occurred";
    }
    std::printf(
        "%d-bit: worst error inside the grid %.3f steps, %d values clipped, worst %.3f steps\n",
        bits, worst_inside, clipped, worst_clipped);
  }
}

TEST(MlxAffine, BitsPredicateAndModulePaths) {
  EXPECT_EQ(mlx_bits_for("layers.0.mlp.gate", 2048), 8);
  EXPECT_EQ(mlx_bits_for("layers.7.mlp.shared_expert_gate", 2048), 8);
  EXPECT_EQ(mlx_bits_for("layers.7.mlp.shared_expert.gate_proj", 2048), 4);
  EXPECT_EQ(mlx_bits_for("layers.7.mlp.switch_mlp.gate_proj", 2048), 4);
  EXPECT_EQ(mlx_bits_for("embed_tokens", 2048), 4);
  EXPECT_EQ(mlx_bits_for("layers.0.linear_attn.in_proj_a", 100), 0);  // not a multiple of 64
  EXPECT_EQ(mlx_module_path("lm_head"), "language_model.lm_head");
  EXPECT_EQ(mlx_module_path("layers.0.mlp.gate"), "language_model.model.layers.0.mlp.gate");
}

// The AVX2/FMA path and the scalar path give the same bits (one fma rounding each).
TEST(MlxAffine, VectorAndScalarDequantisationAreBitIdentical) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> word;
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (int bits : {4, 8}) {
    const int64_t n = 64 * 9;
    std::vector<uint32_t> codes(size_t(n * bits / 32));
    std::vector<uint16_t> scales(9), biases(9);
    for (auto& c : codes) c = word(rng);
    for (size_t g = 0; g < 9; ++g)
      scales[g] = f32_to_bf16(normal(rng)), biases[g] = f32_to_bf16(normal(rng));
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(codes.data(), scales.data(), biases.data(), bits, 64, n, a.data());
    dequantize_row_scalar(codes.data(), scales.data(), biases.data(), bits, 64, n, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << bits << "-bit";
    // And both are fma(scale, q, bias) of the documented layout.
    for (int64_t k = 0; k < n; k += 37) {
      const uint32_t q =
          (codes[size_t(k * bits / 32)] >> (bits * (k % (32 / bits)))) & ((1u << bits) - 1);
      EXPECT_EQ(a[size_t(k)], std::fma(bf16_to_f32(scales[size_t(k / 64)]), float(q),
                                       bf16_to_f32(biases[size_t(k / 64)])));
    }
  }
  std::printf("dequantize_row: %s path\n", dequantize_row_vectorised() ? "AVX2/FMA" : "scalar");
}

// matmul on a quantized Matrix equals matmul on its dequantised f32 copy, bit for bit, and the
// embedding-style row read (widen_row) is one dequantised row.
TEST(MlxAffine, MatmulOnQuantizedRowsEqualsTheDequantisedMatrix) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 0.05f);
  const int64_t rows = 37, cols = 192;
  std::vector<float> w(size_t(rows * cols)), x(size_t(3 * cols));
  for (auto& v : w) v = round_to_bf16(normal(rng));
  for (auto& v : x) v = normal(rng);
  for (int bits : {4, 8}) {
    std::vector<uint32_t> codes(size_t(rows * cols * bits / 32));
    std::vector<uint16_t> scales(size_t(rows * cols / 64)), biases(scales.size());
    for (int64_t r = 0; r < rows; ++r)
      mlx_quantize_row(&w[size_t(r * cols)], cols, bits, 64, &codes[size_t(r * cols * bits / 32)],
                       &scales[size_t(r * 3)], &biases[size_t(r * 3)]);
    Matrix q{codes.data(), DType::U32, rows, cols, "q", bits, 64, scales.data(), biases.data()};
    std::vector<float> deq(w.size());
    for (int64_t r = 0; r < rows; ++r) widen_row(q, r, &deq[size_t(r * cols)]);
    Matrix f{deq.data(), DType::F32, rows, cols, "f"};
    ThreadPool pool(2);
    std::vector<float> ya(size_t(3 * rows)), yb(ya.size());
    cpu::matmul(q, x.data(), 3, cols, ya.data(), rows, pool);
    cpu::matmul(f, x.data(), 3, cols, yb.data(), rows, pool);
    EXPECT_EQ(ya, yb) << bits << "-bit";
    EXPECT_EQ(q.row_bytes(), size_t(cols * bits / 8));
  }
}

}  // namespace
}  // namespace lilac::test
