// The model's weights as plain data: views into the mapped checkpoint (matrices, zero-copy) and
// small f32 vectors converted at load (norms, gates, conv taps). Both expert layouts (fused hub
// tensors and per-expert tensors) become the same per-expert Matrix views, so every backend sees
// one shape of data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "model/config.h"

namespace lilac {

// A row-major weight matrix W [rows, cols] in the checkpoint's dtype (BF16, F16 or F32);
// a Linear layer computes y = W x. `name` is the checkpoint tensor (for error messages).
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::BF16;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string name;

  size_t row_bytes() const { return size_t(cols) * dtype_size(dtype); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes(); }
  int64_t numel() const { return rows * cols; }
};

// Norm weights are stored as the multiplier the norm applies: for the zero-centred RMSNorm that is
// (1 + w) computed in f32 exactly as the reference does; for the GDN output norm it is w itself.
struct FullAttentionWeights {
  Matrix q_proj;  // [heads * head_dim * 2, H]: per head, head_dim query rows then head_dim gate rows
  Matrix k_proj;  // [kv_heads * head_dim, H]
  Matrix v_proj;  // [kv_heads * head_dim, H]
  Matrix o_proj;  // [H, heads * head_dim]
  std::vector<float> q_norm_scale;  // [head_dim], 1 + w
  std::vector<float> k_norm_scale;  // [head_dim], 1 + w
};

struct GatedDeltaNetWeights {
  Matrix in_proj_qkv;  // [C, H], C = 2*Hk*Dk + Hv*Dv (q, k, v head-major)
  Matrix in_proj_z;    // [Hv*Dv, H]
  Matrix in_proj_b;    // [Hv, H]
  Matrix in_proj_a;    // [Hv, H]
  Matrix out_proj;     // [H, Hv*Dv]
  std::vector<float> conv;        // [C, K] causal depthwise taps (tap K-1 multiplies the newest row)
  std::vector<float> neg_exp_A;   // [Hv], -exp(A_log)
  std::vector<float> dt_bias;     // [Hv]
  std::vector<float> norm_scale;  // [Dv], plain w (NOT 1 + w)
};

struct ExpertWeights {
  Matrix gate;  // [I, H]
  Matrix up;    // [I, H]
  Matrix down;  // [H, I]
};

struct MoeWeights {
  Matrix router;                      // [E, H]
  std::vector<ExpertWeights> experts;  // E of them
  Matrix shared_gate;                 // [Is, H]
  Matrix shared_up;                   // [Is, H]
  Matrix shared_down;                 // [H, Is]
  Matrix shared_expert_gate;          // [1, H]
};

struct LayerWeights {
  LayerType type = LayerType::GatedDeltaNet;
  std::vector<float> input_norm_scale;          // [H], 1 + w
  std::vector<float> post_attention_norm_scale;  // [H], 1 + w
  FullAttentionWeights attn;                     // when type == FullAttention
  GatedDeltaNetWeights gdn;                      // when type == GatedDeltaNet
  MoeWeights moe;
};

// Multi-token prediction head (MODEL.md section 7).
struct MtpWeights {
  Matrix fc;                                    // [H, 2H]
  std::vector<float> pre_fc_norm_embedding_scale;  // [H], 1 + w
  std::vector<float> pre_fc_norm_hidden_scale;     // [H], 1 + w
  std::vector<float> final_norm_scale;          // [H], 1 + w
  std::vector<LayerWeights> layers;             // full-attention layers with MoE
};

struct ModelWeights {
  Matrix embed;    // [V, H]
  Matrix lm_head;  // [V, H]
  std::vector<float> final_norm_scale;  // [H], 1 + w
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;
};

}  // namespace lilac
