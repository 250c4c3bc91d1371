#include "model/qwen36.h"

namespace lilac {

ModelConfig qwen36_35b_a3b_config() {
  static const char* kConfig = R"({
    "model_type": "qwen3_5_moe",
    "text_config": {
      "hidden_size": 2048, "num_hidden_layers": 40, "full_attention_interval": 4,
      "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
      "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                          "mrope_section": [11, 11, 10], "mrope_interleaved": true},
      "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
      "num_experts": 256, "num_experts_per_tok": 8,
      "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
      "rms_norm_eps": 1e-6, "vocab_size": 248320, "tie_word_embeddings": false,
      "mtp_num_hidden_layers": 1, "max_position_embeddings": 262144,
      "eos_token_id": 248046
    }
  })";
  return parse_model_config(kConfig, "built-in Qwen3.6-35B-A3B config");
}

}  // namespace lilac
