// MLX affine quantization: the arithmetic and the naming rules shared by the MLX checkpoint
// loader (checkpoint_mlx.cpp), `lilac quantize` (quantize.cpp) and in-memory quantization.
//
// Format (MLX `mx.quantize(w, group_size, bits, mode="affine")`): a matrix W [rows, cols] becomes
//   codes  uint32 [rows, cols * bits / 32]  (element 8j+i of a 4-bit row in bits [4i, 4i+4) of
//                                             word j; 8-bit: 4 per word, the same way)
//   scales bf16 [rows, cols / group_size]
//   biases bf16 [rows, cols / group_size]
// with W[r, k] ~= scale * q + bias, q unsigned in [0, 2^bits - 1]. The bias is the group's edge
// value (its min or max), not a zero point.
#pragma once

#include <cstdint>
#include <string>

namespace lilac {

constexpr int kMlxGroupSize = 64;
constexpr int kMlxDefaultBits = 4;
constexpr int kMlxRouterBits = 8;  // mlp.gate and shared_expert_gate (mlx-lm's quant_predicate)

// Quantizes one row of n values (n a multiple of group_size) as MLX does, group by group.
// Follows MLX's CPU kernel (mlx/backend/cpu/quantized.cpp, `quantize<T, U>`, read at
// ml-explore/mlx 846d176), whose arithmetic is all f32:
//   n_bins = 2^bits - 1
//   scale  = max((max - min) / n_bins, 1e-7), negated unless |min| > |max|
//   edge   = |min| > |max| ? min : max
//   q0     = rint(edge / scale)
//   if q0 != 0: scale = edge / q0, bias = edge   (the edge, and with it 0 = bias - q0 * scale,
//               lands exactly on the grid)
//   else:       bias = 0                          (max == min == 0: scale stays -1e-7)
//   q      = clamp(rint((w - bias) / scale), 0, n_bins)   with the f32 scale and bias
//   stored: bf16(scale), bf16(bias) (round to nearest even)
// So the scale is negative when the group's largest magnitude is positive (q = 0 is the max).
// rint rounds half to even. MLX's Metal kernel (affine_quantize in
// mlx/backend/metal/kernels/quantized.h) differs in two corner cases: its running max starts at 0
// (an all-negative group gets max 0) and it rounds halves away from zero; the CPU kernel and the
// graph fallback in mlx/ops.cpp agree with each other and with this function.
void mlx_quantize_row(const float* w, int64_t n, int bits, int group_size, uint32_t* codes,
                      uint16_t* scales, uint16_t* biases);

// Which bits `lilac quantize` gives a Linear / Embedding whose canonical base name (a tensor name
// without ".weight", e.g. "layers.0.mlp.gate") has in_dim inputs: 0 (left unquantized) when
// in_dim is not a multiple of the group size (mlx-lm's wrapped_predicate), 8 for the router
// "*.mlp.gate" and "*.shared_expert_gate" (Qwen3.5/3.6's quant_predicate), else 4.
int mlx_bits_for(const std::string& canonical_base, int64_t in_dim);

// MLX module path of a canonical base name: "layers.0.mlp.gate" ->
// "language_model.model.layers.0.mlp.gate", "lm_head" -> "language_model.lm_head".
std::string mlx_module_path(const std::string& canonical_base);

}  // namespace lilac
