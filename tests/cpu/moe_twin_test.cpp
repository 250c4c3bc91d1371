// The one-token MoE twins of the CUDA decode kernels (cpu::moe_token_act, cpu::moe_token_down):
// together with router_top_k they must reproduce moe_forward, token by token, and act must hold
// silu(gate . x) * (up . x) in the documented layout (routed experts in slot order, shared last).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu/norm.h"

namespace lilac::test {
namespace {

struct RandomMoe {
  ModelConfig cfg;
  MoeWeights w;
  std::vector<std::vector<float>> store;
  std::mt19937 rng{17};

  Matrix matrix(int64_t rows, int64_t cols, float scale) {
    std::normal_distribution<float> d(0.f, scale);
    store.emplace_back(size_t(rows * cols));
    for (auto& v : store.back()) v = d(rng);
    return Matrix{store.back().data(), DType::F32, rows, cols, "test"};
  }

  RandomMoe(int64_t H, int64_t E, int64_t k, int64_t I, int64_t Is) {
    store.reserve(size_t(4 + 3 * E + 4));
    cfg.hidden = H;
    cfg.experts = E;
    cfg.experts_per_token = k;
    cfg.expert_intermediate = I;
    cfg.shared_intermediate = Is;
    w.router = matrix(E, H, 1.f);
    for (int64_t e = 0; e < E; ++e)
      w.experts.push_back(
          ExpertWeights{matrix(I, H, 0.2f), matrix(I, H, 0.2f), matrix(H, I, 0.2f)});
    w.shared_gate = matrix(Is, H, 0.2f);
    w.shared_up = matrix(Is, H, 0.2f);
    w.shared_down = matrix(H, Is, 0.2f);
    w.shared_expert_gate = matrix(1, H, 0.3f);
  }
};

TEST(MoeTwin, TokenActAndDownReproduceMoeForward) {
  const int64_t H = 40, E = 6, k = 3, I = 16, Is = 24, T = 3;
  RandomMoe m(H, E, k, I, Is);
  ThreadPool pool(2);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(T * H));
  for (auto& v : x) v = d(m.rng);
  std::vector<float> want(static_cast<size_t>(T * H));
  cpu::moe_forward(m.w, m.cfg, x.data(), T, want.data(), pool, nullptr, "");

  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[size_t(t * H)];
    std::vector<float> logits(static_cast<size_t>(E));
    cpu::matmul(m.w.router, xt, 1, H, logits.data(), E, pool);
    std::vector<int32_t> idx(static_cast<size_t>(k));
    std::vector<float> wt(static_cast<size_t>(k));
    cpu::router_top_k(logits.data(), E, k, idx.data(), wt.data());
    float shared_logit = 0;
    cpu::matmul(m.w.shared_expert_gate, xt, 1, H, &shared_logit, 1, pool);

    std::vector<float> act(static_cast<size_t>(k * I + Is)), out(static_cast<size_t>(H));
    cpu::moe_token_act(m.w, xt, idx.data(), k, act.data(), pool);
    cpu::moe_token_down(m.w, act.data(), idx.data(), wt.data(), k, shared_logit, out.data(), pool);
    for (int64_t c = 0; c < H; ++c)
      EXPECT_NEAR(out[size_t(c)], want[size_t(t * H + c)],
                  1e-5 * (1 + std::fabs(want[size_t(t * H + c)])))
          << "token " << t << " column " << c;

    // act by hand: slot 1's expert row 5, and the shared expert's last row.
    auto act_of = [&](const Matrix& g, const Matrix& u, int64_t row) {
      double gs = 0, us = 0;
      const float* gr = static_cast<const float*>(g.data) + row * H;
      const float* ur = static_cast<const float*>(u.data) + row * H;
      for (int64_t j = 0; j < H; ++j) gs += double(gr[j]) * xt[j], us += double(ur[j]) * xt[j];
      return gs / (1 + std::exp(-gs)) * us;
    };
    const ExpertWeights& e1 = m.w.experts[size_t(idx[1])];
    EXPECT_NEAR(act[size_t(1 * I + 5)], act_of(e1.gate, e1.up, 5), 1e-5);
    EXPECT_NEAR(act[size_t(k * I + Is - 1)], act_of(m.w.shared_gate, m.w.shared_up, Is - 1), 1e-5);
  }
}

}  // namespace
}  // namespace lilac::test
