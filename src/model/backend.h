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

namespace lilac {

// Observes named intermediate tensors, for tests and backend-vs-backend diffs. Names are
// "<scope>.<op>", e.g. "hidden.0" (after the embedding), "hidden.4" (after layer 3),
// "layer3.attn.q", "layer0.gdn.core", "layer2.moe.router_probs", "final_norm", "logits".
// `shape` is row-major; data is f32 and only valid during the call.
using TraceFn =
    std::function<void(const std::string& name, const float* data, const std::vector<int64_t>& shape)>;

// Per-sequence state: KV cache for the full-attention layers, conv + recurrent state for the
// Gated DeltaNet layers, and the number of tokens consumed (the next token's position).
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  int64_t position() const { return position_; }

 protected:
  int64_t position_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;

  // A fresh sequence (empty cache, zero recurrent state) able to hold max_context tokens.
  virtual std::unique_ptr<SequenceState> new_sequence(int64_t max_context) = 0;

  // Runs `ids` at positions state.position() .. +n-1 and advances the state by n. When
  // `all_logits`, `logits` receives [n, V] (f32), else [1, V] for the last token. An empty
  // `logits` span skips the lm_head entirely. Throws lilac::Error when the context would overflow.
  virtual void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
                       bool all_logits) = 0;

  // A deep copy of a state (a snapshot for prompt reuse) and the bytes it occupies.
  virtual std::unique_ptr<SequenceState> clone(const SequenceState& state) = 0;
  virtual size_t state_bytes(const SequenceState& state) const = 0;

  // Optional observer of intermediate tensors (nullptr: off, the default and the fast path).
  virtual void set_trace(TraceFn fn) { trace_ = std::move(fn); }

 protected:
  TraceFn trace_;
};

}  // namespace lilac
