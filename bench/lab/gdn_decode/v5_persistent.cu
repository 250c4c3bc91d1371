// gdn_decode version 5, the persistent state pass with its next states in shared memory (batched
// only; lost to version 3, production's gdn_decode_batch: numbers in README.md, "v5 persistent").
// Written in src/cuda/gated_deltanet_decode_batch.cu (commit 8631927, `LILAC_GDN_PERSISTENT`) as a
// candidate and moved here after s12 run 1; the prep kernel is production's
// (cuda::gdn_decode_batch_prep). Run 1 also tried 2 stages with 5 blocks per SM (48 registers,
// 160 KB): it lost as well (README.md).
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/gated_deltanet.h"
#include "cuda/gated_deltanet_step.cuh"
#include "cuda/launch.h"
#include "cuda/vec_util.cuh"
#include "gdn_decode_lab.h"
#include "util/error.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DecodeBatchRow;
using cuda::pdl_launch_dependents;
using cuda::pdl_wait;
using cuda::silu;
using cuda::warp_sum;
namespace cluster = cuda::cluster;
namespace gdn = cuda::gdn;
using gdn::kCols;
constexpr int kMaxCluster = 8;
constexpr int kStages = 3;     // items in flight per block (the current one and the next two)
constexpr int kMinBlocks = 4;  // 4 x 48 KiB of stages per SM: 64 registers (ptxas, no spills)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp.async: 16 bytes global -> shared, bypassing L1 and registers; per-thread groups. (The GEMM
// tile engine's cp_async_16 takes a src-size operand: another instruction form than the one
// measured in s12 run 1, so the lab keeps these.)
__device__ __forceinline__ void copy16(void* dst_smem, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst_smem)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

// Production's workspace row (gated_deltanet_decode_batch.cu): q, k [Hk Dk], v, z [Hv Dv], beta,
// decay [Hv], rounded up to 4 floats.
int ws_row_floats(int Hk, int Hv, int Dk, int Dv) {
  return (2 * Hk * Dk + 2 * Hv * Dv + 2 * Hv + 3) & ~3;
}

