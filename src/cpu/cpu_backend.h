// The CPU backend: the reference forward pass (docs/model.md section 2) over ModelWeights, f32
// arithmetic on weights read in place (BF16 / F16 / F32). It is the specification in code that
// the CUDA kernels are tested against, and the way to run without a GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/state_format.h"
#include "model/weights.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::cpu {

struct CpuSequenceState : SequenceState {
  int64_t max_context = 0;
  // Per full-attention layer (by slot): K and V rows [position, kv_heads * head_dim], f32.
  std::vector<std::vector<float>> k_cache, v_cache;
  // Per Gated DeltaNet layer (by slot): conv state [K-1, C] and recurrent state [Hv, Dk, Dv].
  std::vector<std::vector<float>> conv_state, recurrent;
  // The checkpoints of the last verify pass (CpuBackend::forward_checkpointed): it started at
  // position pos0 and ran `rows` rows; conv[slot] / rec[slot] hold each Gated DeltaNet layer's
  // states after every row ([rows][state size], as a call ending at that row would store them).
  // Empty (rows 0) otherwise; any other forward drops them.
  struct Checkpoints {
    int64_t pos0 = 0, rows = 0;
    std::vector<std::vector<float>> conv, rec;
  } checkpoints;
  bool checkpointing = false;  // set by forward_checkpointed for its pass

  void advance(int64_t n) { position_ += n; }
  void set_position(int64_t p) { position_ = p; }
};

class CpuBackend : public Backend {
 public:
  // `weights` must outlive the backend (it points into the mapped checkpoint).
  CpuBackend(const ModelConfig& config, const ModelWeights& weights,
             ThreadPool& pool = ThreadPool::global());

