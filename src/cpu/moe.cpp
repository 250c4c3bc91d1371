#include "cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/linear.h"
#include "cpu/norm.h"
#include "util/half.h"

namespace lilac::cpu {

void router_top_k(const float* logits, int64_t E, int64_t k, int32_t* idx, float* weight) {
  float mx = *std::max_element(logits, logits + E);
  std::vector<float> p(static_cast<size_t>(E));
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(logits[e] - mx));
  for (auto& v : p) v /= sum;
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  });
  float top = 0.f;
  for (int64_t i = 0; i < k; ++i) top += p[size_t(order[size_t(i)])];
  for (int64_t i = 0; i < k; ++i) {
    idx[i] = order[size_t(i)];
    weight[i] = p[size_t(order[size_t(i)])] / top;
  }
}

namespace {
// silu(g) * u over a [n, I] pair, written into g.
void swiglu(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
}
}  // namespace

void moe_token_act(const MoeWeights& w, const float* x, const int32_t* idx, int64_t k, float* act,
                   ThreadPool& pool) {
  const int64_t H = w.shared_gate.cols, I = w.experts.at(0).gate.rows, Is = w.shared_gate.rows;
  std::vector<float> u(size_t(std::max(I, Is)));
  for (int64_t j = 0; j <= k; ++j) {
    const bool shared = j == k;
    const Matrix& gate = shared ? w.shared_gate : w.experts.at(size_t(idx[j])).gate;
    const Matrix& up = shared ? w.shared_up : w.experts.at(size_t(idx[j])).up;
    float* g = act + j * I;
    matmul(gate, x, 1, H, g, gate.rows, pool);
    matmul(up, x, 1, H, u.data(), up.rows, pool);
    swiglu(g, u.data(), gate.rows);
  }
}

void moe_token_down(const MoeWeights& w, const float* act, const int32_t* idx, const float* wt,
                    int64_t k, float shared_logit, float* out, ThreadPool& pool) {
  const int64_t H = w.shared_down.rows, I = w.experts.at(0).gate.rows, Is = w.shared_gate.rows;
  std::vector<float> d(static_cast<size_t>(H));
  std::fill(out, out + H, 0.f);
  for (int64_t j = 0; j <= k; ++j) {
    const bool shared = j == k;
    const Matrix& down = shared ? w.shared_down : w.experts.at(size_t(idx[j])).down;
    matmul(down, act + j * I, 1, shared ? Is : I, d.data(), H, pool);
    const float s = shared ? sigmoid(shared_logit) : wt[j];
    for (int64_t c = 0; c < H; ++c) out[c] += s * d[size_t(c)];
  }
}

void moe_forward(const MoeWeights& w, const ModelConfig& cfg, const float* x, int64_t T, float* out,
                 ThreadPool& pool, const TraceFn* trace, const std::string& trace_prefix,
                 bool round_act_bf16) {
  auto round_act = [&](std::vector<float>& v, int64_t n) {
    if (round_act_bf16)
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = round_to_bf16(v[size_t(i)]);
  };
  const int64_t H = cfg.hidden, E = cfg.experts, K = cfg.experts_per_token;
  const int64_t I = cfg.expert_intermediate, Is = cfg.shared_intermediate;

  std::vector<float> logits(size_t(T * E));
  matmul(w.router, x, T, H, logits.data(), E, pool);
  std::vector<int32_t> idx(size_t(T * K));
  std::vector<float> wt(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    router_top_k(&logits[size_t(t * E)], E, K, &idx[size_t(t * K)], &wt[size_t(t * K)]);
  if (trace && *trace) {
    (*trace)(trace_prefix + ".router_logits", logits.data(), {T, E});
    std::vector<float> fidx(idx.begin(), idx.end());
    (*trace)(trace_prefix + ".topk_ids", fidx.data(), {T, K});
    (*trace)(trace_prefix + ".topk_weights", wt.data(), {T, K});
  }

  // Group (token, weight) by expert, experts in index order (the reference's summation order).
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      routed[size_t(idx[size_t(t * K + j)])].push_back({t, wt[size_t(t * K + j)]});

  std::fill(out, out + T * H, 0.f);
  std::vector<float> xe, g, u, d;
  for (int64_t e = 0; e < E; ++e) {
    const auto& list = routed[size_t(e)];
    if (list.empty()) continue;
    const int64_t n = int64_t(list.size());
    xe.resize(size_t(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x + list[size_t(i)].first * H, H, &xe[size_t(i * H)]);
    g.resize(size_t(n * I));
    u.resize(size_t(n * I));
    d.resize(size_t(n * H));
    const ExpertWeights& ex = w.experts[size_t(e)];
    matmul(ex.gate, xe.data(), n, H, g.data(), I, pool);
    matmul(ex.up, xe.data(), n, H, u.data(), I, pool);
    swiglu(g.data(), u.data(), n * I);
    round_act(g, n * I);
    matmul(ex.down, g.data(), n, I, d.data(), H, pool);
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + list[size_t(i)].first * H;
      const float s = list[size_t(i)].second;
      for (int64_t c = 0; c < H; ++c) o[c] += s * d[size_t(i * H + c)];
    }
  }
  if (trace && *trace) (*trace)(trace_prefix + ".routed", out, {T, H});

  // Shared expert, gated per token.
  g.resize(size_t(T * Is));
  u.resize(size_t(T * Is));
  d.resize(size_t(T * H));
  std::vector<float> sg(static_cast<size_t>(T));
  matmul(w.shared_gate, x, T, H, g.data(), Is, pool);
  matmul(w.shared_up, x, T, H, u.data(), Is, pool);
  swiglu(g.data(), u.data(), T * Is);
  round_act(g, T * Is);
  matmul(w.shared_down, g.data(), T, Is, d.data(), H, pool);
  matmul(w.shared_expert_gate, x, T, H, sg.data(), 1, pool);
  for (int64_t t = 0; t < T; ++t) {
    const float s = sigmoid(sg[size_t(t)]);
    for (int64_t c = 0; c < H; ++c) out[t * H + c] += s * d[size_t(t * H + c)];
  }
}

}  // namespace lilac::cpu
