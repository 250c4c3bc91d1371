// The reference sampler: the semantics documented in sampling.h, written for clarity.
#include "cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/philox.h"
#include "util/error.h"

namespace lilac {

void PenaltyState::reset(int32_t n_vocab) {
  output_counts.assign(size_t(n_vocab), 0);
  seen.assign(size_t(n_vocab), 0);
}

void PenaltyState::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < seen.size()) seen[size_t(id)] = 1;
}

void PenaltyState::add_output(int32_t id) {
  if (id < 0 || size_t(id) >= seen.size()) return;
  output_counts[size_t(id)]++;
  seen[size_t(id)] = 1;
}

float philox_uniform(uint64_t seed, uint64_t step) { return philox_uniform_hd(seed, step); }

namespace {

// Raw log_softmax of the chosen token and the top-n (ties: lower id first).
void raw_logprobs(const float* logits, int32_t n, int top_n, SampleResult& r) {
  float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const float lse = mx + float(std::log(sum));
  r.logprob = logits[r.token] - lse;
  top_n = std::clamp(top_n, 0, int(n));
  if (top_n == 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int i = 0; i < top_n; ++i) r.top.emplace_back(ids[size_t(i)], logits[ids[size_t(i)]] - lse);
}

}  // namespace

SampleResult sample_token(const float* logits, int32_t n_real, const SamplingParams& p, const PenaltyState* pen,
                          uint64_t step) {
  if (n_real <= 0) fail("sample_token: no tokens to sample from");
  std::vector<float> x(logits, logits + n_real);
  if (pen) {
    const int32_t n = std::min<int32_t>(n_real, int32_t(pen->seen.size()));
    for (int32_t i = 0; i < n; ++i) {
      if (pen->seen[size_t(i)] && p.repetition_penalty != 1.f)
        x[size_t(i)] = x[size_t(i)] > 0 ? x[size_t(i)] / p.repetition_penalty : x[size_t(i)] * p.repetition_penalty;
      const int32_t c = pen->output_counts[size_t(i)];
      x[size_t(i)] -= p.presence_penalty * float(c > 0) + p.frequency_penalty * float(c);
    }
  }
  SampleResult r;
  if (p.greedy()) {
    r.token = int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // first maximum = lowest id
    raw_logprobs(logits, n_real, p.top_logprobs, r);
    return r;
  }
  // q = softmax(x / temperature)
  const float inv_t = 1.f / p.temperature;
  float mx = -INFINITY;
  for (auto& v : x) mx = std::max(mx, v *= inv_t);
  double sum = 0;
  for (auto& v : x) sum += (v = std::exp(v - mx));
  for (auto& v : x) v = float(v / sum);

  // Candidates by probability (descending, ties: lower id), then the three filters.
  std::vector<int32_t> cand(static_cast<size_t>(n_real));
  std::iota(cand.begin(), cand.end(), 0);
  auto by_prob = [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b); };
  size_t kept = cand.size();
  if (p.top_k > 0 && size_t(p.top_k) < kept) {
    kept = size_t(p.top_k);
    std::partial_sort(cand.begin(), cand.begin() + kept, cand.end(), by_prob);
  } else {
    std::sort(cand.begin(), cand.end(), by_prob);
  }
  if (p.top_p < 1.f) {
    double mass = 0;
    for (size_t i = 0; i < kept; ++i) mass += x[size_t(cand[i])];
    double cum = 0;
    size_t n = 0;
    while (n < kept) {
      cum += x[size_t(cand[n++])];
      if (cum >= double(p.top_p) * mass) break;
    }
    kept = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0.f) {
    const float floor_q = p.min_p * x[size_t(cand[0])];
    size_t n = 1;
    while (n < kept && x[size_t(cand[n])] >= floor_q) ++n;
    kept = n;
  }
  cand.resize(kept);
  std::sort(cand.begin(), cand.end());  // walk in ascending id order
  double total = 0;
  for (int32_t id : cand) total += x[size_t(id)];
  const double target = double(philox_uniform(p.seed, step)) * total;
  double cum = 0;
  r.token = cand.back();
  for (int32_t id : cand) {
    cum += x[size_t(id)];
    if (cum > target) {
      r.token = id;
      break;
    }
  }
  raw_logprobs(logits, n_real, p.top_logprobs, r);
  return r;
}

}  // namespace lilac
