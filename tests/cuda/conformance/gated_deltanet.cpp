// Conformance cases of the GPU Gated DeltaNet kernels against the CPU twin: cpu::causal_conv_silu,
// l2_norm, gdn_gates, gdn_recurrence (token by token) and gated_rms_norm composed as
// cpu_backend.cpp does. Real shapes (Hk 16, Hv 32, Dk = Dv = 128, K 4) and tiny-a shapes (Hk 2, Hv
// 4, Dk = Dv = 32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "conformance.h"
#include "cpu/gated_deltanet.h"
#include "cpu/norm.h"
#include "cuda/gated_deltanet.h"
#include "util/thread_pool.h"

namespace lilac::test {
namespace {

struct GdnDims {
  const char* name;
  int Hk, Hv, Dk, Dv, K;
  int C() const { return 2 * Hk * Dk + Hv * Dv; }
  int P() const { return C() + Hv * Dv + 2 * Hv; }  // proj row: qkv, z, b, a
};
constexpr GdnDims kReal{"real", 16, 32, 128, 128, 4};
constexpr GdnDims kTiny{"tiny", 2, 4, 32, 32, 4};
// 4 value heads per key head, two column blocks per head, conv kernel 3: a full 8-block cluster
// whose q/k slices are spread over blocks of different value heads.
constexpr GdnDims kWide{"wide", 2, 8, 128, 64, 3};
constexpr float kEps = 1e-6f;

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Layer parameters. decay sets -exp(A_log) in [-decay, -0.2 decay]; with a ~ N(0, 1) and
// dt_bias ~ N(0, 0.5), g = -exp(A_log) softplus(a + dt_bias) lies in about [-2.5 decay, 0].
struct GdnParams {
  std::vector<float> taps, neg_exp_A, dt_bias, norm_w;
};
GdnParams make_params(const GdnDims& d, float decay, uint32_t seed) {
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

// The CPU twin, as CpuBackend::gated_deltanet after the in_proj matmuls: proj [T, P] -> out
// [T, Hv*Dv] (f32), conv_state and state updated.
std::vector<float> cpu_gdn(const std::vector<float>& proj, int T, const GdnDims& d,
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
                      d.Dv, state.data(), core.data(), pool());
  for (int i = 0; i < T * d.Hv; ++i)
    cpu::gated_rms_norm(&core[size_t(i) * d.Dv], &z[size_t(i) * d.Dv], w.norm_w.data(), d.Dv, kEps,
                        &core[size_t(i) * d.Dv]);
  return core;
}

// The GPU side of one layer: weights, states and workspaces on the device.
struct GpuGdn {
  GdnDims d;
  cuda::DeviceBuffer<float> taps, neg_exp_A, dt_bias, norm_w, conv_state, state, pre_ws;
  int pre_ws_T = 0;

  GpuGdn(const GdnDims& dims, const GdnParams& w, const std::vector<float>& conv0,
         const std::vector<float>& state0)
      : d(dims),
        taps(upload(w.taps)),
        neg_exp_A(upload(w.neg_exp_A)),
        dt_bias(upload(w.dt_bias)),
        norm_w(upload(w.norm_w)),
        conv_state(upload(conv0)),
        state(upload(state0)) {}

  std::vector<float> decode(const std::vector<float>& proj_row) {
    auto d_proj = upload(proj_row);
    cuda::DeviceBuffer<cuda::bf16> out(size_t(d.Hv) * d.Dv);
    poison(out);
    cuda::gdn_decode(d_proj.get(), taps.get(), conv_state.get(), neg_exp_A.get(), dt_bias.get(),
                     norm_w.get(), state.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K, kEps, out.get(),
                     nullptr);
    return download_bf16_as_f32(out);
  }

