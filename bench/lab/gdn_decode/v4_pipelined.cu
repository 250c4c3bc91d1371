// gdn_decode version 4, the pipelined state pass (batched only; lost to version 3, production's
// gdn_decode_batch: numbers in README.md). Written in src/cuda/gated_deltanet_decode_batch.cu
// (commit 252c002) as a candidate and moved here after the lab run: the state kernel unchanged, its
// launcher's cluster set-up now in one helper; the prep kernel is production's
// (cuda::gdn_decode_batch_prep).
#include <algorithm>

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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// Production's workspace row (gated_deltanet_decode_batch.cu): q, k [Hk Dk], v, z [Hv Dv], beta,
// decay [Hv], rounded up to 4 floats.
int ws_row_floats(int Hk, int Hv, int Dk, int Dv) {
  return (2 * Hk * Dk + 2 * Hv * Dv + 2 * Hv + 3) & ~3;
}

// The state pass as a persistent loop. Grid
// (Dv/32, clusters): cluster c (a head's Dv/32 column blocks, as v3) takes the items (row b, value
// head v) = c, c + clusters, ... and, while it computes one, has the next one's 16 KiB of state and
// its workspace values (q, k, v, beta, decay) in flight in registers: v3's blocks load once and
// then compute, so an SM's loads stop while its resident blocks sit in their barriers (2.7 TB/s at
// 16 rows). The per-item arithmetic is v3's, step for step: the same results bit for bit. The
// norm's sums of squares alternate between two shared slots by item parity (a block's next item may
// write a neighbour's slot while the neighbour still reads the previous item's sums).
template <int DK>
__global__ void __launch_bounds__(2 * DK, 3)
    gdn_batch_state_pipelined_kernel(const float* __restrict__ ws, int ws_row,
                                     const float* __restrict__ norm_w, int Hk, int Hv, int Dv,
                                     float eps, bf16* __restrict__ out,
                                     const DecodeBatchRow* __restrict__ rows, int slot, int B) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NTH = 2 * DK, NW = NTH / 32;
  __shared__ __align__(16) float red[NW][kCols];
  __shared__ __align__(16) float red2[NW][kCols];
  __shared__ float ss_o[2][kMaxCluster];

  const int cb = blockIdx.x, nsplit = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ratio = Hv / Hk;
  const int c0 = cb * kCols;
  const int cq = tid & 7, rg = tid >> 3;
  const int items = Hv * B, stride = int(gridDim.y);
  const size_t head_floats = size_t(DK) * Dv;

  pdl_launch_dependents();
  if (nsplit > 1) cluster::arrive_relaxed();
  float w_l = 0.f;
  if (warp == 0) w_l = norm_w[c0 + lane];

  // The item's state slice: rows 4rg..4rg+3, columns c0 + 4cq..+3 of head v of row b.
  auto state_at = [&](int it) {
    const int b = it / Hv, v = it % Hv;
    return rows[b].rec + size_t(slot) * Hv * head_floats + size_t(v) * head_floats +
           size_t(4 * rg) * Dv + c0 + 4 * cq;
  };
  float4 S[4], Sn[4];
  int it = int(blockIdx.y);
  if (it < items) {
    const float* Sp = state_at(it);
#pragma unroll
    for (int i = 0; i < 4; ++i) Sn[i] = *reinterpret_cast<const float4*>(Sp + size_t(i) * Dv);
  }
  pdl_wait();  // the workspace comes from the prep kernel
  float4 qn, kn, vn;
  float betan = 0.f, decayn = 0.f, zn = 0.f;
  auto load_ws = [&](int i) {
    const int b = i / Hv, v = i % Hv, kh = v / ratio;
    const float* wsr = ws + size_t(b) * ws_row;
    qn = *reinterpret_cast<const float4*>(wsr + kh * DK + 4 * rg);
    kn = *reinterpret_cast<const float4*>(wsr + Hk * DK + kh * DK + 4 * rg);
    vn = *reinterpret_cast<const float4*>(wsr + 2 * Hk * DK + v * Dv + c0 + 4 * cq);
    betan = wsr[2 * Hk * DK + 2 * Hv * Dv + v];
    decayn = wsr[2 * Hk * DK + 2 * Hv * Dv + Hv + v];
    if (warp == 0) zn = wsr[2 * Hk * DK + Hv * Dv + size_t(v) * Dv + c0 + lane];
  };
  if (it < items) load_ws(it);
  if (nsplit > 1) cluster::wait();  // every block of the cluster has started
  for (int parity = 0; it < items; it += stride, parity ^= 1) {
    const int b = it / Hv, v = it % Hv;
    float* Sp = const_cast<float*>(state_at(it));
#pragma unroll
    for (int i = 0; i < 4; ++i) S[i] = Sn[i];
    const float kr[4] = {kn.x, kn.y, kn.z, kn.w};
    const float qr[4] = {qn.x, qn.y, qn.z, qn.w};
    const float4 v4 = vn;
    const float beta = betan, decay = decayn, z_l = zn;
    // The next item's loads, in flight during this one.
    const int next = it + stride;
    if (next < items) {
      const float* Np = state_at(next);
#pragma unroll
      for (int i = 0; i < 4; ++i) Sn[i] = *reinterpret_cast<const float4*>(Np + size_t(i) * Dv);
      load_ws(next);
    }

    const float4 u4 = gdn::delta_u(gdn::column_kS<NW>(S, kr, red, warp, lane, cq), v4, beta, decay);
    gdn::update_store_o(S, kr, qr, u4, decay, Sp, Dv, red2, warp, lane, cq);

    float ov = 0.f, ss = 0.f;
    if (warp == 0) {
      ov = gdn::block_o<NW>(red2, lane);
      ss = warp_sum(ov * ov);
    }
    if (nsplit > 1) {
      if (warp == 0 && lane == 0) {
        const uint32_t a_ss = smem_u32(&ss_o[parity][cb]);
        for (int r = 0; r < nsplit; ++r) cluster::st_f32(cluster::map(a_ss, uint32_t(r)), ss);
      }
      cluster::sync();  // the head's Dv / 32 sums of squares are here
      if (warp == 0) {
        ss = 0.f;
        for (int c = 0; c < nsplit; ++c) ss += ss_o[parity][c];
      }
    }
    if (warp == 0) {
      const float r = rsqrtf(ss / float(Dv) + eps);
      out[(size_t(b) * Hv + v) * Dv + c0 + lane] = __float2bfloat16_rn(w_l * (ov * r) * silu(z_l));
    }
  }
  // A block may leave only when no neighbour can still write its ss_o (the last item's sync is
  // the last remote write; blocks with no item at all skipped it together with their cluster).
