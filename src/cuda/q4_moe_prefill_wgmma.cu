// The grouped 4-bit expert GEMMs of prefill on wgmma (q_moe_grouped_gate_up_wgmma /
// q_moe_grouped_down_wgmma, q4_moe.h; the kernel lab's q_moe_grouped version 3, production since
// s7: 1,089 -> 742 us per layer at 4096 tokens, bench/lab/q_moe_grouped/README.md). The main loop
// is the dense 4-bit wgmma GEMM's (q4_gemm_wgmma.cuh, Cfg128: read q4_gemm_wgmma.cu's file
// comment first); what is new here is the block -> (routing tile, weight rows) map, the gathered
// token rows, the wgmma n chosen per tile, and the two epilogues.
//
// Block: 256 threads = 2 warpgroups, 128 weight rows (8 row tiles of 16: warp w owns tile w) x
// one routing tile of moe_route (kMoeTileRows = 128 sorted rows of one expert e: rows [row0,
// min(row0 + 128, offsets[e + 1]))), 8 stages of 16 KB tokens + 4.5 KB weights = 164 KB + 1 KB of
// shared memory, 1 block per SM. The wgmma is m64nNk16 with N the smallest of 32, 64, 128 that
// covers the tile's rows (the loop instantiated three times, chosen per block: an expert's short
// second tile costs ~0.3 of a full one); the accumulators are the same 64 per thread (d[4 j + q]
// does not depend on N; the ones past N stay 0 and their rows are not stored), and the cp.async
// fills all 128 token rows (zeros past the tile). Grid = max_tiles x column blocks; block b ->
// (tile b / n_cb, column block b % n_cb); blocks past num_tiles (read on the device) exit at once.
//  * gate_up (K = H): column block cb (I / 64 of them) owns act columns [64 cb, 64 cb + 64):
//    warps 0-3 (warpgroup 0) take gate tiles 4 cb + w of expert e (weight row tiles
//    e 2P + 4 cb + w, P = I / 16), warps 4-7 (warpgroup 1) the up tiles e 2P + P + 4 cb + w - 4.
//    Thread tid of warpgroup 1 holds the up value of exactly the (act column, token) whose gate
//    value thread tid - 128 holds (same position in the accumulator layout), so after the main
//    loop warpgroup 1 parks its 64 accumulators in shared memory ([i][tid - 128] f32, 32 KB,
//    conflict-free) and warpgroup 0 writes act = bf16(silu(g) * u) (the mma.sync kernel's
//    expression). Token rows: x[sorted_token[s]] gathered by the cp.async loads.
//  * down (K = I): column block cb (H / 128) owns y columns [128 cb, 128 cb + 128), warp w the
//    weight row tile e TH + 8 cb + w (TH = H / 16); token rows = the tile's act rows
//    (contiguous, stride I); y f32 in sorted order.
// Work per block and k-tile at N = 128: 128 x 128 x 64 MACs = 512 tensor clocks. Lab (s6 run 6,
// H200, T = 4096 uniform): gate_up 486 us + down 255 us per layer (278 TFLOP/s on the real MACs;
// the mma.sync kernels: 690 + 399); T = 512: 386 us (446); skewed T = 1000: 413 us (525).
// Resources (sm_90a): gate_up 150 registers, down 141, no spills.
//
// Since s20 the kernels are templated on the block's configuration (QMoeWgmmaTile, q4_moe.h): the
// above is Cfg128 (`adaptive`; `fixed128` keeps N = 128). The short forms Cfg64 / Cfg32 (2 / 3
// blocks per SM, 12.5 / 8.5 KB stages) take a routing tile's rows in passes of 64 / 32 (N from 16),
// each pass a full main loop: the weight bytes in flight per SM are 2-3x Cfg128's, which is what
// a short prompt's ~8-30-row tiles lack (lab, T = 512: 396 -> 212 us per layer for Cfg32; T = 4096:
// 754 -> 724 for Cfg64). Since s21 they run the k-tiles in pairs (PairLoop in the .cuh: these
// blocks are issue-bound, and a pair pays the per-k-tile bookkeeping once): T = 256 204 -> 180 us
// (Cfg32), T = 4096 715 -> 664 (Cfg64); since s26 rows32's gate_up kernels take 4 k-tiles per
// barrier at 12 stages and 2 blocks per SM (with_rows32 below). With a QMoeSharedPart the grid
// also has the shared expert's blocks after the routed ones (dense tiles of the form's rows over
// its own matrices and buffers; job_of). Since s27 the three kernels launch with PDL (launch.h),
// each waiting at its top before any read: the next one's blocks start under this one's tail.
// Since s30 rows32 also has column-block job forms (q4_moe_prefill_jobs.cuh: a block takes 2 or
// 4 column blocks of its tile, its fixed part paid once; the same bits; switches, default off).
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_moe.h"
#include "cuda/q4_moe_prefill_jobs.cuh"
#include "cuda/q4_moe_prefill_wgmma.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

