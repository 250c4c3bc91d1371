// gdn_decode in the kernel lab: every version on the same inputs, checked against the CPU twin
// (cpu/gated_deltanet.cpp and cpu/norm.cpp composed as the CPU backend composes them) for 4 decode
// steps at three shapes (the conformance registry's decode cases, inputs, twin and tolerances:
// tests/cuda/twins/gated_deltanet_twin.h), then timed at the real shape as lilac_cuda_bench_seq
// timed it: a graph of 30 launches rotating over 30 layers' states (as in a decode step, a layer's
// state is not in L2), median per launch.
// Versions 2 and 3 run batched (gdn_decode_batch: B rows, each its own sequence's states
// through DecodeBatchRow pointers): checked at B = 3 against the twin per row and bit for bit
// against the single-row call, then timed at B = 16 and 64 as the batched step runs it (a graph of
// 30 launches, layer slot l of every row's states, one projection buffer as in production).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// Versions 3 to 6 have no single-row form: they exist for batches.
Launch launcher(int version) {
  return version == 1 ? gdn_decode_v1_counter : version == 2 ? v2_cluster : nullptr;
}

// Versions 2 and 3 need a compute capability 9.0 device (clusters); v3's shape rule is looser than
// v2's, which holds at every case here.
bool available(int version, const GdnDims& d) {
  return version == 1 || cuda::gdn_decode_uses_cluster(d.Hk, d.Hv, d.Dk, d.Dv);
}

using BatchLaunch = void (*)(const GdnDecodeBatchArgs&, cudaStream_t);

void v2_cluster_batch(const GdnDecodeBatchArgs& a, cudaStream_t s) {
  cuda::gdn_decode_batch_cluster(a.proj, a.B, a.rows, a.slot, a.taps, a.neg_exp_A, a.dt_bias,
                                 a.norm_w, a.Hk, a.Hv, a.Dk, a.Dv, a.K, a.eps, a.out, s);
}

void v3_split_batch(const GdnDecodeBatchArgs& a, cudaStream_t s) {
  cuda::gdn_decode_batch(a.proj, a.B, a.rows, a.slot, a.taps, a.neg_exp_A, a.dt_bias, a.norm_w,
                         a.Hk, a.Hv, a.Dk, a.Dv, a.K, a.eps, a.workspace, a.out, s,
                         GdnStateFormat::f32, cuda::GdnBatchKernel::split);
}

// Version 6 is production's head kernel (gdn_decode_batch with GdnBatchKernel::head).
void v6_head_batch(const GdnDecodeBatchArgs& a, cudaStream_t s) {
  cuda::gdn_decode_batch(a.proj, a.B, a.rows, a.slot, a.taps, a.neg_exp_A, a.dt_bias, a.norm_w,
                         a.Hk, a.Hv, a.Dk, a.Dv, a.K, a.eps, a.workspace, a.out, s,
                         GdnStateFormat::f32, cuda::GdnBatchKernel::head);
}

// Version 1 has no batched form.
BatchLaunch batch_launcher(int version) {
  return version == 2   ? v2_cluster_batch
         : version == 3 ? v3_split_batch
         : version == 4 ? gdn_decode_v4_pipelined
         : version == 5 ? gdn_decode_v5_persistent
         : version == 6 ? v6_head_batch
                        : nullptr;
}

// Workspace floats for `version` at B rows (v1's counters need zeros: callers clear it once).
size_t workspace_floats(int B, const GdnDims& d) {
  return std::max(gdn_decode_v1_workspace_floats(d.Hk, d.Hv, d.Dv),
                  cuda::gdn_decode_batch_workspace_floats(B, d.Hk, d.Hv, d.Dk, d.Dv));
}

// Elements whose bits differ.
size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
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
  DeviceBuffer<float> ws(workspace_floats(1, d));
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
  DeviceBuffer<float> ws(workspace_floats(1, d));
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

// ---- batched (versions 2 and 3) -----------------------------------------------------------------

// One row's states as a sequence holds them: conv [slots][K-1][C], rec [slots][Hv][Dk][Dv]; the
// lab uses slot 1 of 2, slot 0 holding a sentinel that must stay untouched.
constexpr int kCheckSlots = 2, kCheckSlot = 1;
constexpr float kSentinel = 7.f;

std::vector<float> with_sentinel(const std::vector<float>& slot_data) {
  std::vector<float> all(slot_data.size() * kCheckSlots, kSentinel);
  std::copy(slot_data.begin(), slot_data.end(), all.begin() + slot_data.size() * kCheckSlot);
  return all;
}

