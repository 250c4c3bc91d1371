// --weights: one vocabulary, one parser and one set of error messages for every command that
// opens weights (serve, run, chat, bench, logits).
//   auto        the checkpoint's own format (the synthetic model: bf16)
//   bf16, fp8   the checkpoint's format, said explicitly: refused when it holds another
//   q4          4-bit: an MLX 4-bit checkpoint as it is, or a BF16 / FP8 one quantized at load
//               (MLX affine 4-bit, 8-bit routers, as `lilac quantize` writes it)
// lilac never dequantizes a 4-bit checkpoint.
#pragma once

#include <string>

#include "io/checkpoint.h"

namespace lilac::runtime {

enum class WeightsChoice { Auto, BF16, FP8, Q4 };

// Throws lilac::Error "--weights X: expected auto, bf16, fp8 or q4" for anything else.
WeightsChoice parse_weights(const std::string& flag);

// What a choice means for a loaded model.
struct WeightsPlan {
  bool quantize_at_load = false;  // q4 on a BF16 or FP8 checkpoint
  bool four_bit = false;          // the backend runs 4-bit weights (either way)
  std::string description;        // "bf16", "mlx-4bit", "fp8 quantized to 4-bit at load"
};
// Throws lilac::Error when the checkpoint holds another format than the one asked for.
WeightsPlan plan_weights(WeightsChoice choice, const Model& model);

// The synthetic full-size model's weights: "bf16" (auto, bf16) or "q4"; fp8 is refused.
std::string synthetic_weights(WeightsChoice choice);

}  // namespace lilac::runtime
