// The synthetic model's router choice (model/synthetic_router.h): the zipf rank scales and
// per-layer permutations, and the routing they produce, measured by applying the synthetic
// router of layer 0 (the same values the device generates: cuda/synthetic.h, host-only here) to
// the model's own layer-0 router inputs, RMSNorm(embedding row) * post_norm.
#include "model/synthetic_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/synthetic.h"
#include "model/qwen36.h"
#include "util/error.h"
#include "util/half.h"

namespace lilac::test {
namespace {

TEST(SyntheticRouter, ParsesItsTwoNames) {
  EXPECT_EQ(parse_synthetic_router("uniform"), SyntheticRouter::Uniform);
  EXPECT_EQ(parse_synthetic_router("zipf"), SyntheticRouter::Zipf);
  EXPECT_STREQ(synthetic_router_name(SyntheticRouter::Zipf), "zipf");
  EXPECT_STREQ(synthetic_router_name(SyntheticRouter::Uniform), "uniform");
  try {
    parse_synthetic_router("skewed");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--router skewed: uniform or zipf");
  }
}

TEST(SyntheticRouter, RankScalesAreAPowerOfRankWithUnitRms) {
  const auto w = zipf_rank_scales(256);
  ASSERT_EQ(w.size(), 256u);
  double sum_sq = 0;
  for (size_t r = 0; r < w.size(); ++r) {
    sum_sq += double(w[r]) * w[r];
    if (r) {
      EXPECT_LT(w[r], w[r - 1]);
    }
    // w_r / w_0 = (r + 1)^-0.25
    EXPECT_NEAR(w[r] / w[0], std::pow(double(r + 1), -0.25), 1e-6);
  }
  EXPECT_NEAR(sum_sq / 256, 1.0, 1e-5);
}

TEST(SyntheticRouter, RanksArePermutationsThatDifferByLayer) {
  const uint64_t k0 = synthetic::tensor_key(1, "layers.0.router");
  const uint64_t k1 = synthetic::tensor_key(1, "layers.1.router");
  const auto r0 = zipf_expert_ranks(k0, 256), r1 = zipf_expert_ranks(k1, 256);
  EXPECT_EQ(zipf_expert_ranks(k0, 256), r0);  // deterministic
  EXPECT_NE(r0, r1);
  for (const auto& r : {r0, r1}) {
    auto sorted = r;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> iota(256);
    std::iota(iota.begin(), iota.end(), int64_t(0));
    EXPECT_EQ(sorted, iota);
  }
}

TEST(SyntheticRouter, OnlyTheZipfRouterMatrixGetsRowAmplitudes) {
  const uint64_t key = synthetic::tensor_key(1, "layers.3.router");
  EXPECT_TRUE(synthetic_row_amplitudes(SyntheticRouter::Uniform, "layers.3.router", key, 257, 0.5f)
                  .empty());
  EXPECT_TRUE(
      synthetic_row_amplitudes(SyntheticRouter::Zipf, "layers.3.gate_up", key, 257, 0.5f).empty());
  const auto a = synthetic_row_amplitudes(SyntheticRouter::Zipf, "layers.3.router", key, 257, 0.5f);
  ASSERT_EQ(a.size(), 257u);
  EXPECT_EQ(a[256], 0.5f);  // the shared expert's gate keeps the plain amplitude
  const auto w = zipf_rank_scales(256);
  const auto rank = zipf_expert_ranks(key, 256);
  for (size_t e = 0; e < 256; ++e) EXPECT_EQ(a[e], 0.5f * w[size_t(rank[e])]);
}

// Top-8 selection counts per expert over `tokens` layer-0 router inputs of the seed-1 model.
std::vector<int64_t> layer0_selections(SyntheticRouter router, int64_t tokens) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const int64_t H = c.hidden, E = c.experts, K = c.experts_per_token;
  const uint64_t seed = 1;
  const uint64_t embed_key = synthetic::tensor_key(seed, "embed");
  const uint64_t norm_key = synthetic::tensor_key(seed, "layers.0.post_norm");
  const uint64_t router_key = synthetic::tensor_key(seed, "layers.0.router");
  // The value ranges of device_model.cpp's plan: embed a = 1, norms 1 +- 0.1, matrices
  // a = sqrt(3 / fan_in); bf16 matrices rounded as stored.
  const float a = std::sqrt(3.0f / float(H));
  const auto row_a = synthetic_row_amplitudes(router, "layers.0.router", router_key, E + 1, a);
  std::vector<float> R(size_t(E * H));
  for (size_t i = 0; i < R.size(); ++i)
    R[i] = round_to_bf16(
        synthetic::value(router_key, i, 0.f, row_a.empty() ? a : row_a[i / size_t(H)]));
  std::vector<float> norm(static_cast<size_t>(H));
  for (size_t j = 0; j < norm.size(); ++j) norm[j] = synthetic::value(norm_key, j, 1.f, 0.1f);
  std::vector<int64_t> count(size_t(E), 0);
  std::vector<float> x(static_cast<size_t>(H));
  std::vector<std::pair<float, int64_t>> logits(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    const uint64_t token = uint64_t(t) * 241 % uint64_t(c.vocab);  // spread over the vocabulary
    double ss = 0;
    for (int64_t j = 0; j < H; ++j) {
      x[size_t(j)] =
          round_to_bf16(synthetic::value(embed_key, token * uint64_t(H) + uint64_t(j), 0.f, 1.f));
      ss += double(x[size_t(j)]) * x[size_t(j)];
    }
    const float inv_rms = float(1.0 / std::sqrt(ss / double(H) + double(c.rms_eps)));
    for (int64_t j = 0; j < H; ++j) x[size_t(j)] *= inv_rms * norm[size_t(j)];
    for (int64_t e = 0; e < E; ++e) {
      const float* row = &R[size_t(e * H)];
      float acc = 0;
      for (int64_t j = 0; j < H; ++j) acc += row[j] * x[size_t(j)];
      logits[size_t(e)] = {acc, e};
    }
    std::partial_sort(logits.begin(), logits.begin() + K, logits.end(),
                      [](const auto& p, const auto& q) { return p.first > q.first; });
    for (int64_t k = 0; k < K; ++k) ++count[size_t(logits[size_t(k)].second)];
  }
  return count;
}

constexpr int64_t kTokens = 2048;

TEST(SyntheticRouter, UniformRouterSpreadsTheSelectionsEvenly) {
  auto count = layer0_selections(SyntheticRouter::Uniform, kTokens);
  std::sort(count.rbegin(), count.rend());
  const double total = double(kTokens * 8), mean = total / 256;
  const double top_decile = double(std::accumulate(count.begin(), count.begin() + 26, int64_t(0)));
  std::printf(
      "uniform: top 10%% of experts take %.1f%% of the selections; most %.2fx, least %.2fx "
      "the mean\n",
      100 * top_decile / total, double(count.front()) / mean, double(count.back()) / mean);
  // 64 selections per expert on average: counting noise alone puts the top decile near 13%.
  EXPECT_LT(top_decile / total, 0.16);
  EXPECT_LT(double(count.front()) / mean, 1.7);
  EXPECT_GT(double(count.back()) / mean, 0.4);
}

TEST(SyntheticRouter, ZipfRouterSkewsTheSelectionsByRank) {
  const auto count = layer0_selections(SyntheticRouter::Zipf, kTokens);
  const auto rank = zipf_expert_ranks(synthetic::tensor_key(1, "layers.0.router"), 256);
  std::vector<double> by_rank(256);
  for (size_t e = 0; e < 256; ++e) by_rank[size_t(rank[e])] = double(count[e]);
  const double total = double(kTokens * 8), mean = total / 256;
  auto share = [&](int r0, int r1) {
    return std::accumulate(by_rank.begin() + r0, by_rank.begin() + r1, 0.0) / total;
  };
  // Least-squares slope of log(selections) over log(rank + 1): the Zipf exponent, negated.
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0;
  for (int r = 0; r < 256; ++r) {
    if (by_rank[size_t(r)] == 0) continue;
    const double lx = std::log(r + 1.0), ly = std::log(by_rank[size_t(r)]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, n += 1;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double last_decile_mean = share(230, 256) * total / 26;
  std::printf(
      "zipf: rank 0 in %.1f%% of the tokens' top-8 (%.1fx the mean), top 10%% of experts "
      "take %.1f%% of the selections, bottom 10%% %.1f%%; rank 0 / mean of the last 26 "
      "ranks %.1fx; fitted exponent %.2f\n",
      100 * by_rank[0] / double(kTokens), by_rank[0] / mean, 100 * share(0, 26),
      100 * share(230, 256), by_rank[0] / last_decile_mean, -slope);
  EXPECT_GT(by_rank[0] / double(kTokens), 0.18);  // uniform: 8 / 256 = 3.1%
  EXPECT_GT(share(0, 26), 0.33);                  // uniform: about 10%
  EXPECT_LT(share(230, 256), 0.03);
  EXPECT_GT(by_rank[0] / last_decile_mean, 15.0);
  EXPECT_LT(slope, -0.6);
  EXPECT_GT(slope, -1.3);
}

}  // namespace
}  // namespace lilac::test