// B rows of `version`'s batched call for 4 steps, each row from its own random start with its own
// projections: per row against the twin (the conformance tolerances) and bit for bit against the
// single-row call of the same version (v3, which has none: of v2; required either way, v3 is v2's
// arithmetic); slot 0 must keep its sentinel.
bool check_batch(int version, const GdnDecodeCase& c, int B) {
  const GdnDims& d = c.d;
  const int P = d.P(), V = d.Hv * d.Dv;
  const test::GdnParams w = test::gdn_decode_params(c);
  auto taps = upload(w.taps), nA = upload(w.neg_exp_A), dtb = upload(w.dt_bias),
       nw = upload(w.norm_w);
  const uint32_t seed = test::gdn_decode_seed(c);
  std::vector<test::GdnStart> cpu;
  for (int r = 0; r < B; ++r)
    cpu.push_back(test::random_gdn_start(d, false, seed + 10 + 1000 * uint32_t(r + 1)));
  const size_t conv_n = cpu[0].conv.size(), rec_n = cpu[0].state.size();

  // The batched call's states (slot kCheckSlot of 2) and the single-row references' (one slot).
  std::vector<DeviceBuffer<float>> conv_b, rec_b;
  std::vector<cuda::DecodeBatchRow> rows_h(static_cast<size_t>(B));
  for (int r = 0; r < B; ++r) {
    conv_b.push_back(upload(with_sentinel(cpu[size_t(r)].conv)));
    rec_b.push_back(upload(with_sentinel(cpu[size_t(r)].state)));
    rows_h[size_t(r)].conv = conv_b.back().get();
    rows_h[size_t(r)].rec = rec_b.back().get();
  }
  DeviceBuffer<cuda::DecodeBatchRow> rows(static_cast<size_t>(B));
  LILAC_CUDA_CHECK(cudaMemcpy(rows.get(), rows_h.data(), rows.bytes(), cudaMemcpyHostToDevice));
  const std::vector<int> refs = {launcher(version) ? version : 2};
  struct Ref {
    std::vector<DeviceBuffer<float>> conv, rec;
    size_t mism_out = 0, mism_state = 0, mism_conv = 0;
  };
  std::vector<Ref> ref(refs.size());
  for (Ref& f : ref)
    for (int r = 0; r < B; ++r) {
      f.conv.push_back(upload(cpu[size_t(r)].conv));
      f.rec.push_back(upload(cpu[size_t(r)].state));
    }
  DeviceBuffer<float> ws_b(workspace_floats(B, d)), ws_s(workspace_floats(1, d));
  LILAC_CUDA_CHECK(cudaMemset(ws_b.get(), 0, ws_b.bytes()));
  LILAC_CUDA_CHECK(cudaMemset(ws_s.get(), 0, ws_s.bytes()));
  DeviceBuffer<bf16> out_b(size_t(B) * V), out_s(static_cast<size_t>(V));

  Error e_out, e_state, e_conv;
  for (int step = 0; step < test::kGdnDecodeSteps; ++step) {
    std::vector<float> proj(size_t(B) * P);
    for (int r = 0; r < B; ++r) {
      const std::vector<float> pr =
          test::random_floats(size_t(P), 1.f, seed + 100 + uint32_t(step) + 1000 * uint32_t(r + 1));
      std::copy(pr.begin(), pr.end(), proj.begin() + size_t(r) * P);
    }
    auto d_proj = upload(proj);
    LILAC_CUDA_CHECK(cudaMemset(out_b.get(), 0xff, out_b.bytes()));  // NaN: every element written
    const GdnDecodeBatchArgs ba{
        d_proj.get(), B,    rows.get(), kCheckSlot, taps.get(), nA.get(), dtb.get(),   nw.get(),
        d.Hk,         d.Hv, d.Dk,       d.Dv,       d.K,        kGdnEps,  out_b.get(), ws_b.get()};
    batch_launcher(version)(ba, nullptr);
    const std::vector<float> got_out = download_bf16_as_f32(out_b);
    for (int r = 0; r < B; ++r) {
      const std::vector<float> pr(proj.begin() + size_t(r) * P, proj.begin() + size_t(r + 1) * P);
      const std::vector<float> want =
          test::cpu_gdn(pr, 1, d, w, cpu[size_t(r)].conv, cpu[size_t(r)].state);
      const std::vector<float> out_r(got_out.begin() + size_t(r) * V,
                                     got_out.begin() + size_t(r + 1) * V);
      const std::vector<float> all_state = download(rec_b[size_t(r)]),
                               all_conv = download(conv_b[size_t(r)]);
      const std::vector<float> st(all_state.begin() + rec_n * kCheckSlot,
                                  all_state.begin() + rec_n * (kCheckSlot + 1));
      const std::vector<float> cv(all_conv.begin() + conv_n * kCheckSlot,
                                  all_conv.begin() + conv_n * (kCheckSlot + 1));
      const test::AtolRtol t_out = test::kGdnOutTolerance, t_conv = test::kGdnConvStateTolerance,
                           t_state = test::gdn_state_tolerance(cpu[size_t(r)].state);
      merge(e_out, compare(out_r, want, t_out.atol, t_out.rtol));
      merge(e_state, compare(st, cpu[size_t(r)].state, t_state.atol, t_state.rtol));
      merge(e_conv, compare(cv, cpu[size_t(r)].conv, t_conv.atol, t_conv.rtol));
      for (size_t k = 0; k < refs.size(); ++k) {  // the single-row calls on the same row
        Ref& f = ref[k];
        LILAC_CUDA_CHECK(cudaMemset(out_s.get(), 0xff, out_s.bytes()));
        const GdnDecodeArgs sa{d_proj.get() + size_t(r) * P,
                               taps.get(),
                               f.conv[size_t(r)].get(),
                               nA.get(),
                               dtb.get(),
                               nw.get(),
                               f.rec[size_t(r)].get(),
                               d.Hk,
                               d.Hv,
                               d.Dk,
                               d.Dv,
                               d.K,
                               kGdnEps,
                               out_s.get(),
                               ws_s.get()};
        launcher(refs[k])(sa, nullptr);
        f.mism_out += bit_mismatches(out_r, download_bf16_as_f32(out_s));
        f.mism_state += bit_mismatches(st, download(f.rec[size_t(r)]));
        f.mism_conv += bit_mismatches(cv, download(f.conv[size_t(r)]));
      }
    }
  }
  size_t sentinel_bad = 0;
  for (int r = 0; r < B; ++r) {
    const std::vector<float> all_state = download(rec_b[size_t(r)]),
                             all_conv = download(conv_b[size_t(r)]);
    for (int sl = 0; sl < kCheckSlots; ++sl) {
      if (sl == kCheckSlot) continue;
      for (size_t i = 0; i < rec_n; ++i) sentinel_bad += all_state[sl * rec_n + i] != kSentinel;
      for (size_t i = 0; i < conv_n; ++i) sentinel_bad += all_conv[sl * conv_n + i] != kSentinel;
    }
  }
  const std::string l = std::string(d.name) + " decay " + std::to_string(c.decay).substr(0, 4) +
                        ", B " + std::to_string(B) + ", 4 steps";
  bool ok = report_check(l + ": out", e_out);
  ok = report_check(l + ": state", e_state) && ok;
  ok = report_check(l + ": conv state", e_conv) && ok;
  for (size_t k = 0; k < refs.size(); ++k) {
    const Ref& f = ref[k];
    const bool same = f.mism_out == 0 && f.mism_state == 0 && f.mism_conv == 0;
    const bool required = true;
    std::printf("  check %-44s %zu / %zu / %zu elements differ (out / state / conv) %s\n",
                (l + ": = v" + std::to_string(refs[k]) + " single").c_str(), f.mism_out,
                f.mism_state, f.mism_conv,
                same       ? "ok"
                : required ? "FAIL"
                           : "(reported)");
    if (required) ok = same && ok;
  }
  std::printf("  check %-44s %zu elements changed %s\n", (l + ": slot 0 untouched").c_str(),
              sentinel_bad, sentinel_bad == 0 ? "ok" : "FAIL");
  std::fflush(stdout);
  return ok && sentinel_bad == 0;
}

