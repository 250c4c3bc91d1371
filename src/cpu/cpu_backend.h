// The CPU backend: the reference forward pass (MODEL.md section 2) over ModelWeights, f32
// arithmetic on weights read in place (BF16 / F16 / F32). It is the specification in code that
// the CUDA kernels are tested against, and the way to run without a GPU.
#pragma once

#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/weights.h"
#include "util/thread_pool.h"

namespace lilac::cpu {

struct CpuSequenceState : SequenceState {
  int64_t max_context = 0;
  // Per full-attention layer (by slot): K and V rows [position, kv_heads * head_dim], f32.
  std::vector<std::vector<float>> k_cache, v_cache;
  // Per Gated DeltaNet layer (by slot): conv state [K-1, C] and recurrent state [Hv, Dk, Dv].
  std::vector<std::vector<float>> conv_state, recurrent;

  void advance(int64_t n) { position_ += n; }
};

class CpuBackend : public Backend {
 public:
  // `weights` must outlive the backend (it points into the mapped checkpoint).
  CpuBackend(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool = ThreadPool::global());

  std::string name() const override { return "cpu"; }
  std::string device_description() const override;
  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override;
  void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits) override;
  std::unique_ptr<SequenceState> clone(const SequenceState& state) override;
  size_t state_bytes(const SequenceState& state) const override;

 private:
  void full_attention(int64_t layer, const float* x, int64_t T, CpuSequenceState& st, float* out);
  void gated_deltanet(int64_t layer, const float* x, int64_t T, CpuSequenceState& st, float* out);
  void emit(const std::string& name, const float* data, std::vector<int64_t> shape) const {
    if (trace_) trace_(name, data, shape);
  }

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;
};

}  // namespace lilac::cpu
