// The chunked delta rule (cpu::gdn_chunked, the algorithm of the CUDA prefill kernel) against the
// token-by-token recurrence (cpu::gdn_recurrence): same function, other order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu/gated_deltanet.h"

namespace lilac::test {
namespace {

struct GdnInputs {
  std::vector<float> q, k, v, g, beta, state;
};

// Realistic scales: q, k unit rows (q times Dk^-0.5), v ~ N(0, 1), g in [g_lo, 0], beta in (0, 1).
GdnInputs make_inputs(int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float g_lo,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  GdnInputs in;
  in.q.resize(size_t(T * Hk * Dk));
  in.k.resize(in.q.size());
  for (auto* x : {&in.q, &in.k}) {
    const float mul = x == &in.q ? 1.f / std::sqrt(float(Dk)) : 1.f;
    for (int64_t r = 0; r < T * Hk; ++r) {
      float s = 0.f;
      for (int64_t i = 0; i < Dk; ++i)
        s += ((*x)[size_t(r * Dk + i)] = n01(rng)) * (*x)[size_t(r * Dk + i)];
      for (int64_t i = 0; i < Dk; ++i) (*x)[size_t(r * Dk + i)] *= mul / std::sqrt(s);
    }
  }
  in.v.resize(size_t(T * Hv * Dv));
  for (auto& x : in.v) x = n01(rng);
  in.g.resize(size_t(T * Hv));
  in.beta.resize(in.g.size());
  for (auto& x : in.g) x = g_lo * u01(rng);
  for (auto& x : in.beta) x = 0.02f + 0.96f * u01(rng);
  in.state.resize(size_t(Hv * Dk * Dv));
  for (auto& x : in.state) x = 0.3f * n01(rng);
  return in;
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float f : x) m = std::max(m, double(std::fabs(f)));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const double tol = rel * std::max(1.0, max_abs(want));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
}

struct Case {
  int64_t T, Hk, Hv, Dk, Dv, chunk;
  float g_lo;
  bool zero_state;
};

class GdnChunked : public ::testing::TestWithParam<Case> {};

TEST_P(GdnChunked, EqualsRecurrence) {
  const Case c = GetParam();
  GdnInputs in = make_inputs(c.T, c.Hk, c.Hv, c.Dk, c.Dv, c.g_lo, uint32_t(c.T * 131 + c.Dk));
  if (c.zero_state) std::fill(in.state.begin(), in.state.end(), 0.f);
  ThreadPool pool(2);
  std::vector<float> s_seq = in.state, s_chk = in.state;
  std::vector<float> o_seq(in.v.size()), o_chk(in.v.size(), NAN);
  cpu::gdn_recurrence(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), c.T, c.Hk,
                      c.Hv, c.Dk, c.Dv, s_seq.data(), o_seq.data(), pool);
  cpu::gdn_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), c.T, c.Hk,
                   c.Hv, c.Dk, c.Dv, s_chk.data(), o_chk.data(), pool, c.chunk);
  expect_close(o_chk, o_seq, 2e-5, "output");
  expect_close(s_chk, s_seq, 2e-5, "state");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnChunked,
                         ::testing::Values(Case{1, 2, 4, 32, 32, 64, -5.f, false},
                                           Case{3, 2, 4, 32, 32, 64, -5.f, false},
                                           Case{64, 2, 4, 32, 32, 64, -5.f, true},
                                           Case{65, 2, 4, 32, 32, 64, -0.2f, false},
                                           Case{200, 2, 4, 32, 32, 64, -5.f, false},
                                           Case{200, 1, 2, 16, 24, 16, -0.05f, false},
                                           Case{130, 1, 2, 128, 128, 64, -1.f, false}));

TEST(GdnChunked, SecondCallContinuesFirst) {
  // 100 tokens in one call equal 37 then 63 (the state carries the sequence across calls).
  GdnInputs in = make_inputs(100, 1, 2, 32, 32, -1.f, 7);
  ThreadPool pool(2);
  std::vector<float> s_one = in.state, s_two = in.state, o_one(in.v.size()), o_two(in.v.size());
  cpu::gdn_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), 100, 1, 2,
                   32, 32, s_one.data(), o_one.data(), pool);
  const int64_t t1 = 37;
  cpu::gdn_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t1, 1, 2, 32,
                   32, s_two.data(), o_two.data(), pool);
  cpu::gdn_chunked(in.q.data() + t1 * 32, in.k.data() + t1 * 32, in.v.data() + t1 * 2 * 32,
                   in.g.data() + t1 * 2, in.beta.data() + t1 * 2, 100 - t1, 1, 2, 32, 32,
                   s_two.data(), o_two.data() + t1 * 2 * 32, pool);
  expect_close(o_two, o_one, 2e-5, "output");
  expect_close(s_two, s_one, 2e-5, "state");
}

}  // namespace
}  // namespace lilac::test
