// Mixture-of-experts kernels over 4/8-bit expert weights (tiled layout, q4_layout.h), with the
// contracts of the BF16 ones (moe_decode.h, moe_prefill.h): the same inputs, outputs, routing
// and summation order rules; the weights are QMatrix stacks:
//   gate_up        [E * 2I, H]  per expert I gate rows then I up rows (expert e = rows e*2I ..)
//   down           [E * H, I]
//   shared_gate_up [2 Is, H], shared_down [H, Is]
// Requirements: H, I, Is multiples of 64 (a quantization group), and of 16 rows per expert part
// (2I, H, Is multiples of 16: true when they are multiples of 64). Bits 4 or 8.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_layout.h"

namespace lilac::cuda {

// Decode (one token). act[j * I + i] = bf16(silu(gate_e[i] . x) * (up_e[i] . x)), e = idx[j],
// j < k; act[k * I + i] the shared expert's, i < Is. One launch; the grid depends on k, I, Is.
// Twin: cpu::moe_token_act (dequantised weights), then bf16 rounding.
void q_moe_gate_up_gemv(const QMatrix& gate_up, const QMatrix& shared_gate_up, const int32_t* idx,
                        int k, const bf16* x, int H, int I, int Is, bf16* act, cudaStream_t stream,
                        int B = 1, const int32_t* order = nullptr);

// h[c] += sum_{j<k} w[j] * (down_{idx[j]}[c] . act_j) + sigmoid(*shared_logit) *
// (shared_down[c] . act_k), fixed order (j ascending, shared last). One launch of H / 16 blocks of
// (k + 1) warps. k <= 31. Twin: cpu::moe_token_down.
void q_moe_down_gemv(const QMatrix& down, const QMatrix& shared_down, const int32_t* idx,
                     const float* w, const float* shared_logit, const bf16* act, int k, int H,
                     int I, int Is, float* h, cudaStream_t stream, int B = 1, int logit_stride = 0);
// B > 1: B tokens at once, as moe_gate_up_gemv / moe_down_gemv (moe_decode.h) describe. With
// `order` (moe_sort_pairs of idx [B, k]), q_moe_gate_up_gemv walks the B * k (token, slot) pairs
// in expert order (one grid row): the pairs that share an expert run next to each other and read
// its weights from L2 after the first; the results are those of the unsorted launch. From 32
// tokens the down kernel's grid is token-major (the B tokens of an output tile are neighbours).

// The token tile of a block of the 4-bit wgmma expert kernels (below):
//  * fixed128: 128 token rows, wgmma n 128 (the kernel lab's version 2);
//  * adaptive: 128 token rows, the wgmma n the smallest of 32, 64, 128 covering the tile's rows
//    (the default; 1 block per SM);
//  * rows64 / rows32: a routing tile's rows in passes of 64 / 32 (wgmma n 16 up to that), 2 / 3
//    blocks per SM (rows32's gate_up: 2, with deeper stages; q4_moe_prefill_wgmma.cu): for
//    prompts of a few hundred tokens, where an expert sees ~8-30 rows.
// Every form runs the same K-long chain of wgmmas per output; only n and the rows per pass differ.
enum class QMoeWgmmaTile { fixed128, adaptive, rows64, rows32 };

// Prefill, grouped by expert through moe_route's tables (moe_prefill.h). The weights are
// dequantised to bf16 (w = RNE_bf16(s q + b), dequantize_row_bf16) and multiplied on tensor
// cores with f32 accumulation. act [T*k, I] bf16, sorted rows. 4-bit weights on a compute
// capability 9.x GPU take the wgmma kernels, the rest the mma.sync ones (below).
// tile: the wgmma kernels' token tile when they run (QMoeWgmmaTile, above).
void q_moe_grouped_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const MoeRouting& r,
                           bf16* act, cudaStream_t stream,
                           QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive);
// y [T*k, H] f32, sorted rows = act . down_e^T.
void q_moe_grouped_down(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r,
                        float* y, cudaStream_t stream,
                        QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive);
// The mma.sync kernels (q4_moe_prefill.cu: 256 weight rows x one routing tile per block, q_gemm's
// mma.sync engine): the path for 8-bit weights and off Hopper (4-bit too until s7: the kernel
// lab's q_moe_grouped version 1). Same contracts.
void q_moe_grouped_gate_up_mma(const bf16* x, int H, const QMatrix& gate_up, int I,
                               const MoeRouting& r, bf16* act, cudaStream_t stream);
void q_moe_grouped_down_mma(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r,
                            float* y, cudaStream_t stream);
