// MLX affine-quantized checkpoints (mlx-community/Qwen3.6-35B-A3B-4bit and `lilac quantize`
// output), as mlx-lm's qwen3_5_moe model writes them after sanitize():
//   - names `language_model.model.*` and `language_model.lm_head.*`; no vision, no mtp.*;
//   - every Linear / Embedding whose input dim is a multiple of the group size is quantized:
//     `X.weight` U32 codes [out, in * bits / 32], `X.scales` and `X.biases` BF16 [out, in / group]
//     (embed_tokens and lm_head included); the layout is in mlx_affine.h;
//   - experts stacked per layer: `mlp.switch_mlp.{gate,up,down}_proj` with a leading [E] dim,
//     viewed here as the same per-expert Matrix the BF16 layouts give;
//   - config.json `quantization` (or `quantization_config`): {"group_size": 64, "bits": 4,
//     "mode": "affine", "<module path>": {"group_size": 64, "bits": 8}, ...}; a path maps to its
//     own parameters (mlx-lm's load: `p in config["quantization"]` wins, else a module is
//     quantized iff `p.scales` exists);
//   - zero-centred norms stored as bf16(1 + w) (the multiplier), the GDN `linear_attn.norm` plain;
//     conv1d stored [C, K, 1] (same bytes as HF's [C, 1, K]); A_log F32 (mlx-lm never casts it).
#pragma once

#include "io/checkpoint.h"

namespace lilac {

// Binds an MLX checkpoint (Checkpoint::format() == MLX4), validating names, dtypes and shapes
// against config.json and its quantization block; every problem names the tensor.
ModelWeights bind_weights_mlx(const Checkpoint& ck, const ModelConfig& cfg, LoadReport& rep);

}  // namespace lilac
