// Gated DeltaNet on the CPU: the ops of docs/model.md section 2.2, f32.
#pragma once

#include <cstdint>

#include "util/thread_pool.h"

namespace lilac::cpu {

// Causal depthwise conv over time, then SiLU, on qkv [T, C]:
//   out[t, c] = silu(sum_{j<K} taps[c, j] * x[t - (K-1) + j, c])
// where rows before t = 0 come from conv_state [K-1, C] (oldest first). conv_state is then
// replaced by the last K-1 input rows (pre-conv), ready for the next call.
void causal_conv_silu(const float* qkv, int64_t T, int64_t C, int64_t K, const float* taps,
                      float* conv_state, float* out);

// Per token and value head: beta = sigmoid(b), g = neg_exp_A * softplus(a + dt_bias) (<= 0).
void gdn_gates(const float* a, const float* b, int64_t T, int64_t Hv, const float* neg_exp_A,
               const float* dt_bias, float* g, float* beta);

// The delta-rule recurrence, token by token, per value head v (key head v / (Hv / Hk)):
//   S = S * exp(g_t);  u = v_t - S^T k_t;  S = S + k_t (beta_t u)^T;  o_t = S^T q_t
// q, k [T, Hk, Dk] already l2-normalised (q also scaled by Dk^-0.5); v [T, Hv, Dv];
// g, beta [T, Hv]; state [Hv, Dk, Dv] updated in place; out [T, Hv, Dv]. Threaded over heads.
void gdn_recurrence(const float* q, const float* k, const float* v, const float* g,
                    const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                    float* state, float* out, ThreadPool& pool);

// The same function as gdn_recurrence computed chunk by chunk (the algorithm of the CUDA prefill
// kernel, src/cuda/gated_deltanet_prefill.cu; the maths is written out in gated_deltanet.cpp).
// Tokens are taken in chunks of `chunk`; within a chunk everything is matrix products and one
// triangular solve, the state is carried from chunk to chunk. Equal to gdn_recurrence up to f32
// rounding for any T >= 1 and any initial state.
void gdn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* state,
                 float* out, ThreadPool& pool, int64_t chunk = 64);

}  // namespace lilac::cpu
