// The kernel lab's q_moe_grouped versions 6, 7, 9 and 10 (s20; README.md here): production's
// grouped wgmma expert kernels (src/cuda/q4_moe_prefill_wgmma.cuh) in passes of 32 token rows at
// block configurations production does not use, to tell what bounds its rows32 form (8 stages, 3
// blocks per SM: ~2.3 TB/s at T = 256 in s20 run 2): the k-tiles in flight per block (v6: 12
// stages, 2 blocks per SM, 10 k-tiles of prefetch each: 20 per SM against rows32's 18, with 16
// warps), the blocks per SM that overlap each other's k-tile latency (v7: 6 stages, 4 blocks per
// SM, 4 k-tiles each: 16 per SM, 32 warps), or ptxas serialising the wgmmas: at <= 85 registers (3
// blocks per SM) it reports C7512 ("wgmma.mma_async instructions are serialized due to insufficient
// register resources") for production's rows32 and rows64 kernels and for v7, not at 128 (v6, v9: 8
// stages at 2 blocks per SM, rows32's pipeline without the serialisation), nor for rows64's
// pipeline at 1 block per SM (v10, for the prompts above 512 tokens that rows64 takes).
// Version 8 is v6 with the main loop over pairs of k-tiles (one block barrier per two k-tiles; the
// lab's pair_loop.cuh in s20, production's qmoe_wgmma::PairLoop since s21); versions 11 and 12
// (s21) that loop at rows32's and rows64's configurations, production since s21 (run through
// q_moe_grouped_*_wgmma); versions 4 and 5 (s20's rows64 / rows32, one k-tile per barrier) run
// from here since then. Versions 13 and 14 (s21; run in s22 and s26): v6's configuration with
// groups of 4 and 3 k-tiles per barrier (qmoe_wgmma::GroupLoop; 128 / 122 registers; at rows64's
// configuration groups of 4 spill 250-400 bytes: not tried). v13's gate_up is production's rows32
// gate_up since s26 (its down kernel lost: README.md).
#include <cstdint>

#include "cuda/q4_moe_prefill_wgmma.cuh"
#include "q_moe_grouped_lab.h"
#include "util/error.h"

namespace lilac::lab {
using namespace cuda;

namespace qmoe_lab {

using Deep32 = qgemm_wgmma::QGemmV2Cfg<32, 12, 2>;  // 12 x 8.5 KB = 103 KB + 1 KB
using Wide32 = qgemm_wgmma::QGemmV2Cfg<32, 6, 4>;   // 6 x 8.5 KB = 52 KB + 1 KB, <= 64 registers
using Two32 = qgemm_wgmma::QGemmV2Cfg<32, 8, 2>;    // rows32's stages at 2 blocks: 128 registers
using One64 = qgemm_wgmma::QGemmV2Cfg<64, 8, 1>;    // rows64's stages at 1 block: ~196 registers

// A version's kernels: production's at block configuration C with main loop Loop.
template <class C, class Loop = qmoe_wgmma::KtileLoop>
struct Form {
  static void gate_up(const bf16* x, int H, const QMatrix& W, int I, const MoeRouting& r, bf16* act,
                      cudaStream_t s) {
    qmoe_wgmma::launch_gate_up<C, true, Loop>(x, H, W, I, r, act, nullptr, s);
  }
  static void down(const bf16* act, int I, const QMatrix& W, int H, const MoeRouting& r, float* y,
                   cudaStream_t s) {
    qmoe_wgmma::launch_down<C, true, Loop>(act, I, W, H, r, y, nullptr, s);
  }
};

// Calls run(Form<...>{}) for the version's form.
template <class Run>
void with_form(int version, Run run) {
  switch (version) {
    case 4:
      return run(Form<qmoe_wgmma::Cfg64>{});
    case 5:
      return run(Form<qmoe_wgmma::Cfg32>{});
    case 6:
      return run(Form<Deep32>{});
    case 7:
      return run(Form<Wide32>{});
    case 8:
      return run(Form<Deep32, qmoe_wgmma::PairLoop>{});
    case 9:
      return run(Form<Two32>{});
    case 10:
      return run(Form<One64>{});
    case 13:
      return run(Form<Deep32, qmoe_wgmma::GroupLoop<4>>{});
    case 14:
      return run(Form<Deep32, qmoe_wgmma::GroupLoop<3>>{});
  }
  fail("q_moe_grouped lab: no version {} here (4-10, 13, 14)", version);
}

}  // namespace qmoe_lab

void q_moe_grouped_gate_up_lab(int version, const bf16* x, int H, const QMatrix& gate_up, int I,
                               const MoeRouting& r, bf16* act, cudaStream_t stream) {
  qmoe_lab::with_form(
      version, [&](auto form) { decltype(form)::gate_up(x, H, gate_up, I, r, act, stream); });
}

void q_moe_grouped_down_lab(int version, const bf16* act, int I, const QMatrix& down, int H,
                            const MoeRouting& r, float* y, cudaStream_t stream) {
  qmoe_lab::with_form(version,
                      [&](auto form) { decltype(form)::down(act, I, down, H, r, y, stream); });
}

}  // namespace lilac::lab
