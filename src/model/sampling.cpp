// The reference sampler: sample_token exactly as model/sampling.h specifies, in the exact
// arithmetic of model/sampling_core.h that cuda/sampling.cu shares, so both pick the same token.
//
// Realisation of the contract's steps over the first n logits:
//  1. x'_i = penalize(x_i, ...) (sampling_core.h), when penalties are given.
//  2. greedy: argmax(x') (lowest id on ties).
//  3. y_i = x'_i / T; m = max_i y_i; e_i = exp(y_i - m) in (0, 1] (det_exp; q_i = e_i / sum e);
//     mass M_i = floor(e_i * 2^40).
//  4. Order: e descending, id ascending. L_k = top_k if 0 < top_k < n, else n. Z_k = mass of the
//     first L_k. L_p = the smallest L >= 1 whose prefix mass >= trunc(top_p * Z_k) (top_p < 1,
//     else n). L_m = #{e_i >= min_p} (min_p > 0, else n). Kept: the first max(1, min(L_k, L_p,
//     L_m)).
//  5. r = floor(u24 * Z_kept / 2^24) with u24 = philox_u24(seed, step); walk the kept ids in
//     ascending order summing M; the token is the first id where the sum exceeds r (the last kept
//     id if none does: unreachable, since r < Z_kept).
// Logprobs: log_softmax of the raw logits in double.
#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/philox.h"
#include "model/sampling_core.h"
#include "util/error.h"

namespace lilac {

void PenaltyState::reset(int32_t n_vocab) {
  output_counts.assign(size_t(std::max(n_vocab, 0)), 0);
  seen.assign(size_t(std::max(n_vocab, 0)), 0);
}

// Ids outside the vocabulary are ignored (the forward pass rejects them before they get here).
void PenaltyState::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < seen.size()) seen[size_t(id)] = 1;
}

void PenaltyState::add_output(int32_t id) {
  if (id < 0 || size_t(id) >= seen.size() || size_t(id) >= output_counts.size()) return;
  ++output_counts[size_t(id)];
  seen[size_t(id)] = 1;
}

float philox_uniform(uint64_t seed, uint64_t step) {
  return philox_uniform_hd(seed, step);
}

int32_t argmax(const float* x, int32_t n) {
  int32_t best = -1;
  float bv = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i)
    if (x[i] > bv || (best < 0 && x[i] == bv)) bv = x[i], best = i;  // NaN: both false
  return best < 0 ? 0 : best;
}

namespace {

// Steps 3-5 on the penalised logits x [n]: the sampled id.
int32_t sample_filtered(const std::vector<float>& x, const SamplingParams& p, uint64_t step) {
  using namespace sampling;
  const int32_t n = int32_t(x.size());
  std::vector<float> e(x.size());
  float m = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    e[size_t(i)] = f_div(x[size_t(i)], p.temperature);
    if (e[size_t(i)] > m) m = e[size_t(i)];
  }
  for (auto& v : e) v = unnormalised_prob(v, m);

  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return e[size_t(a)] > e[size_t(b)] || (e[size_t(a)] == e[size_t(b)] && a < b);
  };
  const int32_t Lk = p.top_k > 0 && p.top_k < n ? p.top_k : n;
  int32_t Lm = n;
  if (p.min_p > 0.f)
    Lm = int32_t(std::count_if(e.begin(), e.end(), [&](float v) { return v >= p.min_p; }));
  const bool top_p_on = p.top_p < 1.f;
  // The sorted prefix is needed for top_k, top_p, and for the single-token fallback of min_p > 1.
  if (Lk < n)
    std::partial_sort(order.begin(), order.begin() + Lk, order.end(), before);
  else if (top_p_on || Lm == 0)
    std::sort(order.begin(), order.end(), before);

  uint64_t Zk = 0;
  for (int32_t j = 0; j < Lk; ++j) Zk += mass_of(e[size_t(order[size_t(j)])]);
  int32_t Lp = n;
  if (top_p_on) {
    const uint64_t target = top_p_target(p.top_p, Zk);
    uint64_t cum = 0;
    for (int32_t j = 0; j < Lk; ++j) {
      cum += mass_of(e[size_t(order[size_t(j)])]);
      if (cum >= target) {
        Lp = j + 1;
        break;
      }
    }
  }
  const int32_t L = std::max(1, std::min({Lk, Lp, Lm}));

  std::vector<uint8_t> kept(x.size(), 0);
  if (L == n)
    std::fill(kept.begin(), kept.end(), 1);
  else if (L == Lm) {
    for (int32_t i = 0; i < n; ++i) kept[size_t(i)] = e[size_t(i)] >= p.min_p;
  } else {
    for (int32_t j = 0; j < L; ++j) kept[size_t(order[size_t(j)])] = 1;
  }
  uint64_t Z = 0;
  for (int32_t i = 0; i < n; ++i)
    if (kept[size_t(i)]) Z += mass_of(e[size_t(i)]);
  const uint64_t r = scaled_draw(philox_u24(p.seed, step), Z);
  uint64_t run = 0;
  int32_t last = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!kept[size_t(i)]) continue;
    run += mass_of(e[size_t(i)]);
    last = i;
    if (run > r) return i;
  }
  return last;
}

}  // namespace

SampleResult sample_token(const float* logits, int32_t n_real, const SamplingParams& params,
                          const PenaltyState* penalties, uint64_t step) {
  if (!logits || n_real <= 0) fail("sample_token: no tokens to sample from (n_real = {})", n_real);
  std::vector<float> x(logits, logits + n_real);
  if (penalties) {  // ids past the penalty state's size (none, as the engine sizes it) have no
                    // history
    const size_t n =
        std::min({size_t(n_real), penalties->seen.size(), penalties->output_counts.size()});
    for (size_t i = 0; i < n; ++i)
      x[i] = sampling::penalize(x[i], penalties->output_counts[i], penalties->seen[i] != 0,
                                params.repetition_penalty, params.presence_penalty,
                                params.frequency_penalty);
  }
  SampleResult res;
  res.token = params.greedy() ? argmax(x.data(), n_real) : sample_filtered(x, params, step);

  // Raw log-softmax (no penalties, no temperature).
  double mx = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < n_real; ++i)
    if (logits[i] > mx) mx = logits[i];
  double s = 0;
  for (int32_t i = 0; i < n_real; ++i)
    if (logits[i] > -std::numeric_limits<float>::infinity()) s += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(s);
  res.logprob = float(double(logits[res.token]) - lse);
  const int32_t n_top = std::clamp(params.top_logprobs, 0, std::min(20, n_real));
  if (n_top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n_real));
    std::iota(ids.begin(), ids.end(), 0);
    auto key = [&](int32_t i) {
      return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    };
    std::partial_sort(ids.begin(), ids.begin() + n_top, ids.end(), [&](int32_t a, int32_t b) {
      return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    for (int32_t j = 0; j < n_top; ++j)
      res.top.emplace_back(ids[size_t(j)], float(double(logits[ids[size_t(j)]]) - lse));
  }
  return res;
}

}  // namespace lilac
