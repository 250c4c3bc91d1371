// Gated DeltaNet on the GPU (docs/model.md section 2.2; twin: cpu/gated_deltanet.cpp).
// Input: the fused in_proj output, f32 per token [C + Hv*Dv + 2*Hv] = qkv (C = 2*Hk*Dk + Hv*Dv:
// q [Hk, Dk], k [Hk, Dk], v [Hv, Dv]), z [Hv, Dv], b [Hv], a [Hv]. conv_taps [C, K] f32; conv_state
// [K-1, C] f32 (oldest row first); recurrent state [Hv, Dk, Dv] f32; norm_scale [Dv] (plain w);
// output bf16 [T, Hv*Dv] = w * rmsnorm(o) * silu(z) per value head. Value head v reads key head
// v / (Hv / Hk). Supported: Dk in {32, 64, 128}, Dv a multiple of 32, Hv a multiple of Hk; conv
// kernel K in 2..4 (decode) / 1..8 (prefill). Both launchers throw lilac::Error on other shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// Which gdn_decode kernel runs: Auto picks the cluster kernel (version 2: thread-block clusters and
// distributed shared memory, sm_90) where the device is compute capability 9.0 and the shape allows
// it (Hv/Hk * Dv/32 <= 8 blocks per key head, 2 Dk / that a multiple of 32: the real model,
// tiny-a), otherwise the counter kernel (version 1: cross-block steps through counters in the
// workspace). Tests force each path.
enum class GdnDecodePath { Auto, Cluster, Counter };
bool gdn_decode_uses_cluster(int Hk, int Hv, int Dk, int Dv);

// Decode workspace: per-layer-independent scratch (reusable by every layer, one launch at a time
// on a stream). It holds counters that must be ZERO before the first launch: allocate it once,
// call gdn_decode_workspace_init once, and the kernels leave the counters at zero again.
size_t gdn_decode_workspace_floats(int Hk, int Hv, int Dv);
void gdn_decode_workspace_init(float* workspace, int Hk, int Hv, int Dv, cudaStream_t stream);

// One token, fused: conv update + SiLU, l2norm of q (x Dk^-0.5) and k (eps 1e-6), beta =
// sigmoid(b), g = neg_exp_A * softplus(a + dt_bias), the delta-rule update of `state` and its
// output, and the gated RMS norm (eps) into out [Hv*Dv] bf16. conv_state and state are updated in
// place. The workspace is used by the counter kernel only (pass it always).
void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, float* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace, bf16* out,
                cudaStream_t stream, GdnDecodePath path = GdnDecodePath::Auto);

// B sequences at once (a batched decode step; the cluster kernel only: gdn_decode_uses_cluster
// must hold): row b reads proj[b] (rows of C + Hv*Dv + 2*Hv), updates the conv and recurrent state
// of layer slot `slot` of its own sequence (rows[b].conv / .rec, device memory) and writes out[b]
// [Hv*Dv]. Each row computes exactly what gdn_decode computes for it (the same kernel, grid z =
// the row). One launch.
struct DecodeBatchRow;
void gdn_decode_batch(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                      const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                      const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K, float eps,
                      bf16* out, cudaStream_t stream);

// Prefill workspace for T tokens (no initialisation needed).
size_t gdn_prefill_workspace_floats(int T, int Hk, int Hv, int Dk, int Dv);

// T >= 1 tokens, proj [T, C + Hv*Dv + 2*Hv]: causal conv over T continuing conv_state (updated to
// the last K-1 pre-conv rows), the chunked delta rule (chunks of 64) continuing `state` (updated to
// the state after token T-1), the gated norm; out [T, Hv*Dv] bf16. Four launches. With
// stage_events (5 events; benchmarks), events 0..4 are recorded before the first launch and after
// each of the four (prep, chunk, state, out).
void gdn_prefill(const float* proj, int T, const float* conv_taps, float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, const float* norm_scale,
                 float* state, int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace,
                 bf16* out, cudaStream_t stream, const cudaEvent_t* stage_events = nullptr);

}  // namespace lilac::cuda
