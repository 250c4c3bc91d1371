// Mixture-of-experts block on the CPU (docs/model.md section 2.4), f32.
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

// One token's expert activations (the twin of cuda::moe_gate_up_gemv): for j < k, with e = idx[j],
// act[j * I + i] = silu(gate_e[i] . x) * (up_e[i] . x), i < I; then the shared expert's at
// act[k * I + i], i < Is. x [H], act [k * I + Is], f32. Reads only the experts' and the shared
// expert's matrices (not the router).
void moe_token_act(const MoeWeights& w, const float* x, const int32_t* idx, int64_t k, float* act,
                   ThreadPool& pool);

// One token's MoE output from those activations (the twin of cuda::moe_down_gemv, which adds it
// into the residual): out[c] = sum_{j<k} wt[j] * (down_{idx[j]}[c] . act_j)
//                              + sigmoid(shared_logit) * (shared_down[c] . act_k), c < H,
// summed in that order (j ascending, shared last). With idx/wt from router_top_k and act from
// moe_token_act this equals moe_forward for one token up to f32 summation order.
void moe_token_down(const MoeWeights& w, const float* act, const int32_t* idx, const float* wt,
                    int64_t k, float shared_logit, float* out, ThreadPool& pool);

// out [T, H] = sum over each token's top-k experts of w_e * down_e(silu(gate_e x) * up_e x)
//            + sigmoid(shared_expert_gate x) * shared_down(silu(shared_gate x) * shared_up x).
// Tokens are grouped by expert so each expert's weights are read once per call. `trace_prefix`
// names the intermediates ("layer3.moe") when trace is set.
// round_act_bf16: round the expert activations silu(gate) * up to bf16 before the down
// projection, as the CUDA kernels store them (CpuBackend::set_bf16_activations).
void moe_forward(const MoeWeights& w, const ModelConfig& cfg, const float* x, int64_t T, float* out,
                 ThreadPool& pool, const TraceFn* trace, const std::string& trace_prefix,
                 bool round_act_bf16 = false);

}  // namespace lilac::cpu
