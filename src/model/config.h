// The model's hyper-parameters, read from config.json (text_config). Plain data: every size the
// backends use comes from here, never from constants, so small test configs and the real
// 35B-A3B run through the same code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lilac {

enum class LayerType { GatedDeltaNet, FullAttention };

struct ModelConfig {
  std::string model_type;  // "qwen3_5_moe" (top level) or the text config's type
  int64_t hidden = 0;      // H
  int64_t layers = 0;
  std::vector<LayerType> layer_types;
  int64_t vocab = 0;  // rows of embed_tokens / lm_head (padded)
  float rms_eps = 1e-6f;

  // Full attention
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads (GQA)
  int64_t head_dim = 0;
  float rope_theta = 1e7f;
  float partial_rotary_factor = 0.25f;
  int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor (even)
  // Round RoPE's inv_freq to bf16 before use. HF keeps inv_freq in f32 (the default here), but a
  // model cast with nn.Module.to(bfloat16) rounds that buffer; the HF fixtures were produced from
  // such a cast model, so matching them to 1e-4 needs this (docs/model-notes.md). Not from
  // config.json.
  bool rope_inv_freq_bf16 = false;

  // Gated DeltaNet
  int64_t gdn_key_heads = 0;    // Hk
  int64_t gdn_value_heads = 0;  // Hv
  int64_t gdn_key_dim = 0;      // Dk
  int64_t gdn_value_dim = 0;    // Dv
  int64_t gdn_conv_kernel = 4;

  // Mixture of experts
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate = 0;  // I
  int64_t shared_intermediate = 0;

  int64_t mtp_layers = 0;
  bool tie_word_embeddings = false;
  // FP8 checkpoints: the block of one weight_scale_inv entry
  // (quantization_config.weight_block_size, default 128 x 128).
  int64_t fp8_block_rows = 128, fp8_block_cols = 128;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;  // from text_config / generation_config

  // Derived sizes.
  int64_t gdn_qk_channels() const { return 2 * gdn_key_heads * gdn_key_dim; }
  int64_t gdn_v_channels() const { return gdn_value_heads * gdn_value_dim; }
  int64_t gdn_conv_channels() const { return gdn_qk_channels() + gdn_v_channels(); }  // C
  int64_t q_proj_rows() const { return heads * head_dim * 2; }  // query + gate per head
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t count_layers(LayerType t) const;
  // Index among layers of the same type (KV cache slot or GDN state slot) of layer i.
  int64_t slot_of_layer(int64_t i) const;
  // A one-line summary for logs and `lilac inspect`.
  std::string summary() const;
};

// Parses config.json text (the whole file; reads text_config when present). Throws lilac::Error
// naming `source` and the key on any missing, mistyped or inconsistent value.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace lilac
