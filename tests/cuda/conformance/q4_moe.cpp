// Conformance cases of the 4-bit MoE kernels against their CPU twins on weights quantized by the
// CPU quantizer:
//  * decode: q_moe_gate_up_gemv vs cpu::moe_token_act, q_moe_down_gemv vs cpu::moe_token_down
//    (dequantised f32 weights; bounds of q4_test_util.h), real shapes (H 2048, E 256, k 8,
//    I = Is = 512) and the tiny-a fixture's (H 128, E 16, k 4, I = Is = 64), 4 and 8 bits;
//  * prefill: q_moe_grouped_gate_up / q_moe_grouped_down / q_moe_shared_gate_up on moe_route's
//    tables vs double-precision dot products with the bf16 weights the kernels multiply
//    (dequantize_row_bf16), T = 1, 37, 300, uniform routing. Outputs poisoned. Router logits and
//    the twin per element: tests/cuda/twins/q4_moe_twin.h (shared with the kernel lab).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "../moe_route_util.h"
#include "../q4_test_util.h"
#include "../twins/q4_moe_twin.h"
#include "conformance.h"
#include "cpu/moe.h"
#include "cuda/moe_decode.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct Shape {
  int H, E, k, I, Is, bits;
};

struct QMoe {
  Shape s;
  HostQ gu, dn, sgu, sdn;
  MoeWeights w;
  QMoe(Shape shape, uint64_t seed)
      : s(shape),
        gu(int64_t(shape.E) * 2 * shape.I, shape.H, shape.bits, std::sqrt(3.f / shape.H), seed),
        dn(int64_t(shape.E) * shape.H, shape.I, shape.bits, std::sqrt(3.f / shape.I), seed + 1),
        sgu(2 * shape.Is, shape.H, shape.bits, std::sqrt(3.f / shape.H), seed + 2),
        sdn(shape.H, shape.Is, shape.bits, std::sqrt(3.f / shape.Is), seed + 3) {
    for (int e = 0; e < s.E; ++e)
      w.experts.push_back(ExpertWeights{gu.view(int64_t(e) * 2 * s.I, s.I),
                                        gu.view(int64_t(e) * 2 * s.I + s.I, s.I),
                                        dn.view(int64_t(e) * s.H, s.H)});
    w.shared_gate = sgu.view(0, s.Is);
    w.shared_up = sgu.view(s.Is, s.Is);
    w.shared_down = sdn.view(0, s.H);
  }
};

