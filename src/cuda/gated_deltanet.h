// Gated DeltaNet on the GPU (docs/model.md section 2.2; twin: cpu/gated_deltanet.cpp).
// Input: the fused in_proj output, f32 per token [C + Hv*Dv + 2*Hv] = qkv (C = 2*Hk*Dk + Hv*Dv:
// q [Hk, Dk], k [Hk, Dk], v [Hv, Dv]), z [Hv, Dv], b [Hv], a [Hv]. conv_taps [C, K] f32; conv_state
// [K-1, C] f32 (oldest row first); recurrent state [Hv, Dk, Dv] f32, or bf16 (model/
// state_format.h: the launchers taking a bf16* state compute in f32 and round the state when they
// store it, once per call); norm_scale [Dv] (plain w);
// output bf16 [T, Hv*Dv] = w * rmsnorm(o) * silu(z) per value head. Value head v reads key head
// v / (Hv / Hk). Supported: Dk in {32, 64, 128}, Dv a multiple of 32, Hv a multiple of Hk; conv
// kernel K in 2..4 (decode) / 1..8 (prefill). Both launchers throw lilac::Error on other shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common.h"
#include "model/state_format.h"

namespace lilac::cuda {

// gdn_decode runs the cluster kernel (version 2: thread-block clusters and distributed shared
// memory, sm_90): it needs a compute capability 9.0 device and a shape where the Hv/Hk x Dv/32
// blocks of a key head form one cluster of at most 8 and split its 2 Dk q/k channels into whole
// warps (the real model, tiny-a). gdn_decode_uses_cluster says whether both hold here; the
// launchers throw lilac::Error where they do not. Version 1 (cross-block counters, any device) lost
// and lives in the kernel lab: bench/lab/gdn_decode.
bool gdn_decode_uses_cluster(int Hk, int Hv, int Dk, int Dv);

// One token, fused: conv update + SiLU, l2norm of q (x Dk^-0.5) and k (eps 1e-6), beta =
// sigmoid(b), g = neg_exp_A * softplus(a + dt_bias), the delta-rule update of `state` and its
// output, and the gated RMS norm (eps) into out [Hv*Dv] bf16. conv_state and state are updated in
// place. One launch, no workspace.
void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, float* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, bf16* out, cudaStream_t stream);
void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, bf16* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, bf16* out, cudaStream_t stream);

// B sequences at once (a batched decode step; gdn_decode_uses_cluster must hold): row b reads
// proj[b] (rows of C + Hv*Dv + 2*Hv), updates the conv and recurrent state of layer slot `slot` of
// its own sequence (rows[b].conv / .rec, device memory) and writes out[b] [Hv*Dv]. Each row
// computes exactly what gdn_decode computes for it, bit for bit (state_format: which of
// rows[b].rec (f32) and rows[b].rec_bf16 holds the states). Two launches
// (gated_deltanet_decode_batch.cu: a prep kernel into `workspace`, then the state pass); workspace:
// gdn_decode_batch_workspace_floats(B, ...) floats, no initialisation.
// kernel: the state pass's implementation. split = version 3 (a head's Dv/32 column blocks in a
// cluster, each thread's 4 x 4 state slice in registers); head = version 6 (persistent blocks over
// whole (row, head) items, the next items' states copied into shared memory by the bulk copy
// engine); automatic = head, but split for an f32 state at 16 rows or fewer (measured no better
// there). Both give the same bits (docs/kernels.md, "Sixteenth session").
enum class GdnBatchKernel { automatic, split, head };
struct DecodeBatchRow;
size_t gdn_decode_batch_workspace_floats(int B, int Hk, int Hv, int Dk, int Dv);
void gdn_decode_batch(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                      const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                      const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K, float eps,
                      float* workspace, bf16* out, cudaStream_t stream,
                      GdnStateFormat state_format = GdnStateFormat::f32,
                      GdnBatchKernel kernel = GdnBatchKernel::automatic);

// gdn_decode_batch's first launch alone (the prep kernel: conv, l2norm, gates into `workspace`,
// conv states updated), for the kernel lab's state-pass versions (bench/lab/gdn_decode).
void gdn_decode_batch_prep(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                           const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                           int Hk, int Hv, int Dk, int Dv, int K, float* workspace,
                           cudaStream_t stream);

// gdn_decode's cluster kernel over B rows (grid z = the row), one launch, the same contract and
// results as gdn_decode_batch: the batched path until s6, kept for the kernel lab (bench/lab/
// gdn_decode, v2 batched), which times it beside gdn_decode_batch.
void gdn_decode_batch_cluster(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                              const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                              const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K,
                              float eps, bf16* out, cudaStream_t stream);

// Prefill workspace for T tokens (no initialisation needed).
size_t gdn_prefill_workspace_floats(int T, int Hk, int Hv, int Dk, int Dv);

// T >= 1 tokens, proj [T, C + Hv*Dv + 2*Hv]: causal conv over T continuing conv_state (updated to
// the last K-1 pre-conv rows), the chunked delta rule (chunks of 64) continuing `state` (updated to
// the state after token T-1), the gated norm; out [T, Hv*Dv] bf16. Four launches. With
// stage_events (5 events; benchmarks), events 0..4 are recorded before the first launch and after
// each of the four (prep, chunk, state, out). chunk_blocks: blocks per SM of the chunk kernel (1
// or 2: the same bits; 0: LILAC_GDN_CHUNK_BLOCKS, else 2). tf32_split: the state pass's 3xTF32
// split, 1 rounded hi, 2 truncated hi (fewer instructions, other bits; 0: LILAC_GDN_TF32_SPLIT =
// round | trunc, else truncated: the default since s34).
void gdn_prefill(const float* proj, int T, const float* conv_taps, float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, const float* norm_scale,
                 float* state, int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace,
                 bf16* out, cudaStream_t stream, const cudaEvent_t* stage_events = nullptr,
                 int chunk_blocks = 0, int tf32_split = 0);
void gdn_prefill(const float* proj, int T, const float* conv_taps, float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, const float* norm_scale, bf16* state,
                 int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace, bf16* out,
                 cudaStream_t stream, const cudaEvent_t* stage_events = nullptr,
                 int chunk_blocks = 0, int tf32_split = 0);

}  // namespace lilac::cuda
