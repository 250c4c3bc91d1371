// gdn_decode in the kernel lab (README.md here): the arguments every version takes, and the
// versions kept in this directory (the production version is src/cuda's gdn_decode).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common.h"
#include "cuda/decode_batch.h"

namespace lilac::lab {

// One token of one Gated DeltaNet layer (the contract of src/cuda/gated_deltanet.h's gdn_decode).
struct GdnDecodeArgs {
  const float* proj;  // [C + Hv*Dv + 2*Hv]: qkv (C = 2 Hk Dk + Hv Dv), z, b, a
  const float* taps;  // [C, K]
  float* conv_state;  // [K-1, C], updated
  const float *neg_exp_A, *dt_bias, *norm_w;
  float* state;  // [Hv, Dk, Dv], updated
  int Hk, Hv, Dk, Dv, K;
  float eps;
  cuda::bf16* out;   // [Hv*Dv]
  float* workspace;  // version 1: gdn_decode_v1_workspace_floats, zeroed once (kept at zero)
};

// B rows at once (the contract of src/cuda/gated_deltanet.h's gdn_decode_batch): row b reads
// proj[b] (rows of C + Hv*Dv + 2*Hv), updates the conv state rows[b].conv + slot (K-1) C and the
// recurrent state rows[b].rec + slot Hv Dk Dv, writes out[b] [Hv*Dv].
struct GdnDecodeBatchArgs {
  const float* proj;  // [B, C + Hv*Dv + 2*Hv]
  int B;
  const cuda::DecodeBatchRow* rows;  // [B], device memory
  int slot;
  const float *taps, *neg_exp_A, *dt_bias, *norm_w;
  int Hk, Hv, Dk, Dv, K;
  float eps;
  cuda::bf16* out;   // [B, Hv*Dv]
  float* workspace;  // versions 3, 4, 5: cuda::gdn_decode_batch_workspace_floats(B, ...)
};

// Version 1, the counter kernel (v1_counter.cu).
size_t gdn_decode_v1_workspace_floats(int Hk, int Hv, int Dv);
void gdn_decode_v1_counter(const GdnDecodeArgs& a, cudaStream_t stream);

// Version 4, the pipelined state pass (v4_pipelined.cu): production's prep kernel, then a
// persistent state loop; batched only, workspace as version 3's.
void gdn_decode_v4_pipelined(const GdnDecodeBatchArgs& a, cudaStream_t stream);

// Version 5, the persistent state pass with its next items' states copied into shared memory
// (v5_persistent.cu): production's prep kernel, then the persistent clusters; batched only,
// workspace as version 3's. gdn_decode_v5_clusters: the clusters its grid has (resident at once).
void gdn_decode_v5_persistent(const GdnDecodeBatchArgs& a, cudaStream_t stream);
int gdn_decode_v5_clusters(int Dk, int Dv);

}  // namespace lilac::lab
