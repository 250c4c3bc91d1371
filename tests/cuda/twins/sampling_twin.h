// The sampler's inputs shared by the GPU tests (tests/cuda/sampling_test.cpp) and the kernel lab
// (bench/lab/sampling): a request's SamplingParams as the device reads them. No GoogleTest.
#pragma once

#include <cstdint>

#include "cuda/sampling.h"
#include "model/sampling.h"

namespace lilac::test {

// p with the Philox counter `step`; advance != 0: the sampler records the token in the penalty
// state and moves the step (as the decode graph does). top_logprobs is passed as is (the device
// clamps it).
inline cuda::DeviceSamplingParams to_device(const SamplingParams& p, uint64_t step, int advance) {
  cuda::DeviceSamplingParams d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.presence_penalty = p.presence_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.repetition_penalty = p.repetition_penalty;
  d.top_logprobs = p.top_logprobs;
  d.seed = p.seed;
  d.step = step;
  d.advance = advance;
  return d;
}

}  // namespace lilac::test
