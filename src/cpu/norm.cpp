#include "cpu/norm.h"

#include <cmath>

namespace lilac::cpu {

static float mean_square(const float* x, int64_t n) {
  double s = 0;  // double: the reference's f32 reduction order is unknown; be at least as exact
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return float(s / double(n));
}

void rms_norm(const float* x, const float* scale, int64_t n, float eps, float* y) {
  float r = 1.f / std::sqrt(mean_square(x, n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * scale[i];
}

void gated_rms_norm(const float* x, const float* z, const float* scale, int64_t n, float eps,
                    float* y) {
  float r = 1.f / std::sqrt(mean_square(x, n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = scale[i] * (x[i] * r) * silu(z[i]);
}

void l2_norm(float* x, int64_t n, float eps, float mul) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  float r = mul / std::sqrt(float(s) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace lilac::cpu
