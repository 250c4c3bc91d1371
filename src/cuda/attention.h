// Gated full attention on the GPU (docs/model.md section 2.3; twin: cpu/attention.cpp).
// Layouts: qkv projection f32 [T, heads*2*hd + 2*kv_heads*hd] (per head hd query values then hd
// gate values, then k, then v); q bf16 [T, heads, hd]; gate bf16 [T, heads*hd]; KV cache bf16 per
// layer [kv_heads, max_ctx, hd]; attention output bf16 [T, heads*hd] = attn * sigmoid(gate). Query
// head h reads kv head h / (heads / kv_heads). Supported: hd in {64, 128, 256}, heads / kv_heads in
// {1, 2, 4, 8} (decode: <= 8), rotary_dim even and <= hd.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// RMS-norms q and k per head (scale = the (1 + w) arrays, eps), split-half RoPE on dims [0,
// rotary_dim) at position *d_pos0 + t (angle = pos * inv_freq[j] in f32, inv_freq [rotary_dim /
// 2]), writes q and gate, and stores k, v (bf16) at cache rows *d_pos0 + t. The caller keeps
// *d_pos0 + T <= max_ctx.
void qk_norm_rope_store(const float* qkv, int T, const int32_t* d_pos0, const float* q_norm,
                        const float* k_norm, const float* inv_freq, int heads, int kv_heads, int hd,
                        int rotary_dim, float eps, bf16* q, bf16* gate, bf16* k_cache,
                        bf16* v_cache, int max_ctx, cudaStream_t stream);

// Decode splits the context into a fixed number of ranges (fixed per (kv_heads, max_ctx) and
// device: graph-safe); the workspace holds their partial results.
int attention_decode_splits(int kv_heads, int max_ctx);
size_t attention_decode_workspace_floats(int heads, int kv_heads, int hd, int max_ctx);

// One decode step: one query at position *d_pos0 over cache rows [0, *d_pos0], from the f32 qkv
// row [heads*2*hd + 2*kv_heads*hd] of the token; split-K flash decoding, then a combine kernel
// writes out [heads*hd] bf16 (two launches). The split kernel's prologue RMS-norms and rotates the
// queries of its GQA group (as qk_norm_rope_store), the block whose key range holds position
// *d_pos0 also computes that key and value, stores them at cache row *d_pos0 and uses them; the
// combine kernel takes the gate from the row (rounded to bf16). `partial` has
// attention_decode_workspace_floats(...) floats (no initialisation needed). Version 1 of this step
// (qk_norm_rope_store, then a split kernel over q and gate) is in the kernel lab (bench/lab).
void attention_decode_qkv(const float* qkv, const int32_t* d_pos0, const float* q_norm,
                          const float* k_norm, const float* inv_freq, int heads, int kv_heads,
                          int hd, int rotary_dim, float eps, bf16* k_cache, bf16* v_cache,
                          int max_ctx, float* partial, bf16* out, cudaStream_t stream);

// B sequences at once (a batched decode step): row b takes the f32 qkv row qkv[b] of its token
// at position rows[b].pos, stores its key and value in layer slot `slot` of its own KV cache
// (rows[b].kv, rows[b].max_ctx) and attends over its own rows [0, pos]; out[b] [heads*hd]. Each
// row computes what attention_decode_qkv computes for it, except that every row uses the split
// count attention_decode_batch_splits(B, kv_heads): about one wave of blocks over the batch (so
// its f32 combine may sum in another order). Two launches (grid z = the row). `partial` holds
// attention_decode_batch_workspace_floats(B, ...) floats (sized for the largest count).
struct DecodeBatchRow;
int attention_decode_batch_splits(int kv_heads);  // the largest: the single-sequence maximum
int attention_decode_batch_splits(int B, int kv_heads);
size_t attention_decode_batch_workspace_floats(int B, int heads, int kv_heads, int hd);
void attention_decode_qkv_batch(const float* qkv, int B, const DecodeBatchRow* rows, int slot,
                                const float* q_norm, const float* k_norm, const float* inv_freq,
                                int heads, int kv_heads, int hd, int rotary_dim, float eps,
                                float* partial, bf16* out, cudaStream_t stream);

// Causal flash attention for T queries (q, gate [T, heads*hd]) at positions pos0..pos0+T-1 over
// cache rows [0, pos0 + T) (this chunk's keys already stored), GQA, softmax scale hd^-0.5; out [T,
// heads*hd]. version: 1 = FlashAttention-2 on mma.sync (attention_prefill.cu, any supported
// shape and GPU), 2 = on wgmma, 3 = on wgmma with each tile's softmax overlapped with the previous
// tile's P V, 4 = version 3 warp-specialised (a TMA producer warp), 5 = version 4 with the two
// warpgroups' MMAs taking turns (attention_prefill_wgmma.cu: 2-5 need hd 256 on a compute
// capability 9.x GPU, else they fail naming why); 0 = LILAC_ATTN_PREFILL (mma | wgmma |
// wgmma-overlap | wgmma-ws | wgmma-pingpong; unset: wgmma-pingpong, the fastest measured:
// docs/kernels.md s34), where the wgmma forms fall back to version 1 for shapes or GPUs they do not
// support.
void attention_prefill(const bf16* q, const bf16* gate, const bf16* k_cache, const bf16* v_cache,
                       int pos0, int T, int heads, int kv_heads, int hd, int max_ctx, bf16* out,
                       cudaStream_t stream, int version = 0);

// Versions 2-5's own entry points (attention_prefill checks shapes and positions first; version:
// 2 .. 5).
bool attention_prefill_wgmma_supported(int hd);
void attention_prefill_wgmma(const bf16* q, const bf16* gate, const bf16* k_cache,
                             const bf16* v_cache, int pos0, int T, int heads, int kv_heads, int hd,
                             int max_ctx, bf16* out, cudaStream_t stream, int version);

}  // namespace lilac::cuda
