#include "model/mlx_affine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "model/weight_table.h"
#include "util/half.h"

namespace lilac {

static_assert(std::endian::native == std::endian::little,
              "codes are written as little-endian words");

void mlx_quantize_row(const float* w, int64_t n, int bits, int group_size, uint32_t* codes,
                      uint16_t* scales, uint16_t* biases) {
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / bits;
  for (int64_t g = 0; g < n / group_size; ++g) {
    const float* x = w + g * group_size;
    float w_min = std::numeric_limits<float>::infinity(), w_max = -w_min;
    for (int j = 0; j < group_size; ++j) {
      w_max = std::max(w_max, x[j]);
      w_min = std::min(w_min, x[j]);
    }
    const bool mask = std::abs(w_min) > std::abs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0;
    if (q0 != 0) {
      scale = edge / q0;
      bias = edge;
    }
    uint32_t* out = codes + g * group_size / per_word;
    for (int j = 0; j < group_size / per_word; ++j) {
      uint32_t word = 0;
      for (int k = 0; k < per_word; ++k) {
        float q = std::rint((x[j * per_word + k] - bias) / scale);
        q = q > 0.0f ? std::min(q, n_bins) : 0.0f;  // MLX's clamp to [0, n_bins]; NaN -> 0
        word |= uint32_t(q) << (k * bits);
      }
      out[j] = word;
    }
    scales[g] = f32_to_bf16(scale);
    biases[g] = f32_to_bf16(bias);
  }
}

int mlx_bits_for(const std::string& base, int64_t in_dim) {
  if (in_dim % kMlxGroupSize != 0) return 0;
  // The weight table's rule for the module; a name it does not know gets the default.
  const auto m = match_weight(base + ".weight", NameLayout::Mlx);
  return m && m->entry->kind == WeightKind::Matrix ? m->entry->q4_bits : kMlxDefaultBits;
}

std::string mlx_module_path(const std::string& base) {
  if (base == "lm_head" || base.starts_with("lm_head.")) return "language_model." + base;
  return "language_model.model." + base;
}

}  // namespace lilac
