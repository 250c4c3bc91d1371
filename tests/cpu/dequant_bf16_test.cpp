// CPU twins of the GPU 4-bit kernels (runs in CI, no GPU): double_to_bf16 and
// dequantize_row_bf16 (the weights the GPU prefill kernels multiply) against an
// independent nearest-bf16 search, including the double-rounding case; and the tiled device
// layout's index functions (cuda/q4_layout.h, host-safe) as a bijection consistent with its
// documented nibble order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cpu/linear.h"
#include "cuda/q4_layout.h"
#include "model/mlx_affine.h"
#include "util/half.h"

namespace lilac::test {
namespace {

// The nearest bf16 to v by search (ties to the even bit pattern): an algorithm independent of
// double_to_bf16's f32 route. v finite, |v| < 2^127.
uint16_t nearest_bf16(double v) {
  const uint16_t t = uint16_t([&] {  // bf16 bits of v truncated toward zero
    const float f = float(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t b = uint16_t(u >> 16);
    if (std::fabs(double(bf16_to_f32(b))) > std::fabs(v)) --b;  // f rounded up past v
    return b;
  }());
  const uint16_t up = uint16_t(t + 1);
  const double dt = std::fabs(v - double(bf16_to_f32(t)));
  const double du = std::fabs(double(bf16_to_f32(up)) - v);
  if (dt < du) return t;
  if (du < dt) return up;
  return (t & 1) ? up : t;
}

TEST(DequantBf16, DoubleToBf16MatchesTheNearestSearch) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> e(-40, 40);
  std::uniform_real_distribution<double> m(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    double v = std::ldexp(m(rng), e(rng)) * (i % 2 ? -1 : 1);
    if (i % 3 == 0) {  // exactly on or next to a bf16 midpoint
      const double base = bf16_to_f32(f32_to_bf16(float(v)));
      const double ulp = std::ldexp(1.0, std::ilogb(base) - 7);
      v = base + ulp / 2 + (i % 5 - 2) * std::ldexp(ulp, -30);
    }
    ASSERT_EQ(double_to_bf16(v), nearest_bf16(v)) << "v = " << v;
  }
}

TEST(DequantBf16, RowMatchesTheExactValueRoundedOnce) {
  std::mt19937 rng(9);
  for (int bits : {4, 8}) {
    const int n = 64 * 7;
    std::vector<float> w(static_cast<size_t>(n));
    std::normal_distribution<float> d(0.f, 0.05f);
    for (auto& x : w) x = round_to_bf16(d(rng));
    std::vector<uint32_t> codes(static_cast<size_t>(n) * size_t(bits) / 32);
    std::vector<uint16_t> s(7), b(7);
    mlx_quantize_row(w.data(), n, bits, 64, codes.data(), s.data(), b.data());
    std::vector<uint16_t> got(static_cast<size_t>(n));
    dequantize_row_bf16(codes.data(), s.data(), b.data(), bits, 64, n, got.data());
    std::vector<float> f32(static_cast<size_t>(n));
    dequantize_row(codes.data(), s.data(), b.data(), bits, 64, n, f32.data());
    for (int k = 0; k < n; ++k) {
      const uint32_t q =
          (codes[size_t(k) * bits / 32] >> (bits * (k % (32 / bits)))) & ((1u << bits) - 1);
      const double exact =
          double(bf16_to_f32(s[size_t(k / 64)])) * q + bf16_to_f32(b[size_t(k / 64)]);
      ASSERT_EQ(got[size_t(k)], nearest_bf16(exact)) << bits << "-bit element " << k;
      // Within half a bf16 step of the f32 dequantisation (the two differ by one rounding).
      ASSERT_LE(std::fabs(bf16_to_f32(got[size_t(k)]) - f32[size_t(k)]),
                std::ldexp(std::fabs(f32[size_t(k)]), -8) + 1e-30)
          << bits << "-bit element " << k;
    }
  }
}

// scale 1.0078125 (1 + 2^-7), q 3: s q = 3.0234375 is exactly halfway between the bf16 values
// 3.015625 and 3.03125; with bias -2^-40 the exact value is just below the tie (rounds down),
// but its f32 rounding is the tie itself, which rounds to even (up): bf16(fmaf) is wrong there.
TEST(DequantBf16, NoDoubleRoundingThroughF32) {
  const uint16_t s = f32_to_bf16(1.0078125f), b = f32_to_bf16(-std::ldexp(1.0f, -40));
  ASSERT_EQ(bf16_to_f32(s), 1.0078125f);
  ASSERT_EQ(bf16_to_f32(b), -std::ldexp(1.0f, -40));
  std::vector<uint32_t> codes(8, 0x33333333u);  // every code 3
  std::vector<uint16_t> got(64);
  dequantize_row_bf16(codes.data(), &s, &b, 4, 64, 64, got.data());
  EXPECT_EQ(bf16_to_f32(got[0]), 3.015625f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::fma(1.0078125f, 3.f, bf16_to_f32(b)))), 3.03125f)
      << "the f32 route double-rounds (the reason for the twin)";
}