// The real shape at B rows as the batched step runs it: every row its own sequence's states for 30
// layers (layer l = slot l), one projection buffer [B, P] and one output (rewritten per layer, as
// production's), a graph of 30 launches, median per launch.
void time_batch(const Options& opt, int version, int B) {
  const GdnDims d = kGdnReal;
  const int layers = 30, C = d.C(), P = d.P();
  uint64_t key = 1000;
  auto filled = [&](size_t n, float centre, float a) {
    DeviceBuffer<float> b(n);
    cuda::fill_synthetic_f32(b.get(), n, key++, centre, a, nullptr);
    return b;
  };
  struct Layer {
    DeviceBuffer<float> taps, neg_exp_A, dt_bias, norm_w;
  };
  std::vector<Layer> L;
  for (int l = 0; l < layers; ++l)
    L.push_back(Layer{filled(size_t(C) * d.K, 0.f, 0.5f), filled(size_t(d.Hv), -1.f, 0.5f),
                      filled(size_t(d.Hv), 0.f, 0.5f), filled(size_t(d.Dv), 1.f, 0.1f)});
  const size_t conv_n = size_t(d.K - 1) * C, rec_n = size_t(d.Hv) * d.Dk * d.Dv;
  std::vector<DeviceBuffer<float>> conv, rec;
  std::vector<cuda::DecodeBatchRow> rows_h(static_cast<size_t>(B));
  for (int r = 0; r < B; ++r) {
    conv.push_back(filled(conv_n * layers, 0.f, 1.f));
    rec.push_back(filled(rec_n * layers, 0.f, 0.3f));
    rows_h[size_t(r)].conv = conv.back().get();
    rows_h[size_t(r)].rec = rec.back().get();
  }
  DeviceBuffer<cuda::DecodeBatchRow> rows(static_cast<size_t>(B));
  LILAC_CUDA_CHECK(cudaMemcpy(rows.get(), rows_h.data(), rows.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer<float> proj = filled(size_t(B) * P, 0.f, 1.7f);
  DeviceBuffer<float> ws(workspace_floats(B, d));
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
  DeviceBuffer<bf16> out(size_t(B) * d.Hv * d.Dv);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const BatchLaunch launch = batch_launcher(version);
  const double us = graph_us(s, opt.runs, layers, [&](int i) {
    const Layer& y = L[size_t(i % layers)];
    const GdnDecodeBatchArgs a{proj.get(),
                               B,
                               rows.get(),
                               i % layers,
                               y.taps.get(),
                               y.neg_exp_A.get(),
                               y.dt_bias.get(),
                               y.norm_w.get(),
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
  // Per launch: every row's state and conv state read and written, its projection row and output;
  // the taps once. (v3's workspace round trip stays in L2 and is not counted.)
  const double bytes =
      B * (2.0 * rec_n * 4 + 2.0 * conv_n * 4 + P * 4.0 + d.Hv * d.Dv * 2.0) + double(C) * d.K * 4;
  const double gbs = bytes / us * 1e-3;
  std::printf(
      "  time real shape, B %2d: %.2f us per layer (graph of %d), %.3f ms per 30-layer pass, %.0f "
      "GB/s (%.1f MB), %.0f%% of 4.3 TB/s\n",
      B, us, layers, us * layers * 1e-3, gbs, bytes * 1e-6, 100.0 * gbs / 4300.0);
  if (version == 5)
    std::printf("    v5 grid: %d resident clusters of %d blocks for %d (row, head) items\n",
                std::min(B * d.Hv, gdn_decode_v5_clusters(d.Dk, d.Dv)), d.Dv / 32, B * d.Hv);
  std::fflush(stdout);
}

bool run(const Options& opt, const Version& v) {
  bool ok = true;
  for (const GdnDecodeCase& c : test::gdn_decode_cases()) {
    if (!launcher(v.number)) break;  // batched only
    if (!available(v.number, c.d)) {
      std::printf("  %s: not available here (needs a compute capability 9.0 GPU)\n", c.d.name);
      continue;
    }
    ok = check(v.number, c) && ok;
  }
  if (launcher(v.number) && available(v.number, kGdnReal)) time_real(opt, v.number);
  if (!batch_launcher(v.number)) return ok;
  // v4's and v5's clusters take several items each only when the items outnumber them: B = 40
  // as well.
  for (const GdnDecodeCase& c : test::gdn_decode_cases())
    if (available(v.number, c.d))
      for (const int B : {3, 40})
        if (B == 3 || v.number >= 4) ok = check_batch(v.number, c, B) && ok;
  if (available(v.number, kGdnReal))
    for (const int B : {16, 64}) time_batch(opt, v.number, B);
  return ok;
}

}  // namespace

Op gdn_decode_op() {
  return Op{
      "gdn_decode",
      "Gated DeltaNet decode, one token (v1, v2) and batched at B 3, 16, 64 (v2 to v6): real Hk "
      "16 "
      "Hv "
      "32 Dk = Dv = 128 K 4",
      {{1, "counter", "128 blocks; cross-block steps through counters in global memory", false},
       {2, "cluster",
        "the blocks of a key head form a cluster: distributed shared memory (production for one "
        "row; batched, grid z = the row, until s6)",
        true},
       {3, "split",
        "batched only: prep kernel (conv, l2norm, gates -> workspace), then the state pass with "
        "its "
        "loads before the PDL wait; a cluster per head for the norm only (production "
        "gdn_decode_batch "
        "since s6)",
        true},
       {4, "pipelined",
        "batched only: v3's prep kernel, then a persistent state pass: each cluster loops over "
        "(row, head) items with the next item's state and workspace values in flight",
        false},
       {5, "persistent",
        "batched only: v3's prep kernel, then persistent clusters over (row, head) items, the "
        "next 2 items' states copied into shared memory (cp.async) while the current one is "
        "computed (lost to v3, s12)",
        false},
       {6, "head",
        "batched only: v3's prep kernel, then persistent blocks over whole (row, head) items (no "
        "cluster: the block has the head's columns), the next items' states and workspace values "
        "streamed into a shared-memory ring by the bulk copy engine (production's "
        "GdnBatchKernel::head, s16)",
        true}},
      run};
}

}  // namespace lilac::lab
