// FP8 E4M3 ("e4m3fn", safetensors F8_E4M3) -> f32, as in the OCP 8-bit floating point spec and
// PyTorch's float8_e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities.
//   exponent 1..15: (-1)^s * 2^(e-7) * (1 + m/8)   (largest finite: 0x7E = 1.75 * 2^8 = 448)
//   exponent 0:     (-1)^s * 2^-6 * (m/8)          (subnormals; smallest 2^-9)
//   S.1111.111 (0x7F, 0xFF) is NaN: the only NaN encodings, and there is no infinity.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace lilac {

inline float fp8_e4m3_to_f32(uint8_t v) {
  const bool neg = (v & 0x80u) != 0;
  const int e = (v >> 3) & 0xf, m = v & 0x7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return neg ? -mag : mag;
}

}  // namespace lilac