  std::vector<float> prefill(const std::vector<float>& proj, int T) {
    auto d_proj = upload(proj);
    cuda::DeviceBuffer<float> ws(cuda::gdn_prefill_workspace_floats(T, d.Hk, d.Hv, d.Dk, d.Dv));
    poison(ws);  // nothing read from the workspace may come from before the launch
    cuda::DeviceBuffer<cuda::bf16> out(size_t(T) * d.Hv * d.Dv);
    poison(out);
    cuda::gdn_prefill(d_proj.get(), T, taps.get(), conv_state.get(), neg_exp_A.get(), dt_bias.get(),
                      norm_w.get(), state.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K, kEps, ws.get(),
                      out.get(), nullptr);
    return download_bf16_as_f32(out);
  }
};

// Tolerances. Output: bf16 of values of order 1 (half an ulp = 2^-9 relative) over f32 noise.
// State: f32, the chunked prefill reassociates sums (and the GPU's expf / rsqrtf differ from the
// CPU's by an ulp or two): 1e-4 of the state's scale. Conv state: copied values, exact.
::testing::AssertionResult out_close(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::string& w) {
  return within(got, want, 1e-3, 8e-3, w + " out");
}
::testing::AssertionResult state_close(const std::vector<float>& got,
                                       const std::vector<float>& want, const std::string& w) {
  return within(got, want, 1e-4 * std::max(1e-3, max_abs(want)), 1e-4, w + " state");
}

struct Start {
  std::vector<float> conv, state;
};
Start random_start(const GdnDims& d, bool zero_state, uint32_t seed) {
  Start s;
  s.conv = random_floats(size_t(d.K - 1) * d.C(), 1.f, seed);
  s.state = random_floats(size_t(d.Hv) * d.Dk * d.Dv, 0.3f, seed + 1);
  if (zero_state) {
    std::fill(s.conv.begin(), s.conv.end(), 0.f);
    std::fill(s.state.begin(), s.state.end(), 0.f);
  }
  return s;
}

std::string tag(const GdnDims& d, const char* what, int a, float decay) {
  return std::string(d.name) + " " + what + " " + std::to_string(a) + " decay " +
         std::to_string(decay);
}

// ---- decode
// ---------------------------------------------------------------------------------------

// The one decode kernel (the cluster kernel; version 1, the counter kernel, is in bench/lab).
struct DecodeCase {
  GdnDims d;
  float decay;
};

void check_gdn_decode(const DecodeCase& c) {
  const auto [d, decay] = c;
  if (!cuda::gdn_decode_uses_cluster(d.Hk, d.Hv, d.Dk, d.Dv))
    GTEST_SKIP() << "no cluster path on this device";
  const uint32_t seed = uint32_t(d.Dk * 17 + d.Hv + int(decay * 100));
  const GdnParams w = make_params(d, decay, seed);
  Start cpu = random_start(d, false, seed + 10);
  GpuGdn gpu(d, w, cpu.conv, cpu.state);
  for (int step = 0; step < 4; ++step) {
    const std::string l = tag(d, "decode step", step, decay);
    const std::vector<float> proj = random_floats(size_t(d.P()), 1.f, seed + 100 + uint32_t(step));
    const auto out = gpu.decode(proj);
    const auto want = cpu_gdn(proj, 1, d, w, cpu.conv, cpu.state);
    EXPECT_TRUE(out_close(out, want, l));
    EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
    EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, 0, 0, l + " conv state"));
  }
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> c;
  c.push_back({kReal, 2.f});
  c.push_back({kReal, 0.02f});
  c.push_back({kTiny, 2.f});
  c.push_back({kWide, 1.f});
  return c;
}

// The real model and tiny-a take the cluster kernel on an H100/H200.
TEST(GdnDecodePathChoice, RealAndTinyUseClusters) {
  LILAC_REQUIRE_GPU();
  int major = 0, minor = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major * 10 + minor != 90) GTEST_SKIP() << "not a compute capability 9.0 device";
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kReal.Hk, kReal.Hv, kReal.Dk, kReal.Dv));
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kTiny.Hk, kTiny.Hv, kTiny.Dk, kTiny.Dv));
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kWide.Hk, kWide.Hv, kWide.Dk, kWide.Dv));
  EXPECT_FALSE(cuda::gdn_decode_uses_cluster(16, 32, 128, 256));  // 16 blocks per key head
}

// ---- prefill
// --------------------------------------------------------------------------------------

struct PrefillCase {
  GdnDims d;
  int T;
  float decay;
  bool zero_start;
};

void check_gdn_prefill(const PrefillCase& c) {
  const auto [d, T, decay, zero_start] = c;
  const uint32_t seed = uint32_t(T * 101 + d.Dk + int(decay * 100));
  const GdnParams w = make_params(d, decay, seed);
  Start cpu = random_start(d, zero_start, seed + 10);
  GpuGdn gpu(d, w, cpu.conv, cpu.state);
  const std::vector<float> proj = random_floats(size_t(T) * d.P(), 1.f, seed + 20);
  const auto out = gpu.prefill(proj, T);
  const auto want = cpu_gdn(proj, T, d, w, cpu.conv, cpu.state);
  const std::string l = tag(d, "prefill T", T, decay);
  EXPECT_TRUE(out_close(out, want, l));
  EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
  EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, 0, 0, l + " conv state"));
}

