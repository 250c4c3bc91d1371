#include "model/rope.h"

#include <cmath>

#include "util/half.h"

namespace lilac {

std::vector<float> rope_inv_freq(float theta, int64_t rotary_dim, bool bf16_rounding) {
  std::vector<float> f(size_t(rotary_dim / 2));
  for (int64_t j = 0; j < rotary_dim / 2; ++j) {
    f[size_t(j)] = float(1.0 / std::pow(double(theta), double(2 * j) / double(rotary_dim)));
    if (bf16_rounding) f[size_t(j)] = round_to_bf16(f[size_t(j)]);
  }
  return f;
}

}  // namespace lilac
