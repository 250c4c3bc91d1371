// gdn_decode in the kernel lab: every version on the same inputs, checked against the CPU twin
// (cpu/gated_deltanet.cpp and cpu/norm.cpp composed as the CPU backend composes them) for 4 decode
// steps at three shapes, then timed at the real shape as lilac_cuda_bench_seq timed it: a graph of
// 30 launches rotating over 30 layers' states (as in a decode step, a layer's state is not in L2),
// median per launch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../lab.h"
#include "cpu/gated_deltanet.h"
#include "cpu/norm.h"
#include "cuda/gated_deltanet.h"
#include "cuda/synthetic_fill.h"
#include "gdn_decode_lab.h"
#include "util/thread_pool.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

struct Dims {
  const char* name;
  int Hk, Hv, Dk, Dv, K;
  int C() const { return 2 * Hk * Dk + Hv * Dv; }
  int P() const { return C() + Hv * Dv + 2 * Hv; }
};
constexpr Dims kReal{"real", 16, 32, 128, 128, 4};
constexpr Dims kTiny{"tiny", 2, 4, 32, 32, 4};
// 4 value heads per key head, two column blocks per head, conv kernel 3.
constexpr Dims kWide{"wide", 2, 8, 128, 64, 3};
constexpr float kEps = 1e-6f;

using Launch = void (*)(const GdnDecodeArgs&, cudaStream_t);

void v2_cluster(const GdnDecodeArgs& a, cudaStream_t s) {
  cuda::gdn_decode(a.proj, a.taps, a.conv_state, a.neg_exp_A, a.dt_bias, a.norm_w, a.state, a.Hk,
                   a.Hv, a.Dk, a.Dv, a.K, a.eps, a.out, s);
}

Launch launcher(int version) {
  return version == 1 ? gdn_decode_v1_counter : v2_cluster;
}

bool available(int version, const Dims& d) {
  return version == 1 || cuda::gdn_decode_uses_cluster(d.Hk, d.Hv, d.Dk, d.Dv);
}

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

struct Params {
  std::vector<float> taps, neg_exp_A, dt_bias, norm_w;
};
// decay sets -exp(A_log) in [-decay, -0.2 decay]: strong and mild forgetting.
Params make_params(const Dims& d, float decay, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  Params p;
  p.taps = random_floats(size_t(d.C()) * d.K, 0.5f, seed + 1);
  p.neg_exp_A.resize(size_t(d.Hv));
  for (auto& x : p.neg_exp_A) x = -decay * (0.2f + 0.8f * u01(rng));
  p.dt_bias = random_floats(size_t(d.Hv), 0.5f, seed + 2);
  p.norm_w = random_floats(size_t(d.Dv), 0.1f, seed + 3);
  for (auto& x : p.norm_w) x += 1.f;
  return p;
}

// The CPU twin of one token: proj [P] -> out [Hv*Dv] (f32); conv_state and state updated.
std::vector<float> cpu_step(const std::vector<float>& proj, const Dims& d, const Params& w,
                            std::vector<float>& conv_state, std::vector<float>& state) {
  const int C = d.C(), QK = d.Hk * d.Dk, V = d.Hv * d.Dv;
  std::vector<float> conv(static_cast<size_t>(C));
  cpu::causal_conv_silu(proj.data(), 1, C, d.K, w.taps.data(), conv_state.data(), conv.data());
  std::vector<float> q(conv.begin(), conv.begin() + QK),
      k(conv.begin() + QK, conv.begin() + 2 * QK),
      v(conv.begin() + 2 * QK, conv.begin() + 2 * QK + V);
  for (int h = 0; h < d.Hk; ++h) {
    cpu::l2_norm(&q[size_t(h) * d.Dk], d.Dk, 1e-6f, 1.f / std::sqrt(float(d.Dk)));
    cpu::l2_norm(&k[size_t(h) * d.Dk], d.Dk, 1e-6f, 1.f);
  }
  const float* z = proj.data() + C;
  const float* b = z + V;
  const float* a = b + d.Hv;
  std::vector<float> g(size_t(d.Hv)), beta(g.size());
  cpu::gdn_gates(a, b, 1, d.Hv, w.neg_exp_A.data(), w.dt_bias.data(), g.data(), beta.data());
  std::vector<float> core(static_cast<size_t>(V));
  cpu::gdn_recurrence(q.data(), k.data(), v.data(), g.data(), beta.data(), 1, d.Hk, d.Hv, d.Dk,
                      d.Dv, state.data(), core.data(), pool());
  for (int h = 0; h < d.Hv; ++h)
    cpu::gated_rms_norm(&core[size_t(h) * d.Dv], z + size_t(h) * d.Dv, w.norm_w.data(), d.Dv, kEps,
                        &core[size_t(h) * d.Dv]);
  return core;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Four decode steps of `version` from a random state, against the CPU twin. Output: bf16 of
// values of order 1 (atol 1e-3, rtol 8e-3); state: f32, 1e-4 of its scale; conv state: copies,
// exact. (The tolerances of tests/cuda/gated_deltanet_test.cpp.)
bool check(int version, const Dims& d, float decay) {
  const uint32_t seed = uint32_t(d.Dk * 17 + d.Hv + int(decay * 100));
  const Params w = make_params(d, decay, seed);
  std::vector<float> conv = random_floats(size_t(d.K - 1) * d.C(), 1.f, seed + 10),
                     state = random_floats(size_t(d.Hv) * d.Dk * d.Dv, 0.3f, seed + 11);
  auto taps = upload(w.taps), nA = upload(w.neg_exp_A), dtb = upload(w.dt_bias),
       nw = upload(w.norm_w), d_conv = upload(conv), d_state = upload(state);
  DeviceBuffer<float> ws(gdn_decode_v1_workspace_floats(d.Hk, d.Hv, d.Dv));
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
  DeviceBuffer<bf16> out(size_t(d.Hv) * d.Dv);
  Error e_out, e_state, e_conv;
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> proj = random_floats(size_t(d.P()), 1.f, seed + 100 + uint32_t(step));
    auto d_proj = upload(proj);
    LILAC_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));  // NaN: every element is written
    const GdnDecodeArgs a{d_proj.get(), taps.get(),    d_conv.get(), nA.get(),  dtb.get(),
                          nw.get(),     d_state.get(), d.Hk,         d.Hv,      d.Dk,
                          d.Dv,         d.K,           kEps,         out.get(), ws.get()};
    launcher(version)(a, nullptr);
    const std::vector<float> want = cpu_step(proj, d, w, conv, state);
    merge(e_out, compare(download_bf16(out), want, 1e-3, 8e-3));
    merge(e_state, compare(download(d_state), state, 1e-4 * std::max(1e-3, max_abs(state)), 1e-4));
    merge(e_conv, compare(download(d_conv), conv, 0, 0));
  }
  const std::string l =
      std::string(d.name) + " decay " + std::to_string(decay).substr(0, 4) + ", 4 steps";
  bool ok = report_check(l + ": out", e_out);
  ok = report_check(l + ": state", e_state) && ok;
  return report_check(l + ": conv state", e_conv) && ok;
}