// A bias far below s q (here the smallest bf16 subnormal, 2^-133) is lost in the double sum, yet
// decides where s q is a bf16 tie: scale 0x3A83 (0.00099945068359375 = 131 x 2^-17), q 3: s q =
// 393 x 2^-17, between the bf16 values 392 and 394 x 2^-17, a tie; + 2^-133 rounds up (the GPU's
// fma, which rounds the exact sum, found this: s49), - 2^-133 down, 0 to even (392).
TEST(DequantBf16, ABiasLostInTheDoubleSumStillBreaksTheTie) {
  const uint16_t s = 0x3A83;
  ASSERT_EQ(double(bf16_to_f32(s)), 131 * std::ldexp(1.0, -17));
  std::vector<uint32_t> codes(8, 0x33333333u);  // every code 3
  std::vector<uint16_t> got(64);
  const double below = 392 * std::ldexp(1.0, -17), above = 394 * std::ldexp(1.0, -17);
  for (const auto& [b, want] :
       {std::pair{uint16_t(0x0001), above}, std::pair{uint16_t(0x8001), below},
        std::pair{uint16_t(0x0000), below}}) {
    dequantize_row_bf16(codes.data(), &s, &b, 4, 64, 64, got.data());
    EXPECT_EQ(double(bf16_to_f32(got[0])), want) << std::hex << "bias bits 0x" << b;
  }
}

TEST(Q4Layout, PositionsAreABijectionInTheDocumentedOrder) {
  for (int bits : {4, 8}) {
    const int rows = 37, cols = 192, G = cols / 64, P = bits / 4;
    const size_t words = cuda::q_code_words(rows, cols, bits);
    ASSERT_EQ(words, size_t(3) * 3 * P * 128);
    ASSERT_EQ(cuda::q_sb_words(rows, cols), size_t(3) * 3 * 16);
    std::set<std::pair<size_t, int>> seen;
    for (int r = 0; r < 48; ++r)  // including the padding rows of the last tile
      for (int k = 0; k < cols; ++k)
        for (int p = 0; p < P; ++p) {
          size_t w;
          int shift;
          cuda::q_code_position(G, P, r, k, p, w, shift);
          ASSERT_LT(w, words);
          ASSERT_EQ(shift % 4, 0);
          ASSERT_TRUE(seen.insert({w, shift}).second) << "r " << r << " k " << k;
          // The inverse within the block.
          int row, col;
          cuda::q_block_element(int(w % 128), shift, row, col);
          EXPECT_EQ(row, r % 16);
          EXPECT_EQ(col, k % 64);
          // The documented A-fragment order: lane 4g + t, word kb, nibble i (+4 for col + 1).
          const int lane = int(w % 128) / 4, kb = int(w % 4), nib = shift / 4;
          const int g = lane / 4, t = lane % 4, i = nib % 4;
          EXPECT_EQ(r % 16, g + 8 * (i & 1));
          EXPECT_EQ(k % 64, 16 * kb + 2 * t + 8 * (i >> 1) + nib / 4);
        }
    EXPECT_EQ(seen.size(), words * 8);
    std::set<size_t> sb;
    for (int r = 0; r < 48; ++r)
      for (int grp = 0; grp < G; ++grp) {
        const size_t i = cuda::q_sb_position(G, r, grp);
        ASSERT_LT(i, cuda::q_sb_words(rows, cols));
        ASSERT_TRUE(sb.insert(i).second);
        EXPECT_EQ(i % 16, size_t(2 * (r % 8) + (r % 16) / 8));  // rows g and g + 8 adjacent
      }
  }
}

}  // namespace
}  // namespace lilac::test
