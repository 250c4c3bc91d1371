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

#include "model/config.h"
#include "model/dtype.h"

namespace lilac {

// A row-major weight matrix W [rows, cols]; a Linear layer computes y = W x. `name` is the
// checkpoint tensor (for error messages). Two storage kinds:
//  - plain (bits == 0): `data` holds [rows, cols] elements of `dtype` (BF16, F16 or F32);
//  - MLX affine quantized (bits == 4 or 8, dtype U32): `data` holds the codes, uint32 words
//    [rows, cols * bits / 32]; within a row, element k sits in word k / (32 / bits) at bits
//    [bits * (k % (32 / bits)), +bits), little-endian (4-bit: element 8j+i in bits [4i, 4i+4) of
//    word j). `scales` and `biases` are bf16 [rows, cols / group_size], and
//    W[r, k] = scales[r, g] * q + biases[r, g] with g = k / group_size and q the unsigned code
//    (computed in f32 as fma(scale, q, bias): see dequantize_row).
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::BF16;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string name;
  int bits = 0;                      // 0: plain; 4 or 8: MLX affine quantized
  int group_size = 0;                // elements per scale/bias (64 in MLX checkpoints)
  const uint16_t* scales = nullptr;  // bf16 [rows, cols / group_size]
  const uint16_t* biases = nullptr;  // bf16 [rows, cols / group_size]
  // FP8 E4M3 checkpoints (dtype F8_E4M3): W[r, c] = fp8(data[r, c]) * block_scale[r / block_rows,
  // c / block_cols], the checkpoint's weight_scale_inv (F32, BF16 or F16, row-major
  // [ceil(rows / block_rows), ceil(cols / block_cols)]).
  const void* block_scale = nullptr;
  DType block_scale_dtype = DType::F32;
  int64_t block_rows = 0, block_cols = 0;

  bool quantized() const { return bits != 0; }
  bool fp8() const { return dtype == DType::F8_E4M3; }
  // Bytes of one row of `data` (the codes when quantized).
  size_t row_bytes() const {
    return quantized() ? size_t(cols) * size_t(bits) / 8 : size_t(cols) * dtype_size(dtype);
  }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes();
  }
  int64_t groups_per_row() const { return quantized() ? cols / group_size : 0; }
  const uint16_t* row_scales(int64_t r) const {
    return scales + size_t(r) * size_t(groups_per_row());
  }
  const uint16_t* row_biases(int64_t r) const {
    return biases + size_t(r) * size_t(groups_per_row());
  }
  int64_t numel() const { return rows * cols; }
};

// Norm weights are stored as the multiplier the norm applies: for the zero-centred RMSNorm that is
// (1 + w) computed in f32 exactly as the reference does (MLX checkpoints store bf16(1 + w) and the
// multiplier is that stored value); for the GDN output norm it is w itself.
struct FullAttentionWeights {
  Matrix
      q_proj;  // [heads * head_dim * 2, H]: per head, head_dim query rows then head_dim gate rows
  Matrix k_proj;                    // [kv_heads * head_dim, H]
  Matrix v_proj;                    // [kv_heads * head_dim, H]
  Matrix o_proj;                    // [H, heads * head_dim]
  std::vector<float> q_norm_scale;  // [head_dim], 1 + w
  std::vector<float> k_norm_scale;  // [head_dim], 1 + w
};

struct GatedDeltaNetWeights {
  Matrix in_proj_qkv;            // [C, H], C = 2*Hk*Dk + Hv*Dv (q, k, v head-major)
  Matrix in_proj_z;              // [Hv*Dv, H]
  Matrix in_proj_b;              // [Hv, H]
  Matrix in_proj_a;              // [Hv, H]
  Matrix out_proj;               // [H, Hv*Dv]
  std::vector<float> conv;       // [C, K] causal depthwise taps (tap K-1 multiplies the newest row)
  std::vector<float> neg_exp_A;  // [Hv], -exp(A_log)
  std::vector<float> dt_bias;    // [Hv]
  std::vector<float> norm_scale;  // [Dv], plain w (NOT 1 + w)
};

struct ExpertWeights {
  Matrix gate;  // [I, H]
  Matrix up;    // [I, H]
  Matrix down;  // [H, I]
};

struct MoeWeights {
  Matrix router;                       // [E, H]
  std::vector<ExpertWeights> experts;  // E of them
  Matrix shared_gate;                  // [Is, H]
  Matrix shared_up;                    // [Is, H]
  Matrix shared_down;                  // [H, Is]
  Matrix shared_expert_gate;           // [1, H]
};

struct LayerWeights {
  LayerType type = LayerType::GatedDeltaNet;
  std::vector<float> input_norm_scale;           // [H], 1 + w
  std::vector<float> post_attention_norm_scale;  // [H], 1 + w
  FullAttentionWeights attn;                     // when type == FullAttention
  GatedDeltaNetWeights gdn;                      // when type == GatedDeltaNet
  MoeWeights moe;

  // Calls f(Matrix&) on every weight matrix of the layer: both mixers' slots (set or not: check
  // `data`), the router and shared expert, then each expert's gate, up and down. For code that
  // treats them alike (format checks, whole-model conversions in tests).
  template <typename F>
  void for_each_matrix(F&& f) {
    visit(*this, f);
  }
  template <typename F>
  void for_each_matrix(F&& f) const {
    visit(*this, f);
  }

 private:
  template <typename Self, typename F>
  static void visit(Self& L, F& f) {
    for (auto* m :
         {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.gdn.in_proj_qkv,
          &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj, &L.moe.router,
          &L.moe.shared_gate, &L.moe.shared_up, &L.moe.shared_down, &L.moe.shared_expert_gate})
      f(*m);
    for (auto& e : L.moe.experts) {
      f(e.gate);
      f(e.up);
      f(e.down);
    }
  }
};

// Multi-token prediction head (docs/model.md section 8).
struct MtpWeights {
  Matrix fc;                                       // [H, 2H]
  std::vector<float> pre_fc_norm_embedding_scale;  // [H], 1 + w
  std::vector<float> pre_fc_norm_hidden_scale;     // [H], 1 + w
  std::vector<float> final_norm_scale;             // [H], 1 + w
  std::vector<LayerWeights> layers;                // full-attention layers with MoE
};

struct ModelWeights {
  Matrix embed;                         // [V, H]
  Matrix lm_head;                       // [V, H]
  std::vector<float> final_norm_scale;  // [H], 1 + w
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;
};

}  // namespace lilac