  std::string name() const override { return "cpu"; }
  std::string device_description() const override;
  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override;
  void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits) override;
  // All items in one pass: the rows of every item go through each layer's projections and MoE
  // together (each weight read once per step, not once per sequence); rope, the KV cache, the
  // attention, the convolution and the recurrence run per sequence. Every row's arithmetic is
  // that of the item alone, so the results are bit for bit those of the one-by-one loop. With a
  // trace observer set, or one item, it is the loop.
  std::vector<StepResult> step_batch(std::span<const BatchItem> items) override;
  std::unique_ptr<SequenceState> clone(const SequenceState& state) override;
  std::unique_ptr<SequenceState> clone_with_capacity(const SequenceState& state,
                                                     int64_t max_context) override;
  size_t state_bytes(const SequenceState& state) const override;

  // Round activations to bf16 wherever the CUDA backend stores them in bf16 (normed inputs of
  // every projection, mixer outputs, q / gate / k / v, expert activations), so GPU-vs-CPU checks
  // at full size compare the same function: with random routers, f32 vs bf16 inputs can flip a
  // top-k choice and make an honest comparison look like a bug. Off by default (the reference).
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

  // How each sequence's Gated DeltaNet recurrent state (CpuSequenceState::recurrent[slot],
  // [Hv, Dk, Dv] per layer) is kept between calls: the CPU twin of the CUDA backend's state
  // format (model/state_format.h). f32 (the default, the reference) keeps it as computed; bf16
  // rounds it to bf16 (round to nearest even) at the end of every call that ran the layer for the
  // sequence: after each decode step, and after a prompt piece, whose own tokens carry it in f32.
  // The values stay in f32 vectors here (state_bytes() is unchanged); only their precision is
  // that of the GPU's bf16 state, so the two backends compute the same function.
  void set_gdn_state_format(GdnStateFormat f) { gdn_state_ = f; }
  GdnStateFormat gdn_state_format() const { return gdn_state_; }

  // The pieces of forward(), public for layer-by-layer checks of other backends: layer i applied
  // in place to the residual h [T, H] at the state's position (the state's caches of that layer
  // are updated, its position is not advanced), and the final norm + lm_head of `rows` rows.
  void forward_layer(int64_t layer, float* h, int64_t T, SequenceState& state);
  void forward_head(const float* h, int64_t rows, float* logits);

  // forward() that also hands out every row's hidden state after the final norm (the MTP head's
  // input): normed [T, H] and logits [T, V] for every row, each when not null.
  void forward_normed(SequenceState& state, std::span<const int32_t> ids, float* normed,
                      float* logits);

  // A speculative verify pass (docs/speculative.md): forward_normed over T rows that also keeps
  // every Gated DeltaNet layer's states after each row; rollback(state, n) then leaves the
  // sequence exactly as if only its first n rows (1 <= n <= T) had been forwarded (positions, KV
  // rows and states bit for bit), until the next forward, which drops the checkpoints. The
  // recurrence and convolution run row by row either way, so the checkpoints are what a call
  // ending at that row would store (bf16-rounded with the bf16 state format).
  void forward_checkpointed(SequenceState& state, std::span<const int32_t> ids, float* normed,
                            float* logits);
  void rollback(SequenceState& state, int64_t n);

  // The multi-token-prediction head (docs/model.md section 8), for checkpoints that carry one.
  // Its state is a sequence of its own (new_mtp_sequence: the head's layers' KV caches, no
  // recurrent state) whose position is the next trunk position the head takes. mtp_forward runs
  // the head on T consecutive positions p = position() .. + T - 1: hidden [T, H] is the trunk's
  // hidden after its final norm at p (or, chaining drafts, the head's own `out` of the previous
  // position), next_ids [T] the token at p + 1; it writes out [T, H] (after mtp.norm) and, when not
  // null, logits [T, V]: the head's prediction of the token at p + 2. The position advances by T.
  bool has_mtp() const { return w_.mtp.has_value() && !w_.mtp->layers.empty(); }
  std::unique_ptr<SequenceState> new_mtp_sequence(int64_t max_context);
  void mtp_forward(SequenceState& mtp, const float* hidden, std::span<const int32_t> next_ids,
                   float* out, float* logits);

 private:
  // Checks the ids and the context, embeds the ids and runs every layer on them (the state's
  // position advanced): h [T, H].
  void trunk(CpuSequenceState& st, std::span<const int32_t> ids, std::vector<float>& h);
  // A checkpointing pass's conv states after each of its T rows of qkv, from the state before it.
  void checkpoint_conv(CpuSequenceState& st, int64_t slot, const std::vector<float>& state,
                       const float* qkv, int64_t T);
  // The final norm of `rows` rows of h into xn [rows, H] (bf16-rounded when asked).
  void final_norm(const float* h, int64_t rows, float* xn);
  // Rows [row0, row0 + T) of a pass are one sequence's next T tokens (from its position on).
  struct Segment {
    CpuSequenceState* st;
    int64_t row0, T;
  };
  // Layer i on the R rows of h [R, H], the rows split into sequences by `segs`.
  void layer(int64_t i, float* h, int64_t R, std::span<const Segment> segs);
  // A decoder layer's body (norm, mixer, residual, norm, MoE, residual) with weights L: a
  // full-attention layer uses KV cache `slot` of each segment's state, a Gated DeltaNet one is
  // trunk layer gdn_layer; `name` prefixes its trace names ("layer3", "mtp.layer0").
  void decoder_layer(const LayerWeights& L, int64_t slot, int64_t gdn_layer,
                     const std::string& name, float* h, int64_t R, std::span<const Segment> segs);
  void full_attention(const FullAttentionWeights& a, int64_t slot, const std::string& name,
                      const float* x, int64_t R, std::span<const Segment> segs, float* out);
  void gated_deltanet(int64_t layer, const float* x, int64_t R, std::span<const Segment> segs,
                      float* out);
  void emit(const std::string& name, const float* data, std::vector<int64_t> shape) const {
    if (trace_) trace_(name, data, shape);
  }

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;
  bool bf16_activations_ = false;
  GdnStateFormat gdn_state_ = GdnStateFormat::f32;
  void round_bf16(float* x, size_t n) const {
    if (bf16_activations_)
      for (size_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
  }
};

}  // namespace lilac::cpu