// The same block (2 Dk threads, thread (rg, cq) holding S rows 4rg.. x columns 4cq.. of the
// block's 32) and the same arithmetic as gdn_batch_state_kernel, but the grid is only as large as
// the GPU holds at once: cluster c (Dv/32 blocks, rank = column block) runs items (row, head)
// c, c + G, c + 2G, ... (G clusters), and each block copies the state slices of its next kStages -
// 1 items into shared memory (cp.async: no registers held) while it computes the current one. Why:
// the one-shot grid runs 3.1 waves at 16 rows (2,048 blocks, 660 resident), and a wave's DRAM
// traffic stops while its blocks sit in their barriers (26.5 us per layer for 67 MB, 2.5 TB/s,
// against 15.6 us at 4.3 TB/s); here a block's next states are in flight through its barriers.
// Stage layout [kStages][4][2 Dk] float4: a thread copies and later reads only its own four 16-byte
// pieces (so no block barrier guards the stages), lane-consecutive (conflict-free). The gated
// norm's sums of squares go through ss_o[item parity]: a fast block may push item k + 1's sum into
// a peer that is still reading item k's.
template <int DK>
__global__ void __launch_bounds__(2 * DK, kMinBlocks)
    gdn_batch_state_persistent_kernel(const float* __restrict__ ws, int ws_row,
                                      const float* __restrict__ norm_w, int Hk, int Hv, int Dv,
                                      float eps, bf16* __restrict__ out,
                                      const DecodeBatchRow* __restrict__ rows, int slot,
                                      int items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NTH = 2 * DK, NW = NTH / 32;
  extern __shared__ __align__(16) float4 stage[];  // [kStages][4][NTH]
  __shared__ __align__(16) float red[NW][kCols];
  __shared__ __align__(16) float red2[NW][kCols];
  __shared__ float ss_o[2][kMaxCluster];

  const int nsplit = Dv / kCols;
  const int cb = int(cluster::ctarank());
  const int cid = int(blockIdx.x) / nsplit, G = int(gridDim.x) / nsplit;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ratio = Hv / Hk;
  const int c0 = cb * kCols;
  const int cq = tid & 7, rg = tid >> 3;
  const size_t head_floats = size_t(DK) * Dv;
  // Item it = (row it / Hv, head it % Hv); this thread's first state float of it.
  auto state_at = [&](int it) -> float* {
    const int b = it / Hv, v = it - b * Hv;
    return rows[b].rec + size_t(slot) * Hv * head_floats + size_t(v) * head_floats +
           size_t(4 * rg) * Dv + c0 + 4 * cq;
  };
  auto prefetch = [&](int it, int s) {
    if (it < items) {
      const float* src = state_at(it);
#pragma unroll
      for (int i = 0; i < 4; ++i) copy16(&stage[(s * 4 + i) * NTH + tid], src + size_t(i) * Dv);
    }
    commit();  // empty past the last item: the group count stays uniform
  };

  pdl_launch_dependents();
  if (nsplit > 1) cluster::arrive_relaxed();
  float w_l = 0.f;
  if (warp == 0) w_l = norm_w[c0 + lane];
  // The states are written by no kernel of the step, but they are read after the wait as in
  // gdn_batch_state_kernel (the ordering PDL states is with the previous kernel only).
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) prefetch(cid + s * G, s);

  for (int k = 0, it = cid; it < items; ++k, it += G) {
    prefetch(it + (kStages - 1) * G, (k + kStages - 1) % kStages);
    const int b = it / Hv, v = it - b * Hv, kh = v / ratio;
    // The workspace values of this item (L2), issued before the state wait.
    const float* wsr = ws + size_t(b) * ws_row;
    float z_l = 0.f;
    if (warp == 0) z_l = wsr[2 * Hk * DK + Hv * Dv + size_t(v) * Dv + c0 + lane];
    const float4 q4 = *reinterpret_cast<const float4*>(wsr + kh * DK + 4 * rg);
    const float4 k4 = *reinterpret_cast<const float4*>(wsr + Hk * DK + kh * DK + 4 * rg);
    const float4 v4 = *reinterpret_cast<const float4*>(wsr + 2 * Hk * DK + v * Dv + c0 + 4 * cq);
    const float beta = wsr[2 * Hk * DK + 2 * Hv * Dv + v];
    const float decay = wsr[2 * Hk * DK + 2 * Hv * Dv + Hv + v];
    const float kr[4] = {k4.x, k4.y, k4.z, k4.w};
    const float qr[4] = {q4.x, q4.y, q4.z, q4.w};

    wait_copies<kStages - 1>();  // this thread's pieces of item k have landed
    const int s = k % kStages;
    float4 S[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) S[i] = stage[(s * 4 + i) * NTH + tid];

    const float4 u4 = gdn::delta_u(gdn::column_kS<NW>(S, kr, red, warp, lane, cq), v4, beta, decay);
    gdn::update_store_o(S, kr, qr, u4, decay, state_at(it), Dv, red2, warp, lane, cq);

    float ov = 0.f, ss = 0.f;
    if (warp == 0) {
      ov = gdn::block_o<NW>(red2, lane);
      ss = warp_sum(ov * ov);
    }
    if (nsplit > 1) {
      if (k == 0) cluster::wait();  // every block of the cluster has started
      float* slot_ss = ss_o[k & 1];
      if (warp == 0 && lane == 0) {
        const uint32_t a_ss = smem_u32(&slot_ss[cb]);
        for (int r = 0; r < nsplit; ++r) cluster::st_f32(cluster::map(a_ss, uint32_t(r)), ss);
      }
      cluster::sync();  // the head's Dv / 32 sums of squares are here
      if (warp == 0) {
        ss = 0.f;
        for (int c = 0; c < nsplit; ++c) ss += slot_ss[c];
      }
    }
    if (warp == 0) {
      const float r = rsqrtf(ss / float(Dv) + eps);
      out[(size_t(b) * Hv + v) * Dv + c0 + lane] = __float2bfloat16_rn(w_l * (ov * r) * silu(z_l));
    }
  }
  wait_copies<0>();  // no copy outlives the block (the trailing groups are empty)
