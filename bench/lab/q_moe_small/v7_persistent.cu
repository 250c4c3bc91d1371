// Kernel lab q_moe_small version 7 (s44): the register pair (version 1's arithmetic) as one
// persistent launch whose blocks take units of work from a counter until none is left, gate_up's
// units first, then down's: the SMs stay full to the end of the pair.
//
// Why (docs/kernels.md, "Forty-fourth session", runs 2 and 5): at 16 rows production's gate_up is
// 1,040 blocks on 528 slots; its slots are full for the first half of the launch (where it moves
// the weights at the H100's limit) and then empty out (424, 336, 336, 270, 39 working blocks per
// tenth of the span), and down starts its own ramp after it (the chained pair overlaps the two
// only where gate_up's tail leaves slots). Here the grid is what fits at once (4 blocks of 128
// threads per SM at <= 128 registers: the gate_up kernel's bounds, down's 5 giving way) and a unit
// is one block of production's grids, taken in their tile order (y fastest, then z, then x:
// block_pos of the chained kernels): unit u < U1 is gate_up's block (x, y, z) of its X x Y1 x Z
// grid, unit U1 + v is down's block of its X x Y2 x Z grid. A down unit of x waits (acquire) until
// the Y1 Z gate_up units of x have signalled (release), as the chained pair's down does; no wait
// can deadlock: every gate_up unit is taken before any down unit and each is run to its end by the
// block that took it. The last block out resets the counters for the next launch.
//
// Counters (int32, zeroed once by the caller; every launch leaves them at zero):
//   [0] the next unit, [1] blocks finished, [2 + x] gate_up units of x done (x < X).
// Arithmetic: version 1's set_dot_staged calls in the same order per unit: act and y are its bits.
#include <algorithm>

#include "cuda/common.h"
#include "cuda/q4_moe_small.cuh"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "q_moe_small_lab.h"
#include "register_pair.cuh"
#include "util/error.h"

namespace lilac::lab {
namespace {

using namespace cuda::qmoe_small;
using cuda::bf16;
using cuda::QMatrix;

constexpr int kBlocksPerSm = 4;

struct PairArgs {
  RegisterPair p;
  int X, Y1, Y2;  // the two grids: X x Y1 x Z (gate_up) and X x Y2 x Z (down), Z = p.Z
  int32_t* counters;
};

template <int J>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) pair_persistent_kernel(PairArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int unit_s;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  int32_t* const next = a.counters;
  int32_t* const finished = a.counters + 1;
  int32_t* const done = a.counters + 2;
  const int Z = a.p.Z, U1 = a.X * a.Y1 * Z, U2 = a.X * a.Y2 * Z;
  for (;;) {
    if (threadIdx.x == 0) unit_s = atomicAdd(next, 1);
    __syncthreads();
    const int u = unit_s;
    __syncthreads();  // every thread has read unit_s before thread 0 takes the next unit
    if (u >= U1 + U2) break;
    if (u < U1) {
      const int x = u / (a.Y1 * Z), y = u % a.Y1, z = (u / a.Y1) % Z;
      gate_up_unit(a.p, x, y, z, xs);  // ends with a block barrier after its stores
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&done[x], 1);
      }
    } else {
      const int v = u - U1;
      const int x = v / (a.Y2 * Z), y = v % a.Y2, z = (v / a.Y2) % Z;
      if (threadIdx.x == 0) {
        const int want = a.Y1 * Z;
        for (int polls = 0;; ++polls) {
          int c;
          asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(c) : "l"(&done[x]) : "memory");
          if (c >= want) break;
          if (polls > (1 << 24)) __trap();  // a gate_up unit never signalled: fail, not hang
          __nanosleep(64);
        }
      }
      __syncthreads();
      down_unit<J>(a.p, x, y, z, xs);
    }
  }
  // The last block out resets the counters (no block reads them after its own final take).
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(finished, 1) == int(gridDim.x) - 1) {
      for (int i = 0; i < 2 + a.X; ++i) atomicExch(&a.counters[i], 0);
    }
  }
}

template <int J>
size_t launch_pair(const PairArgs& a, size_t smem, cudaStream_t stream) {
  auto fn = pair_persistent_kernel<J>;
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int per_sm = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem));
  if (per_sm < 1) fail("lab q_moe_small v7: no block fits an SM");
  const int units = a.X * (a.Y1 + a.Y2) * a.p.Z;
  const int blocks = std::min(units, per_sm * cuda::sm_count());
  fn<<<blocks, kThreads, smem, stream>>>(a);
  LILAC_CUDA_LAUNCHED();
  return size_t(blocks);
}

}  // namespace

size_t q_moe_small_pair_persistent(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                                   const QMatrix& shared_gate_up, int Is, const QMatrix& down,
                                   const QMatrix& shared_down, const cuda::MoeRouting& r, bf16* act,
                                   bf16* shared_act, float* y, float* shared_out, int32_t* counters,
                                   cudaStream_t stream) {
  if (gate_up.bits != 4 || shared_gate_up.bits != 4 || down.bits != 4 || shared_down.bits != 4)
    fail("lab q_moe_small v7: 4-bit weights");
  if (T != r.T) fail("lab q_moe_small v7: {} tokens, routing laid out for {}", T, r.T);
  const int Z = grid_passes(r.T, r.E, r.k);
  const int J = r.T <= 16 ? 2 : 4;  // production's down_tiles_per_warp
  const RegisterPair p{
      x,   H, gate_up, I,          shared_gate_up, Is,          tiles_of(r), r.sorted_token,
      r.E, T, act,     shared_act, down,           shared_down, y,           shared_out,
      Z};
  const PairArgs a{p, int(grid_x(r, Z)),
                   int(cuda::ceil_div(std::max(I, Is) / cuda::kQTileRows, kWarps)),
                   int(cuda::ceil_div(H / cuda::kQTileRows, kWarps * J)), counters};
  if (a.X + 2 > kPairCounters)
    fail("lab q_moe_small v7: {} x-blocks, counters for {}", a.X, kPairCounters - 2);
  const size_t smem = std::max(staged_x_bytes(H), staged_x_bytes(std::max(I, Is)));
  return J == 2 ? launch_pair<2>(a, smem, stream) : launch_pair<4>(a, smem, stream);
}

}  // namespace lilac::lab