std::vector<PrefillCase> prefill_cases() {
  std::vector<PrefillCase> c;
  for (const GdnDims& d : {kReal, kTiny})
    for (int T : {1, 2, 3, 17, 64, 65, 200, 1000}) c.push_back({d, T, 2.f, false});
  for (int T : {65, 1000}) c.push_back({kReal, T, 0.02f, false});  // long memory
  c.push_back({kReal, 130, 2.f, true});                            // a fresh sequence
  c.push_back({kTiny, 130, 0.02f, true});
  return c;
}

// ---- prefill in two calls, then decode: the state carried between launchers
// ----------------------

void check_gdn_chain(const GdnDims& d) {
  const uint32_t seed = 777u + uint32_t(d.Dk);
  const GdnParams w = make_params(d, 1.f, seed);
  Start cpu = random_start(d, true, seed + 10);
  GpuGdn gpu(d, w, cpu.conv, cpu.state);
  int pos = 0;
  for (int T : {100, 37, 1, 1, 1}) {
    const std::string l = tag(d, "chain at", pos, 1.f) + " T " + std::to_string(T);
    const std::vector<float> proj =
        random_floats(size_t(T) * d.P(), 1.f, seed + 20 + uint32_t(pos));
    const auto out = T > 1 ? gpu.prefill(proj, T) : gpu.decode(proj);
    const auto want = cpu_gdn(proj, T, d, w, cpu.conv, cpu.state);
    EXPECT_TRUE(out_close(out, want, l));
    EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
    EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, 0, 0, l + " conv state"));
    pos += T;
  }
  // A one-token prefill is the same function as a decode step.
  const std::vector<float> proj = random_floats(size_t(d.P()), 1.f, seed + 999);
  const auto out = gpu.prefill(proj, 1);
  const auto want = cpu_gdn(proj, 1, d, w, cpu.conv, cpu.state);
  EXPECT_TRUE(out_close(out, want, tag(d, "chain prefill T=1 at", pos, 1.f)));
  EXPECT_TRUE(
      state_close(download(gpu.state), cpu.state, tag(d, "chain prefill T=1 at", pos, 1.f)));
}

std::string dims_name(const GdnDims& d) {
  return std::string(d.name) + "_Hk" + std::to_string(d.Hk) + "_Hv" + std::to_string(d.Hv) + "_Dk" +
         std::to_string(d.Dk) + "_Dv" + std::to_string(d.Dv) + "_K" + std::to_string(d.K);
}

// The real dims (Hk 16, Hv 32, Dk = Dv = 128, K 4), tiny-a's (Hk 2, Hv 4, Dk = Dv = 32) and a
// wide one (a full 8-block cluster); decay "strong" (2) or "mild" (0.02, long memory; 1 for wide).
LILAC_CONFORMANCE_CASES(gated_deltanet) {
  std::vector<OpCase> cases;
  const char* twin =
      "cpu::causal_conv_silu + l2_norm + gdn_gates + gdn_recurrence + gated_rms_norm";
  for (const DecodeCase& c : decode_cases())
    cases.push_back({"gdn_decode",
                     dims_name(c.d) + (c.decay > 1.f ? "_strong" : "_mild") + "_4steps_cluster",
                     "f32", twin, [c] { check_gdn_decode(c); }});
  for (const PrefillCase& c : prefill_cases())
    cases.push_back({"gdn_prefill",
                     dims_name(c.d) + "_T" + std::to_string(c.T) +
                         (c.decay > 1.f ? "_strong" : "_mild") + (c.zero_start ? "_fresh" : ""),
                     "f32", twin, [c] { check_gdn_prefill(c); }});
  // Prefill 100 and 37 tokens, 3 decode steps, then a one-token prefill.
  for (const GdnDims& d : {kReal, kTiny, kWide})
    cases.push_back({"gdn_chain", dims_name(d) + "_T100_37_decode3_prefill1", "f32", twin,
                     [d] { check_gdn_chain(d); }});
  return cases;
}

}  // namespace
}  // namespace lilac::test
