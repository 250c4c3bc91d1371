// Kernel lab q_moe_small version 6 (s41): production's register kernels (version 1: gate_up at 4
// blocks per SM, down with J tiles per warp at 5) with a time stamp per block, to see where the
// time of a batched step's expert kernels goes between the blocks: the waves (at 16 rows gate_up
// is ~816 blocks on 132 SMs x 4 = 528 slots, 1.55 waves), the tail, the spread of block durations.
//
// Each block's thread 0 writes, for block b (x + X (y + Y z)): stamps[4 b] the %globaltimer
// (ns) at its start (after the PDL wait), stamps[4 b + 1] at its end (after its last pass's block
// barrier), stamps[4 b + 2] its SM (%smid), stamps[4 b + 3] the passes it ran (0: a block past the
// used tiles, which exits at once). The arithmetic is version 1's (q4_moe_small.cu): the same
// set_dot_staged calls in the same order, so act and y are its bits; the lab checks them as it
// checks every version. Only the stamps differ, a few instructions per block.
#include <algorithm>

#include "cuda/q4_moe_small.cuh"
#include "cuda/q4_tile.cuh"
#include "q_moe_small_lab.h"
#include "register_pair.cuh"
#include "util/error.h"

namespace lilac::lab {
namespace {

using namespace cuda::qmoe_small;
using cuda::bf16;
using cuda::QMatrix;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ unsigned long long* block_stamps(unsigned long long* stamps) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return stamps + 4 * size_t(b);
}

// q4_moe_small.cu's q_moe_small_gate_up_kernel<4> (4 blocks per SM), with the stamps.
__global__ void __launch_bounds__(kThreads, 4)
    gate_up_stamped_kernel(RegisterPair a, unsigned long long* stamps) {
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned long long start = global_ns();
  const int passes = gate_up_unit(a, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z),
                                  reinterpret_cast<bf16*>(smem));
  if (threadIdx.x == 0) {
    unsigned long long* s = block_stamps(stamps);
    s[0] = start, s[1] = global_ns(), s[2] = sm_id(), s[3] = unsigned(passes);
  }
}

// q4_moe_small.cu's q_moe_small_down_kernel<4, J> (5 blocks per SM), with the stamps.
template <int J>
__global__ void __launch_bounds__(kThreads, 5)
    down_stamped_kernel(RegisterPair a, unsigned long long* stamps) {
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned long long start = global_ns();
  const int passes = down_unit<J>(a, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z),
                                  reinterpret_cast<bf16*>(smem));
  if (threadIdx.x == 0) {
    unsigned long long* s = block_stamps(stamps);
    s[0] = start, s[1] = global_ns(), s[2] = sm_id(), s[3] = unsigned(passes);
  }
}

template <typename Kernel, typename... Args>
size_t launch_stamped(Kernel fn, size_t smem, unsigned grid_y, const cuda::MoeRouting& r,
                      cudaStream_t stream, Args... args) {
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int Z = grid_passes(r.T, r.E, r.k);
  const dim3 grid(grid_x(r, Z), grid_y, unsigned(Z));
  fn<<<grid, kThreads, smem, stream>>>(args...);
  LILAC_CUDA_LAUNCHED();
  return size_t(grid.x) * grid.y * grid.z;
}

}  // namespace

size_t q_moe_small_gate_up_stamped(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                                   const QMatrix& shared_gate_up, int Is, const cuda::MoeRouting& r,
                                   bf16* act, bf16* shared_act, unsigned long long* stamps,
                                   cudaStream_t stream) {
  if (gate_up.bits != 4 || shared_gate_up.bits != 4) fail("lab q_moe_small v6: 4-bit weights");
  const RegisterPair a{x,
                       H,
                       gate_up,
                       I,
                       shared_gate_up,
                       Is,
                       tiles_of(r),
                       r.sorted_token,
                       r.E,
                       T,
                       act,
                       shared_act,
                       {},
                       {},
                       nullptr,
                       nullptr,
                       grid_passes(r.T, r.E, r.k)};
  return launch_stamped(gate_up_stamped_kernel, staged_x_bytes(H),
                        unsigned(cuda::ceil_div(std::max(I, Is) / cuda::kQTileRows, kWarps)), r,
                        stream, a, stamps);
}

size_t q_moe_small_down_stamped(const bf16* act, int I, const bf16* shared_act, int Is,
                                const QMatrix& down, const QMatrix& shared_down, int H,
                                const cuda::MoeRouting& r, float* y, float* shared_out,
                                unsigned long long* stamps, cudaStream_t stream) {
  if (down.bits != 4 || shared_down.bits != 4) fail("lab q_moe_small v6: 4-bit weights");
  const size_t smem = staged_x_bytes(std::max(I, Is));
  const int J = r.T <= 16 ? 2 : 4;  // production's down_tiles_per_warp
  const unsigned gy = unsigned(cuda::ceil_div(H / cuda::kQTileRows, kWarps * J));
  // down only reads act and shared_act (the struct holds them writable, for gate_up).
  const RegisterPair a{nullptr,
                       H,
                       {},
                       I,
                       {},
                       Is,
                       tiles_of(r),
                       nullptr,
                       r.E,
                       r.T,
                       const_cast<bf16*>(act),
                       const_cast<bf16*>(shared_act),
                       down,
                       shared_down,
                       y,
                       shared_out,
                       grid_passes(r.T, r.E, r.k)};
  if (J == 2) return launch_stamped(down_stamped_kernel<2>, smem, gy, r, stream, a, stamps);
  return launch_stamped(down_stamped_kernel<4>, smem, gy, r, stream, a, stamps);
}

}  // namespace lilac::lab