void check_decode(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << s.H << " E=" << s.E << " k=" << s.k << " I=" << s.I
                                  << " Is=" << s.Is << " bits=" << s.bits);
  ThreadPool& pool = ThreadPool::global();
  QMoe m(s, seed);
  const int k = s.k, n_act = s.k * s.I + s.Is;
  std::vector<int32_t> idx(static_cast<size_t>(k));
  std::vector<float> wt(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) {
    idx[size_t(j)] = int32_t((size_t(j) * 37 + seed) % size_t(s.E));  // distinct for E > k (37 odd)
    wt[size_t(j)] = float(k - j) / float(k * (k + 1) / 2);
  }
  idx[0] = s.E - 1;  // the last expert's rows end the stack
  const float shared_logit = 0.7f;
  auto didx = upload(idx);
  auto dwt = upload(wt);
  auto dlogit = upload(std::vector<float>{shared_logit});

  std::vector<float> x = random_floats(size_t(s.H), 1.f, uint32_t(seed + 9));
  const std::vector<uint16_t> xb = to_bf16_rounding(x);
  auto dx = upload_bf16(xb);
  const size_t guard = 24;
  cuda::DeviceBuffer<cuda::bf16> dact(static_cast<size_t>(n_act) + guard);
  poison(dact);
  cuda::q_moe_gate_up_gemv(m.gu.q(), m.sgu.q(), didx.get(), k, dx.get(), s.H, s.I, s.Is, dact.get(),
                           nullptr);
  std::vector<uint16_t> raw(dact.size());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), dact.get(), dact.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(guard_untouched(raw, size_t(n_act), "q_moe_gate_up_gemv"));
  std::vector<float> act_gpu(static_cast<size_t>(n_act));
  for (size_t i = 0; i < act_gpu.size(); ++i) act_gpu[i] = bf16_to_f32(raw[i]);
  std::vector<float> act_cpu(static_cast<size_t>(n_act));
  cpu::moe_token_act(m.w, x.data(), idx.data(), k, act_cpu.data(), pool);
  // act = silu(g) u moves by <= 1.1 (|u| tol_g + |silu(g)| tol_u), then bf16 rounding.
  std::vector<double> tol(static_cast<size_t>(n_act));
  for (int j = 0; j <= k; ++j) {
    const bool shared = j == k;
    const HostQ& M = shared ? m.sgu : m.gu;
    const int n = shared ? s.Is : s.I;
    const int64_t g0 = shared ? 0 : int64_t(idx[size_t(j)]) * 2 * s.I;
    const auto g = q_twin(M, g0, n, x), u = q_twin(M, g0 + n, n, x);
    const auto tg = q_gemv_tolerance(M, g0, n, x), tu = q_gemv_tolerance(M, g0 + n, n, x);
    for (int i = 0; i < n; ++i) {
      const size_t at = size_t(j) * size_t(s.I) + size_t(i);
      const double gi = g[size_t(i)], ui = u[size_t(i)];
      tol[at] = 1.1 * (std::fabs(ui) * tg[size_t(i)] +
                       std::fabs(gi / (1 + std::exp(-gi))) * tu[size_t(i)]) +
                (1.0 / 256 + 1e-6) * std::fabs(act_cpu[at]) + 1e-30;
    }
  }
  EXPECT_TRUE(within(act_gpu, act_cpu, tol, "q_moe_gate_up_gemv act"));

  // down, from the GPU's act
  std::vector<float> h0 = random_floats(size_t(s.H), 2.f, uint32_t(seed + 5));
  std::vector<float> out(static_cast<size_t>(s.H));
  cpu::moe_token_down(m.w, act_gpu.data(), idx.data(), wt.data(), k, shared_logit, out.data(),
                      pool);
  std::vector<float> want(static_cast<size_t>(s.H));
  std::vector<double> td(static_cast<size_t>(s.H), 0.0);
  for (int j = 0; j <= k; ++j) {
    const bool shared = j == k;
    const std::vector<float> a(act_gpu.begin() + ptrdiff_t(j) * s.I,
                               act_gpu.begin() + ptrdiff_t(j) * s.I + (shared ? s.Is : s.I));
    const auto t = shared ? q_gemv_tolerance(m.sdn, 0, s.H, a)
                          : q_gemv_tolerance(m.dn, int64_t(idx[size_t(j)]) * s.H, s.H, a);
    const double weight = shared ? 1 / (1 + std::exp(-double(shared_logit))) : wt[size_t(j)];
    for (int c = 0; c < s.H; ++c) td[size_t(c)] += weight * t[size_t(c)];
  }
  for (size_t c = 0; c < want.size(); ++c) {
    want[c] = h0[c] + out[c];
    td[c] += 4 * kU * (std::fabs(double(h0[c])) + std::fabs(double(out[c]))) + 1e-30;
  }
  std::vector<float> h_init = h0;
  h_init.resize(size_t(s.H) + guard, 0.f);
  auto dh = upload(h_init);
  LILAC_CUDA_CHECK(cudaMemset(dh.get() + s.H, 0xff, guard * sizeof(float)));
  cuda::q_moe_down_gemv(m.dn.q(), m.sdn.q(), didx.get(), dwt.get(), dlogit.get(), dact.get(), k,
                        s.H, s.I, s.Is, dh.get(), nullptr);
  std::vector<float> got = download(dh);
  EXPECT_TRUE(guard_untouched(got, size_t(s.H), "q_moe_down_gemv"));
  got.resize(size_t(s.H));
  EXPECT_TRUE(within(got, want, td, "q_moe_down_gemv h"));
}

// ---- prefill ------------------------------------------------------------------------------------

// Which kernels: the dispatch (the wgmma kernels for 4-bit weights on Hopper), the mma.sync ones
// (q_moe_grouped_*_mma), or the wgmma kernels' short-tile forms (passes of 64 / 32 rows).
enum class Form { dispatch, mma, rows64, rows32 };

