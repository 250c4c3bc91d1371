// Small known-answer tests of CPU ops whose behaviour the fixtures exercise only indirectly.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/attention.h"
#include "cpu/gated_deltanet.h"
#include "cpu/moe.h"

namespace lilac::test {
namespace {

TEST(RouterTopK, SoftmaxTopKRenormalised) {
  float logits[5] = {0.f, 2.f, 1.f, 2.f, -1.f};
  int32_t idx[3];
  float w[3];
  cpu::router_top_k(logits, 5, 3, idx, w);
  EXPECT_EQ(idx[0], 1);  // tie between 1 and 3: lower index first
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 2);
  float e2 = std::exp(2.f), e1 = std::exp(1.f), s = 2 * e2 + e1;
  EXPECT_NEAR(w[0], e2 / s, 1e-6);
  EXPECT_NEAR(w[2], e1 / s, 1e-6);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.f, 1e-6);
}

TEST(Rope, RotatesSplitHalfPairsAndLeavesTailAlone) {
  // head_dim 8, rotary 4: dims (0,2) and (1,3) rotate; 4..7 pass through.
  auto inv = rope_inv_freq(100.f, 4);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_FLOAT_EQ(inv[1], 0.1f);  // 100^(-2/4)
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  cpu::rope(x, 1, 1, 8, 4, /*pos0=*/3, inv.data());
  float a0 = 3.f, a1 = 0.3f;
  EXPECT_NEAR(x[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
  EXPECT_EQ(x[4], 5.f);
  EXPECT_EQ(x[7], 8.f);
}

TEST(CausalConv, StateCarriesAcrossCalls) {
  // One channel, K = 3, taps (1, 10, 100): out[t] = silu(x[t-2] + 10 x[t-1] + 100 x[t]).
  const float taps[3] = {1, 10, 100};
  const float x[4] = {1, 2, 3, 4};
  float state[2] = {0, 0}, whole[4];
  cpu::causal_conv_silu(x, 4, 1, 3, taps, state, whole);
  float state2[2] = {0, 0}, a[2], b[2];
  cpu::causal_conv_silu(x, 2, 1, 3, taps, state2, a);
  EXPECT_EQ(state2[0], 1.f);
  EXPECT_EQ(state2[1], 2.f);
  cpu::causal_conv_silu(x + 2, 2, 1, 3, taps, state2, b);
  EXPECT_EQ(a[0], whole[0]);
  EXPECT_EQ(b[1], whole[3]);
  float pre = 2 + 30 + 400;
  EXPECT_NEAR(whole[3], pre / (1 + std::exp(-pre)), 1e-3);
  EXPECT_EQ(state2[1], 4.f);
}

TEST(Attention, CausalMaskAndGqa) {
  // 2 query heads share 1 kv head; hd 2. Query 0 sees key 0 only: output = v0 exactly.
  float q[2 * 2 * 2] = {1, 0, 0, 1, 1, 0, 0, 1};
  float k[2 * 2] = {1, 0, 0, 1};
  float v[2 * 2] = {3, 4, 5, 6};
  float out[8];
  ThreadPool pool(2);
  cpu::attention(q, k, v, 0, 2, 2, 1, 2, out, pool);
  EXPECT_FLOAT_EQ(out[0], 3.f);
  EXPECT_FLOAT_EQ(out[3], 4.f);
  // Token 1, head 0: q = (1, 0): scores (1, 0) / sqrt(2).
  float s = 1.f / std::sqrt(2.f), w0 = std::exp(s) / (std::exp(s) + 1.f);
  EXPECT_NEAR(out[4], w0 * 3 + (1 - w0) * 5, 1e-6);
}

TEST(GatedDeltaNet, SingleStepDeltaRule) {
  // Dk = Dv = 2, one head, zero state: S = k (beta v)^T, o = S^T q.
  float q[2] = {1, 2}, k[2] = {0.6f, 0.8f}, v[2] = {1, -1}, g = -0.5f, beta = 0.5f;
  float S[4] = {0, 0, 0, 0}, o[2];
  ThreadPool pool(1);
  cpu::gdn_recurrence(q, k, v, &g, &beta, 1, 1, 1, 2, 2, S, o, pool);
  EXPECT_NEAR(S[0], 0.6f * 0.5f, 1e-7);
  EXPECT_NEAR(S[3], 0.8f * -0.5f, 1e-7);
  EXPECT_NEAR(o[0], (1 * 0.6f + 2 * 0.8f) * 0.5f, 1e-6);
  // Second step decays S by exp(g) first, then subtracts the prediction S^T k.
  float S_before[4];
  std::copy(S, S + 4, S_before);
  cpu::gdn_recurrence(q, k, v, &g, &beta, 1, 1, 1, 2, 2, S, o, pool);
  float d = std::exp(-0.5f);
  float pred0 = d * (S_before[0] * 0.6f + S_before[2] * 0.8f);
  EXPECT_NEAR(S[0], d * S_before[0] + 0.6f * 0.5f * (1 - pred0), 1e-6);
}

}  // namespace
}  // namespace lilac::test
