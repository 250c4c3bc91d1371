// Conformance cases of the MoE decode kernels (router_topk, moe_router, moe_gate_up_gemv,
// moe_down_gemv) against their CPU twins (cpu::router_top_k, cpu::moe_token_act,
// cpu::moe_token_down) at the real shapes (H 2048, E 256, k 8, I = Is = 512) and awkward ones (I !=
// Is, chunk tails, k + 1 not a multiple of 3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "conformance.h"
#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "cuda/linear.h"
#include "cuda/moe_decode.h"
#include "cuda/norm.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace lilac::test {
namespace {

// Router: idx must be identical (the logits are random, so no two probabilities are within
// rounding of each other except the planted exact ties, which both sides order by index); the
// weights differ only by the softmax's summation order and expf: 1e-5 relative.
struct TopKCase {
  int T, E, k;
};
void check_router_topk(TopKCase c) {
  {
    const int stride = c.E + 1;  // the router GEMV's extra column (shared expert gate)
    std::vector<float> logits = random_floats(size_t(c.T) * stride, 2.f, uint32_t(c.E * 7 + c.T));
    for (int t = 0; t < c.T; ++t) {
      float* l = &logits[size_t(t) * stride];
      l[c.E] = 1000.f;  // the shared-gate column must not be read as an expert
      if (c.E >= 8) {
        l[c.E - 1] = 9.f;  // the last expert, and a tie pair 2 / 6 (order must be 2, 6)
        l[2] = l[6] = 8.f;
        if (t % 2) l[0] = l[c.E - 2] = 7.5f;
      }
    }
    std::vector<int32_t> want_idx(size_t(c.T) * c.k);
    std::vector<float> want_w(size_t(c.T) * c.k);
    for (int t = 0; t < c.T; ++t)
      cpu::router_top_k(&logits[size_t(t) * stride], c.E, c.k, &want_idx[size_t(t) * c.k],
                        &want_w[size_t(t) * c.k]);
    auto dl = upload(logits);
    cuda::DeviceBuffer<int32_t> idx(size_t(c.T) * c.k + 8);
    cuda::DeviceBuffer<float> w(size_t(c.T) * c.k + 8);
    poison(idx);
    poison(w);
    cuda::router_topk(dl.get(), stride, c.T, c.E, c.k, idx.get(), w.get(), nullptr);
    std::vector<int32_t> got_idx = download(idx);
    std::vector<float> got_w = download(w);
    EXPECT_TRUE(guard_untouched(got_idx, want_idx.size(), "router idx"));
    EXPECT_TRUE(guard_untouched(got_w, want_w.size(), "router w"));
    got_idx.resize(want_idx.size());
    got_w.resize(want_w.size());
    for (size_t i = 0; i < want_idx.size(); ++i)
      ASSERT_EQ(got_idx[i], want_idx[i])
          << "token " << i / size_t(c.k) << " slot " << i % size_t(c.k);
    EXPECT_TRUE(within(got_w, want_w, 1e-7, 1e-5, "router weights"));
  }
}

// moe_router (post norm + router GEMV + top-k, one launch) against the unfused GPU path rms_norm
// + gemv(E + 1 rows) + router_topk: logits, ids, weights and the normalised x equal bit for bit;
// against the twins: ids equal to cpu::router_top_k on those logits, logits within the dot
// tolerance of cpu::matmul on that x. The workspace counter is back at zero after each launch
// (a second launch, reusing it, must agree again).
struct RouterCase {
  int E, H, k;
  bool x_out;
};
void check_moe_router(RouterCase c) {
  std::vector<uint8_t> zero(cuda::moe_router_workspace_bytes(), 0);
  auto ws = upload(zero);
  {
    const int rows = c.E + 1;
    const uint64_t seed = uint64_t(c.E * 31 + c.H + c.k);
    std::vector<uint16_t> w = random_bf16(size_t(rows) * c.H, 0.05f, seed);
    std::vector<float> h = random_floats(size_t(c.H), 2.f, uint32_t(seed + 1));
    std::vector<float> scale = random_floats(size_t(c.H), 0.1f, uint32_t(seed + 2));
    for (auto& v : scale) v += 1.f;
    const float eps = 1e-6f;
    auto dw = upload_bf16(w);
    auto dh = upload(h);
    auto ds = upload(scale);
    const size_t guard = 16;

    // Unfused.
    cuda::DeviceBuffer<cuda::bf16> x1(static_cast<size_t>(c.H));
    cuda::DeviceBuffer<float> l1(static_cast<size_t>(rows));
    cuda::DeviceBuffer<int32_t> i1(static_cast<size_t>(c.k));
    cuda::DeviceBuffer<float> w1(static_cast<size_t>(c.k));
    cuda::rms_norm(dh.get(), ds.get(), x1.get(), 1, c.H, eps, nullptr);
    cuda::gemv(dw.get(), rows, c.H, x1.get(), l1.get(), cuda::GemvOut::Store, nullptr);
    cuda::router_topk(l1.get(), rows, 1, c.E, c.k, i1.get(), w1.get(), nullptr);
    const std::vector<float> logits1 = download(l1), wt1 = download(w1);
    const std::vector<int32_t> idx1 = download(i1);
    std::vector<uint16_t> xb1(static_cast<size_t>(c.H));
    LILAC_CUDA_CHECK(cudaMemcpy(xb1.data(), x1.get(), xb1.size() * 2, cudaMemcpyDeviceToHost));

    for (int launch = 0; launch < 2; ++launch) {
      SCOPED_TRACE(testing::Message() << "launch " << launch);
      cuda::DeviceBuffer<cuda::bf16> x2(size_t(c.H) + guard);
      cuda::DeviceBuffer<float> l2(size_t(rows) + guard);
      cuda::DeviceBuffer<int32_t> i2(size_t(c.k) + guard);
      cuda::DeviceBuffer<float> w2(size_t(c.k) + guard);
      poison(x2);
      poison(l2);
      poison(i2);
      poison(w2);
      cuda::moe_router(dw.get(), c.E, c.H, dh.get(), ds.get(), eps, c.k, l2.get(), i2.get(),
                       w2.get(), c.x_out ? x2.get() : nullptr, ws.get(), nullptr);
      std::vector<float> logits2 = download(l2), wt2 = download(w2);
      std::vector<int32_t> idx2 = download(i2);
      std::vector<uint16_t> xb2(x2.size());
      LILAC_CUDA_CHECK(cudaMemcpy(xb2.data(), x2.get(), x2.bytes(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(guard_untouched(logits2, size_t(rows), "moe_router logits"));
      EXPECT_TRUE(guard_untouched(idx2, size_t(c.k), "moe_router idx"));
      EXPECT_TRUE(guard_untouched(wt2, size_t(c.k), "moe_router w"));
      EXPECT_TRUE(guard_untouched(xb2, c.x_out ? size_t(c.H) : 0, "moe_router x_out"));
      EXPECT_EQ(0, std::memcmp(logits2.data(), logits1.data(), size_t(rows) * 4))
          << "logits differ from rms_norm + gemv";
      idx2.resize(size_t(c.k));
      wt2.resize(size_t(c.k));
      EXPECT_EQ(idx2, idx1) << "ids differ from router_topk";
      EXPECT_EQ(0, std::memcmp(wt2.data(), wt1.data(), size_t(c.k) * 4))
          << "weights differ from router_topk";
      if (c.x_out)
        EXPECT_EQ(0, std::memcmp(xb2.data(), xb1.data(), size_t(c.H) * 2))
            << "x_out differs from rms_norm";
      std::vector<uint8_t> counter = download(ws);
      EXPECT_EQ(counter, zero) << "the workspace counter was not left at zero";
    }

    // The twins.
    std::vector<float> x = widen(xb1);
    std::vector<float> want(static_cast<size_t>(rows));
    cpu::matmul(bf16_matrix(w.data(), rows, c.H), x.data(), 1, c.H, want.data(), rows,
                ThreadPool::global());
    EXPECT_TRUE(within(logits1, want, dot_tolerance(c.H, rms_bf16(w) * rms(x)), 0.0,
                       "router logits vs twin"));
    std::vector<int32_t> want_idx(static_cast<size_t>(c.k));
    std::vector<float> want_w(static_cast<size_t>(c.k));
    cpu::router_top_k(logits1.data(), c.E, c.k, want_idx.data(), want_w.data());
    EXPECT_EQ(idx1, want_idx);
    EXPECT_TRUE(within(wt1, want_w, 1e-7, 1e-5, "router weights vs twin"));
  }
}

struct MoeShape {
  int H, E, k, I, Is;
};

// Host copies of one layer's MoE weights in the device layout, and the twin's view of them.
struct HostMoe {
  MoeShape s;
  std::vector<uint16_t> gate_up, down, shared_gate_up, shared_down;
  MoeWeights w;

  HostMoe(MoeShape shape, uint64_t seed) : s(shape) {
    const size_t H = size_t(s.H), I = size_t(s.I), Is = size_t(s.Is);
    gate_up = random_bf16(size_t(s.E) * 2 * I * H, 0.05f, seed);
    down = random_bf16(size_t(s.E) * H * I, 0.05f, seed + 1);
    shared_gate_up = random_bf16(2 * Is * H, 0.05f, seed + 2);
    shared_down = random_bf16(H * Is, 0.05f, seed + 3);
    for (int e = 0; e < s.E; ++e) {
      const uint16_t* gu = &gate_up[size_t(e) * 2 * I * H];
      w.experts.push_back(ExpertWeights{bf16_matrix(gu, s.I, s.H),
                                        bf16_matrix(gu + I * H, s.I, s.H),
                                        bf16_matrix(&down[size_t(e) * H * I], s.H, s.I)});
    }
    w.shared_gate = bf16_matrix(shared_gate_up.data(), s.Is, s.H);
    w.shared_up = bf16_matrix(shared_gate_up.data() + Is * H, s.Is, s.H);
    w.shared_down = bf16_matrix(shared_down.data(), s.H, s.Is);
  }
};

void check_moe(MoeShape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << s.H << " E=" << s.E << " k=" << s.k << " I=" << s.I
                                  << " Is=" << s.Is);
  ThreadPool& pool = ThreadPool::global();
  HostMoe m(s, seed);
  const int k = s.k, n_act = s.k * s.I + s.Is;

  // Routing (the router GEMV itself is gemv's test): the last and the first expert are planted.
  std::vector<float> logits = random_floats(size_t(s.E) + 1, 1.f, uint32_t(seed));
  logits[size_t(s.E) - 1] = 6.f;
  logits[0] = 5.f;
  logits[size_t(s.E)] = 0.7f;  // the shared expert's gate logit
  auto dlogits = upload(logits);
  cuda::DeviceBuffer<int32_t> didx(static_cast<size_t>(k));
  cuda::DeviceBuffer<float> dw(static_cast<size_t>(k));
  cuda::router_topk(dlogits.get(), s.E + 1, 1, s.E, k, didx.get(), dw.get(), nullptr);
  const std::vector<int32_t> idx = download(didx);
  const std::vector<float> wt = download(dw);
  {
    std::vector<int32_t> want_idx(static_cast<size_t>(k));
    std::vector<float> want_w(static_cast<size_t>(k));
    cpu::router_top_k(logits.data(), s.E, k, want_idx.data(), want_w.data());
    ASSERT_EQ(idx, want_idx);
  }

  std::vector<float> x = random_floats(size_t(s.H), 1.f, uint32_t(seed + 9));
  const std::vector<uint16_t> xb = to_bf16_rounding(x);
  auto dx = upload_bf16(xb);
  auto dgu = upload_bf16(m.gate_up);
  auto dsgu = upload_bf16(m.shared_gate_up);
  auto ddown = upload_bf16(m.down);
  auto dsdown = upload_bf16(m.shared_down);

  // ---- gate/up: act = bf16(silu(g) * u) ----
  const size_t guard = 24;
  cuda::DeviceBuffer<cuda::bf16> dact(size_t(n_act) + guard);
  poison(dact);
  cuda::moe_gate_up_gemv(dgu.get(), dsgu.get(), didx.get(), k, dx.get(), s.H, s.I, s.Is, dact.get(),
                         nullptr);
  std::vector<float> act_gpu = download_bf16_as_f32(dact);
  {
    std::vector<uint16_t> raw(dact.size());
    LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), dact.get(), dact.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(guard_untouched(raw, size_t(n_act), "moe_gate_up_gemv"));
  }
  act_gpu.resize(size_t(n_act));
  std::vector<float> act_cpu(static_cast<size_t>(n_act));
  cpu::moe_token_act(m.w, x.data(), idx.data(), k, act_cpu.data(), pool);
  // Tolerance: g and u are dots of H terms (dot_tolerance dt each); act = silu(g) u moves by at
  // most |silu'(g)| |u| dt + |silu(g)| dt with |silu'| < 1.1; then the bf16 rounding (2^-8
  // relative) and expf's last bits (1e-6 relative).
  const double dt = dot_tolerance(s.H, rms_bf16(m.gate_up) * rms(x));
  std::vector<double> tol(static_cast<size_t>(n_act));
  for (int j = 0; j <= k; ++j) {
    const bool shared = j == k;
    const Matrix& gm = shared ? m.w.shared_gate : m.w.experts[size_t(idx[size_t(j)])].gate;
    const Matrix& um = shared ? m.w.shared_up : m.w.experts[size_t(idx[size_t(j)])].up;
    std::vector<float> g(size_t(gm.rows)), u(size_t(gm.rows));
    cpu::matmul(gm, x.data(), 1, s.H, g.data(), gm.rows, pool);
    cpu::matmul(um, x.data(), 1, s.H, u.data(), um.rows, pool);
    for (int64_t i = 0; i < gm.rows; ++i) {
      const size_t at = size_t(j) * size_t(s.I) + size_t(i);
      const double gi = g[size_t(i)], ui = u[size_t(i)];
      tol[at] = 1.1 * (std::fabs(ui) + std::fabs(gi / (1 + std::exp(-gi)))) * dt +
                (1.0 / 256 + 1e-6) * std::fabs(act_cpu[at]) + 1e-30;
    }
  }
  EXPECT_TRUE(within(act_gpu, act_cpu, tol, "moe_gate_up_gemv act"));

  // ---- down: h += sum_j w_j down_j act_j + sigmoid(logit_E) shared_down act_k, from the GPU's act
  // ----
  std::vector<float> h0 = random_floats(size_t(s.H), 2.f, uint32_t(seed + 5));
  std::vector<float> out(static_cast<size_t>(s.H));
  cpu::moe_token_down(m.w, act_gpu.data(), idx.data(), wt.data(), k, logits[size_t(s.E)],
                      out.data(), pool);
  std::vector<float> want(size_t(s.H));
  for (size_t c = 0; c < want.size(); ++c) want[c] = h0[c] + out[c];
  // Tolerance: k + 1 dots of I (or Is) terms weighted by w_j (summing to 1) and sigmoid (< 1): at
  // most 2 dot_tolerance of the longer length, plus the roundings of the weighted sum and of the
  // residual add (4u relative).
  const double act_rms = rms(act_gpu);
  const double dd = 2 * dot_tolerance(std::max(s.I, s.Is), rms_bf16(m.down) * act_rms);
  std::vector<float> h_init = h0;
  h_init.resize(size_t(s.H) + guard, 0.f);
  auto dh = upload(h_init);
  LILAC_CUDA_CHECK(cudaMemset(dh.get() + s.H, 0xff, guard * sizeof(float)));
  cuda::moe_down_gemv(ddown.get(), dsdown.get(), didx.get(), dw.get(), dlogits.get() + s.E,
                      dact.get(), k, s.H, s.I, s.Is, dh.get(), nullptr);
  std::vector<float> got = download(dh);
  EXPECT_TRUE(guard_untouched(got, size_t(s.H), "moe_down_gemv"));
  got.resize(size_t(s.H));
  EXPECT_TRUE(within(got, want, dd, 4 * kU, "moe_down_gemv h"));

  // Deterministic: the same inputs give the same bits.
  auto dh2 = upload(h_init);
  cuda::moe_down_gemv(ddown.get(), dsdown.get(), didx.get(), dw.get(), dlogits.get() + s.E,
                      dact.get(), k, s.H, s.I, s.Is, dh2.get(), nullptr);
  std::vector<float> again = download(dh2);
  again.resize(size_t(s.H));
  EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float)))
      << "moe_down_gemv is not deterministic";
}