void check_prefill(Shape s, int T, uint64_t seed, Form form) {
  const bool mma = form == Form::mma;
  const bool rows_form = form == Form::rows64 || form == Form::rows32;
  const cuda::QMoeWgmmaTile tile =
      form == Form::rows32 ? cuda::QMoeWgmmaTile::rows32 : cuda::QMoeWgmmaTile::rows64;
  const std::string what = "T " + std::to_string(T) + " E " + std::to_string(s.E) + " bits " +
                           std::to_string(s.bits) +
                           (mma                    ? " mma.sync"
                            : form == Form::rows64 ? " rows64"
                            : form == Form::rows32 ? " rows32"
                                                   : "");
  SCOPED_TRACE(what);
  if (rows_form && !cuda::q_moe_grouped_wgmma_available())
    GTEST_SKIP() << "the wgmma expert kernels need a compute capability 9.x GPU";
  QMoe m(s, seed);
  const int k = s.k, P = T * k;
  const auto gub = m.gu.dequant_bf16(), dnb = m.dn.dequant_bf16(), sgub = m.sgu.dequant_bf16();
  // Routing on the device (moe_route is tested against a counting sort in moe_prefill_test.cpp).
  const std::vector<float> logits = moe_router_logits(T, s.E, seed);
  const DeviceRouting route(logits, T, s.E, k);
  const cuda::MoeRouting& r = route.r;
  const std::vector<int32_t>& sorted_token = route.sorted_token;
  const std::vector<int32_t>& expert_of = route.expert_of;

  const auto xb = random_bf16_bits(size_t(T) * s.H, 1.f, seed + 8);
  const auto x = widen(xb.data(), xb.size());
  auto dx = upload_bf16(xb);

  // The short-tile forms run the shared expert inside the grouped launches (QMoeSharedPart):
  // its act and out are checked below, act as the shared kernel's would be.
  cuda::DeviceBuffer<cuda::bf16> shared_act(static_cast<size_t>(T) * s.Is + 16);
  cuda::DeviceBuffer<float> shared_out(static_cast<size_t>(T) * s.H + 16);
  poison(shared_act);
  poison(shared_out);
  const cuda::QMoeSharedPart part{m.sgu.q(), m.sdn.q(), shared_act.get(), shared_out.get()};

  // gate_up (grouped) and the shared expert's
  for (int pass = 0; pass < 2; ++pass) {
    const bool shared = pass == 1;
    const int rows = shared ? T : P, I = shared ? s.Is : s.I;
    cuda::DeviceBuffer<cuda::bf16> act(static_cast<size_t>(rows) * I + 16);
    poison(act);
    if (shared && rows_form)
      LILAC_CUDA_CHECK(
          cudaMemcpy(act.get(), shared_act.get(), size_t(T) * s.Is * 2, cudaMemcpyDeviceToDevice));
    else if (shared && mma)
      cuda::q_moe_shared_gate_up_mma(dx.get(), T, s.H, m.sgu.q(), s.Is, act.get(), nullptr);
    else if (shared)
      cuda::q_moe_shared_gate_up(dx.get(), T, s.H, m.sgu.q(), s.Is, act.get(), nullptr);
    else if (rows_form)
      cuda::q_moe_grouped_gate_up_wgmma(dx.get(), s.H, m.gu.q(), s.I, r, act.get(), nullptr, tile,
                                        &part);
    else if (mma)
      cuda::q_moe_grouped_gate_up_mma(dx.get(), s.H, m.gu.q(), s.I, r, act.get(), nullptr);
    else
      cuda::q_moe_grouped_gate_up(dx.get(), s.H, m.gu.q(), s.I, r, act.get(), nullptr);
    const auto got = download_bf16_as_f32(act);
    std::vector<double> want(static_cast<size_t>(rows) * I), tol(size_t(rows) * I);
    ThreadPool::global().parallel_for(size_t(rows), [&](size_t b0, size_t e0) {
      for (size_t row = b0; row < e0; ++row) {
        const int t = shared ? int(row) : sorted_token[row];
        const uint16_t* base = shared ? sgub.data() : &gub[size_t(expert_of[row]) * 2 * s.I * s.H];
        const float* xt = &x[size_t(t) * s.H];
        const double xn = std::sqrt(std::inner_product(xt, xt + s.H, xt, 0.0));
        for (int i = 0; i < I; ++i) {
          const uint16_t* gw = base + size_t(i) * s.H;
          const uint16_t* uw = base + size_t(I + i) * s.H;
          const TwinValue t = moe_act_twin(gw, uw, xt, s.H, xn);
          want[row * I + size_t(i)] = t.want;
          tol[row * I + size_t(i)] = t.tol;
        }
      }
    });
    EXPECT_TRUE(within(
        size_t(rows) * I, [&](size_t i) { return got[i]; }, [&](size_t i) { return want[i]; },
        [&](size_t i) { return tol[i]; },
        [&](size_t i) {
          return "row " + std::to_string(i / size_t(I)) + ", col " + std::to_string(i % size_t(I));
        },
        what + (shared ? " shared gate_up" : " grouped gate_up")));
    if (shared) continue;

    // grouped down from the GPU's act
    std::vector<float> actf(got.begin(), got.begin() + ptrdiff_t(rows) * I);
    cuda::DeviceBuffer<float> y(static_cast<size_t>(P) * s.H + 16);
    poison(y);
    if (rows_form)
      cuda::q_moe_grouped_down_wgmma(act.get(), s.I, m.dn.q(), s.H, r, y.get(), nullptr, tile,
                                     &part);
    else if (mma)
      cuda::q_moe_grouped_down_mma(act.get(), s.I, m.dn.q(), s.H, r, y.get(), nullptr);
    else
      cuda::q_moe_grouped_down(act.get(), s.I, m.dn.q(), s.H, r, y.get(), nullptr);
    const auto yg = download(y);
    EXPECT_TRUE(guard_untouched(yg, size_t(P) * s.H, what + " grouped down"));
    std::vector<double> yw(static_cast<size_t>(P) * s.H), yt(size_t(P) * s.H);
    ThreadPool::global().parallel_for(size_t(P), [&](size_t b0, size_t e0) {
      for (size_t row = b0; row < e0; ++row) {
        const float* a = &actf[row * size_t(s.I)];
        const double an = std::sqrt(std::inner_product(a, a + s.I, a, 0.0));
        for (int c = 0; c < s.H; ++c) {
          const uint16_t* dw = &dnb[(size_t(expert_of[row]) * s.H + size_t(c)) * s.I];
          const TwinValue t = moe_down_twin(dw, a, s.I, an);
          yw[row * s.H + size_t(c)] = t.want;
          yt[row * s.H + size_t(c)] = t.tol;
        }
      }
    });
    EXPECT_TRUE(within(
        size_t(P) * s.H, [&](size_t i) { return yg[i]; }, [&](size_t i) { return yw[i]; },
        [&](size_t i) { return yt[i]; },
        [&](size_t i) {
          return "sorted row " + std::to_string(i / size_t(s.H)) + ", col " +
                 std::to_string(i % size_t(s.H));
        },
        what + " grouped down"));
    if (!rows_form) continue;

    // The shared expert's out from the GPU's shared act (its act is checked in pass 1).
    const auto sa = download_bf16_as_f32(shared_act);
    const auto so = download(shared_out);
    EXPECT_TRUE(guard_untouched(so, size_t(T) * s.H, what + " shared down"));
    const auto sdnb = m.sdn.dequant_bf16();
    std::vector<double> sw(static_cast<size_t>(T) * s.H), st(size_t(T) * s.H);
    ThreadPool::global().parallel_for(size_t(T), [&](size_t b0, size_t e0) {
      for (size_t t = b0; t < e0; ++t) {
        const float* a = &sa[t * size_t(s.Is)];
        const double an = std::sqrt(std::inner_product(a, a + s.Is, a, 0.0));
        for (int c = 0; c < s.H; ++c) {
          const TwinValue v = moe_down_twin(&sdnb[size_t(c) * s.Is], a, s.Is, an);
          sw[t * s.H + size_t(c)] = v.want;
          st[t * s.H + size_t(c)] = v.tol;
        }
      }
    });
    EXPECT_TRUE(within(
        size_t(T) * s.H, [&](size_t i) { return so[i]; }, [&](size_t i) { return sw[i]; },
        [&](size_t i) { return st[i]; },
        [&](size_t i) {
          return "token " + std::to_string(i / size_t(s.H)) + ", col " +
                 std::to_string(i % size_t(s.H));
        },
        what + " shared down"));
  }
}

