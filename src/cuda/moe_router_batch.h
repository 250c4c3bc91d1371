// The batched decode step's router in one launch (moe_router_batch.cu): the post-attention norm,
// the 4/8-bit router GEMV (E expert rows and the shared expert's gate row), the top-k and the
// routing tables of the grouped expert kernels, for B <= 32 rows.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_layout.h"

namespace lilac::cuda {

// Rows the fused router takes at most (the batched step's 8-token chunks, four of them).
constexpr int kMoeRouterRouteMaxRows = 32;

// Whether moe_router_route takes this router at B rows: a 4/8-bit matrix of E + 1 rows (the
// experts', then the shared expert's gate) and H <= 2,048 columns (a multiple of 64), E <= 256,
// 1 <= k <= min(E, 32), 1 <= B <= 32, q_gemv_rows splitting it into ranks of one register set
// with its group sums from MMAs (q_gemv_rows_ranks), and a device with thread-block clusters.
bool moe_router_route_supported(const QMatrix& router, int B, int E, int k);

// x [B, H] bf16 = rms_norm(h [B, H] f32, norm_scale [H], eps); logits [B, E + 1] f32 = x .
// router^T; the top-k of each row's first E logits and their counting sort into r (laid out for
// B rows, E, k). All of it bit for bit what rms_norm, q_gemv_rows and moe_route give, in one
// thread-block cluster launch (PDL: the weights are requested before it waits for h). h, norm_scale
// and x 16-byte aligned. Throws unless moe_router_route_supported.
void moe_router_route(const QMatrix& router, const float* h, const float* norm_scale, float eps,
                      int B, int E, int k, float* logits, bf16* x, const MoeRouting& r,
                      cudaStream_t stream);

}  // namespace lilac::cuda
