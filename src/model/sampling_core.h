// The exact arithmetic shared by the CPU sampler (model/sampling.cpp) and the CUDA sampler
// (cuda/sampling.cu), compiled by g++ (C++20) and nvcc (C++17, __host__ __device__). Every
// function here gives bit-identical results on both sides, so the two samplers pick the same
// token for the same logits, parameters, seed and step, always (not just usually):
//  - Philox4x32-10 (integer only, model/philox.h), as Random123 defines it.
//  - penalties and temperature: single IEEE operations (fma where a product meets a sum), no
//    expression the compiler could contract differently on the two sides.
//  - det_exp: exp(x) for x <= 0 from IEEE fma/mul only (no libm, whose exp differs between glibc
//    and CUDA by an ulp or two).
//  - probability masses as 40-bit fixed point integers (sums exact, order-independent).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "model/philox.h"

#if defined(__CUDACC__)
#define LILAC_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define LILAC_SAMPLING_HD inline
#endif

namespace lilac::sampling {

// ---- Philox (model/philox.h)
// ----------------------------------------------------------------------

// The 24-bit uniform integer of (seed, step), as philox_uniform_hd: key = (seed low, seed high),
// counter = (step low, step high, 0, 0), the first output word's 24 high bits; u = u24 / 2^24.
LILAC_SAMPLING_HD uint32_t philox_u24(uint64_t seed, uint64_t step) {
  return philox4x32_10(uint32_t(step), uint32_t(step >> 32), 0u, 0u, uint32_t(seed),
                       uint32_t(seed >> 32))
             .v[0] >>
         8;
}

// ---- IEEE single operations that neither compiler may fuse or reorder -------------------------
#if defined(__CUDA_ARCH__)
LILAC_SAMPLING_HD float f_fma(float a, float b, float c) {
  return __fmaf_rn(a, b, c);
}
LILAC_SAMPLING_HD float f_mul(float a, float b) {
  return __fmul_rn(a, b);
}
LILAC_SAMPLING_HD float f_sub(float a, float b) {
  return __fsub_rn(a, b);
}
LILAC_SAMPLING_HD float f_div(float a, float b) {
  return __fdiv_rn(a, b);
}
LILAC_SAMPLING_HD double d_mul(double a, double b) {
  return __dmul_rn(a, b);
}
LILAC_SAMPLING_HD float f_rint(float a) {
  return rintf(a);
}
#else
LILAC_SAMPLING_HD float f_fma(float a, float b, float c) {
  return std::fma(a, b, c);
}
// A lone product / difference / quotient: nothing for the host compiler to contract with, since
// every use below feeds a comparison, a conversion or an explicit f_fma.
LILAC_SAMPLING_HD float f_mul(float a, float b) {
  return a * b;
}
LILAC_SAMPLING_HD float f_sub(float a, float b) {
  return a - b;
}
LILAC_SAMPLING_HD float f_div(float a, float b) {
  return a / b;
}
LILAC_SAMPLING_HD double d_mul(double a, double b) {
  return a * b;
}
LILAC_SAMPLING_HD float f_rint(float a) {
  return std::nearbyint(a);
}  // round half to even (default mode)
#endif

LILAC_SAMPLING_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// exp(x) for x <= 0 (larger x is clamped to 0), within ~2 ulp of the true value; 0 below -87
// (where exp is under FLT_MIN; such probabilities have no mass in the 40-bit fixed point anyway);
// det_exp(0) == 1 exactly and det_exp(x) <= 1. NaN -> 0.
LILAC_SAMPLING_HD float det_exp(float x) {
  if (!(x > -87.f)) return 0.f;
  if (x > 0.f) x = 0.f;
  // x = n ln2 + r, |r| <= ln2 / 2: n = rint(x / ln2); r by a two-part (Cody-Waite) ln2 with fma.
  const float n = f_rint(f_mul(x, 1.44269504088896341f));
  float r = f_fma(n, -0.693145751953125f, x);  // ln2 high part (0x3f317200)
  r = f_fma(n, -1.42860676533018e-06f, r);     // ln2 - high part
  // exp(r) by its Taylor series to r^7 (relative error < 1e-8 on |r| <= 0.347), Horner with fma.
  float p = 1.98412698e-4f;  // 1/7!
  p = f_fma(p, r, 1.38888889e-3f);
  p = f_fma(p, r, 8.33333333e-3f);
  p = f_fma(p, r, 4.16666667e-2f);
  p = f_fma(p, r, 1.66666667e-1f);
  p = f_fma(p, r, 0.5f);
  p = f_fma(p, r, 1.0f);
  p = f_fma(p, r, 1.0f);
  // times 2^n, n in [-126, 0]: an exact power of two, one rounding.
  const float e = f_mul(p, bits_float(uint32_t(int(n) + 127) << 23));
  return e < 1.f ? e : 1.f;
}

// ---- sampler steps, identical on both sides ----------------------------------------------------

// Step 1 of the contract: the repetition penalty r for seen ids, then presence p and frequency f
// for output counts c. With pen = fma(f, c, c > 0 ? p : 0):
//   x' = x / r - pen (seen, x > 0);  fma(x, r, -pen) (seen, x <= 0: one rounding, the form a
//   compiler could contract to on its own, so written explicitly);  x - pen (not seen).
// A neutral setting (r = 1, p = f = 0) returns x exactly.
LILAC_SAMPLING_HD float penalize(float x, int32_t count, bool seen, float rep, float presence,
                                 float frequency) {
  const float pen = f_fma(frequency, float(count), count > 0 ? presence : 0.f);
  if (!seen) return f_sub(x, pen);
  return x > 0.f ? f_sub(f_div(x, rep), pen) : f_fma(x, rep, -pen);
}

// Unnormalised probability of a logit y (already divided by the temperature) given the maximum m
// of all y: e = exp(y - m) in (0, 1], exactly 1 at the maximum (also when y = m = +inf).
LILAC_SAMPLING_HD float unnormalised_prob(float y, float m) {
  return y == m ? 1.f : det_exp(f_sub(y, m));
}

// Fixed-point mass of an unnormalised probability e in [0, 1]: floor(e * 2^40) (exact: a power of
// two product, then truncation). The maximum has mass 2^40; V <= 2^18 masses sum below 2^58.
constexpr int kMassBits = 40;
LILAC_SAMPLING_HD uint64_t mass_of(float e) {
  return uint64_t(f_mul(e, 1099511627776.0f));
}

// The top_p target: trunc(top_p * Z) in double (both sides round the product identically).
LILAC_SAMPLING_HD uint64_t top_p_target(float top_p, uint64_t Z) {
  if (!(top_p > 0.f)) return 0;
  const double t = d_mul(double(top_p), double(Z));
  return t >= double(Z) ? Z : uint64_t(t);
}

// r = floor(u24 * Z / 2^24) without 128-bit arithmetic: Z = zh 2^24 + zl.
LILAC_SAMPLING_HD uint64_t scaled_draw(uint32_t u24, uint64_t Z) {
  const uint64_t zh = Z >> 24, zl = Z & 0xFFFFFFull;
  return uint64_t(u24) * zh + ((uint64_t(u24) * zl) >> 24);
}

}  // namespace lilac::sampling