// The real shape, 30 layers' states and projections rotating, one graph of 30 launches.
void time_real(const Options& opt, int version) {
  const Dims d = kReal;
  const int layers = 30, C = d.C(), P = d.P();
  uint64_t key = 1;
  auto filled = [&](size_t n, float centre, float a) {
    DeviceBuffer<float> b(n);
    cuda::fill_synthetic_f32(b.get(), n, key++, centre, a, nullptr);
    return b;
  };
  struct Layer {
    DeviceBuffer<float> taps, neg_exp_A, dt_bias, norm_w, conv, state, proj;
  };
  std::vector<Layer> L;
  for (int l = 0; l < layers; ++l)
    L.push_back(Layer{filled(size_t(C) * d.K, 0.f, 0.5f), filled(size_t(d.Hv), -1.f, 0.5f),
                      filled(size_t(d.Hv), 0.f, 0.5f), filled(size_t(d.Dv), 1.f, 0.1f),
                      filled(size_t(d.K - 1) * C, 0.f, 1.f),
                      filled(size_t(d.Hv) * d.Dk * d.Dv, 0.f, 0.3f), filled(size_t(P), 0.f, 1.7f)});
  DeviceBuffer<float> ws(gdn_decode_v1_workspace_floats(d.Hk, d.Hv, d.Dv));
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
  DeviceBuffer<bf16> out(size_t(d.Hv) * d.Dv);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Launch launch = launcher(version);
  const double us = graph_us(s, opt.runs, layers, [&](int i) {
    Layer& y = L[size_t(i % layers)];
    const GdnDecodeArgs a{y.proj.get(),
                          y.taps.get(),
                          y.conv.get(),
                          y.neg_exp_A.get(),
                          y.dt_bias.get(),
                          y.norm_w.get(),
                          y.state.get(),
                          d.Hk,
                          d.Hv,
                          d.Dk,
                          d.Dv,
                          d.K,
                          kEps,
                          out.get(),
                          ws.get()};
    launch(a, s);
  });
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
  // Moved per launch: the state read and written, the conv state read and written, the taps, the
  // projection row, the output.
  const double bytes = 2.0 * d.Hv * d.Dk * d.Dv * 4 + 2.0 * (d.K - 1) * C * 4 +
                       double(C) * d.K * 4 + P * 4.0 + d.Hv * d.Dv * 2.0;
  const double gbs = bytes / us * 1e-3;
  std::printf(
      "  time real shape: %.2f us per layer (graph of %d), %.0f GB/s (%.1f MB), %.0f%% of "
      "4.3 TB/s\n",
      us, layers, gbs, bytes * 1e-6, 100.0 * gbs / 4300.0);
  std::fflush(stdout);
}

bool run(const Options& opt, const Version& v) {
  bool ok = true;
  struct Case {
    Dims d;
    float decay;
  };
  for (const Case& c : {Case{kReal, 2.f}, Case{kReal, 0.02f}, Case{kTiny, 2.f}, Case{kWide, 1.f}}) {
    if (!available(v.number, c.d)) {
      std::printf("  %s: not available here (needs a compute capability 9.0 GPU)\n", c.d.name);
      continue;
    }
    ok = check(v.number, c.d, c.decay) && ok;
  }
  if (available(v.number, kReal)) time_real(opt, v.number);
  return ok;
}

}  // namespace

Op gdn_decode_op() {
  return Op{
      "gdn_decode",
      "Gated DeltaNet decode, one token: real Hk 16 Hv 32 Dk = Dv = 128 K 4",
      {{1, "counter", "128 blocks; cross-block steps through counters in global memory", false},
       {2, "cluster", "the blocks of a key head form a cluster: distributed shared memory", true}},
      run};
}

}  // namespace lilac::lab
