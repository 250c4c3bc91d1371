#include "cpu/attention.h"

#include <cmath>

#include "cpu/linear.h"
#include "util/half.h"

namespace lilac::cpu {

void split_query_gate(const float* qg, int64_t T, int64_t heads, int64_t hd, float* q,
                      float* gate) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = qg + (t * heads + h) * 2 * hd;
      for (int64_t d = 0; d < hd; ++d) {
        q[(t * heads + h) * hd + d] = src[d];
        gate[(t * heads + h) * hd + d] = src[hd + d];
      }
    }
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t hd, int64_t rotary_dim, int64_t pos0,
          const float* inv_freq) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      float angle = float(pos0 + t) * inv_freq[j];
      c[size_t(j)] = std::cos(angle);
      s[size_t(j)] = std::sin(angle);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * hd;
      for (int64_t j = 0; j < half; ++j) {
        float a = v[j], b = v[j + half];
        v[j] = a * c[size_t(j)] - b * s[size_t(j)];
        v[j + half] = b * c[size_t(j)] + a * s[size_t(j)];
      }
    }
  }
}

void attention(const float* q, const float* k_cache, const float* v_cache, int64_t pos0, int64_t T,
               int64_t heads, int64_t kv_heads, int64_t hd, float* out, ThreadPool& pool) {
  const int64_t group = heads / kv_heads;
  const float scale = 1.f / std::sqrt(float(hd));
  pool.parallel_for(size_t(T * heads), [&](size_t i0, size_t i1) {
    std::vector<float> scores;
    for (size_t i = i0; i < i1; ++i) {
      int64_t t = int64_t(i) / heads, h = int64_t(i) % heads, kvh = h / group;
      int64_t n_keys = pos0 + t + 1;
      const float* qv = q + (t * heads + h) * hd;
      scores.resize(static_cast<size_t>(n_keys));
      float mx = -INFINITY;
      for (int64_t p = 0; p < n_keys; ++p) {
        scores[size_t(p)] = dot(qv, k_cache + (p * kv_heads + kvh) * hd, hd) * scale;
        mx = std::max(mx, scores[size_t(p)]);
      }
      float sum = 0.f;
      for (auto& sc : scores) sum += (sc = std::exp(sc - mx));
      float* o = out + (t * heads + h) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0.f;
      for (int64_t p = 0; p < n_keys; ++p) {
        float w = scores[size_t(p)] / sum;
        const float* vv = v_cache + (p * kv_heads + kvh) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += w * vv[d];
      }
    }
  });
}

}  // namespace lilac::cpu