#else
  __trap();  // sm_90 only (check_batch refuses other devices)
#endif
}

// Grid (nsplit, clusters) of 2 DK threads in clusters of nsplit blocks along x (vec_util.cuh's
// launch_config; PDL when `pdl`).
template <int DK>
cudaLaunchConfig_t cluster_config(int nsplit, int clusters, cudaStream_t stream, bool pdl,
                                  cudaLaunchAttribute (&attr)[2]) {
  const dim3 cluster{unsigned(nsplit)};
  return cuda::launch_config(gdn_batch_state_pipelined_kernel<DK>,
                             dim3(unsigned(nsplit), unsigned(clusters)), dim3(2 * DK), 0, stream,
                             &cluster, pdl, attr);
}

// Clusters of `nsplit` blocks resident at once (0: cannot run).
template <int DK>
int pipelined_clusters(int nsplit) {
  static int cached[kMaxCluster + 1] = {};
  int& n = cached[nsplit];
  if (n == 0) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = cluster_config<DK>(nsplit, 1024, nullptr, false, attr);
    if (cudaOccupancyMaxActiveClusters(&n, gdn_batch_state_pipelined_kernel<DK>, &cfg) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      n = -1;
    }
  }
  return n;
}

template <int DK>
void launch_state(const GdnDecodeBatchArgs& a, cudaStream_t stream) {
  const int ws_row = ws_row_floats(a.Hk, a.Hv, DK, a.Dv);
  const int nsplit = a.Dv / kCols, clusters = pipelined_clusters<DK>(nsplit);
  if (clusters <= 0) fail("gdn_decode v4: no cluster of {} blocks fits an SM", nsplit);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      cluster_config<DK>(nsplit, std::min(clusters, a.Hv * a.B), stream, true, attr);
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gdn_batch_state_pipelined_kernel<DK>, a.workspace,
                                      ws_row, a.norm_w, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                                      a.slot, a.B));
  LILAC_CUDA_LAUNCHED();
}

}  // namespace

void gdn_decode_v4_pipelined(const GdnDecodeBatchArgs& a, cudaStream_t stream) {
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

}  // namespace lilac::lab
