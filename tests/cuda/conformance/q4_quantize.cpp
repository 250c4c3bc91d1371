// Conformance cases of the GPU quantizer (cuda::quantize_mlx) bit for bit against
// lilac::mlx_quantize_row on random rows and the edge cases of MLX's arithmetic; the repack
// (cuda::repack_mlx) against the layout's index functions for every code and scale. Outputs are
// poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "conformance.h"
#include "cuda/q4_layout.h"
#include "cuda/q4_quantize.h"
#include "model/mlx_affine.h"
#include "util/error.h"
#include "util/half.h"

namespace lilac::test {
namespace {

// Rows of bf16 weights: random at varied scales, and special rows exercising every branch.
std::vector<uint16_t> quantizer_inputs(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r) {
    float* row = &w[size_t(r) * size_t(cols)];
    const float scale = std::ldexp(1.f, (r % 41) - 20);  // 2^-20 .. 2^20
    for (int j = 0; j < cols; ++j) row[j] = d(rng) * scale;
    switch (r % 16) {
      case 0:  // all zero: scale -1e-7, bias 0
        for (int j = 0; j < cols; ++j) row[j] = 0.f;
        break;
      case 1:  // constant groups (max == min)
        for (int j = 0; j < cols; ++j) row[j] = 0.375f * float(1 + j / 64);
        break;
      case 2:  // all negative (MLX's CPU kernel: max is the true max)
        for (int j = 0; j < cols; ++j) row[j] = -std::fabs(row[j]) - 0.01f;
        break;
      case 3:  // |min| == |max|: not "|min| > |max|", the scale is negative
        for (int j = 0; j < cols; j += 64) row[j] = 2.f, row[j + 1] = -2.f;
        for (int j = 0; j < cols; ++j)
          if (j % 64 > 1) row[j] = std::fmin(std::fmax(row[j], -1.9f), 1.9f);
        break;
      case 4:  // 0 and 15 with half-step values: rint ties (half to even)
        for (int j = 0; j < cols; ++j)
          row[j] = j % 64 == 0 ? 0.f : j % 64 == 1 ? 15.f : float(j % 15) + 0.5f;
        break;
      case 5:  // bf16 subnormals
        for (int j = 0; j < cols; ++j) row[j] = float(j % 7 - 3) * 1e-39f;
        break;
      case 6:  // huge
        for (int j = 0; j < cols; ++j) row[j] = row[j] * 1e30f;
        break;
      case 7:  // an outlier per group (the far edge is clipped)
        for (int j = 0; j < cols; j += 64) row[j + 5] = 50.f;
        break;
      case 8:  // signed zeros and a single non-zero
        for (int j = 0; j < cols; ++j) row[j] = (j % 2) ? -0.f : 0.f;
        row[3] = 1e-3f;
        break;
      default:
        break;
    }
  }
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]);
  return b;
}

void check_quantizer(int rows, int cols, int bits, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << rows << " x " << cols << " at " << bits << " bits");
  const auto wb = quantizer_inputs(rows, cols, seed);
  const int G = cols / 64, wpr = cols * bits / 32;
  std::vector<uint32_t> want_codes(static_cast<size_t>(rows) * wpr);
  std::vector<uint16_t> want_s(static_cast<size_t>(rows) * G), want_b(size_t(rows) * G);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) row[size_t(j)] = bf16_to_f32(wb[size_t(r) * cols + j]);
    mlx_quantize_row(row.data(), cols, bits, 64, &want_codes[size_t(r) * wpr],
                     &want_s[size_t(r) * G], &want_b[size_t(r) * G]);
  }
  auto dw = upload_bf16(wb);
  cuda::DeviceBuffer<uint32_t> codes(want_codes.size());
  cuda::DeviceBuffer<uint16_t> s(want_s.size()), b(want_b.size());
  poison(codes);
  poison(s);
  poison(b);
  cuda::quantize_mlx(dw.get(), rows, cols, bits, codes.get(), s.get(), b.get(), nullptr);
  const auto got_codes = download(codes);
  const auto got_s = download(s), got_b = download(b);
  for (size_t i = 0; i < want_codes.size(); ++i)
    ASSERT_EQ(got_codes[i], want_codes[i])
        << "codes: row " << i / wpr << " word " << i % wpr << " (group "
        << (i % wpr) * (32 / bits) / 64 << "): gpu 0x" << std::hex << got_codes[i] << " vs cpu 0x"
        << want_codes[i];
  for (size_t i = 0; i < want_s.size(); ++i) {
    ASSERT_EQ(got_s[i], want_s[i]) << "scale of row " << i / G << " group " << i % G << ": gpu "
                                   << bf16_to_f32(got_s[i]) << " vs cpu " << bf16_to_f32(want_s[i]);
    ASSERT_EQ(got_b[i], want_b[i]) << "bias of row " << i / G << " group " << i % G << ": gpu "
                                   << bf16_to_f32(got_b[i]) << " vs cpu " << bf16_to_f32(want_b[i]);
  }
}

