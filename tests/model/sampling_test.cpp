// The reference sampler: known-answer Philox vectors, greedy and filter semantics computed by
// hand, and sampling frequencies checked statistically with fixed seeds; the exact arithmetic it
// shares with the CUDA sampler (model/sampling_core.h), tie rules and the walk, exactly.
#include "model/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "model/philox.h"
#include "model/sampling_core.h"
#include "util/error.h"

namespace lilac::test {
namespace {

TEST(Philox, Random123KnownAnswers) {
  Philox4x32 a = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  Philox4x32 b =
      philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(b.v[0], 0xd16cfe09u);
  EXPECT_EQ(b.v[1], 0x94fdccebu);
  EXPECT_EQ(b.v[2], 0x5001e420u);
  EXPECT_EQ(b.v[3], 0x24126ea1u);
  float u = philox_uniform(7, 3);
  EXPECT_GE(u, 0.f);
  EXPECT_LT(u, 1.f);
  EXPECT_EQ(u, philox_uniform(7, 3));
  EXPECT_NE(u, philox_uniform(7, 4));
}

TEST(Sampler, GreedyIsArgmaxLowestIdAndIgnoresPaddedIds) {
  std::vector<float> l = {1, 5, 2, 5, 9};  // id 4 is beyond n_real = 4
  SamplingParams g;
  g.temperature = 0;
  EXPECT_EQ(sample_token(l.data(), 4, g, nullptr, 0).token, 1);
  SamplingParams k1;
  k1.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 4, k1, nullptr, 0).token, 1);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::vector<float> l = {0, std::log(3.f), std::log(6.f)};  // probabilities 0.1, 0.3, 0.6
  SamplingParams g;
  g.temperature = 0;
  g.top_logprobs = 2;
  g.repetition_penalty = 2;  // changes x, not the reported logprobs
  auto r = sample_token(l.data(), 3, g, nullptr, 0);
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, std::log(0.6), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[1].first, 1);
  EXPECT_NEAR(r.top[1].second, std::log(0.3), 1e-6);
}

TEST(Sampler, PenaltiesAsSpecified) {
  std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.2f};
  PenaltyState pen;
  pen.reset(4);
  SamplingParams g;
  g.temperature = 0;
  g.repetition_penalty = 1.1f;  // 2.0 -> 1.818 for a seen id: id 1 (1.9) wins
  pen.add_prompt(std::vector<int32_t>{0});
  EXPECT_EQ(sample_token(l.data(), 4, g, &pen, 0).token, 1);
  g.repetition_penalty = 1;
  g.presence_penalty = 0.5f;  // output counts only: the prompt id 0 is not penalised
  EXPECT_EQ(sample_token(l.data(), 4, g, &pen, 0).token, 0);
  pen.add_output(0);  // 2.0 - 0.5 = 1.5 < 1.9
  EXPECT_EQ(sample_token(l.data(), 4, g, &pen, 0).token, 1);
  g.presence_penalty = 0;
  g.frequency_penalty = 0.06f;
  pen.add_output(0);  // 2.0 - 2 * 0.06 = 1.88 < 1.9
  EXPECT_EQ(sample_token(l.data(), 4, g, &pen, 0).token, 1);
  g.repetition_penalty = 2.f;  // a negative logit of a seen id is multiplied: -1 -> -2
  g.frequency_penalty = 0;
  pen.add_output(2);
  std::vector<float> neg = {-1.0f, -1.5f};
  PenaltyState p2;
  p2.reset(2);
  p2.add_output(0);
  EXPECT_EQ(sample_token(neg.data(), 2, g, &p2, 0).token, 1);
}

// Draws `n` samples and returns the frequency of each id.
std::map<int32_t, double> frequencies(const std::vector<float>& logits, const SamplingParams& p,
                                      int n) {
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i)
    f[sample_token(logits.data(), int32_t(logits.size()), p, nullptr, uint64_t(i)).token] +=
        1.0 / n;
  return f;
}

// Pearson chi-square of observed frequencies against expected probabilities (n draws).
double chi_square(const std::map<int32_t, double>& f, const std::vector<double>& expect, int n) {
  double chi = 0;
  for (size_t i = 0; i < expect.size(); ++i) {
    if (expect[i] == 0) continue;
    double o = f.count(int32_t(i)) ? f.at(int32_t(i)) * n : 0;
    chi += (o - expect[i] * n) * (o - expect[i] * n) / (expect[i] * n);
  }
  return chi;
}

