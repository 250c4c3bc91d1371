#include "model/backend.h"

#include <vector>

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

StepResult Backend::step(SequenceState& state, std::span<const int32_t> ids,
                         uint64_t sample_index) {
  std::vector<float> logits(size_t(config().vocab));
  forward(state, ids, logits, false);
  StepResult r = sample_token(logits.data(), sampling_vocab(), state.sampling,
                              state.penalties_active ? &state.penalties : nullptr, sample_index);
  if (state.penalties_active) state.penalties.add_output(r.token);
  return r;
}

std::vector<StepResult> Backend::step_batch(std::span<const BatchItem> items) {
  std::vector<StepResult> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.sample)
      out[i] = step(*it.state, it.ids, it.sample_index);
    else
      forward(*it.state, it.ids, {}, false);
  }
  return out;
}

}  // namespace lilac