// Random MLX data (any code words, finite bf16 scales / biases) repacked on the device, compared
// word by word with the tiled buffer built on the host from q_code_position / q_sb_position
// (padding rows must be zero).
void check_repack(int rows, int cols, int bits, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << rows << " x " << cols << " at " << bits << " bits");
  std::mt19937_64 rng(seed);
  const int G = cols / 64, P = bits / 4, wpr = cols * bits / 32;
  std::vector<uint32_t> codes(static_cast<size_t>(rows) * wpr);
  for (auto& c : codes) c = uint32_t(rng());
  std::vector<uint16_t> s(static_cast<size_t>(rows) * G), b(size_t(rows) * G);
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = f32_to_bf16(float(int(rng() % 2001) - 1000) * 1e-4f);
    b[i] = f32_to_bf16(float(int(rng() % 2001) - 1000) * 1e-3f);
  }
  std::vector<uint32_t> want(cuda::q_code_words(rows, cols, bits), 0u);
  std::vector<uint32_t> want_sb(cuda::q_sb_words(rows, cols), 0u);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) {
      const uint32_t q =
          (codes[size_t(r) * wpr + size_t(k * bits / 32)] >> (bits * (k % (32 / bits)))) &
          ((1u << bits) - 1);
      for (int p = 0; p < P; ++p) {
        size_t w;
        int shift;
        cuda::q_code_position(G, P, r, k, p, w, shift);
        want[w] |= ((q >> (4 * p)) & 15u) << shift;
      }
      if (k % 64 == 0)
        want_sb[cuda::q_sb_position(G, r, k / 64)] =
            uint32_t(s[size_t(r) * G + k / 64]) | uint32_t(b[size_t(r) * G + k / 64]) << 16;
    }
  auto dc = upload(codes);
  auto ds = upload(s);
  auto db = upload(b);
  cuda::DeviceBuffer<uint32_t> tiled(want.size()), sb(want_sb.size());
  poison(tiled);
  poison(sb);
  cuda::repack_mlx(dc.get(), ds.get(), db.get(), rows, cols, bits, tiled.get(), sb.get(), nullptr);
  const auto got = download(tiled), got_sb = download(sb);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << "code word " << i << " (block " << i / 128 << ", lane "
                               << (i % 128) / 4 << ", word " << i % 4 << "): gpu 0x" << std::hex
                               << got[i] << " vs 0x" << want[i];
  for (size_t i = 0; i < want_sb.size(); ++i)
    ASSERT_EQ(got_sb[i], want_sb[i])
        << "sb word " << i << " (block " << i / 16 << ", slot " << i % 16 << ")";
}

LILAC_CONFORMANCE_CASES(q4_quantize) {
  std::vector<OpCase> cases;
  for (int bits : {4, 8}) {
    const std::string q = bits == 4 ? "q4" : "q8";
    cases.push_back({"quantize_mlx", "300x576", q, "mlx_quantize_row",
                     [bits] { check_quantizer(300, 576, bits, 11); }});
    cases.push_back({"quantize_mlx", "1x64", q, "mlx_quantize_row",
                     [bits] { check_quantizer(1, 64, bits, 12); }});
    cases.push_back({"quantize_mlx", "2048x2048", q, "mlx_quantize_row",
                     [bits] { check_quantizer(2048, 2048, bits, 13); }});
  }
  for (int bits : {4, 8}) {
    const std::string q = bits == 4 ? "q4" : "q8";
    const char* twin = "q_code_position + q_sb_position";
    cases.push_back({"repack_mlx", "37x192", q, twin, [bits] { check_repack(37, 192, bits, 1); }});
    cases.push_back({"repack_mlx", "16x64", q, twin, [bits] { check_repack(16, 64, bits, 2); }});
    cases.push_back(
        {"repack_mlx", "100x2048", q, twin, [bits] { check_repack(100, 2048, bits, 3); }});
    cases.push_back({"repack_mlx", "1x4096", q, twin, [bits] { check_repack(1, 4096, bits, 4); }});
  }
  return cases;
}

TEST(Q4Quantize, BadArgumentsThrow) {
  auto* w = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* c = reinterpret_cast<uint32_t*>(uintptr_t(256));
  auto* h = reinterpret_cast<uint16_t*>(uintptr_t(256));
  EXPECT_THROW(cuda::quantize_mlx(w, 4, 100, 4, c, h, h, nullptr), Error);   // cols % 64
  EXPECT_THROW(cuda::quantize_mlx(w, 4, 128, 3, c, h, h, nullptr), Error);   // bits
  EXPECT_THROW(cuda::repack_mlx(c, h, h, 0, 128, 4, c, c, nullptr), Error);  // rows
}

// q_scales_below_half (QMatrix::small_scales): |s| < 1/2 passes, 1/2 itself, larger, infinite and
// NaN scales fail, wherever in the array they are; the bias half of a word is not looked at.
TEST(Q4Quantize, ScalesBelowHalfScan) {
  LILAC_REQUIRE_GPU();
  auto scan = [](std::vector<uint32_t> sb) {
    auto d = upload(sb);
    return cuda::q_scales_below_half(d.get(), sb.size());
  };
  // Scale bits in the low half: +-0, +-the smallest subnormal, the largest below 1/2 (0x3EFF),
  // its negative, 2^-7; a NaN bias beside a small scale.
  const std::vector<uint32_t> small = {0x0000u, 0x8000u, 0x0001u, 0x8001u,
                                       0x3EFFu, 0xBEFFu, 0x3C00u, 0x7FC03C00u};
  EXPECT_TRUE(scan(small));
  EXPECT_TRUE(cuda::q_scales_below_half(nullptr, 0));
  for (uint32_t bad : {0x3F00u, 0xBF00u, 0x3F80u, 0x7F80u, 0xFF80u, 0x7FC0u}) {
    for (size_t at : {size_t(0), size_t(3), size_t(5000)}) {
      std::vector<uint32_t> sb(6000, 0x3A83u);  // ~1e-3
      sb[at] = bad | 0x3F800000u;               // bias 1.0
      EXPECT_FALSE(scan(sb)) << std::hex << "scale bits 0x" << bad << " at " << std::dec << at;
    }
  }
}

}  // namespace
}  // namespace lilac::test