std::string dims(Shape s) {
  return "H" + std::to_string(s.H) + "_E" + std::to_string(s.E) + "_k" + std::to_string(s.k) +
         "_I" + std::to_string(s.I) + "_Is" + std::to_string(s.Is);
}

LILAC_CONFORMANCE_CASES(q4_moe) {
  std::vector<OpCase> cases;
  auto decode = [&](Shape s, uint64_t seed) {
    cases.push_back({"q_moe_decode", dims(s), s.bits == 4 ? "q4" : "q8",
                     "cpu::moe_token_act + cpu::moe_token_down",
                     [s, seed] { check_decode(s, seed); }});
  };
  decode(Shape{2048, 256, 8, 512, 512, 4}, 1000);  // the real shape
  decode(Shape{128, 16, 4, 64, 64, 4}, 2000);      // the tiny-a fixture's
  decode(Shape{128, 16, 4, 64, 64, 8}, 2100);
  decode(Shape{192, 9, 3, 128, 64, 4}, 2200);  // I != Is, 3 groups of H
  decode(Shape{2048, 32, 8, 512, 512, 8}, 2300);
  auto prefill = [&](Shape s, int T, uint64_t seed, Form form = Form::dispatch) {
    const char* suffix = form == Form::mma      ? "_mma"
                         : form == Form::rows64 ? "_rows64"
                         : form == Form::rows32 ? "_rows32"
                                                : "";
    cases.push_back({"q_moe_prefill", dims(s) + "_T" + std::to_string(T) + suffix,
                     s.bits == 4 ? "q4" : "q8", "dequantize_row_bf16 + f64 dot products",
                     [s, T, seed, form] { check_prefill(s, T, seed, form); }});
  };
  for (int bits : {4, 8})
    for (int T : {1, 37, 300})
      prefill(Shape{128, 16, 4, 64, 64, bits}, T, 40 + uint64_t(T) + uint64_t(bits));
  // 4-bit on Hopper: tiles of <= 32, <= 64 and more rows (the wgmma n 32 / 64 / 128) and experts
  // with two tiles (T = 600: ~150 rows each); the mma.sync kernels on the same inputs.
  for (int T : {150, 600}) prefill(Shape{128, 16, 4, 64, 64, 4}, T, 40 + uint64_t(T));
  prefill(Shape{192, 9, 3, 128, 64, 4}, 500, 41);  // H 192: a part-filled column block of down
  prefill(Shape{2048, 256, 8, 512, 512, 4}, 300, 77);
  prefill(Shape{2048, 256, 8, 512, 512, 4}, 1200, 78);
  for (int T : {37, 600}) prefill(Shape{128, 16, 4, 64, 64, 4}, T, 44 + uint64_t(T), Form::mma);
  prefill(Shape{2048, 256, 8, 512, 512, 4}, 300, 77, Form::mma);
  // The short-tile forms (passes of 64 / 32 rows, wgmma n from 16): rows per expert of ~2-10
  // (T = 37), ~75 and ~150 (T = 300 / 600 at E 16: two to five passes, a second routing tile),
  // H 192 (a part-filled column block of down), the real shape at 256 tokens (~8 rows per expert)
  // and skew-free 1,200 (~38: two passes of 32).
  for (Form f : {Form::rows64, Form::rows32}) {
    for (int T : {37, 300, 600}) prefill(Shape{128, 16, 4, 64, 64, 4}, T, 50 + uint64_t(T), f);
    prefill(Shape{192, 9, 3, 128, 64, 4}, 500, 42, f);
    prefill(Shape{2048, 256, 8, 512, 512, 4}, 256, 79, f);
    prefill(Shape{2048, 256, 8, 512, 512, 4}, 1200, 78, f);
  }
  return cases;
}