// The wgmma kernels (q4_moe_prefill_wgmma.cu: 128 weight rows x one routing tile per block, the
// main loop of q_gemm_wgmma): 4-bit weights on compute capability 9.x only
// (q_moe_grouped_wgmma_available), 16-byte aligned x / act; the block's token tile as `tile` says.
// With `shared`, the same launches also compute the shared expert over all r.T tokens (its blocks
// after the routed ones, dense tiles of the form's rows): shared->act [T, Is] bf16 =
// silu(x sg^T) * (x su^T) (as q_moe_shared_gate_up_wgmma with the same tile, bit for bit) and
// shared->out [T, H] f32 = shared->act . shared_down^T; gate_up [2 Is, H], down [H, Is] 4-bit,
// Is a multiple of 64 (it may differ from I). Saves the shared expert's two launches of its own.
struct QMoeSharedPart {
  QMatrix gate_up;
  QMatrix down;
  bf16* act = nullptr;
  float* out = nullptr;
};
bool q_moe_grouped_wgmma_available();
void q_moe_grouped_gate_up_wgmma(const bf16* x, int H, const QMatrix& gate_up, int I,
                                 const MoeRouting& r, bf16* act, cudaStream_t stream,
                                 QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive,
                                 const QMoeSharedPart* shared = nullptr);
// down_jobs (rows32 only): column blocks of 128 y columns per block, 1 or 2 (the block's fixed
// part paid once per 2 of them, s30-s31; q4_moe_prefill_jobs.cuh; the same bits); 0: the switch
// LILAC_ROWS32_DOWN_JOBS, else 2 up to 256 tokens and 1 above.

// y_bf16 (s32, CudaOptions::prefill_moe_y_bf16): the routed rows of y are stored as bf16 [T k, H]
// in y's memory (each rounded once, to nearest even), for moe_combine(..., y_bf16 = true): half
// the bytes of the largest write and read of a prompt chunk's MoE; the shared expert's out stays
// f32.
void q_moe_grouped_down_wgmma(const bf16* act, int I, const QMatrix& down, int H,
                              const MoeRouting& r, float* y, cudaStream_t stream,
                              QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive,
                              const QMoeSharedPart* shared = nullptr, int down_jobs = 0,
                              bool y_bf16 = false);
// The shared expert's gate_up (q_moe_shared_gate_up's contract) on the same wgmma kernel over T
// dense rows in tiles of 128 (fixed128 / adaptive: the adaptive kernel), 64 or 32 rows (since s7;
// 4-bit on compute capability 9.x), and on the mma.sync one.
void q_moe_shared_gate_up_wgmma(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                                bf16* act, cudaStream_t stream,
                                QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive);
void q_moe_shared_gate_up_mma(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                              bf16* act, cudaStream_t stream);
// The shared expert's act [T, Is] bf16 (the same kernel over dense rows).
void q_moe_shared_gate_up(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                          bf16* act, cudaStream_t stream,
                          QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive);

// Small M (tokens per expert few: batched decode, short prompts; q4_moe_small.cu). The same
// results as the grouped kernels above plus the shared expert's, in two launches that read every
// touched expert's weights once at DRAM bandwidth, with MMAs per expert growing with its tokens
// (8 per MMA) rather than with a 128-token tile:
//   gate_up: act [T*k, I] bf16 (sorted rows, as q_moe_grouped_gate_up) and shared_act [T, Is]
//            bf16 (as q_moe_shared_gate_up);
//   down:    y [T*k, H] f32 (sorted rows, as q_moe_grouped_down) and shared_out [T, H] f32
//            = shared_act . shared_down^T.
// Numerics of the decode kernels (q_gemv: exact (128 + q) products, f32 scale and offset per
// group), not the prefill kernels' bf16 weights. All four matrices at the same bits (4 or 8).
// Two implementations, the same results bit for bit: `registers` (each warp loads its weights
// into registers; any GPU) and `streamed` (a producer warp per block streams them into shared
// memory with Hopper's bulk copy engine; 4-bit on cc 9.x). `automatic`: streamed for more than
// 64 tokens (prompt chunks, where it is faster) where it runs, else registers; given the pair's
// counters (`chain`, below), chained where the 4-bit register kernels run: down's blocks wait
// through those device counters for gate_up's blocks of their own tile rather than for the whole
// gate_up grid (q4_moe_small.cu, "The chained pair"; s41-s42), the same bits. `chained`: as
// automatic, failing without counters (the backend passes its counters for both; `registers`
// is the unchained A/B arm, LILAC_SMALL_MOE_KERNEL=registers). A chained
// gate_up must be followed by its down on the same routing, counters and stream before the next
// gate_up on those counters.
enum class MoeSmallKernel { automatic, registers, streamed, chained };
// int32 counters of a chained pair (`chain`): zeroed once by the owner; every pair leaves them at
// zero. One set per stream that launches pairs (the backend's Workspace).
constexpr int kMoeSmallChainCounts = 2 * 4096;
// Whether every counter in `chain` is back at zero (no pair is in flight): for tests.
bool q_moe_small_chain_idle(const int32_t* chain);
bool q_moe_small_supported(const QMatrix& gate_up, const QMatrix& down,
                           const QMatrix& shared_gate_up, const QMatrix& shared_down);
// Whether `streamed` runs for weights of `bits` on this GPU.
bool q_moe_small_streamed_available(int bits);
void q_moe_small_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                         const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                         bf16* shared_act, cudaStream_t stream,
                         MoeSmallKernel kernel = MoeSmallKernel::automatic,
                         int32_t* chain = nullptr);
void q_moe_small_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                      const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                      float* shared_out, cudaStream_t stream,
                      MoeSmallKernel kernel = MoeSmallKernel::automatic, int32_t* chain = nullptr);

}  // namespace lilac::cuda