// rows32's block configuration and main loop. The gate_up kernels (routed and shared): 12
// stages at 2 blocks per SM with 4 k-tiles per block barrier (the lab's q_moe_grouped v13: gate_up
// at T = 256 / 512 118.9 / 132.2 -> 113.7 / 124.0 us per layer; engine, s26 run F, three runs:
// 192-768 tokens +0.7-1.4%). The down kernel: Cfg32 (3 blocks per SM) in pairs of k-tiles: v13's
// form cost it 68.2 -> 75.4 us (16-row tiles need the third block's warps). A/B:
// LILAC_ROWS32_GATE_UP_GROUPS=2|3|4 (2: Cfg32 in pairs, s21-s25's form) and
// LILAC_ROWS32_DOWN_GROUPS=2|3|4 (3 / 4: at the 12-stage configuration); s26 run E measured all
// three kernels at 3 / 4 (then one switch): -1.5% to -2.7%.
using Deep32 = qgemm_wgmma::QGemmV2Cfg<32, 12, 2>;

int rows32_down_groups() {
  static const int dn = env_choice("LILAC_ROWS32_DOWN_GROUPS", {2, 3, 4});
  return dn ? dn : 2;
}
int rows32_gate_up_groups() {
  static const int gu = env_choice("LILAC_ROWS32_GATE_UP_GROUPS", {2, 3, 4});
  return gu ? gu : 4;
}

// Column blocks per block of rows32's down (q4_moe_prefill_jobs.cuh): `arg` (1 or 2), else (arg
// 0) the switch LILAC_ROWS32_DOWN_JOBS, else 2 up to 256 tokens and 1 above. s31 (H100, 4-bit,
// synthetic, greedy, warm; three interleaved rounds): the kernel lab's down at 256 / 512 tokens
// 68.0 -> 64.2 / 73.6 -> 70.5 us, at 4,096 315 -> 318, skewed 1,000 103 -> 106; engine prefill at
// 192 / 256 / 512 / 768 tokens +1.7 / +0.7 / +0.9 / +0.5% with the uniform router, +0.8 / +0.7 /
// -0.1 / -0.9% with the zipf one. J = 4 was slower than 2 everywhere (2.8 waves at 256 tokens).
int rows32_down_jobs(int arg, int T) {
  if (arg == 0) {
    static const int env = env_choice("LILAC_ROWS32_DOWN_JOBS", {1, 2});
    return env ? env : T <= 256 ? 2 : 1;
  }
  if (arg != 1 && arg != 2)
    fail("q_moe_grouped_down_wgmma: {} column blocks per block (1 or 2)", arg);
  return arg;
}

// The block configuration C as the kernels get it: its one-FMA form (q4_gemm_wgmma.cuh
// dequant_ktile, OneFma) when every matrix the launch reads has QMatrix::small_scales. A
// compile-time form, not a flag: with s49's flag inside every k-tile the one-FMA form was no
// faster than main's two-FMA kernels (s50 run 1, H100); as its own instantiation, +2-3% (run 2).
template <class C, class Run>
void with_dequant(bool one_fma, Run run) {
  if (one_fma) return run(qgemm_wgmma::OneFma<C>{});
  return run(C{});
}
bool one_fma(const QMatrix& m, const QMatrix* shared) {
  return m.small_scales && (!shared || shared->small_scales);
}

template <class Run>
void with_rows32(Run run, bool gate_up, bool one) {
  using namespace qmoe_wgmma;
  const int groups = gate_up ? rows32_gate_up_groups() : rows32_down_groups();
  auto with = [&](auto cfg, auto loop) {
    with_dequant<decltype(cfg)>(one, [&](auto c) { run(c, loop); });
  };
  if (groups == 4) return with(Deep32{}, GroupLoop<4>{});
  if (groups == 3) return with(Deep32{}, GroupLoop<3>{});
  return with(Cfg32{}, PairLoop{});
}

}  // namespace

bool q_moe_grouped_wgmma_available() {
  return q_gemm_wgmma_available();
}