// The check of rows32's column-block job form (q4_moe_prefill_jobs.cuh): `run(jobs)` launches
// with 1 or 2 column blocks per block on poisoned outputs and returns its two outputs as floats,
// each with a 16-element guard past its n1 / n2 elements. The one-job launch writes every
// output, no launch writes past them, and 2 gives its bits.
template <class Run>
void expect_same_bits_over_jobs(Run run, size_t n1, size_t n2) {
  std::vector<float> first1, first2;
  for (int jobs : {1, 2}) {
    const auto [out1, out2] = run(jobs);
    const std::string what = "jobs " + std::to_string(jobs);
    for (size_t i = n1; i < out1.size(); ++i)
      ASSERT_TRUE(std::isnan(out1[i])) << what << ": output 1 written past its end at " << i;
    for (size_t i = n2; i < out2.size(); ++i)
      ASSERT_TRUE(std::isnan(out2[i])) << what << ": output 2 written past its end at " << i;
    if (jobs == 1) {
      first1.assign(out1.begin(), out1.begin() + ptrdiff_t(n1));
      first2.assign(out2.begin(), out2.begin() + ptrdiff_t(n2));
      size_t unwritten = 0;
      for (float v : first1) unwritten += std::isnan(v) ? 1 : 0;
      for (float v : first2) unwritten += std::isnan(v) ? 1 : 0;
      EXPECT_EQ(unwritten, 0u) << "outputs the one-job launch left poisoned";
      continue;
    }
    EXPECT_EQ(std::memcmp(out1.data(), first1.data(), n1 * sizeof(float)), 0)
        << what << " output 1";
    EXPECT_EQ(std::memcmp(out2.data(), first2.data(), n2 * sizeof(float)), 0)
        << what << " output 2";
  }
}

struct JobsCase {
  Shape s;
  int T;
};

