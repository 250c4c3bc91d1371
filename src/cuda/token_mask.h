// The structured-output token mask on the device (model/backend.h, TokenConstraint): the logits
// of the tokens a grammar forbids set to -inf before the sampler runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lilac::cuda {

// logits[t] = -inf for every t in [0, n) whose bit in `allowed` (bit t % 32 of word t / 32, as
// TokenConstraint::allowed_tokens fills it) is clear; the others are left as they are. One
// thread per logit, one plain launch (no PDL: it is not part of the graphed decode step).
// Twin: lilac::mask_disallowed_logits (model/backend.h).
void mask_logits(float* logits, int n, const uint32_t* allowed, cudaStream_t stream);

}  // namespace lilac::cuda