LILAC_CONFORMANCE_CASES(moe_decode) {
  std::vector<OpCase> cases;
  for (TopKCase c : {TopKCase{1, 256, 8}, TopKCase{5, 256, 8}, TopKCase{3, 16, 4},
                     TopKCase{2, 5, 5}, TopKCase{4, 33, 1}, TopKCase{7, 64, 32}})
    cases.push_back(
        {"router_topk",
         "T" + std::to_string(c.T) + "_E" + std::to_string(c.E) + "_k" + std::to_string(c.k), "f32",
         "cpu::router_top_k", [c] { check_router_topk(c); }});
  for (RouterCase c :
       {RouterCase{256, 2048, 8, true}, RouterCase{256, 2048, 8, false},
        RouterCase{16, 136, 4, true}, RouterCase{5, 8, 5, true}, RouterCase{64, 4096, 32, true},
        RouterCase{33, 1032, 1, true}, RouterCase{256, 512, 8, true}})
    cases.push_back({"moe_router",
                     "E" + std::to_string(c.E) + "_H" + std::to_string(c.H) + "_k" +
                         std::to_string(c.k) + (c.x_out ? "_x_out" : ""),
                     "bf16", "rms_norm + gemv + router_topk, cpu::matmul + cpu::router_top_k",
                     [c] { check_moe_router(c); }});
  auto add = [&](MoeShape s, uint64_t seed) {
    cases.push_back(
        {"moe_decode",
         "H" + std::to_string(s.H) + "_E" + std::to_string(s.E) + "_k" + std::to_string(s.k) +
             "_I" + std::to_string(s.I) + "_Is" + std::to_string(s.Is),
         "bf16", "cpu::moe_token_act + cpu::moe_token_down", [s, seed] { check_moe(s, seed); }});
  };
  add(MoeShape{2048, 256, 8, 512, 512}, 1000);  // the real shape
  add(MoeShape{136, 5, 3, 24, 40}, 2000);       // I != Is, H of 17 chunks, k + 1 = 4 slots
  add(MoeShape{128, 16, 4, 64, 64}, 3000);      // the tiny-a fixture's MoE dims
  add(MoeShape{256, 32, 2, 520, 512}, 4000);    // I of 65 chunks (a second, 1-chunk step)
  add(MoeShape{2048, 8, 1, 8, 16}, 5000);       // k = 1, single-chunk rows
  // down: k > 8 takes two passes of 8 routed rows; I = 1032 (129 chunks: three 64-chunk steps,
  // the last one partial), Is = 520 (65 chunks) shorter than I
  add(MoeShape{136, 24, 12, 1032, 520}, 6000);
  add(MoeShape{2048, 40, 17, 512, 1024}, 7000);  // 3 passes; Is longer than I (2 steps)
  return cases;
}

