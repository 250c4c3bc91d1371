#include "cpu/gated_deltanet.h"

#include <algorithm>
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

void gdn_recurrence(const float* q, const float* k, const float* v, const float* g,
                    const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                    float* state, float* out, ThreadPool& pool) {
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

// Chunked form of the delta rule (what the CUDA prefill kernel computes; as HF
// torch_chunk_gated_delta_rule and flash-linear-attention's chunk_gated_delta_rule).
// Per value head, chunk of L tokens r = 0..L-1 with start state S0 [Dk, Dv]:
//   G_r = g_0 + ... + g_r              cumulative log-decay from the chunk start (<= 0)
//   S_r = e^{G_r} S0 + sum_{s<=r} e^{G_r - G_s} k_s u_s^T                     (unrolled recurrence)
//   u_r = beta_r (v_r - (e^{g_r} S_{r-1})^T k_r)
//       = beta_r v_r - beta_r e^{G_r} S0^T k_r - sum_{s<r} beta_r e^{G_r - G_s} (k_r . k_s) u_s
// In matrices (rows = tokens): (I + A) U = diag(beta) V - diag(beta e^G) K S0 with the strictly
// lower A[r][s] = beta_r e^{G_r - G_s} (k_r . k_s), so with the forward substitution
//   W  = (I + A)^{-1} diag(beta e^G) K   [L, Dk]
//   U~ = (I + A)^{-1} diag(beta) V       [L, Dv]      (neither depends on S0)
//   U  = U~ - W S0
//   O  = diag(e^G) Q S0 + P U,  P[r][s] = e^{G_r - G_s} (q_r . k_s) for s <= r, else 0
//   S_L = e^{G_{L-1}} S0 + sum_s e^{G_{L-1} - G_s} k_s u_s^T
// Only differences G_r - G_s with s <= r are exponentiated (<= 0: no overflow). Rows past T in
// the last chunk act as g = 0, beta = 0, k = q = v = 0: they leave the state alone.
void gdn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* state,
                 float* out, ThreadPool& pool, int64_t chunk) {
  const int64_t ratio = Hv / Hk, L = chunk;
  pool.parallel_for(size_t(Hv), [&](size_t h0, size_t h1) {
    const auto n_of = [](int64_t n) { return static_cast<size_t>(n); };
    std::vector<float> G(n_of(L)), bt(n_of(L)), A(n_of(L * L)), P(n_of(L * L));
    std::vector<float> W(n_of(L * Dk)), U(n_of(L * Dv)), Kc(n_of(L * Dk)), Qc(n_of(L * Dk));
    std::vector<float> S1(n_of(Dk * Dv));
    for (size_t hv = h0; hv < h1; ++hv) {
      const int64_t h = int64_t(hv), kh = h / ratio;
      float* S = state + h * Dk * Dv;
      for (int64_t c0 = 0; c0 < T; c0 += L) {
        const int64_t n = std::min(L, T - c0);  // valid rows of this chunk
        // Chunk inputs, zero past T.
        float acc = 0.f;
        for (int64_t r = 0; r < L; ++r) {
          const bool ok = r < n;
          acc += ok ? g[(c0 + r) * Hv + h] : 0.f;
          G[size_t(r)] = acc;
          bt[size_t(r)] = ok ? beta[(c0 + r) * Hv + h] : 0.f;
          for (int64_t i = 0; i < Dk; ++i) {
            Kc[size_t(r * Dk + i)] = ok ? k[((c0 + r) * Hk + kh) * Dk + i] : 0.f;
            Qc[size_t(r * Dk + i)] = ok ? q[((c0 + r) * Hk + kh) * Dk + i] : 0.f;
          }
        }
        auto dotk = [&](const float* x, const float* y) {
          float s = 0.f;
          for (int64_t i = 0; i < Dk; ++i) s += x[i] * y[i];
          return s;
        };
        for (int64_t r = 0; r < L; ++r)
          for (int64_t s = 0; s < L; ++s) {
            const float d = s <= r ? std::exp(G[size_t(r)] - G[size_t(s)]) : 0.f;
            A[size_t(r * L + s)] =
                s < r ? bt[size_t(r)] * d * dotk(&Kc[size_t(r * Dk)], &Kc[size_t(s * Dk)]) : 0.f;
            P[size_t(r * L + s)] =
                s <= r ? d * dotk(&Qc[size_t(r * Dk)], &Kc[size_t(s * Dk)]) : 0.f;
          }
        // Forward substitution: row r of W and U~ from the right-hand sides and earlier rows.
        for (int64_t r = 0; r < L; ++r) {
          const float bg = bt[size_t(r)] * std::exp(G[size_t(r)]);
          for (int64_t i = 0; i < Dk; ++i) W[size_t(r * Dk + i)] = bg * Kc[size_t(r * Dk + i)];
          for (int64_t j = 0; j < Dv; ++j)
            U[size_t(r * Dv + j)] = r < n ? bt[size_t(r)] * v[((c0 + r) * Hv + h) * Dv + j] : 0.f;
          for (int64_t s = 0; s < r; ++s) {
            const float a = A[size_t(r * L + s)];
            for (int64_t i = 0; i < Dk; ++i) W[size_t(r * Dk + i)] -= a * W[size_t(s * Dk + i)];
            for (int64_t j = 0; j < Dv; ++j) U[size_t(r * Dv + j)] -= a * U[size_t(s * Dv + j)];
          }
        }
        // U = U~ - W S0; O = e^G Q S0 + P U; S = e^{G_L} S0 + (k e^{G_L - G})^T U.
        for (int64_t r = 0; r < L; ++r)
          for (int64_t j = 0; j < Dv; ++j) {
            float ws = 0.f;
            for (int64_t i = 0; i < Dk; ++i) ws += W[size_t(r * Dk + i)] * S[i * Dv + j];
            U[size_t(r * Dv + j)] -= ws;
          }
        for (int64_t r = 0; r < n; ++r) {
          const float eg = std::exp(G[size_t(r)]);
          for (int64_t j = 0; j < Dv; ++j) {
            float qs = 0.f, pu = 0.f;
            for (int64_t i = 0; i < Dk; ++i) qs += Qc[size_t(r * Dk + i)] * S[i * Dv + j];
            for (int64_t s = 0; s <= r; ++s) pu += P[size_t(r * L + s)] * U[size_t(s * Dv + j)];
            out[((c0 + r) * Hv + h) * Dv + j] = eg * qs + pu;
          }
        }
        const float gl = G[size_t(L - 1)];
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) {
            float ku = 0.f;
            for (int64_t s = 0; s < L; ++s)
              ku += Kc[size_t(s * Dk + i)] * std::exp(gl - G[size_t(s)]) * U[size_t(s * Dv + j)];
            S1[size_t(i * Dv + j)] = std::exp(gl) * S[i * Dv + j] + ku;
          }
        std::memcpy(S, S1.data(), S1.size() * 4);
      }
    }
  });
}

}  // namespace lilac::cpu
