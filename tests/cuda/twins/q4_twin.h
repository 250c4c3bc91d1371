// The 4-bit (and 8-bit) matrices of the GPU checks, without GoogleTest (shared by the conformance
// registry and the kernel lab): an MLX-quantized matrix on the host (codes / scales / biases from
// lilac::mlx_quantize_row, the CPU quantizer) with its device copy in the tiled layout, the CPU
// twin of q_gemv (dequantize_row + cpu::matmul) and the error bound of the q4 kernels' arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/linear.h"
#include "cuda/q4_layout.h"
#include "cuda/q4_quantize.h"
#include "host_data.h"
#include "model/mlx_affine.h"
#include "model/weight_rows.h"
#include "model/weights.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::test {

// W [rows, cols] uniform in [-a, a) rounded to bf16, quantized per row by the CPU quantizer;
// the device copy is repacked on the GPU (cuda::repack_mlx, checked element by element in
// conformance/q4_quantize.cpp).
struct HostQ {
  int64_t rows = 0, cols = 0;
  int bits = 4;
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
  cuda::DeviceBuffer<uint32_t> d_codes, d_sb;

  HostQ(int64_t r, int64_t c, int b, float a, uint64_t seed) : rows(r), cols(c), bits(b) {
    const int64_t G = cols / 64, wpr = cols * bits / 32;
    codes.resize(size_t(rows * wpr));
    scales.resize(size_t(rows * G));
    biases.resize(size_t(rows * G));
    ThreadPool::global().parallel_for(size_t(rows), [&](size_t b0, size_t e0) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (size_t i = b0; i < e0; ++i) {
        for (int64_t j = 0; j < cols; ++j)
          row[size_t(j)] = round_to_bf16(hash_uniform(seed, i * size_t(cols) + size_t(j), a));
        mlx_quantize_row(row.data(), cols, bits, 64, &codes[i * size_t(wpr)],
                         &scales[i * size_t(G)], &biases[i * size_t(G)]);
      }
    });
    upload_tiled();
  }

  void upload_tiled() {
    auto dc = upload(codes);
    auto ds = upload(scales);
    auto db = upload(biases);
    d_codes.resize(cuda::q_code_words(rows, cols, bits));
    d_sb.resize(cuda::q_sb_words(rows, cols));
    cuda::repack_mlx(dc.get(), ds.get(), db.get(), rows, int(cols), bits, d_codes.get(), d_sb.get(),
                     nullptr);
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    small_scales = cuda::q_scales_below_half(d_sb.get(), d_sb.size());
  }

  // As the engine builds it (device_model.cpp): small_scales from the scan of the scales.
  bool small_scales = false;
  cuda::QMatrix q() const {
    cuda::QMatrix m{d_codes.get(), d_sb.get(), int(rows), int(cols), bits};
    m.small_scales = small_scales;
    return m;
  }

  // Rows [row0, row0 + n) as the CPU twins read them.
  Matrix view(int64_t row0, int64_t n) const {
    const int64_t G = cols / 64;
    Matrix m{codes.data() + size_t(row0 * cols * bits / 32), DType::U32, n, cols, "test"};
    m.bits = bits;
    m.group_size = 64;
    m.scales = scales.data() + size_t(row0 * G);
    m.biases = biases.data() + size_t(row0 * G);
    return m;
  }

  // Row r dequantised in f32 (dequantize_row) and as the prefill kernels' bf16 weights.
  std::vector<float> row_f32(int64_t r) const {
    std::vector<float> out(static_cast<size_t>(cols));
    widen_row(view(r, 1), 0, out.data());
    return out;
  }
  // All rows as bf16 bits (dequantize_row_bf16).
  std::vector<uint16_t> dequant_bf16() const {
    std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
    const Matrix m = view(0, rows);
    ThreadPool::global().parallel_for(size_t(rows), [&](size_t b0, size_t e0) {
      for (size_t r = b0; r < e0; ++r)
        dequantize_row_bf16(m.row(int64_t(r)), m.row_scales(int64_t(r)), m.row_biases(int64_t(r)),
                            bits, 64, cols, &out[r * size_t(cols)]);
    });
    return out;
  }
};

// Bound of |q_gemv(W, x)[r] - twin[r]| for rows [row0, row0 + n) (twin: dequantize_row +
// cpu::matmul on the bf16 x). With u = 2^-24 and A = sum_k |w_k x_k|: the twin's f32 sum is off by
// at most (K/16 + 16) u A; the kernel's y adds 2 terms per group (2G additions) and per group
// sum_k (offset + q_k) x_k on the tensor core (4 MMA steps, possible truncation: 2u each, on
// partial sums up to Cmax * sum_{k in g} |x_k|, Cmax = 143 at 4 bits, 2431 at 8), then s * C and
// (b - offset s) * Sx (one rounding each, |b - offset s| <= |b| + offset |s|). Bound:
//   u [2 (K/16 + 2G + 32) A + 16 sum_g (Cmax |s_g| + |b_g|) sum_{k in g} |x_k|].
// For H = 2048 random data that is ~0.3% of a typical output, and below the change one wrong code
// makes (|s x| ~ 0.6%).
inline std::vector<double> q_gemv_tolerance(const HostQ& W, int64_t row0, int64_t n,
                                            const std::vector<float>& x) {
  const int64_t K = W.cols, G = K / 64;
  const double u = std::ldexp(1.0, -24), cmax = W.bits == 4 ? 143 : 2431;
  std::vector<double> sabs(static_cast<size_t>(G), 0.0);
  for (int64_t k = 0; k < K; ++k) sabs[size_t(k / 64)] += std::fabs(x[size_t(k)]);
  std::vector<double> tol(static_cast<size_t>(n));
  ThreadPool::global().parallel_for(size_t(n), [&](size_t b0, size_t e0) {
    for (size_t i = b0; i < e0; ++i) {
      const int64_t r = row0 + int64_t(i);
      const std::vector<float> w = W.row_f32(r);
      double A = 0, B = 0;
      for (int64_t k = 0; k < K; ++k) A += std::fabs(double(w[size_t(k)]) * x[size_t(k)]);
      for (int64_t g = 0; g < G; ++g)
        B += (cmax * std::fabs(bf16_to_f32(W.scales[size_t(r * G + g)])) +
              std::fabs(bf16_to_f32(W.biases[size_t(r * G + g)]))) *
             sabs[size_t(g)];
      tol[i] = u * (2.0 * (double(K) / 16 + 2.0 * double(G) + 32) * A + 16 * B) + 1e-30;
    }
  });
  return tol;
}

// Host matmul of rows [row0, row0 + n) of W (dequantised f32) with x: the twin of q_gemv.
inline std::vector<float> q_twin(const HostQ& W, int64_t row0, int64_t n,
                                 const std::vector<float>& x) {
  std::vector<float> y(static_cast<size_t>(n));
  cpu::matmul(W.view(row0, n), x.data(), 1, W.cols, y.data(), n, ThreadPool::global());
  return y;
}

}  // namespace lilac::test
