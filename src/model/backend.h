// The interface every backend (cpu, cuda) implements over the model's plain data. The engine and
// the CLI see only this.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/sampling.h"

namespace lilac {

// Observes named intermediate tensors, for tests and backend-vs-backend diffs. Names are
// "<scope>.<op>", e.g. "hidden.0" (after the embedding), "hidden.4" (after layer 3),
// "layer3.attn.q", "layer0.gdn.core", "layer2.moe.router_probs", "final_norm", "logits".
// `shape` is row-major; data is f32 and only valid during the call.
using TraceFn = std::function<void(const std::string& name, const float* data,
                                   const std::vector<int64_t>& shape)>;

// Per-sequence state: KV cache for the full-attention layers, conv + recurrent state for the
// Gated DeltaNet layers, and the number of tokens consumed (the next token's position).
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  int64_t position() const { return position_; }

  // Sampling set up by Backend::begin_sampling: parameters and the penalty history (prompt ids
  // seen, output counts). Backends that sample on the device keep their own copy in sync.
  SamplingParams sampling;
  PenaltyState penalties;
  bool penalties_active = false;

 protected:
  int64_t position_ = 0;
};

// One sampled token: its id, its raw logprob and the requested top logprobs.
using StepResult = SampleResult;

// Limits which tokens may be sampled next (structured output: a grammar's parser state). The
// mask is a bitset over the sampling vocab: bit t % 32 of word t / 32 set when token t may be
// sampled. Backends call allowed_tokens() once per sampled token, after the forward pass was
// started (a device backend may compute the mask on the host while the device works); the engine
// calls accept() with every token the sequence takes (sampled or forced), in order.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Fills `allowed` ((sampling vocab + 31) / 32 words) for the next token.
  virtual void allowed_tokens(std::span<uint32_t> allowed) = 0;
  virtual void accept(int32_t token) = 0;
};

// logits[t] = -inf for every t < logits.size() whose bit in `allowed` is clear (the mask's
// meaning; the CPU reference of cuda::mask_logits).
void mask_disallowed_logits(std::span<float> logits, std::span<const uint32_t> allowed);

// One sequence's share of a batched step (Backend::step_batch): its state, the ids it consumes
// (the previous sampled token when decoding, or a piece of its prompt), and whether to sample.
struct BatchItem {
  SequenceState* state = nullptr;
  std::span<const int32_t> ids;
  uint64_t sample_index = 0;  // as in step(): tokens sampled so far in this request
  bool sample = true;         // false: a prompt piece that is not the last (no logits, no token)
  TokenConstraint* constraint = nullptr;  // when sampling: only the tokens it allows (null: any)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The hardware, for logs and bench results ("NVIDIA H200 (132 SMs, ...)", "cpu: 16 threads").
  virtual std::string device_description() const { return name(); }
  virtual const ModelConfig& config() const = 0;

  // A fresh sequence (empty cache, zero recurrent state) able to hold max_context tokens.
  virtual std::unique_ptr<SequenceState> new_sequence(int64_t max_context) = 0;

  // Runs `ids` at positions state.position() .. +n-1 and advances the state by n. When
  // `all_logits`, `logits` receives [n, V] (f32), else [1, V] for the last token. An empty
  // `logits` span skips the lm_head entirely. Throws lilac::Error when the context would overflow.
  virtual void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
                       bool all_logits) = 0;

  // Generation API (engine, bench). begin_sampling fixes the sampling parameters and resets the
  // penalty history to `prompt` (all ids the model has seen in this request). step() feeds `ids`
  // (a prompt chunk, or the previous sampled token), samples the next token from the last
  // position (sample_index = the Philox counter: the number of tokens sampled so far in this
  // request), records it as an output for the penalties, and returns it. The base implementation
  // runs forward() and the CPU sampler; the CUDA backend samples on the device.
  virtual void begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                              const SamplingParams& params);
  virtual StepResult step(SequenceState& state, std::span<const int32_t> ids,
                          uint64_t sample_index);
  // Advances several distinct sequences at once: each item consumes its ids and, when
  // item.sample, samples its next token with its own parameters, seed and penalties exactly as
  // step() would. Returns one result per item, in order (token -1 where !sample). Results equal
  // those of the items run one at a time (greedy: the same tokens; logits within the backend's
  // stated tolerance). The base implementation runs the items one by one (forward() / step());
  // the CUDA backend runs decode items as one batched pass.
  virtual std::vector<StepResult> step_batch(std::span<const BatchItem> items);
  // step() with a constraint: the logits, the disallowed tokens set to -inf, then the sampler.
  // The base implementation runs forward() and the host sampler (the reference); the CUDA
  // backend computes the mask on the host while the device runs the step and samples there.
  virtual StepResult step_constrained(SequenceState& state, std::span<const int32_t> ids,
                                      uint64_t sample_index, TokenConstraint& constraint);
  // The number of ids the sampler may choose from (the tokenizer's size; the model's vocab may
  // be padded). Defaults to the model's vocab.
  void set_sampling_vocab(int32_t n) { sampling_vocab_ = n; }
  int32_t sampling_vocab() const {
    return sampling_vocab_ > 0 ? sampling_vocab_ : int32_t(config().vocab);
  }

  // A deep copy of a state (a snapshot for prompt reuse) and the bytes it occupies.
  virtual std::unique_ptr<SequenceState> clone(const SequenceState& state) = 0;
  // A copy with room for `max_context` tokens (>= the state's position): prompt-reuse snapshots
  // are stored compact (max_context = position) and restored with the full context. Backends
  // whose states grow on demand keep the default, a plain clone.
  virtual std::unique_ptr<SequenceState> clone_with_capacity(const SequenceState& state,
                                                             int64_t max_context) {
    (void)max_context;
    return clone(state);
  }
  virtual size_t state_bytes(const SequenceState& state) const = 0;

  // Prepares step_batch for up to `max_sequences` sequences at once, so that the first busy
  // moments of a server do not pay for lazy set-up (CUDA: captures and uploads the batched pass's
  // graph for every batch size, and runs one multi-sequence prefill chunk on scratch sequences).
  // Optional: the default does nothing.
  virtual void prepare_batches(int max_sequences) { (void)max_sequences; }

  // Optional observer of intermediate tensors (nullptr: off, the default and the fast path).
  virtual void set_trace(TraceFn fn) { trace_ = std::move(fn); }

 protected:
  TraceFn trace_;
  int32_t sampling_vocab_ = 0;
};

}  // namespace lilac
