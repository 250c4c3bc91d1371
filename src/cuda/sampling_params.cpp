// SamplingParams -> DeviceSamplingParams (cuda/sampling.h): the one conversion the backend, the
// sampler tests and the sampling lab use.
#include <algorithm>

#include "cuda/sampling.h"
#include "model/sampling.h"

namespace lilac::cuda {

DeviceSamplingParams device_sampling_params(const SamplingParams& p, uint64_t step, int advance) {
  DeviceSamplingParams d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.presence_penalty = p.presence_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.repetition_penalty = p.repetition_penalty;
  d.top_logprobs = std::clamp(p.top_logprobs, 0, kMaxTopLogprobs);
  d.seed = p.seed;
  d.step = step;
  d.advance = advance;
  return d;
}

}  // namespace lilac::cuda