// rows32's down over 2 column blocks of 128 y columns per block (down_jobs_kernel; the default up
// to 256 tokens): y and the shared expert's out. Shapes: the real one at 256 tokens (~8 rows per
// expert) and 1,200 (~38: two passes of 32), H 320 (3 column blocks, the last with 4 of its 8 row
// tiles: blocks of 2 and 1), and Is 64 (one k-tile: not whole pairs, so the launch keeps one
// column block per block).
TEST(Q4Moe, DownOverColumnBlockJobsGivesTheSameBits) {
  if (!cuda::q_moe_grouped_wgmma_available())
    GTEST_SKIP() << "the wgmma expert kernels need a compute capability 9.x GPU";
  for (const JobsCase c :
       {JobsCase{{2048, 256, 8, 512, 512, 4}, 256}, JobsCase{{2048, 256, 8, 512, 512, 4}, 1200},
        JobsCase{{320, 16, 4, 128, 128, 4}, 300}, JobsCase{{192, 9, 3, 128, 64, 4}, 500}}) {
    const Shape s = c.s;
    const int T = c.T, P = T * s.k;
    SCOPED_TRACE(testing::Message()
                 << "H " << s.H << " E " << s.E << " I " << s.I << " Is " << s.Is << " T " << T);
    QMoe m(s, 90 + uint64_t(T));
    const DeviceRouting route(moe_router_logits(T, s.E, 91 + uint64_t(T)), T, s.E, s.k);
    auto act = upload_bf16(random_bf16_bits(size_t(P) * s.I, 1.f, 92 + uint64_t(T)));
    auto shared_act = upload_bf16(random_bf16_bits(size_t(T) * s.Is, 1.f, 93 + uint64_t(T)));
    expect_same_bits_over_jobs(
        [&](int jobs) {
          cuda::DeviceBuffer<float> y(static_cast<size_t>(P) * s.H + 16);
          cuda::DeviceBuffer<float> shared_out(static_cast<size_t>(T) * s.H + 16);
          poison(y);
          poison(shared_out);
          const cuda::QMoeSharedPart part{m.sgu.q(), m.sdn.q(), shared_act.get(), shared_out.get()};
          cuda::q_moe_grouped_down_wgmma(act.get(), s.I, m.dn.q(), s.H, route.r, y.get(), nullptr,
                                         cuda::QMoeWgmmaTile::rows32, &part, jobs);
          return std::pair(download(y), download(shared_out));
        },
        size_t(P) * s.H, size_t(T) * s.H);
  }
  cuda::MoeRouting none;
  EXPECT_THROW(cuda::q_moe_grouped_down_wgmma(nullptr, 512, cuda::QMatrix{}, 2048, none, nullptr,
                                              nullptr, cuda::QMoeWgmmaTile::rows32, nullptr, 4),
               Error);  // 4 column blocks per block (removed in s31)
}

// dequant_ktile's one-FMA form (QMatrix::small_scales, the engine's pick for every real and
// synthetic matrix) gives the two-FMA form's bits in every grouped expert kernel: gate_up and down
// (one and two column blocks per block) with the shared expert inside, for each tile form, at the
// real shape at 256 and 1,200 tokens. Outputs poisoned; every one written.
TEST(Q4Moe, OneFmaDequantisationGivesTheSameBits) {
  if (!cuda::q_moe_grouped_wgmma_available())
    GTEST_SKIP() << "the wgmma expert kernels need a compute capability 9.x GPU";
  const Shape s{2048, 256, 8, 512, 512, 4};
  QMoe m(s, 95);
  for (const HostQ* q : {&m.gu, &m.dn, &m.sgu, &m.sdn}) ASSERT_TRUE(q->small_scales);
  for (int T : {256, 1200}) {
    const int P = T * s.k;
    const DeviceRouting route(moe_router_logits(T, s.E, 96 + uint64_t(T)), T, s.E, s.k);
    auto x = upload_bf16(random_bf16_bits(size_t(T) * s.H, 1.f, 97 + uint64_t(T)));
    auto act_in = upload_bf16(random_bf16_bits(size_t(P) * s.I, 1.f, 98 + uint64_t(T)));
    auto shared_in = upload_bf16(random_bf16_bits(size_t(T) * s.Is, 1.f, 99 + uint64_t(T)));
    using Tile = cuda::QMoeWgmmaTile;
    for (const auto& [tile, jobs] : {std::pair{Tile::rows32, 1}, std::pair{Tile::rows32, 2},
                                     std::pair{Tile::rows64, 0}, std::pair{Tile::fixed128, 0}}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " tile " << int(tile) << " jobs " << jobs);
      // act, the shared act, y and the shared out, as raw bytes.
      auto run = [&](bool one_fma) {
        cuda::QMatrix gu = m.gu.q(), dn = m.dn.q(), sgu = m.sgu.q(), sdn = m.sdn.q();
        gu.small_scales = dn.small_scales = sgu.small_scales = sdn.small_scales = one_fma;
        cuda::DeviceBuffer<cuda::bf16> act(size_t(P) * s.I), shared_act(size_t(T) * s.Is);
        cuda::DeviceBuffer<float> y(size_t(P) * s.H), shared_out(size_t(T) * s.H);
        poison(act);
        poison(shared_act);
        poison(y);
        poison(shared_out);
        const cuda::QMoeSharedPart gp{sgu, sdn, shared_act.get(), shared_out.get()};
        cuda::q_moe_grouped_gate_up_wgmma(x.get(), s.H, gu, s.I, route.r, act.get(), nullptr, tile,
                                          &gp);
        const cuda::QMoeSharedPart dp{sgu, sdn, shared_in.get(), shared_out.get()};
        cuda::q_moe_grouped_down_wgmma(act_in.get(), s.I, dn, s.H, route.r, y.get(), nullptr, tile,
                                       &dp, jobs);
        std::vector<std::vector<float>> out = {download_bf16_as_f32(act),
                                               download_bf16_as_f32(shared_act), download(y),
                                               download(shared_out)};
        return out;
      };
      const auto two = run(false), one = run(true);
      const char* names[] = {"act", "shared act", "y", "shared out"};
      for (size_t i = 0; i < two.size(); ++i) {
        size_t unwritten = 0;
        for (float v : two[i]) unwritten += std::isnan(v) ? 1 : 0;
        EXPECT_EQ(unwritten, 0u) << names[i] << " left poisoned";
        EXPECT_EQ(std::memcmp(one[i].data(), two[i].data(), two[i].size() * sizeof(float)), 0)
            << names[i] << ": the one-FMA form gave other bits";
      }
    }
  }
}