TEST(CudaMoe, BadArgumentsThrowBeforeLaunching) {
  auto* p = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* f = reinterpret_cast<float*>(uintptr_t(256));
  auto* i = reinterpret_cast<int32_t*>(uintptr_t(256));
  auto* a = reinterpret_cast<cuda::bf16*>(uintptr_t(256));
  EXPECT_THROW(cuda::router_topk(f, 257, 1, 300, 8, i, f, nullptr), Error);  // E > 256
  EXPECT_THROW(cuda::router_topk(f, 100, 1, 256, 8, i, f, nullptr), Error);  // stride < E
  EXPECT_THROW(cuda::router_topk(f, 257, 1, 256, 0, i, f, nullptr), Error);
  EXPECT_THROW(cuda::moe_gate_up_gemv(p, p, i, 8, p, 2044, 512, 512, a, nullptr), Error);  // H % 8
  EXPECT_THROW(cuda::moe_gate_up_gemv(p, p, i, 8, p + 1, 2048, 512, 512, a, nullptr),
               Error);  // x misaligned
  EXPECT_THROW(cuda::moe_down_gemv(p, p, i, f, f, p, 8, 2048, 500, 512, f, nullptr),
               Error);  // I % 8
  EXPECT_THROW(cuda::moe_router(p, 300, 2048, f, f, 1e-6f, 8, f, i, f, a, f, nullptr),
               Error);  // E > 256
  EXPECT_THROW(cuda::moe_router(p, 256, 2044, f, f, 1e-6f, 8, f, i, f, a, f, nullptr),
               Error);  // H % 8
  EXPECT_THROW(cuda::moe_router(p, 256, 2048, f + 1, f, 1e-6f, 8, f, i, f, a, f, nullptr),
               Error);  // h misaligned
  EXPECT_THROW(cuda::moe_router(p, 256, 2048, f, f, 1e-6f, 8, f, i, f, a, nullptr, nullptr),
               Error);  // no workspace
}

}  // namespace
}  // namespace lilac::test
