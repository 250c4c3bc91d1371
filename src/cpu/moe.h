// Mixture-of-experts block on the CPU (MODEL.md section 2, "MoE"), f32.
#pragma once

#include <cstdint>

#include "model/backend.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/thread_pool.h"

namespace lilac::cpu {

// p = softmax(logits [E]) in f32; the k largest (ties: lower index first) in descending order,
// their weights renormalised to sum to 1.
void router_top_k(const float* logits, int64_t E, int64_t k, int32_t* idx, float* weight);

// out [T, H] = sum over each token's top-k experts of w_e * down_e(silu(gate_e x) * up_e x)
//            + sigmoid(shared_expert_gate x) * shared_down(silu(shared_gate x) * shared_up x).
// Tokens are grouped by expert so each expert's weights are read once per call. `trace_prefix`
// names the intermediates ("layer3.moe") when trace is set.
void moe_forward(const MoeWeights& w, const ModelConfig& cfg, const float* x, int64_t T, float* out,
                 ThreadPool& pool, const TraceFn* trace, const std::string& trace_prefix);

}  // namespace lilac::cpu