// The routed rows of y in bf16 (q_moe_grouped_down_wgmma's y_bf16, s32): every tile form's
// outputs are its f32 outputs rounded to nearest even, element for element, nothing written past
// the P x H bf16 rows, and the shared expert's out (f32) the same bits; moe_combine over the bf16
// rows gives, bit for bit, its sums over f32 rows holding the same values widened. Shapes: the
// real one at 256 and 1,200 tokens, and H 320 (a partial column block) at 300.
TEST(Q4Moe, DownBf16RowsAreTheF32RowsRounded) {
  if (!cuda::q_moe_grouped_wgmma_available())
    GTEST_SKIP() << "the wgmma expert kernels need a compute capability 9.x GPU";
  for (const JobsCase c :
       {JobsCase{{2048, 256, 8, 512, 512, 4}, 256}, JobsCase{{2048, 256, 8, 512, 512, 4}, 1200},
        JobsCase{{320, 16, 4, 128, 128, 4}, 300}}) {
    const Shape s = c.s;
    const int T = c.T, P = T * s.k;
    const size_t nY = size_t(P) * s.H, nS = size_t(T) * s.H;
    QMoe m(s, 190 + uint64_t(T));
    const std::vector<float> logits = moe_router_logits(T, s.E, 191 + uint64_t(T));
    const DeviceRouting route(logits, T, s.E, s.k);
    auto act = upload_bf16(random_bf16_bits(size_t(P) * s.I, 1.f, 192 + uint64_t(T)));
    auto shared_act = upload_bf16(random_bf16_bits(size_t(T) * s.Is, 1.f, 193 + uint64_t(T)));
    for (const auto& [tile, jobs] : {std::pair{cuda::QMoeWgmmaTile::fixed128, 0},
                                     {cuda::QMoeWgmmaTile::adaptive, 0},
                                     {cuda::QMoeWgmmaTile::rows64, 0},
                                     {cuda::QMoeWgmmaTile::rows32, 1},
                                     {cuda::QMoeWgmmaTile::rows32, 2}}) {
      SCOPED_TRACE(testing::Message()
                   << "H " << s.H << " T " << T << " tile " << int(tile) << " jobs " << jobs);
      auto run = [&](bool y_bf16) {
        cuda::DeviceBuffer<float> y(nY + 16), shared_out(nS + 16);
        poison(y);
        poison(shared_out);
        const cuda::QMoeSharedPart part{m.sgu.q(), m.sdn.q(), shared_act.get(), shared_out.get()};
        cuda::q_moe_grouped_down_wgmma(act.get(), s.I, m.dn.q(), s.H, route.r, y.get(), nullptr,
                                       tile, &part, jobs, y_bf16);
        return std::pair(download(y), download(shared_out));
      };
      const auto [y32, sh32] = run(false);
      const auto [y16, sh16] = run(true);
      EXPECT_EQ(std::memcmp(sh32.data(), sh16.data(), nS * sizeof(float)), 0) << "shared out";
      std::vector<uint16_t> bits(nY);
      std::memcpy(bits.data(), y16.data(), nY * 2);
      size_t wrong = 0, first = nY;
      for (size_t i = 0; i < nY; ++i)
        if (bits[i] != f32_to_bf16(y32[i])) wrong += 1, first = std::min(first, i);
      EXPECT_EQ(wrong, 0u) << "bf16 rows that are not the f32 rows rounded; first at " << first;
      for (size_t i = nY / 2; i < y16.size(); ++i)
        ASSERT_TRUE(std::isnan(y16[i])) << "written past the bf16 rows at float " << i;
      // The combine over the bf16 rows and over their widened f32 values.
      if (tile != cuda::QMoeWgmmaTile::adaptive) continue;
      std::vector<float> widened(nY);
      for (size_t i = 0; i < nY; ++i) widened[i] = bf16_to_f32(bits[i]);
      auto d_logits = upload(logits);
      auto d_shared = upload(sh32);
      const std::vector<float> h0 = random_floats(nS, 1.f, uint32_t(194 + T));
      auto combine = [&](const std::vector<float>& rows, bool y_bf16) {
        auto d_y = upload(rows);
        auto d_h = upload(h0);
        cuda::moe_combine(d_y.get(), route.r, d_logits.get(), s.E + 1, d_shared.get(), s.H,
                          d_h.get(), nullptr, nullptr, nullptr, 0.f, y_bf16);
        return download(d_h);
      };
      const auto h16 = combine(y16, true), h32 = combine(widened, false);
      EXPECT_EQ(std::memcmp(h16.data(), h32.data(), nS * sizeof(float)), 0) << "combine";
    }
  }
}

