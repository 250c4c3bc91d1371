// BF16 / FP8 checkpoints -> MLX affine 4-bit (`lilac quantize`), and the same quantization of a
// loaded model in memory (`lilac logits --weights q4`).
//
// The output is what mlx-lm's convert (`mlx_lm.convert -q`, group 64, 4 bits, Qwen3.5/3.6 MoE
// predicate) writes for this model, so MLX tools can read it and lilac loads it as MLX4
// (checkpoint_mlx.h):
//   - names `language_model.model.*` / `language_model.lm_head.weight`; vision and mtp.* dropped;
//   - experts stacked as `mlp.switch_mlp.{gate,up,down}_proj` [E, out, in] (from the hub's fused
//     gate_up_proj / down_proj or the per-expert tensors);
//   - every Linear and the embedding quantized with group 64: 4 bits, 8 bits for the router
//     `mlp.gate` and `mlp.shared_expert_gate` (listed as per-path overrides in config.json
//     `quantization` and `quantization_config`); a matrix whose input dim is not a multiple of 64
//     would stay BF16 (none in this model);
//   - zero-centred norm weights written as bf16(1 + w), the GDN `linear_attn.norm` as is, conv1d
//     as [C, K, 1], A_log in its input dtype (mlx-lm never casts it), everything else BF16.
// Inputs: FP8 weights (F8_E4M3 + F32 `weight_scale_inv` blocks, W = fp8 * scale_inv) and F16/F32
// ones are first rounded to the BF16 values a BF16 conversion would hold, then quantized exactly
// as MLX quantizes BF16 weights (mlx_affine.h). The conversion streams: one output module at a
// time (the largest is one layer's stacked experts), input pages released as it goes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/weight_rows.h"

namespace lilac {

struct QuantizeProgress {
  uint64_t done_bytes = 0;   // output bytes written so far
  uint64_t total_bytes = 0;  // of the whole output
  int64_t layer = -1;        // layer being converted; -1 outside the layers
  int64_t layers = 0;
  std::string tensor;  // the output module just written
};

struct QuantizeOptions {
  std::string input;                      // model directory (BF16 hub / per-expert layout, or FP8)
  std::string output;                     // created; must not exist or be empty
  uint64_t max_shard_bytes = 5ull << 30;  // mlx-lm's MAX_FILE_SIZE_GB = 5
  std::function<void(const QuantizeProgress&)> progress;
};

struct QuantizeSummary {
  WeightFormat input_format = WeightFormat::BF16;
  std::string input_layout;
  int64_t tensors = 0;  // output tensors
  size_t shards = 0;
  uint64_t input_bytes = 0, output_bytes = 0;
  int64_t parameters = 0;         // logical weights of the output
  int64_t quantized_weights = 0;  // of which quantized
  uint64_t quantized_bytes = 0;   // their codes + scales + biases
  int overrides = 0;              // 8-bit per-path entries in config.json
  std::vector<std::string> copied_files;
  std::vector<std::string> notes;
};

// Validates the whole input first (throws lilac::Error listing every problem, writing nothing),
// then writes the output directory.
QuantizeSummary quantize_checkpoint(const QuantizeOptions& options);

// Quantizes a loaded BF16/F16/F32 model in place with the rules above, so its weights dequantize
// to exactly what loading `lilac quantize`'s output gives: matrices become MLX affine codes (owned
// by model.owned), zero-centred norm multipliers become bf16(1 + w), conv / dt_bias / GDN norm are
// rounded to bf16, the MTP head is dropped. Throws on an already quantized model.
void quantize_model_in_memory(Model& model);

}  // namespace lilac
