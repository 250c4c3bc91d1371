// Gated full attention on the CPU: the ops of docs/model.md section 2.3, f32.
#pragma once

#include <cstdint>
#include <vector>

#include "model/rope.h"
#include "util/thread_pool.h"

namespace lilac::cpu {

// Splits q_proj's output qg [T, heads, 2*hd] (per head: hd query values, then hd gate values)
// into q [T, heads, hd] and gate [T, heads*hd].
void split_query_gate(const float* qg, int64_t T, int64_t heads, int64_t hd, float* q, float* gate);

// RoPE in place on x [T, n_heads, hd], dims [0, R) only, split-half pairing (j with j + R/2),
// token t at position pos0 + t: x' = x cos + rotate_half(x) sin.
void rope(float* x, int64_t T, int64_t n_heads, int64_t hd, int64_t rotary_dim, int64_t pos0,
          const float* inv_freq);

// Causal GQA softmax attention of T queries at positions pos0..pos0+T-1 over the cache rows
// [0, pos0+T). q [T, heads, hd]; k_cache, v_cache [ctx, kv_heads, hd]; out [T, heads, hd].
// Query head h reads kv head h / (heads / kv_heads). Scale hd^-0.5, softmax in f32.
void attention(const float* q, const float* k_cache, const float* v_cache, int64_t pos0, int64_t T,
               int64_t heads, int64_t kv_heads, int64_t hd, float* out, ThreadPool& pool);

}  // namespace lilac::cpu
