// The Gated DeltaNet GPU checks' shapes, inputs, CPU twin and tolerances, without GoogleTest:
// shared by the conformance cases (tests/cuda/conformance/gated_deltanet.cpp) and the kernel lab
// (bench/lab/gdn_decode). The twin is cpu::causal_conv_silu, l2_norm, gdn_gates, gdn_recurrence
// (token by token) and gated_rms_norm composed as cpu_backend.cpp does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/gated_deltanet.h"
#include "cpu/norm.h"
#include "host_data.h"

namespace lilac::test {

struct GdnDims {
  const char* name;
  int Hk, Hv, Dk, Dv, K;
  int C() const { return 2 * Hk * Dk + Hv * Dv; }
  int P() const { return C() + Hv * Dv + 2 * Hv; }  // proj row: qkv, z, b, a
};
constexpr GdnDims kGdnReal{"real", 16, 32, 128, 128, 4};
constexpr GdnDims kGdnTiny{"tiny", 2, 4, 32, 32, 4};
// 4 value heads per key head, two column blocks per head, conv kernel 3: a full 8-block cluster
// whose q/k slices are spread over blocks of different value heads.
constexpr GdnDims kGdnWide{"wide", 2, 8, 128, 64, 3};
constexpr float kGdnEps = 1e-6f;

// Layer parameters. decay sets -exp(A_log) in [-decay, -0.2 decay]; with a ~ N(0, 1) and
// dt_bias ~ N(0, 0.5), g = -exp(A_log) softplus(a + dt_bias) lies in about [-2.5 decay, 0].
struct GdnParams {
  std::vector<float> taps, neg_exp_A, dt_bias, norm_w;
};
inline GdnParams make_gdn_params(const GdnDims& d, float decay, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  GdnParams p;
  p.taps = random_floats(size_t(d.C()) * d.K, 0.5f, seed + 1);
  p.neg_exp_A.resize(size_t(d.Hv));
  for (auto& x : p.neg_exp_A) x = -decay * (0.2f + 0.8f * u01(rng));
  p.dt_bias = random_floats(size_t(d.Hv), 0.5f, seed + 2);
  p.norm_w = random_floats(size_t(d.Dv), 0.1f, seed + 3);
  for (auto& x : p.norm_w) x += 1.f;
  return p;
}

// The starting conv state [K-1, C] and recurrent state [Hv, Dk, Dv]: random, or zero (a fresh
// sequence).
struct GdnStart {
  std::vector<float> conv, state;
};
inline GdnStart random_gdn_start(const GdnDims& d, bool zero_state, uint32_t seed) {
  GdnStart s;
  s.conv = random_floats(size_t(d.K - 1) * d.C(), 1.f, seed);
  s.state = random_floats(size_t(d.Hv) * d.Dk * d.Dv, 0.3f, seed + 1);
  if (zero_state) {
    std::fill(s.conv.begin(), s.conv.end(), 0.f);
    std::fill(s.state.begin(), s.state.end(), 0.f);
  }
  return s;
}

// The CPU twin, as CpuBackend::gated_deltanet after the in_proj matmuls: proj [T, P] -> out
// [T, Hv*Dv] (f32), conv_state and state updated.
inline std::vector<float> cpu_gdn(const std::vector<float>& proj, int T, const GdnDims& d,
                                  const GdnParams& w, std::vector<float>& conv_state,
                                  std::vector<float>& state) {
  const int C = d.C(), P = d.P(), QK = d.Hk * d.Dk, V = d.Hv * d.Dv;
  std::vector<float> qkv(size_t(T) * C), z(size_t(T) * V), a(size_t(T) * d.Hv), b(size_t(T) * d.Hv);
  for (int t = 0; t < T; ++t) {
    const float* row = &proj[size_t(t) * P];
    std::copy(row, row + C, &qkv[size_t(t) * C]);
    std::copy(row + C, row + C + V, &z[size_t(t) * V]);
    std::copy(row + C + V, row + C + V + d.Hv, &b[size_t(t) * d.Hv]);
    std::copy(row + C + V + d.Hv, row + C + V + 2 * d.Hv, &a[size_t(t) * d.Hv]);
  }
  std::vector<float> conv(size_t(T) * C);
  cpu::causal_conv_silu(qkv.data(), T, C, d.K, w.taps.data(), conv_state.data(), conv.data());
  std::vector<float> q(size_t(T) * QK), k(size_t(T) * QK), v(size_t(T) * V);
  for (int t = 0; t < T; ++t) {
    const float* c = &conv[size_t(t) * C];
    std::copy(c, c + QK, &q[size_t(t) * QK]);
    std::copy(c + QK, c + 2 * QK, &k[size_t(t) * QK]);
    std::copy(c + 2 * QK, c + 2 * QK + V, &v[size_t(t) * V]);
  }
  for (int i = 0; i < T * d.Hk; ++i) {
    cpu::l2_norm(&q[size_t(i) * d.Dk], d.Dk, 1e-6f, 1.f / std::sqrt(float(d.Dk)));
    cpu::l2_norm(&k[size_t(i) * d.Dk], d.Dk, 1e-6f, 1.f);
  }
  std::vector<float> g(size_t(T) * d.Hv), beta(g.size());
  cpu::gdn_gates(a.data(), b.data(), T, d.Hv, w.neg_exp_A.data(), w.dt_bias.data(), g.data(),
                 beta.data());
  std::vector<float> core(size_t(T) * V);
  cpu::gdn_recurrence(q.data(), k.data(), v.data(), g.data(), beta.data(), T, d.Hk, d.Hv, d.Dk,
                      d.Dv, state.data(), core.data(), twin_pool());
  for (int i = 0; i < T * d.Hv; ++i)
    cpu::gated_rms_norm(&core[size_t(i) * d.Dv], &z[size_t(i) * d.Dv], w.norm_w.data(), d.Dv,
                        kGdnEps, &core[size_t(i) * d.Dv]);
  return core;
}

// Tolerances. Output: bf16 of values of order 1 (half an ulp = 2^-9 relative) over f32 noise.
// State: f32, the chunked prefill reassociates sums (and the GPU's expf / rsqrtf differ from the
// CPU's by an ulp or two): 1e-4 of the state's scale. Conv state: copied values, exact.
constexpr AtolRtol kGdnOutTolerance{1e-3, 8e-3};
inline AtolRtol gdn_state_tolerance(const std::vector<float>& want_state) {
  return {1e-4 * std::max(1e-3, max_abs(want_state)), 1e-4};
}
constexpr AtolRtol kGdnConvStateTolerance{0, 0};

// ---- decode: one token, 4 steps from a random start ---------------------------------------------

// The decode cases: the real dims, strong (2) and mild (0.02, long memory) decay; tiny-a's; and
// the wide dims (a full 8-block cluster).
struct GdnDecodeCase {
  GdnDims d;
  float decay;
};
inline std::vector<GdnDecodeCase> gdn_decode_cases() {
  return {{kGdnReal, 2.f}, {kGdnReal, 0.02f}, {kGdnTiny, 2.f}, {kGdnWide, 1.f}};
}
constexpr int kGdnDecodeSteps = 4;

// The inputs of a decode case: parameters, start (random_gdn_start(d, false, seed + 10)) and the
// projection row of each step (random_floats(P, 1, seed + 100 + step)), seed from the dims and
// decay.
inline uint32_t gdn_decode_seed(const GdnDecodeCase& c) {
  return uint32_t(c.d.Dk * 17 + c.d.Hv + int(c.decay * 100));
}
inline GdnParams gdn_decode_params(const GdnDecodeCase& c) {
  return make_gdn_params(c.d, c.decay, gdn_decode_seed(c));
}
inline GdnStart gdn_decode_start(const GdnDecodeCase& c) {
  return random_gdn_start(c.d, false, gdn_decode_seed(c) + 10);
}
inline std::vector<float> gdn_decode_proj(const GdnDecodeCase& c, int step) {
  return random_floats(size_t(c.d.P()), 1.f, gdn_decode_seed(c) + 100 + uint32_t(step));
}

}  // namespace lilac::test