#else
  __trap();  // sm_90 only (check_batch refuses other devices)
#endif
}

// A launch of the state kernel: `blocks` blocks in clusters of `nsplit` (vec_util.cuh's
// launch_config; PDL when `pdl`).
template <int DK>
cudaLaunchConfig_t cluster_config(int blocks, int nsplit, cudaStream_t stream, bool pdl,
                                  cudaLaunchAttribute (&attr)[2]);

template <int DK>
size_t persistent_smem_bytes() {
  return size_t(kStages) * 4 * 2 * DK * sizeof(float4);
}

// Clusters of `nsplit` persistent state blocks the GPU holds at once (queried once per shape; the
// shared-memory carveout set to its maximum so that kMinBlocks fit an SM).
template <int DK>
int persistent_clusters(int nsplit) {
  static std::mutex mu;
  static int cached[kMaxCluster + 1] = {};  // per cluster size
  std::lock_guard<std::mutex> lock(mu);
  if (cached[nsplit] > 0) return cached[nsplit];
  auto kernel = gdn_batch_state_persistent_kernel<DK>;
  const size_t smem = persistent_smem_bytes<DK>();
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = cluster_config<DK>(nsplit, nsplit, nullptr, false, attr);
  int n = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  if (n < 1) fail("gdn_decode v5: the persistent state kernel fits no cluster of {}", nsplit);
  cached[nsplit] = n;
  return n;
}

template <int DK>
cudaLaunchConfig_t cluster_config(int blocks, int nsplit, cudaStream_t stream, bool pdl,
                                  cudaLaunchAttribute (&attr)[2]) {
  const dim3 cluster{unsigned(nsplit)};
  return cuda::launch_config(gdn_batch_state_persistent_kernel<DK>, dim3(unsigned(blocks)),
                             dim3(2 * DK), persistent_smem_bytes<DK>(), stream, &cluster, pdl,
                             attr);
}

template <int DK>
void launch_state(const GdnDecodeBatchArgs& a, cudaStream_t stream) {
  const int nsplit = a.Dv / kCols, items = a.B * a.Hv;
  const int ws_row = ws_row_floats(a.Hk, a.Hv, DK, a.Dv);
  const int clusters = std::min(items, persistent_clusters<DK>(nsplit));
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = cluster_config<DK>(clusters * nsplit, nsplit, stream, true, attr);
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gdn_batch_state_persistent_kernel<DK>, a.workspace,
                                      ws_row, a.norm_w, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                                      a.slot, items));
  LILAC_CUDA_LAUNCHED();
}

}  // namespace

void gdn_decode_v5_persistent(const GdnDecodeBatchArgs& a, cudaStream_t stream) {
  cuda::gdn_decode_batch_prep(a.proj, a.B, a.rows, a.slot, a.taps, a.neg_exp_A, a.dt_bias, a.Hk,
                              a.Hv, a.Dk, a.Dv, a.K, a.workspace, stream);
  switch (a.Dk) {
    case 32:
      launch_state<32>(a, stream);
      break;
    case 64:
      launch_state<64>(a, stream);
      break;
    default:
      launch_state<128>(a, stream);
      break;
  }
}

int gdn_decode_v5_clusters(int Dk, int Dv) {
  const int n = Dv / kCols;
  return Dk == 32   ? persistent_clusters<32>(n)
         : Dk == 64 ? persistent_clusters<64>(n)
                    : persistent_clusters<128>(n);
}

}  // namespace lilac::lab
