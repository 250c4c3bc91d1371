// The 4-bit grouped MoE prefill kernels' inputs and CPU twin, without GoogleTest (the
// conformance case q_moe_prefill, tests/cuda/conformance/q4_moe.cpp, and the kernel lab's
// q_moe_grouped): expert stacks quantized by the CPU quantizer, router logits, and per sorted row
// the double-precision twin of q_moe_grouped_gate_up / q_moe_grouped_down on the bf16 weights the
// kernels multiply (dequantize_row_bf16) with the conformance test's bounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "gemm_twin.h"
#include "host_data.h"
#include "model/weight_rows.h"
#include "q4_twin.h"

namespace lilac::test {

// The routed experts' stacks of the conformance test's QMoe: gate_up [E * 2I, H] (per expert I
// gate rows then I up rows), down [E * H, I], W uniform in +-sqrt(3 / K) (seeds seed, seed + 1).
struct QMoeExperts {
  int H, E, I;
  HostQ gu, dn;
  QMoeExperts(int h, int e, int i, int bits, uint64_t seed)
      : H(h),
        E(e),
        I(i),
        gu(int64_t(e) * 2 * i, h, bits, std::sqrt(3.f / float(h)), seed),
        dn(int64_t(e) * h, i, bits, std::sqrt(3.f / float(i)), seed + 1) {}
};

// Router logits [T, E + 1] uniform in +-3 (the conformance test's: hash_uniform(seed + 7, i, 3)).
inline std::vector<float> moe_router_logits(int T, int E, uint64_t seed) {
  std::vector<float> logits(static_cast<size_t>(T) * size_t(E + 1));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = hash_uniform(seed + 7, i, 3.f);
  return logits;
}

// Rows [row0, row0 + n) of W as the prefill kernels' bf16 weights (dequantize_row_bf16).
inline std::vector<uint16_t> dequant_rows_bf16(const HostQ& W, int64_t row0, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n * W.cols));
  const Matrix m = W.view(row0, n);
  for (int64_t r = 0; r < n; ++r)
    dequantize_row_bf16(m.row(r), m.row_scales(r), m.row_biases(r), W.bits, 64, W.cols,
                        &out[size_t(r * W.cols)]);
  return out;
}

inline double dot_bf16_f64(const uint16_t* w, const float* a, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(bf16_to_f32(w[i])) * a[i];
  return s;
}

inline double norm_bf16_f64(const uint16_t* w, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(bf16_to_f32(w[i])) * bf16_to_f32(w[i]);
  return std::sqrt(s);
}

// One act element: g = gate . x, u = up . x (f64), want = silu(g) u; the bound covers both dots'
// f32 summation (dot_tolerance(H)) moved through silu(g) u (<= 1.1 (|u| tol_g + |silu(g)| tol_u))
// and the final bf16 rounding (|v| / 256). gw, uw: the bf16 gate and up rows; xn = ||x||.
struct TwinValue {
  double want, tol;
};
inline TwinValue moe_act_twin(const uint16_t* gw, const uint16_t* uw, const float* x, int H,
                              double xn) {
  const double dtH = dot_tolerance(int64_t(H));
  const double g = dot_bf16_f64(gw, x, H), u = dot_bf16_f64(uw, x, H);
  const double silu = g / (1 + std::exp(-g)), v = silu * u;
  return {v, 1.1 * (std::fabs(u) * dtH * norm_bf16_f64(gw, H) * xn +
                    std::fabs(silu) * dtH * norm_bf16_f64(uw, H) * xn) +
                 std::fabs(v) * (1.0 / 256 + 1e-6) + 1e-30};
}

// One y element: down row dw (bf16) . act row a (the GPU's bf16 act, widened), an = ||a||.
inline TwinValue moe_down_twin(const uint16_t* dw, const float* a, int I, double an) {
  return {dot_bf16_f64(dw, a, I), dot_tolerance(int64_t(I)) * norm_bf16_f64(dw, I) * an + 1e-30};
}

}  // namespace lilac::test
