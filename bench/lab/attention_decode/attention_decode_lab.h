// attention_decode in the kernel lab (README.md here): the arguments every version takes, and the
// versions kept in this directory (the production version is src/cuda's attention_decode_qkv).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"

namespace lilac::lab {

// One decode token of one gated attention layer, from its f32 qkv projection row to the gated
// attention output (the contract of src/cuda/attention.h's attention_decode_qkv): the new key and
// value are stored at cache row *d_pos, the query attends over rows [0, *d_pos].
struct AttentionDecodeArgs {
  const float* qkv;      // [heads*2*hd + 2*kv_heads*hd]
  const int32_t* d_pos;  // the token's position (device memory)
  const float *q_norm, *k_norm, *inv_freq;
  int heads, kv_heads, hd, rotary_dim;
  float eps;
  cuda::bf16 *k_cache, *v_cache;  // [kv_heads, max_ctx, hd]
  int max_ctx;
  float* partial;        // attention_decode_workspace_floats(heads, kv_heads, hd, max_ctx)
  cuda::bf16 *q, *gate;  // version 1's scratch: [heads*hd] each
  cuda::bf16* out;       // [heads*hd]
};

// Version 1: qk_norm_rope_store, then the split kernel and the combine kernel (v1_split.cu).
void attention_decode_v1_split(const AttentionDecodeArgs& a, cudaStream_t stream);

}  // namespace lilac::lab