void q_moe_grouped_gate_up_wgmma(const bf16* x, int H, const QMatrix& gate_up, int I,
                                 const MoeRouting& r, bf16* act, cudaStream_t stream,
                                 QMoeWgmmaTile tile, const QMoeSharedPart* shared) {
  using namespace qmoe_wgmma;
  const bool one = one_fma(gate_up, shared ? &shared->gate_up : nullptr);
  switch (tile) {
    case QMoeWgmmaTile::fixed128:
      return with_dequant<Cfg128>(one, [&](auto c) {
        launch_gate_up<decltype(c), false>(x, H, gate_up, I, r, act, shared, stream);
      });
    case QMoeWgmmaTile::adaptive:
      return with_dequant<Cfg128>(one, [&](auto c) {
        launch_gate_up<decltype(c), true>(x, H, gate_up, I, r, act, shared, stream);
      });
    case QMoeWgmmaTile::rows64:
      return with_dequant<Cfg64>(one, [&](auto c) {
        launch_gate_up<decltype(c), true, PairLoop>(x, H, gate_up, I, r, act, shared, stream);
      });
    case QMoeWgmmaTile::rows32:
      return with_rows32(
          [&](auto cfg, auto loop) {
            launch_gate_up<decltype(cfg), true, decltype(loop)>(x, H, gate_up, I, r, act, shared,
                                                                stream);
          },
          true, one);
  }
  fail("q_moe_grouped_gate_up_wgmma: unknown tile form {}", int(tile));
}

void q_moe_shared_gate_up_wgmma(const bf16* x, int T, int H, const QMatrix& shared_gate_up, int Is,
                                bf16* act, cudaStream_t stream, QMoeWgmmaTile tile) {
  using namespace qmoe_wgmma;
  const bool one = one_fma(shared_gate_up, nullptr);
  switch (tile) {
    case QMoeWgmmaTile::fixed128:
    case QMoeWgmmaTile::adaptive:
      return with_dequant<Cfg128>(one, [&](auto c) {
        launch_shared_gate_up<decltype(c)>(x, T, H, shared_gate_up, Is, act, stream);
      });
    case QMoeWgmmaTile::rows64:
      return with_dequant<Cfg64>(one, [&](auto c) {
        launch_shared_gate_up<decltype(c), PairLoop>(x, T, H, shared_gate_up, Is, act, stream);
      });
    case QMoeWgmmaTile::rows32:
      return with_rows32(
          [&](auto cfg, auto loop) {
            launch_shared_gate_up<decltype(cfg), decltype(loop)>(x, T, H, shared_gate_up, Is, act,
                                                                 stream);
          },
          true, one);
  }
  fail("q_moe_shared_gate_up_wgmma: unknown tile form {}", int(tile));
}

void q_moe_grouped_down_wgmma(const bf16* act, int I, const QMatrix& down, int H,
                              const MoeRouting& r, float* y, cudaStream_t stream,
                              QMoeWgmmaTile tile, const QMoeSharedPart* shared, int down_jobs,
                              bool y_bf16) {
  using namespace qmoe_wgmma;
  const bool one = one_fma(down, shared ? &shared->down : nullptr);
  switch (tile) {
    case QMoeWgmmaTile::fixed128:
      return with_dequant<Cfg128>(one, [&](auto c) {
        launch_down<decltype(c), false>(act, I, down, H, r, y, shared, stream, y_bf16);
      });
    case QMoeWgmmaTile::adaptive:
      return with_dequant<Cfg128>(one, [&](auto c) {
        launch_down<decltype(c), true>(act, I, down, H, r, y, shared, stream, y_bf16);
      });
    case QMoeWgmmaTile::rows64:
      return with_dequant<Cfg64>(one, [&](auto c) {
        launch_down<decltype(c), true, PairLoop>(act, I, down, H, r, y, shared, stream, y_bf16);
      });
    case QMoeWgmmaTile::rows32: {
      // With the default pairs only, where K fits the stages.
      const int jobs = rows32_down_jobs(down_jobs, r.T);
      const int Is = shared ? shared->down.cols : 0;
      if (jobs == 2 && rows32_down_groups() == 2 && down_jobs_fit<Cfg32, 2>(I, Is))
        return with_dequant<Cfg32>(one, [&](auto c) {
          launch_down_jobs<decltype(c), 2, 2>(act, I, down, H, r, y, shared, stream, y_bf16);
        });
      return with_rows32(
          [&](auto cfg, auto loop) {
            launch_down<decltype(cfg), true, decltype(loop)>(act, I, down, H, r, y, shared, stream,
                                                             y_bf16);
          },
          false, one);
    }
  }
  fail("q_moe_grouped_down_wgmma: unknown tile form {}", int(tile));
}

}  // namespace lilac::cuda