TEST(Sampler, TemperatureDistribution) {
  // p = softmax(l / 0.5) over 4 ids; 20000 draws; chi-square with 3 degrees of freedom: 16.3 is
  // the 0.999 quantile, so this fails by chance once in a thousand seeds (the seed is fixed).
  std::vector<float> l = {0.f, 0.5f, 1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 42;
  std::vector<double> e(4);
  double s = 0;
  for (int i = 0; i < 4; ++i) s += (e[size_t(i)] = std::exp(l[size_t(i)] / 0.5));
  for (auto& v : e) v /= s;
  auto f = frequencies(l, p, 20000);
  EXPECT_LT(chi_square(f, e, 20000), 16.3);
}

TEST(Sampler, TopKTopPMinPKeepTheRightSets) {
  // probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1
  std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p;
  p.seed = 9;
  p.top_k = 2;  // {0, 1} renormalised: 4/7, 3/7
  auto f = frequencies(l, p, 20000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_LT(chi_square(f, {4.0 / 7, 3.0 / 7, 0, 0}, 20000), 10.8);  // 1 dof, 0.999
  p.top_k = 0;
  p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75: the prefix needs id 2 as well
  f = frequencies(l, p, 20000);
  EXPECT_EQ(f.count(3), 0u);
  EXPECT_LT(chi_square(f, {4.0 / 9, 3.0 / 9, 2.0 / 9, 0}, 20000), 13.8);  // 2 dof
  p.top_p = 1;
  p.min_p = 0.6f;  // keep q >= 0.24: {0, 1}
  f = frequencies(l, p, 20000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_GT(f[1], 0.35);
}

TEST(Sampler, SameSeedAndStepSameToken) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(float(i)) * 3;
  SamplingParams p;
  p.seed = 1234;
  for (uint64_t step = 0; step < 50; ++step)
    EXPECT_EQ(sample_token(l.data(), 1000, p, nullptr, step).token,
              sample_token(l.data(), 1000, p, nullptr, step).token);
  // Different seeds give different streams.
  int differ = 0;
  SamplingParams q = p;
  q.seed = 4321;
  for (uint64_t step = 0; step < 50; ++step)
    differ += sample_token(l.data(), 1000, p, nullptr, step).token !=
              sample_token(l.data(), 1000, q, nullptr, step).token;
  EXPECT_GT(differ, 10);
}

TEST(Philox, UniformIsTheFirstWordsHighBits) {
  // seed -> key (low, high), step -> counter (low, high, 0, 0).
  const uint64_t seed = 0x299f31d0a4093822ull, step = 0x85a308d3243f6a88ull;
  const Philox4x32 out = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0, 0, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(sampling::philox_u24(seed, step), out.v[0] >> 8);
  EXPECT_EQ(philox_uniform(seed, step), float(out.v[0] >> 8) / 16777216.f);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = philox_uniform(42, uint64_t(i));
    ASSERT_GE(u, 0.f);
    ASSERT_LT(u, 1.f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // sd of the mean: 0.29 / sqrt(1e5) = 0.0009
}

TEST(SamplingCore, DetExpIsAccurateAndBounded) {
  EXPECT_EQ(sampling::det_exp(0.f), 1.f);
  EXPECT_EQ(sampling::det_exp(-0.f), 1.f);
  EXPECT_EQ(sampling::det_exp(3.f), 1.f);  // clamped: x > 0 is not a valid input
  EXPECT_EQ(sampling::det_exp(-90.f), 0.f);
  EXPECT_EQ(sampling::det_exp(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(sampling::det_exp(std::numeric_limits<float>::quiet_NaN()), 0.f);
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -86.9f * float(i) / 200000.f;
    const double want = std::exp(double(x));
    const float got = sampling::det_exp(x);
    ASSERT_LE(got, 1.f);
    worst = std::max(worst, std::fabs(got - want) / want);
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "relative error above 4 ulp";
}

TEST(SamplingCore, PenaltiesByHand) {
  using sampling::penalize;
  for (float x : {-3.5f, -0.f, 0.f, 1e-30f, 2.25f, 17.f})
    EXPECT_EQ(penalize(x, 0, true, 1.f, 0.f, 0.f), x);
  EXPECT_EQ(penalize(2.4f, 0, true, 1.2f, 0.f, 0.f), 2.4f / 1.2f);
  EXPECT_EQ(penalize(-2.f, 0, true, 1.5f, 0.f, 0.f), -3.f);
  EXPECT_EQ(penalize(2.f, 0, false, 1.5f, 0.f, 0.f), 2.f);  // unseen: no repetition penalty
  EXPECT_EQ(penalize(2.f, 3, true, 1.f, 1.5f, 0.25f), 2.f - 1.5f - 0.75f);
  EXPECT_EQ(penalize(2.f, 0, true, 1.f, 1.5f, 0.25f), 2.f);  // presence needs an output count
}

TEST(SamplingCore, MassesAndDrawAreExactIntegers) {
  EXPECT_EQ(sampling::mass_of(1.f), 1ull << 40);
  EXPECT_EQ(sampling::mass_of(0.5f), 1ull << 39);
  EXPECT_EQ(sampling::mass_of(0.f), 0ull);
  EXPECT_EQ(sampling::top_p_target(0.5f, 1000), 500ull);
  EXPECT_EQ(sampling::top_p_target(0.f, 1000), 0ull);
  EXPECT_EQ(sampling::top_p_target(1.f, 1000), 1000ull);
  const uint64_t Z = (uint64_t(1) << 57) + 12345;
  for (uint32_t u : {0u, 1u, 12345u, (1u << 23), (1u << 24) - 1}) {
    __extension__ typedef unsigned __int128 u128;  // an independent 128-bit reference
    const u128 want = (u128(u) * Z) >> 24;
    EXPECT_EQ(sampling::scaled_draw(u, Z), uint64_t(want)) << u;
    EXPECT_LT(sampling::scaled_draw(u, Z), Z);
  }
}

TEST(Sampling, ArgmaxLowestIdAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const float a[6] = {1.f, 3.f, nan, 3.f, -2.f, 0.f};
  EXPECT_EQ(argmax(a, 6), 1);
  const float b[3] = {nan, -inf, -inf};
  EXPECT_EQ(argmax(b, 3), 1);
  const float c[2] = {nan, nan};
  EXPECT_EQ(argmax(c, 2), 0);
  EXPECT_EQ(argmax(a, 1), 0);
}

std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> x;
  for (double v : p) x.push_back(float(std::log(v)));
  return x;
}

TEST(Sampling, GreedyPathsAndPenaltiesByHand) {
  std::vector<float> x = {2.0f, 1.9f, -0.5f, 1.0f};
  SamplingParams p;
  p.temperature = 0.f;
  EXPECT_EQ(sample_token(x.data(), 4, p, nullptr, 0).token, 0);
  // Repetition 1.2 on the seen id 0: 2.0 / 1.2 = 1.667 < 1.9, so id 1 wins.
  PenaltyState st;
  st.reset(4);
  const int32_t prompt[1] = {0};
  st.add_prompt(prompt);
  p.repetition_penalty = 1.2f;
  EXPECT_EQ(sample_token(x.data(), 4, p, &st, 0).token, 1);
  // id 1 becomes an output: seen too, so 1.9 / 1.2 - presence 0.5 = 1.083 < 1.667: back to id 0.
  st.add_output(1);
  p.presence_penalty = 0.5f;
  EXPECT_EQ(sample_token(x.data(), 4, p, &st, 0).token, 0);
  // Frequency 0.2, id 0 output 3 times: id 0: 2 / 1.2 - (0.5 + 3 * 0.2) = 0.567; id 1:
  // 1.9 / 1.2 - (0.5 + 0.2) = 0.883; the never-seen id 3 (1.0) wins.
  for (int i = 0; i < 3; ++i) st.add_output(0);
  p.frequency_penalty = 0.2f;
  EXPECT_EQ(sample_token(x.data(), 4, p, &st, 0).token, 3);
  // Negative logits are multiplied by the repetition penalty (pushed further down).
  std::vector<float> y = {-1.0f, -1.1f};
  PenaltyState st2;
  st2.reset(2);
  const int32_t seen0[1] = {0};
  st2.add_prompt(seen0);
  SamplingParams g;
  g.temperature = 0.f;
  g.repetition_penalty = 1.2f;  // -1.2 < -1.1
  EXPECT_EQ(sample_token(y.data(), 2, g, &st2, 0).token, 1);
  // top_k == 1 is greedy whatever the temperature.
  SamplingParams k1;
  k1.top_k = 1;
  for (uint64_t s = 0; s < 50; ++s) EXPECT_EQ(sample_token(x.data(), 4, k1, nullptr, s).token, 0);
}

TEST(Sampling, TwoEqualTokensSplitAtOneHalf) {
  // Z = 2 * 2^40, r = u24 * 2^17: id 0 iff its mass 2^40 > r, i.e. u < 1/2. Checks the walk
  // exactly.
  const float x[2] = {0.3f, 0.3f};
  SamplingParams p;
  p.seed = 7;
  int zeros = 0;
  for (uint64_t step = 0; step < 2000; ++step) {
    const int32_t t = sample_token(x, 2, p, nullptr, step).token;
    ASSERT_EQ(t, philox_uniform(7, step) < 0.5f ? 0 : 1) << step;
    zeros += t == 0;
  }
  EXPECT_GT(zeros, 900);
  EXPECT_LT(zeros, 1100);
}

// Draws n tokens with steps 0..n-1 and returns the counts per id.
std::vector<int> histogram(const std::vector<float>& x, const SamplingParams& p, int n) {
  std::vector<int> c(x.size(), 0);
  for (int s = 0; s < n; ++s)
    ++c[size_t(sample_token(x.data(), int32_t(x.size()), p, nullptr, uint64_t(s)).token)];
  return c;
}

// Pearson chi-square of counts against probabilities (zero-probability ids must have no draws),
// compared with the 0.9999 quantile for the degrees of freedom.
void expect_distribution(const std::vector<int>& counts, const std::vector<double>& prob,
                         const char* what) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0;
  int df = -1;
  for (size_t i = 0; i < prob.size(); ++i) {
    if (prob[i] == 0) {
      EXPECT_EQ(counts[i], 0) << what << ": id " << i << " is outside the kept set";
      continue;
    }
    const double e = n * prob[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++df;
  }
  const double q9999[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88};
  ASSERT_GE(df, 1);
  ASSERT_LE(df, 7);
  EXPECT_LT(chi2, q9999[df]) << what << ": chi-square " << chi2 << " with " << df
                             << " degrees of freedom";
}

std::vector<double> normalised(std::vector<double> p) {
  const double s = std::accumulate(p.begin(), p.end(), 0.0);
  for (auto& v : p) v /= s;
  return p;
}

TEST(Sampling, DistributionsMatchTheFilteredSoftmax) {
  const std::vector<double> q = {0.1, 0.3, 0.05, 0.4, 0.15};  // sorted: 3, 1, 4, 0, 2
  const std::vector<float> x = logits_of(q);
  const int n = 20000;
  SamplingParams p;
  p.seed = 1234;
  expect_distribution(histogram(x, p, n), q, "plain");

  SamplingParams t = p;  // temperature 0.5: q^2
  t.temperature = 0.5f;
  std::vector<double> q2;
  for (double v : q) q2.push_back(v * v);
  expect_distribution(histogram(x, t, n), normalised(q2), "temperature 0.5");

  SamplingParams k = p;  // top_k 3: ids 3, 1, 4
  k.top_k = 3;
  expect_distribution(histogram(x, k, n), normalised({0, 0.3, 0, 0.4, 0.15}), "top_k 3");

  SamplingParams tp = p;  // top_p 0.65: 0.4 < 0.65 <= 0.7: ids 3, 1
  tp.top_p = 0.65f;
  expect_distribution(histogram(x, tp, n), normalised({0, 0.3, 0, 0.4, 0}), "top_p 0.65");

  SamplingParams kp =
      p;  // top_k 3 then top_p 0.8 of the renormalised 0.4/0.85, 0.7/0.85 = 0.82: ids 3, 1
  kp.top_k = 3;
  kp.top_p = 0.8f;
  expect_distribution(histogram(x, kp, n), normalised({0, 0.3, 0, 0.4, 0}), "top_k 3 + top_p 0.8");

  SamplingParams mp = p;  // min_p 0.3: q >= 0.12: ids 3, 1, 4
  mp.min_p = 0.3f;
  expect_distribution(histogram(x, mp, n), normalised({0, 0.3, 0, 0.4, 0.15}), "min_p 0.3");

  SamplingParams one = p;  // top_p 0 and min_p > 1 both keep only the most likely token
  one.top_p = 0.f;
  for (int s = 0; s < 100; ++s)
    EXPECT_EQ(sample_token(x.data(), 5, one, nullptr, uint64_t(s)).token, 3);
  one.top_p = 1.f;
  one.min_p = 1.5f;
  for (int s = 0; s < 100; ++s)
    EXPECT_EQ(sample_token(x.data(), 5, one, nullptr, uint64_t(s)).token, 3);
}

TEST(Sampling, TiesAtTheCutGoToLowerIds) {
  // Three equal logits at the top, top_k = 2: ids 0 and 1 only, evenly.
  const std::vector<float> x = {1.f, 1.f, 1.f, 0.f};
  SamplingParams k;
  k.top_k = 2;
  expect_distribution(histogram(x, k, 4000), {0.5, 0.5, 0, 0}, "tied top_k");
  // Four equal logits, top_p = 0.5: the shortest prefix with half the mass is ids 0, 1.
  const std::vector<float> y = {2.f, 2.f, 2.f, 2.f};
  SamplingParams tp;
  tp.top_p = 0.5f;
  expect_distribution(histogram(y, tp, 4000), {0.5, 0.5, 0, 0}, "tied top_p");
  tp.top_p = 0.51f;  // needs a third
  expect_distribution(histogram(y, tp, 6000), {1 / 3., 1 / 3., 1 / 3., 0}, "tied top_p 0.51");
}

TEST(Sampling, IdsPastNRealAreNeverChosen) {
  std::vector<float> x = {0.f, 0.5f, 0.2f, 100.f, 100.f};  // ids 3, 4 are padding (n_real = 3)
  SamplingParams p;
  for (int s = 0; s < 500; ++s)
    EXPECT_LT(sample_token(x.data(), 3, p, nullptr, uint64_t(s)).token, 3);
  SamplingParams g;
  g.temperature = 0.f;
  EXPECT_EQ(sample_token(x.data(), 3, g, nullptr, 0).token, 1);
  g.top_logprobs = 5;
  EXPECT_EQ(sample_token(x.data(), 3, g, nullptr, 0).top.size(), 3u);
}

TEST(Sampling, SameSeedAndStepSameToken) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.37) * 3);
  SamplingParams p;
  p.seed = 99;
  p.top_p = 0.9f;
  int differ = 0;
  for (uint64_t s = 0; s < 100; ++s) {
    const int32_t a = sample_token(x.data(), 1000, p, nullptr, s).token;
    EXPECT_EQ(a, sample_token(x.data(), 1000, p, nullptr, s).token);
    SamplingParams q = p;
    q.seed = 100;
    differ += a != sample_token(x.data(), 1000, q, nullptr, s).token;
  }
  EXPECT_GT(differ, 50);  // another seed is another stream
}

TEST(Sampling, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> x = {1.f, 3.f, 3.f, -1.f, 2.f};
  double s = 0;
  for (float v : x) s += std::exp(double(v));
  auto lp = [&](int i) { return float(double(x[size_t(i)]) - std::log(s)); };
  SamplingParams p;
  p.temperature = 0.f;
  p.top_logprobs = 4;
  p.presence_penalty = 10.f;  // penalties do not change the reported logprobs
  PenaltyState st;
  st.reset(5);
  st.add_output(1);
  const SampleResult r = sample_token(x.data(), 5, p, &st, 0);
  EXPECT_EQ(r.token, 2);  // id 1 penalised
  EXPECT_NEAR(r.logprob, lp(2), 1e-6);
  ASSERT_EQ(r.top.size(), 4u);
  const int want[4] = {1, 2, 4, 0};  // ties: lower id first
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(r.top[size_t(j)].first, want[j]);
    EXPECT_NEAR(r.top[size_t(j)].second, lp(want[j]), 1e-6);
  }
}

TEST(Sampling, PenaltyStateAndErrors) {
  PenaltyState st;
  st.reset(3);
  const int32_t ids[3] = {2, 2, -1};  // out-of-range ids are ignored
  st.add_prompt(ids);
  st.add_output(1);
  st.add_output(1);
  st.add_output(3);
  EXPECT_EQ(st.seen, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(st.output_counts, (std::vector<int32_t>{0, 2, 0}));
  // A state shorter than the logits penalises only the ids it covers.
  const float x[4] = {1.f, 1.f, 1.f, 0.9f};
  SamplingParams g;
  g.temperature = 0.f;
  g.presence_penalty = 0.5f;
  g.repetition_penalty = 2.f;
  EXPECT_EQ(sample_token(x, 4, g, &st, 0).token, 0);  // 1, 0.5 - 0.5, 0.5, 0.9 -> id 0
  const float one[1] = {0.f};
  EXPECT_THROW(sample_token(one, 0, SamplingParams{}, nullptr, 0), Error);
}

}  // namespace
}  // namespace lilac::test
