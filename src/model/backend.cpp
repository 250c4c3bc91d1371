#include "model/backend.h"

#include <limits>
#include <vector>

#include "util/error.h"

namespace lilac {

void Backend::begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                             const SamplingParams& params) {
  state.sampling = params;
  state.penalties_active = params.presence_penalty != 0.f || params.frequency_penalty != 0.f ||
                           params.repetition_penalty != 1.f;
  if (state.penalties_active) {
    state.penalties.reset(int32_t(config().vocab));
    state.penalties.add_prompt(prompt);
  }
}

// Samples from host logits with the state's parameters and penalties, and records the output.
static StepResult sample_host(SequenceState& state, const float* logits, int32_t n_vocab,
                              uint64_t sample_index) {
  StepResult r = sample_token(logits, n_vocab, state.sampling,
                              state.penalties_active ? &state.penalties : nullptr, sample_index);
  if (state.penalties_active) state.penalties.add_output(r.token);
  return r;
}

StepResult Backend::step(SequenceState& state, std::span<const int32_t> ids,
                         uint64_t sample_index) {
  std::vector<float> logits(size_t(config().vocab));
  forward(state, ids, logits, false);
  return sample_host(state, logits.data(), sampling_vocab(), sample_index);
}

StepResult Backend::step_constrained(SequenceState& state, std::span<const int32_t> ids,
                                     uint64_t sample_index, TokenConstraint& constraint) {
  std::vector<float> logits(size_t(config().vocab));
  forward(state, ids, logits, false);
  const int32_t n = sampling_vocab();
  std::vector<uint32_t> allowed((size_t(n) + 31) / 32, 0u);
  constraint.allowed_tokens(allowed);
  mask_disallowed_logits(std::span(logits).first(size_t(n)), allowed);
  return sample_host(state, logits.data(), n, sample_index);
}

void mask_disallowed_logits(std::span<float> logits, std::span<const uint32_t> allowed) {
  if (allowed.size() * 32 < logits.size())
    fail("token mask: {} words for {} logits", allowed.size(), logits.size());
  for (size_t t = 0; t < logits.size(); ++t)
    if (!(allowed[t / 32] >> (t % 32) & 1u)) logits[t] = -std::numeric_limits<float>::infinity();
}

std::vector<StepResult> Backend::step_batch(std::span<const BatchItem> items) {
  std::vector<StepResult> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.sample && it.constraint)
      out[i] = step_constrained(*it.state, it.ids, it.sample_index, *it.constraint);
    else if (it.sample)
      out[i] = step(*it.state, it.ids, it.sample_index);
    else
      forward(*it.state, it.ids, {}, false);
  }
  return out;
}

}  // namespace lilac
