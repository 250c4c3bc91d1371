// RMS norms on the CPU (f32).
#pragma once

#include <cstdint>

namespace lilac::cpu {

// y = x * rsqrt(mean(x^2) + eps) * scale, per row of n. For the model's zero-centred norms the
// scale is (1 + w) (see weights.h). x and y may alias.
void rms_norm(const float* x, const float* scale, int64_t n, float eps, float* y);

// Gated output norm of Gated DeltaNet: y = scale * (x * rsqrt(mean(x^2) + eps)) * silu(z).
void gated_rms_norm(const float* x, const float* z, const float* scale, int64_t n, float eps,
                    float* y);

// l2norm(x) = x * rsqrt(sum(x^2) + eps), then times `mul`.
void l2_norm(float* x, int64_t n, float eps, float mul);

inline float silu(float x) {
  return x / (1.f + __builtin_expf(-x));
}
inline float sigmoid(float x) {
  return 1.f / (1.f + __builtin_expf(-x));
}
inline float softplus(float x) {
  return x > 20.f ? x : __builtin_log1pf(__builtin_expf(x));
}

}  // namespace lilac::cpu
