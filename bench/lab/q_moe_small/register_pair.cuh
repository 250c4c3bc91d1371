// Kernel lab q_moe_small: production's register arithmetic (q4_moe_small.cu, version 1) for the
// lab's versions that run it in kernels of their own (v6 stamps, v7 persistent pair): its
// set_dot_staged (4-bit; a warp's NT weight tiles x the pass's staged tokens over one set of GS
// groups, loaded into registers, then the q_group_dot MMAs group by group) and its kernels' bodies
// for one block of their grids (gate_up_unit, down_unit), unchanged: the same bits as production.
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

// The register pair's arguments (q_moe_small_gate_up / q_moe_small_down's, 4-bit) for the unit
// bodies below; Z: the grids' passes (grid_passes).
struct RegisterPair {
  const cuda::bf16* x;
  int H;
  cuda::QMatrix gate_up;
  int I;
  cuda::QMatrix shared_gate_up;
  int Is;
  cuda::qmoe_small::Tiles tiles;
  const int32_t* sorted_token;
  int E, T;
  cuda::bf16* act;
  cuda::bf16* shared_act;
  cuda::QMatrix down, shared_down;
  float* y;
  float* shared_out;
  int Z;
};

// Production's q_moe_small_gate_up_kernel<4> body for its block (x, y, z): the same passes and
// set_dot_staged calls in the same order. Returns the passes run; ends each pass with a block
// barrier (after its stores).
__device__ __forceinline__ int gate_up_unit(const RegisterPair& a, int x, int y, int z,
                                            cuda::bf16* xs) {
  using namespace cuda::qmoe_small;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = a.H / cuda::kQGroup;
  int passes = 0;
  Segment seg;
  for (PassIter it(a.tiles, a.E, a.T, x, z, a.Z); it.segment(seg); it.pass += it.step) {
    ++passes;
    const bool shared = it.e == a.E;
    stage_x(a.x, a.H, shared ? nullptr : a.sorted_token, seg, xs);
    const uint32_t* const wc = shared ? a.shared_gate_up.codes : a.gate_up.codes;
    const uint32_t* const ws = shared ? a.shared_gate_up.sb : a.gate_up.sb;
    const int n = shared ? a.Is : a.I;
    const int P = n / cuda::kQTileRows;
    const int p = y * kWarps + warp;
    if (p < P) {  // warp-uniform
      const int gate_tile = (shared ? 0 : it.e * 2 * P) + p;
      const uint32_t* const codes[2] = {wc + size_t(gate_tile) * G * cuda::kQBlockWords,
                                        wc + size_t(gate_tile + P) * G * cuda::kQBlockWords};
      const uint32_t* const sb[2] = {ws + size_t(gate_tile) * G * cuda::kQSbWords,
                                     ws + size_t(gate_tile + P) * G * cuda::kQSbWords};
      float acc[2][4] = {};
      for (int set = 0; set * kGateUpSet < G; ++set)
        set_dot_staged<2, kGateUpSet>(codes, sb, G, set, reinterpret_cast<const uint32_t*>(xs),
                                      (a.H + kXPad) / 2, seg.count, acc);
      cuda::bf16* out = shared ? a.shared_act : a.act;
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int i = p * cuda::kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(n) + i] =
            __float2bfloat16_rn(cuda::silu(acc[0][q]) * acc[1][q]);
      }
    }
    __syncthreads();  // the staged x is re-used by the next pass
  }
  return passes;
}

// Production's q_moe_small_down_kernel<4, J> body for its block (x, y, z). Returns the passes.
template <int J>
__device__ __forceinline__ int down_unit(const RegisterPair& a, int x, int y, int z,
                                         cuda::bf16* xs) {
  using namespace cuda::qmoe_small;
  const int TH = a.H / cuda::kQTileRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int passes = 0;
  Segment seg;
  for (PassIter it(a.tiles, a.E, a.T, x, z, a.Z); it.segment(seg); it.pass += it.step) {
    ++passes;
    const bool shared = it.e == a.E;
    const int K = shared ? a.Is : a.I;
    stage_x(shared ? a.shared_act : a.act, K, nullptr, seg, xs);
#pragma unroll 1
    for (int j = 0; j < J; ++j) {
      const int th = (y * J + j) * kWarps + warp;
      if (th >= TH) break;  // warp-uniform
      const uint32_t* const wc = shared ? a.shared_down.codes : a.down.codes;
      const uint32_t* const ws = shared ? a.shared_down.sb : a.down.sb;
      const int G = K / cuda::kQGroup;
      const int tile = (shared ? 0 : it.e * TH) + th;
      const uint32_t* const codes[1] = {wc + size_t(tile) * G * cuda::kQBlockWords};
      const uint32_t* const sb[1] = {ws + size_t(tile) * G * cuda::kQSbWords};
      float acc[1][4] = {};
      for (int set = 0; set * 8 < G; ++set)
        set_dot_staged<1, 8>(codes, sb, G, set, reinterpret_cast<const uint32_t*>(xs),
                             (K + kXPad) / 2, seg.count, acc);
      float* out = shared ? a.shared_out : a.y;
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int c = th * cuda::kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(a.H) + c] = acc[0][q];
      }
    }
    __syncthreads();
  }
  return passes;
}

}  // namespace lilac::lab
