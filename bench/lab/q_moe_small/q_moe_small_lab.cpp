// q_moe_small in the kernel lab: the small-M 4-bit expert kernels of the batched decode step and
// of short prompts (q_moe_small_gate_up: act = bf16(silu(x gate_e^T) * (x up_e^T)) over
// moe_route's sorted rows and shared_act for the shared expert; q_moe_small_down: y = act
// down_e^T and shared_out, f32) at the real model's shapes (H 2048, I = Is = 512, E 256, k 8), on
// the conformance case q_moe_small's twin (tests/cuda/twins/q4_twin.h: q_twin, the decode
// kernels' numerics, within q_gemv_tolerance; act's bound as in the conformance test). Inputs:
// the expert stacks of twins/q4_moe_twin.h (seed 77), router logits uniform in +-3, x uniform in
// +-1 as bf16. Cases: T = 16 and 64 (batched decode: ~1.25 and ~2.3 tokens per touched expert)
// and 256 and 512 (short prompts: ~8 and ~16). Checked per version and case: every act and y value
// finite (outputs start poisoned), and at ~24 sorted rows (expert boundaries, the busiest expert,
// random ones) plus 4 shared-expert tokens all act and y values against the twin; down runs on the
// version's own act. Timed: a CUDA graph of 16 launches, median per launch; GB/s on the weight
// bytes the call must read (touched experts' tiles and the shared expert's, 4.5 bits a weight).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../lab.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"
#include "q_moe_small_lab.h"
#include "twins/q4_moe_twin.h"
#include "twins/q4_twin.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::MoeRouting;
using cuda::MoeSmallKernel;

constexpr int kH = 2048, kI = 512, kE = 256, kK = 8;
constexpr uint64_t kSeed = 77;
const int kCases[] = {16, 64, 256, 512};

struct Shared {
  test::HostQ gu, dn;
  Shared()
      : gu(2 * kI, kH, 4, std::sqrt(3.f / float(kH)), kSeed + 2),
        dn(kH, kI, 4, std::sqrt(3.f / float(kI)), kSeed + 3) {}
};

const test::QMoeExperts& experts() {
  static const std::unique_ptr<test::QMoeExperts> m =
      std::make_unique<test::QMoeExperts>(kH, kE, kI, 4, kSeed);
  return *m;
}
const Shared& shared() {
  static const std::unique_ptr<Shared> s = std::make_unique<Shared>();
  return *s;
}

struct Inputs {
  int T = 0, P = 0, touched = 0;
  DeviceBuffer<uint8_t> workspace;
  MoeRouting r;
  std::vector<int32_t> sorted_token, offsets, expert_of;
  std::vector<float> x;
  DeviceBuffer<bf16> d_x;
  std::vector<int> rows;  // checked sorted rows
};

