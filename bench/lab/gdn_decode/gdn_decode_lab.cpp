// gdn_decode in the kernel lab: every version on the same inputs, checked against the CPU twin
// (cpu/gated_deltanet.cpp and cpu/norm.cpp composed as the CPU backend composes them) for 4 decode
// steps at three shapes (the conformance registry's decode cases, inputs, twin and tolerances:
// tests/cuda/twins/gated_deltanet_twin.h), then timed at the real shape as lilac_cuda_bench_seq
// timed it: a graph of 30 launches rotating over 30 layers' states (as in a decode step, a layer's
// state is not in L2), median per launch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../lab.h"
#include "cuda/gated_deltanet.h"
#include "cuda/synthetic_fill.h"
#include "gdn_decode_lab.h"
#include "twins/gated_deltanet_twin.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

using test::GdnDecodeCase;
using test::GdnDims;
using test::kGdnEps;
using test::kGdnReal;

using Launch = void (*)(const GdnDecodeArgs&, cudaStream_t);

void v2_cluster(const GdnDecodeArgs& a, cudaStream_t s) {
  cuda::gdn_decode(a.proj, a.taps, a.conv_state, a.neg_exp_A, a.dt_bias, a.norm_w, a.state, a.Hk,
                   a.Hv, a.Dk, a.Dv, a.K, a.eps, a.out, s);
}

Launch launcher(int version) {
  return version == 1 ? gdn_decode_v1_counter : v2_cluster;
}

bool available(int version, const GdnDims& d) {
  return version == 1 || cuda::gdn_decode_uses_cluster(d.Hk, d.Hv, d.Dk, d.Dv);
}

// Four decode steps of `version` from a random state, against the CPU twin, with the tolerances of
// the conformance test (gated_deltanet_twin.h): output bf16 of values of order 1, state f32 to 1e-4
// of its scale, conv state (copies) exact.
bool check(int version, const GdnDecodeCase& c) {
  const GdnDims& d = c.d;
  const test::GdnParams w = test::gdn_decode_params(c);
  test::GdnStart cpu = test::gdn_decode_start(c);
  auto taps = upload(w.taps), nA = upload(w.neg_exp_A), dtb = upload(w.dt_bias),
       nw = upload(w.norm_w), d_conv = upload(cpu.conv), d_state = upload(cpu.state);
  DeviceBuffer<float> ws(gdn_decode_v1_workspace_floats(d.Hk, d.Hv, d.Dv));
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
  DeviceBuffer<bf16> out(size_t(d.Hv) * d.Dv);
  Error e_out, e_state, e_conv;
  for (int step = 0; step < test::kGdnDecodeSteps; ++step) {
    const std::vector<float> proj = test::gdn_decode_proj(c, step);
    auto d_proj = upload(proj);
    LILAC_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));  // NaN: every element is written
    const GdnDecodeArgs a{d_proj.get(), taps.get(),    d_conv.get(), nA.get(),  dtb.get(),
                          nw.get(),     d_state.get(), d.Hk,         d.Hv,      d.Dk,
                          d.Dv,         d.K,           kGdnEps,      out.get(), ws.get()};
    launcher(version)(a, nullptr);
    const std::vector<float> want = test::cpu_gdn(proj, 1, d, w, cpu.conv, cpu.state);
    const test::AtolRtol t_out = test::kGdnOutTolerance, t_conv = test::kGdnConvStateTolerance,
                         t_state = test::gdn_state_tolerance(cpu.state);
    merge(e_out, compare(download_bf16_as_f32(out), want, t_out.atol, t_out.rtol));
    merge(e_state, compare(download(d_state), cpu.state, t_state.atol, t_state.rtol));
    merge(e_conv, compare(download(d_conv), cpu.conv, t_conv.atol, t_conv.rtol));
  }
  const std::string l =
      std::string(d.name) + " decay " + std::to_string(c.decay).substr(0, 4) + ", 4 steps";
  bool ok = report_check(l + ": out", e_out);
  ok = report_check(l + ": state", e_state) && ok;
  return report_check(l + ": conv state", e_conv) && ok;
}

// The real shape, 30 layers' states and projections rotating, one graph of 30 launches.
void time_real(const Options& opt, int version) {
  const GdnDims d = kGdnReal;
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
                          kGdnEps,
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
  for (const GdnDecodeCase& c : test::gdn_decode_cases()) {
    if (!available(v.number, c.d)) {
      std::printf("  %s: not available here (needs a compute capability 9.0 GPU)\n", c.d.name);
      continue;
    }
    ok = check(v.number, c) && ok;
  }
  if (available(v.number, kGdnReal)) time_real(opt, v.number);
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
