#include "cpu/gated_deltanet.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/norm.h"

namespace lilac::cpu {

void causal_conv_silu(const float* qkv, int64_t T, int64_t C, int64_t K, const float* taps,
                      float* conv_state, float* out) {
  // Row r of the virtual sequence [state (K-1 rows); qkv (T rows)].
  auto row = [&](int64_t r) { return r < K - 1 ? conv_state + r * C : qkv + (r - (K - 1)) * C; };
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = 0.f;
    for (int64_t j = 0; j < K; ++j) {
      const float* x = row(t + j);
      for (int64_t c = 0; c < C; ++c) o[c] += taps[c * K + j] * x[c];
    }
    for (int64_t c = 0; c < C; ++c) o[c] = silu(o[c]);
  }
  // New state: the last K-1 rows of [state; qkv].
  std::vector<float> tail(size_t((K - 1) * C));
  for (int64_t r = 0; r < K - 1; ++r) std::memcpy(&tail[size_t(r * C)], row(T + r), size_t(C) * 4);
  std::memcpy(conv_state, tail.data(), tail.size() * 4);
}

void gdn_gates(const float* a, const float* b, int64_t T, int64_t Hv, const float* neg_exp_A,
               const float* dt_bias, float* g, float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      beta[t * Hv + h] = sigmoid(b[t * Hv + h]);
      g[t * Hv + h] = neg_exp_A[h] * softplus(a[t * Hv + h] + dt_bias[h]);
    }
}

void gdn_recurrence(const float* q, const float* k, const float* v, const float* g, const float* beta,
                    int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* state, float* out,
                    ThreadPool& pool) {
  const int64_t ratio = Hv / Hk;
  pool.parallel_for(size_t(Hv), [&](size_t h0, size_t h1) {
    std::vector<float> u(static_cast<size_t>(Dv));
    for (size_t hv = h0; hv < h1; ++hv) {
      const int64_t h = int64_t(hv), kh = h / ratio;
      float* S = state + h * Dk * Dv;  // S[i, j], i over Dk, j over Dv
      for (int64_t t = 0; t < T; ++t) {
        const float* kt = k + (t * Hk + kh) * Dk;
        const float* qt = q + (t * Hk + kh) * Dk;
        const float* vt = v + (t * Hv + h) * Dv;
        const float decay = std::exp(g[t * Hv + h]);
        const float bt = beta[t * Hv + h];
        // u = v - (decay * S)^T k, computed with the decay applied to S as it is scaled.
        for (int64_t j = 0; j < Dv; ++j) u[size_t(j)] = 0.f;
        for (int64_t i = 0; i < Dk; ++i) {
          float* Si = S + i * Dv;
          const float ki = kt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            Si[j] *= decay;
            u[size_t(j)] += Si[j] * ki;
          }
        }
        for (int64_t j = 0; j < Dv; ++j) u[size_t(j)] = bt * (vt[j] - u[size_t(j)]);
        float* o = out + (t * Hv + h) * Dv;
        for (int64_t j = 0; j < Dv; ++j) o[j] = 0.f;
        for (int64_t i = 0; i < Dk; ++i) {
          float* Si = S + i * Dv;
          const float ki = kt[i], qi = qt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            Si[j] += ki * u[size_t(j)];
            o[j] += Si[j] * qi;
          }
        }
      }
    }
  });
}

}  // namespace lilac::cpu