const Inputs& get_inputs(int T) {
  static std::map<int, std::unique_ptr<Inputs>> cache;
  auto it = cache.find(T);
  if (it != cache.end()) return *it->second;
  auto in = std::make_unique<Inputs>();
  in->T = T;
  in->P = T * kK;
  const std::vector<float> logits = test::moe_router_logits(T, kE, kSeed);
  in->workspace.resize(cuda::moe_routing_workspace_bytes(T, kE, kK));
  in->r = cuda::moe_routing_layout(in->workspace.get(), T, kE, kK);
  auto dlog = upload(logits);
  cuda::moe_route(dlog.get(), kE + 1, T, kE, kK, in->r, nullptr);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  in->sorted_token.resize(size_t(in->P));
  in->offsets.resize(kE + 1);
  in->expert_of.resize(size_t(in->P));
  LILAC_CUDA_CHECK(cudaMemcpy(in->sorted_token.data(), in->r.sorted_token, size_t(in->P) * 4,
                              cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(
      cudaMemcpy(in->offsets.data(), in->r.expert_offsets, (kE + 1) * 4, cudaMemcpyDeviceToHost));
  int busiest = 0, most = 0;
  for (int e = 0; e < kE; ++e) {
    const int n = in->offsets[size_t(e) + 1] - in->offsets[size_t(e)];
    in->touched += n > 0;
    if (n > most) most = n, busiest = e;
    for (int i = in->offsets[size_t(e)]; i < in->offsets[size_t(e) + 1]; ++i)
      in->expert_of[size_t(i)] = e;
  }
  const auto xb = test::random_bf16_bits(size_t(T) * kH, 1.f, kSeed + 8);
  in->x = test::widen(xb.data(), xb.size());
  in->d_x = upload_bf16(xb);
  std::set<int> rows = {0, 1, in->P / 2, in->P - 1};
  for (int e : {0, kE / 2, kE - 1, busiest}) {
    const int b = in->offsets[size_t(e)], n = in->offsets[size_t(e) + 1] - b;
    for (int d : {0, 7, 8, 15, 16, n - 1})
      if (d >= 0 && d < n) rows.insert(b + d);
  }
  for (uint64_t i = 0; i < 8; ++i)
    rows.insert(int(test::hash_uniform(kSeed + 9, i, 0.5f) * float(in->P) + float(in->P) / 2) %
                in->P);
  for (int s : rows)
    if (s >= 0 && s < in->P) in->rows.push_back(s);
  std::printf("  case T=%d: %d pairs, %d experts touched, busiest %d rows\n", T, in->P, in->touched,
              most);
  return *cache.emplace(T, std::move(in)).first->second;
}

// Weight bytes a call must read: every touched expert's tiles and the shared expert's.
double weight_bytes(const Inputs& in, bool gate_up) {
  const double per_expert = (gate_up ? 2.0 * kI * kH : double(kH) * kI) * 4.5 / 8;
  return per_expert * (in.touched + 1);
}

struct Outputs {
  std::vector<float> act, shared_act, y, shared_out;
};

// A version's launches: its gate_up (production's by MoeSmallKernel, or the lab's slots form of
// version 3 / 4) and production's down.
struct Kernels {
  MoeSmallKernel kernel;
  int slots;        // 0: production's gate_up; 2 / 3: lab version 3 (and 5) / 4
  bool down_slots;  // the lab's down of version 5
  unsigned long long* stamps = nullptr;  // version 6: both kernels stamped (4 words a block)
  mutable size_t blocks = 0;             // the last stamped launch's grid
  int32_t* chain = nullptr;              // production's chained pair: its counters
  int32_t* persistent = nullptr;         // version 7: the pair in one launch, its counters
  void gate_up(const Inputs& in, bf16* act, bf16* sact, cudaStream_t st) const;
  void down(const Inputs& in, const bf16* act, const bf16* sact, float* y, float* sout,
            cudaStream_t st) const;
  // gate_up then down, or version 7's one launch.
  void pair(const Inputs& in, bf16* act, bf16* sact, float* y, float* sout, cudaStream_t st) const;
};

void Kernels::gate_up(const Inputs& in, bf16* act, bf16* sact, cudaStream_t st) const {
  const test::QMoeExperts& m = experts();
  const Shared& s = shared();
  if (stamps)
    blocks = q_moe_small_gate_up_stamped(in.d_x.get(), in.T, kH, m.gu.q(), kI, s.gu.q(), kI, in.r,
                                         act, sact, stamps, st);
  else if (slots)
    q_moe_small_gate_up_slots(slots, in.d_x.get(), in.T, kH, m.gu.q(), kI, s.gu.q(), kI, in.r, act,
                              sact, st);
  else
    cuda::q_moe_small_gate_up(in.d_x.get(), in.T, kH, m.gu.q(), kI, s.gu.q(), kI, in.r, act, sact,
                              st, kernel, chain);
}

void Kernels::down(const Inputs& in, const bf16* act, const bf16* sact, float* y, float* sout,
                   cudaStream_t st) const {
  const test::QMoeExperts& m = experts();
  const Shared& s = shared();
  if (stamps)
    blocks = q_moe_small_down_stamped(act, kI, sact, kI, m.dn.q(), s.dn.q(), kH, in.r, y, sout,
                                      stamps, st);
  else if (down_slots)
    q_moe_small_down_slots(act, kI, sact, kI, m.dn.q(), s.dn.q(), kH, in.r, y, sout, st);
  else
    cuda::q_moe_small_down(act, kI, sact, kI, m.dn.q(), s.dn.q(), kH, in.r, y, sout, st, kernel,
                           chain);
}

void Kernels::pair(const Inputs& in, bf16* act, bf16* sact, float* y, float* sout,
                   cudaStream_t st) const {
  if (!persistent) {
    gate_up(in, act, sact, st);
    return down(in, act, sact, y, sout, st);
  }
  const test::QMoeExperts& m = experts();
  const Shared& s = shared();
  blocks = q_moe_small_pair_persistent(in.d_x.get(), in.T, kH, m.gu.q(), kI, s.gu.q(), kI, m.dn.q(),
                                       s.dn.q(), in.r, act, sact, y, sout, persistent, st);
}

Outputs run_once(const Kernels& kernel, const Inputs& in) {
  const size_t P = size_t(in.P), T = size_t(in.T);
  DeviceBuffer<bf16> act(P * kI), sact(T * kI);
  DeviceBuffer<float> y(P * kH), sout(T * kH);
  test::poison(act);
  test::poison(sact);
  test::poison(y);
  test::poison(sout);
  kernel.pair(in, act.get(), sact.get(), y.get(), sout.get(), nullptr);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  return {download_bf16_as_f32(act), download_bf16_as_f32(sact), download(y), download(sout)};
}

// Row `row` of act and y (n outputs of gate/up rows from g0, H outputs of down rows from d0)
// against the twin, folded into ea / ey.
void check_row(const test::HostQ& Wgu, int64_t g0, const test::HostQ& Wdn, int64_t d0,
               const std::vector<float>& xt, const float* a, const float* yv, Error& ea,
               Error& ey) {
  const std::vector<float> g = test::q_twin(Wgu, g0, kI, xt),
                           u = test::q_twin(Wgu, g0 + kI, kI, xt);
  const std::vector<double> tg = test::q_gemv_tolerance(Wgu, g0, kI, xt),
                            tu = test::q_gemv_tolerance(Wgu, g0 + kI, kI, xt);
  for (int i = 0; i < kI; ++i) {
    const double gi = g[size_t(i)], ui = u[size_t(i)], silu = gi / (1 + std::exp(-gi));
    const double want = silu * ui;
    const double tol = 1.1 * (std::fabs(ui) * tg[size_t(i)] + std::fabs(silu) * tu[size_t(i)]) +
                       (1.0 / 256 + 1e-6) * std::fabs(want) + 1e-30;
    const double d = std::fabs(double(a[i]) - want);
    ea.max_abs = std::max(ea.max_abs, std::isfinite(d) ? d : INFINITY);
    ea.worst = std::max(ea.worst, std::isfinite(d) ? d / tol : INFINITY);
  }
  const std::vector<float> arow(a, a + kI);
  const std::vector<float> yw = test::q_twin(Wdn, d0, kH, arow);
  const std::vector<double> yt = test::q_gemv_tolerance(Wdn, d0, kH, arow);
  for (int c = 0; c < kH; ++c) {
    const double d = std::fabs(double(yv[c]) - yw[size_t(c)]);
    ey.max_abs = std::max(ey.max_abs, std::isfinite(d) ? d : INFINITY);
    ey.worst = std::max(ey.worst, std::isfinite(d) ? d / yt[size_t(c)] : INFINITY);
  }
}

bool check(const Kernels& kernel, int T) {
  const test::QMoeExperts& m = experts();
  const Shared& s = shared();
  const Inputs& in = get_inputs(T);
  const Outputs o = run_once(kernel, in);
  Error ea, ey;
  for (const std::vector<float>* v : {&o.act, &o.shared_act, &o.y, &o.shared_out})
    for (float f : *v)
      if (!std::isfinite(f)) {
        ea.max_abs = ea.worst = INFINITY;
        break;
      }
  for (int row : in.rows) {
    const int t = in.sorted_token[size_t(row)], e = in.expert_of[size_t(row)];
    const std::vector<float> xt(in.x.begin() + ptrdiff_t(t) * kH,
                                in.x.begin() + ptrdiff_t(t + 1) * kH);
    check_row(m.gu, int64_t(e) * 2 * kI, m.dn, int64_t(e) * kH, xt, &o.act[size_t(row) * kI],
              &o.y[size_t(row) * kH], ea, ey);
  }
  for (int t : {0, 1, T / 2, T - 1}) {
    const std::vector<float> xt(in.x.begin() + ptrdiff_t(t) * kH,
                                in.x.begin() + ptrdiff_t(t + 1) * kH);
    check_row(s.gu, 0, s.dn, 0, xt, &o.shared_act[size_t(t) * kI], &o.shared_out[size_t(t) * kH],
              ea, ey);
  }
  const std::string n = " T=" + std::to_string(T) + ", " + std::to_string(in.rows.size()) +
                        " rows + 4 shared, all finite";
  const bool ok_a = report_check("gate_up" + n, ea);
  const bool ok_y = report_check("down" + n, ey);
  return ok_a && ok_y;
}

// A case's outputs on the device, act and sact zeroed (a timed launch reads whatever act holds),
// and a stream for the timed graphs.
struct Timed {
  const Inputs& in;
  DeviceBuffer<bf16> act, sact;
  DeviceBuffer<float> y, sout;
  cudaStream_t st = nullptr;
  explicit Timed(int T)
      : in(get_inputs(T)),
        act(size_t(in.P) * kI),
        sact(size_t(T) * kI),
        y(size_t(in.P) * kH),
        sout(size_t(T) * kH) {
    LILAC_CUDA_CHECK(cudaMemset(act.get(), 0, act.bytes()));
    LILAC_CUDA_CHECK(cudaMemset(sact.get(), 0, sact.bytes()));
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  }
  ~Timed() { cudaStreamDestroy(st); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
};

void time_case(const Options& opt, const Kernels& kernel, int T) {
  Timed b(T);
  const double gu_us = graph_us(
      b.st, opt.runs, 16, [&](int) { kernel.gate_up(b.in, b.act.get(), b.sact.get(), b.st); });
  const double dn_us = graph_us(b.st, opt.runs, 16, [&](int) {
    kernel.down(b.in, b.act.get(), b.sact.get(), b.y.get(), b.sout.get(), b.st);
  });
  const double gb_gu = weight_bytes(b.in, true) / gu_us * 1e-3;
  const double gb_dn = weight_bytes(b.in, false) / dn_us * 1e-3;
  std::printf(
      "  time T=%-4d gate_up %8.2f us (%5.0f GB/s)  down %8.2f us (%5.0f GB/s)  "
      "x40 layers %.2f ms\n",
      T, gu_us, gb_gu, dn_us, gb_dn, 40 * (gu_us + dn_us) * 1e-3);
  std::fflush(stdout);
}

// Version 7: the pair as the step runs it, gate_up and down (or version 7's one launch) back to
// back in one graph of 16 pairs, median per pair; GB/s on both kernels' weight bytes.
void time_pair(const Options& opt, const Kernels& kernel, int T, const char* what) {
  Timed b(T);
  const double us = graph_us(b.st, opt.runs, 16, [&](int) {
    kernel.pair(b.in, b.act.get(), b.sact.get(), b.y.get(), b.sout.get(), b.st);
  });
  const double gb = (weight_bytes(b.in, true) + weight_bytes(b.in, false)) / us * 1e-3;
  std::printf("  pair T=%-4d %-28s %8.2f us (%5.0f GB/s)  x40 layers %.2f ms\n", T, what, us, gb,
              40 * us * 1e-3);
  std::fflush(stdout);
}

// Version 6: where a launch's time goes between its blocks, from the stamps of one launch (4
// words a block: start ns, end ns, SM, passes). Prints the blocks that ran passes (the rest exit at
// once), the span from the first start to the last end, the working blocks' durations, when 50 /
// 90 / 100% of them had ended, and the mean number of working blocks resident in each tenth of
// the span against the grid's slots (SMs x blocks per SM: the waves and the tail).
void report_stamps(const char* name, int T, const std::vector<unsigned long long>& w, size_t n,
                   int per_sm) {
  std::vector<double> st, en, dur;
  unsigned long long t0 = ~0ull, t1 = 0, tick = ~0ull;
  int sms = 0;
  for (size_t b = 0; b < n; ++b) {
    t0 = std::min(t0, w[4 * b]);
    t1 = std::max(t1, w[4 * b + 1]);
    sms = std::max(sms, int(w[4 * b + 2]) + 1);
  }
  for (size_t b = 0; b < n; ++b) {
    if (w[4 * b + 3] == 0) continue;
    st.push_back(double(w[4 * b] - t0) * 1e-3);
    en.push_back(double(w[4 * b + 1] - t0) * 1e-3);
    dur.push_back(en.back() - st.back());
  }
  std::vector<unsigned long long> starts;
  for (size_t b = 0; b < n; ++b) starts.push_back(w[4 * b]);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i)
    if (starts[i] != starts[i - 1]) tick = std::min(tick, starts[i] - starts[i - 1]);
  if (dur.empty()) return;
  const double span = double(t1 - t0) * 1e-3;
  auto q = [](std::vector<double> v, double f) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(f * double(v.size())))];
  };
  std::printf(
      "  stamps %s T=%d: %zu blocks (%zu ran passes) on %d SMs, %d slots; span %.2f us (timer "
      "step %llu ns)\n    durations p10 / p50 / p90 / max %.2f / %.2f / %.2f / %.2f us; starts "
      "p50 / p90 %.2f / %.2f; 50 / 90 / 100%% ended by %.2f / %.2f / %.2f us\n    resident "
      "working blocks per tenth of the span:",
      name, T, n, dur.size(), sms, sms * per_sm, span, tick == ~0ull ? 0ull : tick, q(dur, 0.1),
      q(dur, 0.5), q(dur, 0.9), q(dur, 1.0), q(st, 0.5), q(st, 0.9), q(en, 0.5), q(en, 0.9),
      q(en, 1.0));
  for (int i = 0; i < 10; ++i) {
    const double a = span * i / 10, b = span * (i + 1) / 10;
    double busy = 0;
    for (size_t j = 0; j < dur.size(); ++j)
      busy += std::max(0.0, std::min(b, en[j]) - std::max(a, st[j]));
    std::printf(" %.0f", busy / (b - a));
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Version 6: one warm launch of each kernel at T with the stamps, reported.
void stamps_case(const Kernels& kernel, int T) {
  const Inputs& in = get_inputs(T);
  const size_t P = size_t(in.P), Tz = size_t(T);
  DeviceBuffer<bf16> act(P * kI), sact(Tz * kI);
  DeviceBuffer<float> y(P * kH), sout(Tz * kH);
  for (int rep = 0; rep < 3; ++rep) {  // three back-to-back pairs first: warm
    kernel.gate_up(in, act.get(), sact.get(), nullptr);
    kernel.down(in, act.get(), sact.get(), y.get(), sout.get(), nullptr);
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  for (int which = 0; which < 2; ++which) {
    if (which == 0)
      kernel.gate_up(in, act.get(), sact.get(), nullptr);
    else
      kernel.down(in, act.get(), sact.get(), y.get(), sout.get(), nullptr);
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned long long> w(4 * kernel.blocks);
    LILAC_CUDA_CHECK(cudaMemcpy(w.data(), kernel.stamps, w.size() * 8, cudaMemcpyDeviceToHost));
    report_stamps(which == 0 ? "gate_up" : "down", T, w, kernel.blocks, which == 0 ? 4 : 5);
  }
}

bool run(const Options& opt, const Version& v) {
  // Versions 3 / 4: the slots form of gate_up (2 / 3 slots per warp), production's register down;
  // version 5: version 3's gate_up and the slots form of down.
  const int slots = v.number == 3 || v.number == 5 ? 2 : v.number == 4 ? 3 : 0;
  DeviceBuffer<unsigned long long> stamps(v.number == 6 ? size_t(4) << 20 : 0);
  Kernels kernel{v.number == 2 ? MoeSmallKernel::streamed : MoeSmallKernel::registers, slots,
                 v.number == 5, v.number == 6 ? stamps.get() : nullptr};
  // Version 7: its counters, and production's chained pair's (each zeroed once).
  DeviceBuffer<int32_t> pair_counters(v.number == 7 ? kPairCounters : 0),
      chain(v.number == 7 ? cuda::kMoeSmallChainCounts : 0);
  if (v.number == 7) {
    LILAC_CUDA_CHECK(cudaMemset(pair_counters.get(), 0, pair_counters.bytes()));
    LILAC_CUDA_CHECK(cudaMemset(chain.get(), 0, chain.bytes()));
    kernel.persistent = pair_counters.get();
  }
  if (kernel.kernel == MoeSmallKernel::streamed && !cuda::q_moe_small_streamed_available(4)) {
    std::printf("  not available here (the bulk copy engine: a compute capability 9.x GPU)\n");
    return true;
  }
  bool ok = true;
  for (int T : kCases) ok = check(kernel, T) && ok;
  if (kernel.persistent) {
    // Against production's pair as the step runs it: unchained, and chained (the default).
    Kernels unchained{MoeSmallKernel::registers, 0, false};
    Kernels chained{MoeSmallKernel::chained, 0, false};
    chained.chain = chain.get();
    for (int T : kCases) {
      time_pair(opt, unchained, T, "production, unchained");
      time_pair(opt, chained, T, "production, chained");
      time_pair(opt, kernel, T, "v7 persistent");
      std::printf("    v7 launched %zu blocks\n", kernel.blocks);
    }
    return ok;
  }
  for (int T : kCases) time_case(opt, kernel, T);
  if (kernel.stamps)
    for (int T : kCases) stamps_case(kernel, T);
  return ok;
}

}  // namespace

Op q_moe_small_op() {
  return Op{"q_moe_small",
            "4-bit small-M MoE (routed experts + shared expert) on moe_route's tiles: gate_up "
            "[256 x 1024, 2048] -> act silu(g) u, down [256 x 2048, 512] -> y f32; T 16, 64 "
            "(batched decode), 256, 512 (short prompts), uniform router",
            {{1, "registers",
              "a warp per 16-row weight tile, its weights loaded into registers a set of groups "
              "at a time, the pass's 8 tokens staged in shared memory (production for batched "
              "decode, T <= 64, and for 8-bit)",
              true},
             {2, "streamed",
              "a producer warp per block streams the weight tiles and x slices into a ring of "
              "shared-memory slots with cp.async.bulk; passes of 16 / 32 tokens for prompts "
              "(production for prompts, T > 64, 4-bit on Hopper)",
              true},
             {3, "slots2",
              "version 1's gate_up with each warp's next set of weights copied by cp.async into a "
              "private shared-memory slot (2 slots: 1 set in flight) while it computes the "
              "current one, 3 blocks per SM; production's register down (s22)",
              true},
             {4, "slots3",
              "version 3 with 3 slots per warp (2 sets in flight), 2 blocks per SM (s22)", true},
             {5, "slots2_down",
              "version 3 and a down with J = 4 tiles per warp, tile j + 1's weights copied into "
              "the warp's second slot while tile j is computed (s22)",
              true},
             {6, "stamps",
              "version 1's kernels with a time stamp per block (start, end, SM): the waves, the "
              "tail and the spread of block durations of one launch (s41)",
              true},
             {7, "persistent",
              "version 1's gate_up and down as one persistent launch (4 blocks per SM) taking "
              "production's blocks of both grids as units from a counter, down's units waiting "
              "for their tile's gate_up units: the SMs full to the end of the pair; timed as pairs "
              "against production's unchained and chained pairs (s44, not yet run)",
              true}},
            run};
}

}  // namespace lilac::lab