TEST(Q4Moe, BadArgumentsThrow) {
  cuda::QMatrix q{reinterpret_cast<const uint32_t*>(uintptr_t(256)),
                  reinterpret_cast<const uint32_t*>(uintptr_t(256)), 1024, 2048, 4};
  auto* i = reinterpret_cast<const int32_t*>(uintptr_t(256));
  auto* x = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* a = reinterpret_cast<cuda::bf16*>(uintptr_t(256));
  cuda::QMatrix shared = q;
  shared.bits = 8;
  EXPECT_THROW(cuda::q_moe_gate_up_gemv(q, shared, i, 8, x, 2048, 512, 512, a, nullptr),
               Error);  // bits differ
  EXPECT_THROW(cuda::q_moe_gate_up_gemv(q, q, i, 8, x, 2048, 500, 512, a, nullptr),
               Error);  // I % 64
  EXPECT_THROW(cuda::q_moe_gate_up_gemv(q, q, i, 40, x, 2048, 512, 512, a, nullptr), Error);  // k
  // The grouped wgmma kernels: 4 bits only, H and I multiples of 64, a laid-out routing table.
  cuda::MoeRouting r;
  r.topk_idx = const_cast<int32_t*>(i);
  r.T = 4;
  cuda::QMatrix gu{q.codes, q.sb, 256 * 1024, 2048, 8};
  EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 512, r, a, nullptr),
               Error);  // 8 bits
  gu.bits = 4;
  EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 500, r, a, nullptr),
               Error);  // I % 64
  EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x + 1, 2048, gu, 512, r, a, nullptr),
               Error);  // x alignment
  cuda::MoeRouting empty;
  auto* y = reinterpret_cast<float*>(uintptr_t(256));
  cuda::QMatrix dn{q.codes, q.sb, 256 * 2048, 512, 4};
  EXPECT_THROW(cuda::q_moe_grouped_down_wgmma(a, 512, dn, 2048, empty, y, nullptr),
               Error);  // routing not laid out
  // The shared expert inside the launches (QMoeSharedPart): its matrices 4-bit, [2 Is, H] and
  // [H, Is] with Is a multiple of 64, its buffers given; refused before any launch.
  using cuda::QMoeWgmmaTile;
  const cuda::QMatrix sgu{q.codes, q.sb, 1024, 2048, 4}, sdn{q.codes, q.sb, 2048, 512, 4};
  auto* sact = reinterpret_cast<cuda::bf16*>(uintptr_t(256));
  const cuda::QMoeSharedPart ok{sgu, sdn, sact, y};
  for (QMoeWgmmaTile t : {QMoeWgmmaTile::adaptive, QMoeWgmmaTile::rows64, QMoeWgmmaTile::rows32}) {
    cuda::QMoeSharedPart bad = ok;
    bad.gate_up.bits = 8;
    EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 512, r, a, nullptr, t, &bad),
                 Error);  // 8 bits
    bad = ok;
    bad.gate_up.rows = 1000;  // Is 500
    EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 512, r, a, nullptr, t, &bad),
                 Error);  // Is % 64
    bad = ok;
    bad.gate_up.cols = 1024;
    EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 512, r, a, nullptr, t, &bad),
                 Error);  // not [2 Is, H]
    bad = ok;
    bad.act = nullptr;
    EXPECT_THROW(cuda::q_moe_grouped_gate_up_wgmma(x, 2048, gu, 512, r, a, nullptr, t, &bad),
                 Error);  // no shared act
    bad = ok;
    bad.down.rows = 1024;
    EXPECT_THROW(cuda::q_moe_grouped_down_wgmma(a, 512, dn, 2048, r, y, nullptr, t, &bad),
                 Error);  // not [H, Is]
    bad = ok;
    bad.out = nullptr;
    EXPECT_THROW(cuda::q_moe_grouped_down_wgmma(a, 512, dn, 2048, r, y, nullptr, t, &bad),
                 Error);  // no shared out
  }
}

}  // namespace
}  // namespace lilac::test
