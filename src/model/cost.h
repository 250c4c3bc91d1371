// What a forward pass must move and compute, from the config alone: the denominators of the
// bench's "fraction of roofline" columns (docs/benchmarking.md section 3).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace lilac {

// Parameters one decode token reads, summed over the weight table (model/weight_table.h): every
// dense weight, the router, k routed experts plus the shared expert per layer, one embedding row
// and the lm_head.
int64_t active_params_per_token(const ModelConfig& c);

// Bytes one decode step at `context` tokens must move: active weights at `bytes_per_weight`
// (2 for bf16, 4.5/8 for MLX 4-bit), the GDN recurrent state read + written at
// `state_bytes_per_value` (4: f32, 2: bf16; model/state_format.h), and the KV cache read (bf16)
// for the full-attention layers.
double decode_bytes(const ModelConfig& c, int64_t context, double bytes_per_weight,
                    double state_bytes_per_value = 4.0);

// FLOPs of prefilling L tokens from an empty state: 2 per active weight per token, plus causal
// attention (QK^T and PV over L^2/2 pairs per head), plus the GDN recurrence (~6 Dk Dv per token
// and value head).
double prefill_flops(const ModelConfig& c, int64_t L);

}  // namespace lilac
