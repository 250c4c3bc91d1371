#include "model/weight_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/fp8.h"
#include "util/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LILAC_X86 1
#endif

namespace lilac {

__attribute__((target_clones("arch=haswell", "default"))) void widen_row(const void* src,
                                                                         DType dtype, int64_t n,
                                                                         float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, size_t(n) * 4);
  } else if (dtype == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t j = 0; j < n; ++j) {
      uint32_t u = uint32_t(s[j]) << 16;
      std::memcpy(&dst[j], &u, 4);
    }
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t j = 0; j < n; ++j) dst[j] = f16_to_f32(s[j]);
  }
}

namespace {

// Calls f(k, q, scale, bias) for every element k < n of an MLX affine row: codes of `bits` bits
// packed little-endian into 32-bit words (the row may be unaligned), one bf16 scale and bias per
// group of `group_size` elements, widened to f32 (exactly).
template <class F>
void for_each_code(const void* codes, const uint16_t* scales, const uint16_t* biases, int bits,
                   int group_size, int64_t n, F&& f) {
  const uint8_t* c = static_cast<const uint8_t*>(codes);
  const uint32_t mask = (1u << bits) - 1u;
  const int per_word = 32 / bits;
  for (int64_t g = 0; g < n / group_size; ++g) {
    const float s = bf16_to_f32(scales[g]), b = bf16_to_f32(biases[g]);
    for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) {
      uint32_t word;
      std::memcpy(&word, c + 4 * (k / per_word), 4);
      f(k, (word >> (bits * int(k % per_word))) & mask, s, b);
    }
  }
}

}  // namespace

void dequantize_row_scalar(const void* codes, const uint16_t* scales, const uint16_t* biases,
                           int bits, int group_size, int64_t n, float* dst) {
  for_each_code(
      codes, scales, biases, bits, group_size, n,
      [&](int64_t k, uint32_t q, float s, float b) { dst[k] = std::fma(s, float(q), b); });
}

#ifdef LILAC_X86
namespace {

// 8 elements per step: a 4-bit word is broadcast and shifted lane-wise by 0, 4, ..., 28; an 8-bit
// pair of words is 8 bytes widened with vpmovzxbd. Integers up to 255 convert to f32 exactly and
// vfmadd rounds once, like std::fma in the scalar path.
__attribute__((target("avx2,fma"))) void dequantize_row_avx2(const void* codes,
                                                             const uint16_t* scales,
                                                             const uint16_t* biases, int bits,
                                                             int group_size, int64_t n,
                                                             float* dst) {
  const uint8_t* c = static_cast<const uint8_t*>(codes);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i nibble = _mm256_set1_epi32(15);
  for (int64_t g = 0; g < n / group_size; ++g) {
    const __m256 s = _mm256_set1_ps(bf16_to_f32(scales[g]));
    const __m256 b = _mm256_set1_ps(bf16_to_f32(biases[g]));
    for (int64_t k = g * group_size; k < (g + 1) * group_size; k += 8) {
      __m256i q;
      if (bits == 4) {
        int32_t word;
        std::memcpy(&word, c + k / 2, 4);
        q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), nibble);
      } else {
        int64_t eight;
        std::memcpy(&eight, c + k, 8);
        q = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight));
      }
      _mm256_storeu_ps(dst + k, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b));
    }
  }
}

bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace
#endif

bool dequantize_row_vectorised() {
#ifdef LILAC_X86
  return cpu_has_avx2_fma();
#else
  return false;
#endif
}

void dequantize_row(const void* codes, const uint16_t* scales, const uint16_t* biases, int bits,
                    int group_size, int64_t n, float* dst) {
#ifdef LILAC_X86
  if (cpu_has_avx2_fma() && group_size % 8 == 0 && (bits == 4 || bits == 8))
    return dequantize_row_avx2(codes, scales, biases, bits, group_size, n, dst);
#endif
  dequantize_row_scalar(codes, scales, biases, bits, group_size, n, dst);
}

uint16_t double_to_bf16(double v) {
  const float f = float(v);  // round to nearest even in f32
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // The bf16 rounding of f equals that of v unless f is exactly a bf16 midpoint (the only f32
  // value that can lie between v and a bf16 rounding boundary is f itself): then v decides.
  if (double(f) != v && (u & 0xffffu) == 0x8000u)
    return std::fabs(v) > std::fabs(double(f)) ? uint16_t((u >> 16) + 1) : uint16_t(u >> 16);
  return f32_to_bf16(f);
}

// RNE_bf16(p + b) of the exact sum, p = s q exact in double (8 x 8 significant bits), b a bf16.
// The double sum is exact unless b is more than ~40 binades below p (or p below b); then it is
// the larger term, and the smaller one decides only where that term is a bf16 tie (p has up to
// 16 significant bits: it can be one). TwoSum gives the lost part; the sum is moved one double
// ulp towards it, onto a double that is neither a bf16 value nor a tie, which rounds as the exact
// sum does. (s49: bias 2^-133 with s q on a tie; the GPU's fma rounds the exact sum.)
static uint16_t sum_to_bf16(double p, double b) {
  const double sum = p + b, bv = sum - p;
  const double lost = (p - (sum - bv)) + (b - bv);
  if (lost == 0) return double_to_bf16(sum);
  return double_to_bf16(std::nextafter(sum, lost > 0 ? HUGE_VAL : -HUGE_VAL));
}

void dequantize_row_bf16(const void* codes, const uint16_t* scales, const uint16_t* biases,
                         int bits, int group_size, int64_t n, uint16_t* dst) {
  for_each_code(codes, scales, biases, bits, group_size, n,
                [&](int64_t k, uint32_t q, float s, float b) {
                  dst[k] = sum_to_bf16(double(s) * double(q), double(b));
                });
}

// Row r of an FP8 E4M3 matrix: fp8 * its block's scale, in f32 (the checkpoint's weight; one
// rounding, of the product).
static void widen_fp8_row(const Matrix& W, int64_t r, float* dst) {
  const uint8_t* q = W.row(r);
  const int64_t scale_cols = (W.cols + W.block_cols - 1) / W.block_cols;
  const int64_t s0 = (r / W.block_rows) * scale_cols;
  for (int64_t b = 0; b < scale_cols; ++b) {
    float s;
    widen_row(static_cast<const uint8_t*>(W.block_scale) +
                  size_t(s0 + b) * dtype_size(W.block_scale_dtype),
              W.block_scale_dtype, 1, &s);
    const int64_t c1 = std::min(W.cols, (b + 1) * W.block_cols);
    for (int64_t c = b * W.block_cols; c < c1; ++c) dst[c] = fp8_e4m3_to_f32(q[c]) * s;
  }
}

void widen_row(const Matrix& W, int64_t r, float* dst) {
  if (W.fp8()) return widen_fp8_row(W, r, dst);
  if (W.quantized())
    dequantize_row(W.row(r), W.row_scales(r), W.row_biases(r), W.bits, W.group_size, W.cols, dst);
  else
    widen_row(W.row(r), W.dtype, W.cols, dst);
}

bool has_quantized_weights(const ModelWeights& w) {
  bool any = w.embed.quantized() || w.lm_head.quantized();
  for (const auto& L : w.layers)
    L.for_each_matrix([&](const Matrix& m) { any = any || m.quantized(); });
  return any;
}

}  // namespace lilac
