// Kernel lab q_moe_small: q4_moe_small.cu's set_dot_staged (4-bit), unchanged, for the lab's
// versions that run production's register arithmetic in kernels of their own (v6 stamps, v7
// persistent pair): a warp's NT weight tiles x the pass's staged tokens over one set of GS groups,
// loaded into registers, then the q_group_dot MMAs group by group (the same bits as production).
#pragma once

#include "cuda/q4_moe_small.cuh"
#include "cuda/q4_tile.cuh"

namespace lilac::lab {

template <int NT, int GS>
__device__ __forceinline__ void set_dot_staged(const uint32_t* const (&codes)[NT],
                                               const uint32_t* const (&sb)[NT], int G, int set,
                                               const uint32_t* xs, int stride, int count,
                                               float (&y)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int grp0 = set * GS;
  const int ng = min(GS, G - grp0);
  cuda::qtile::QSet<4, NT, GS> w;
  cuda::qtile::load_qset(w, codes, sb, grp0, ng);
  const bool has = g < count;
  const uint32_t* xr = xs + g * stride + grp0 * 32;
#pragma unroll
  for (int m = 0; m < GS; ++m) {
    if (m >= ng) continue;  // warp-uniform
    uint32_t X[4][2];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      X[kb][0] = has ? xr[m * 32 + 8 * kb + t] : 0u;
      X[kb][1] = has ? xr[m * 32 + 8 * kb + t + 4] : 0u;
    }
    cuda::qtile::q_group_dot(w, m, X, y);
  }
}

}  // namespace lilac::lab
