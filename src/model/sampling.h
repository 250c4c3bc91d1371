// Token sampling: the reference semantics, shared by the engine (CPU backend) and the CUDA
// sampler (tested to pick the same token for the same seed and step).
//
// INTERFACE CONTRACT (the engine codes against this; implementations may add to it).
//
// Semantics, in order, over the first n_real logits (ids >= n_real are never sampled):
//  1. Penalties. repetition_penalty r applies to ids seen in the prompt or the output:
//     x = x > 0 ? x / r : x * r. presence p and frequency f apply to output counts c:
//     x -= p * (c > 0) + f * c.
//  2. temperature <= 0 (or top_k == 1): the argmax of x (lowest id on ties). Done.
//  3. x /= temperature; q = softmax(x).
//  4. Candidates sorted by q descending (ties: lower id first). top_k > 0 keeps the first top_k.
//     top_p < 1 keeps the shortest prefix whose mass (renormalised after top_k) reaches top_p.
//     min_p > 0 keeps q >= min_p * max(q).
//  5. u = uniform [0, 1) from Philox4x32-10 with key = seed, counter = (step, 0, 0, 0);
//     r = u * (sum of kept q); walk the kept ids in ASCENDING ID ORDER accumulating q; the
//     token is the first id where the running sum exceeds r (the last kept id if none does).
// Exact realisation (model/sampling.cpp and cuda/sampling.cu; arithmetic in model/sampling_core.h,
// so both pick the same token bit for bit): q is kept unnormalised, e = exp(x/T - max) in (0, 1] by
// a libm-free exp, and masses are floor(e * 2^40) integers; "reaches top_p" is prefix mass >=
// trunc(top_p * mass of the top_k set); min_p keeps e >= min_p; r = floor(u24 * kept mass / 2^24).
// The 64-bit counter (step) is Philox counter words (step low, step high, 0, 0); the key is (seed
// low, seed high).
// Logprobs are reported from log_softmax of the raw logits (before penalties and temperature):
// the chosen token's, and the top_logprobs highest (ties: lower id first).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lilac {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;  // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;  // 0..20
  // The caller reads SampleResult::logprob. When false and top_logprobs == 0, a backend may skip
  // the log-softmax (the CUDA backend's greedy path is then a single argmax launch).
  bool logprobs = false;
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// Token history the penalties read: output counts and the prompt-or-output mask, both [n_vocab].
struct PenaltyState {
  std::vector<int32_t> output_counts;
  std::vector<uint8_t> seen;
  void reset(int32_t n_vocab);
  void add_prompt(std::span<const int32_t> ids);
  void add_output(int32_t id);
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                        // raw log_softmax of the chosen token
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs (id, raw logprob)
};

// Philox4x32-10 uniform in [0, 1) for (seed, step): 24 high bits of the first output word / 2^24.
float philox_uniform(uint64_t seed, uint64_t step);

// The greedy pick over x[0, n): the lowest id holding the maximum (NaN never wins; 0 if all are
// NaN).
int32_t argmax(const float* x, int32_t n);

// Samples one token from logits[0, n_real). `penalties` may be null (no penalties).
SampleResult sample_token(const float* logits, int32_t n_real, const SamplingParams& params,
                          const PenaltyState* penalties, uint64_t step);

}  // namespace lilac
