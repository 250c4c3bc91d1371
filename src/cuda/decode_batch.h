// One sequence of a batched decode step (CudaBackend::step_batch), as the batched kernels read it
// from device memory: where the sequence's per-layer state lives, the position of this step's
// token and the token itself. The host fills an array of B rows and uploads it in one copy before
// the step's graph replay, so the graph (captured once per batch size) does not depend on which
// sequences are in the batch. Layouts as CudaSequenceState (docs/cuda-design.md):
//   kv   [n_attn][2][kv_heads][max_ctx][hd] bf16 (K then V per attention layer slot)
//   conv [n_gdn][K-1][C] f32, rec [n_gdn][Hv][Dk][Dv] f32 (or rec_bf16, the same shape in bf16,
//   where the backend keeps the state in bf16: model/state_format.h; the other pointer is null)
#pragma once

#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

struct DecodeBatchRow {
  bf16* kv = nullptr;
  float* conv = nullptr;
  float* rec = nullptr;
  bf16* rec_bf16 = nullptr;
  int32_t* d_pos = nullptr;  // the sequence's position counter (set to pos + 1 by the step)
  int32_t max_ctx = 0;       // the KV cache's rows per kv head (its stride)
  int32_t pos = 0;           // position of this step's token
};

// After a batched step: *rows[b].d_pos = rows[b].pos + 1 for b < B (one launch).
void finish_decode_batch(const DecodeBatchRow* rows, int B, cudaStream_t stream);

}  // namespace lilac::cuda
