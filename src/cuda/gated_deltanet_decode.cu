// Gated DeltaNet decode: one token, one fused kernel per layer.
//
// Bytes at the real shapes (Hk 16, Hv 32, Dk = Dv = 128, C = 8192, K = 4): the recurrent state,
// 32 x 128 x 128 f32 = 2 MiB, read and written once (4 MiB); proj 48 KiB; conv state 96 KiB read,
// 96 KiB written; taps 128 KiB. ~4.6 MB -> 1.1 us at 4.3 TB/s. FLOPs ~ 4 * 2 MiB/4 * 2 = 4 MFLOP
// (nothing). The floor is one DRAM round trip plus one pass over the state; the time goes to the
// chain of dependent steps, so the design counts them.
//
// Version 1 (measured 7.8 us per layer in a graph, H200): 128 blocks, two cross-block steps through
// a "last block to arrive" counter in global memory, each a __threadfence (waits for the block's
// writes to reach L2) plus an atomic round trip plus an L2 read by the last block: ~4 dependent L2
// round trips (~0.7 us each) on top of the state load and the launch. It lost to version 2 (5.9 us)
// and lives in the kernel lab (bench/lab/gdn_decode, `v1_counter.cu`), runnable beside this one.
//
// Version 2 (`gdn_decode_cluster_kernel`, sm_90): the same 128 blocks of 256 threads, grid
// (Dv/32, Hv), block (cb, v) owning value columns [32 cb, 32 cb + 32) of value head v, but the
// Hv/Hk x Dv/32 blocks that share key head kh (8 at the real shapes) form one thread-block cluster
// and talk through distributed shared memory and the cluster barrier (~0.2 us) instead of global
// memory:
//  - the 2 Dk q/k channels of key head kh are split over the cluster: rank r convolves channels
//    [r cpr, (r+1) cpr) (cpr = 2 Dk / cluster size = 32: one warp), owns their conv state (reads
//    and shifts it: no other block touches it, so no ordering is needed), and pushes the values and
//    their 32-channel sum of squares into every rank's shared memory (st.shared::cluster);
//  - barrier 1 (release/acquire): every block now holds the whole q and k of its key head;
//  - the state pass, in registers: thread (rg, cq) holds S rows 4rg..4rg+3 x columns 4cq..4cq+3
//    (four 16-byte loads issued first, so DRAM latency overlaps the conv); kS by shuffles and one
//    shared-memory pass; u = beta (v - e^g S^T k) computed by each thread for its own 4 columns
//    (no second barrier); S' = e^g S + k u^T stored in place; o = S'^T q likewise;
//  - the gated norm needs the head's mean square over Dv columns held by Dv/32 blocks: each block
//    pushes its sum of squares to every rank, barrier 2, each block normalises its own 32 outputs.
// Dependent steps: state + conv loads (one DRAM round trip, ~1 us with the 2 MiB transfer) ->
// conv -> push -> barrier -> 2 block barriers -> stores -> push -> barrier -> 32 bf16 stores.
// Predicted ~3 us per layer in a graph (launch gap ~1.5 us included). No workspace is used.
// Cluster ranks are taken from %cluster_ctarank only (rank r convolves slice r; pushes go to all
// ranks, indexed by the source's (value head in the group, column block)), so nothing depends on
// how the hardware linearises the cluster's blocks.
#include <algorithm>
#include <type_traits>

#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/gated_deltanet.h"
#include "cuda/gated_deltanet_step.cuh"
#include "cuda/launch.h"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using gdn::conv_silu;
using gdn::kCols;               // value columns per block
constexpr int kMaxCluster = 8;  // portable cluster size

// ---- version 2: thread-block clusters (sm_90)

// Cluster primitives: cluster.cuh. Addresses are 32-bit shared-window addresses.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ST: the recurrent state's element type (float, or bf16: model/state_format.h).
template <int DK, int KC, class ST>
__global__ void __launch_bounds__(2 * DK)
    gdn_decode_cluster_kernel(const float* __restrict__ proj, const float* __restrict__ taps,
                              float* __restrict__ conv_state, const float* __restrict__ neg_exp_A,
                              const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                              ST* __restrict__ state, int Hk, int Hv, int Dv, float eps,
                              bf16* __restrict__ out, const DecodeBatchRow* __restrict__ rows,
                              int slot, int proj_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NTH = 2 * DK, NW = NTH / 32;
  __shared__ __align__(16) float qk_all[2 * DK];   // post-conv q [0, DK) and k [DK, 2 DK) of kh
  __shared__ float ss_part[2 * DK / 32];           // sum of squares per 32-channel slice of qk_all
  __shared__ float ss_o[kMaxCluster];              // o's sum of squares per block of the cluster
  __shared__ __align__(16) float vs[kCols];        // post-conv v of this block's columns
  __shared__ __align__(16) float red[NW][kCols];   // per-warp partial column sums: S^T k
  __shared__ __align__(16) float red2[NW][kCols];  // ... and S'^T q
  __shared__ float s_beta, s_decay;

  // PDL (launch.h): the launch overlaps the previous kernel's tail; everything read below (the
  // projections, the states) waits for it.
  pdl_launch_dependents();
  pdl_wait();
  // The cluster's blocks all start before any remote store below (the wait sits after the loads).
  cluster::arrive_relaxed();

  const int cb = blockIdx.x, v = blockIdx.y, nsplit = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ratio = Hv / Hk, kh = v / ratio, vi = v % ratio;
  const int CS = ratio * nsplit, cpr = 2 * DK / CS;  // cluster size; q/k channels per rank
  const int C = 2 * Hk * DK + Hv * Dv;
  const int c0 = cb * kCols;
  const int cq = tid & 7, rg = tid >> 3;  // columns 4cq..4cq+3 (of 32), rows 4rg..4rg+3
  const uint32_t rank = cluster::ctarank();
  // Batched (gdn_decode_batch_cluster, the kernel lab's v2 batched): grid z = the batch row; its
  // projection row, output row and the states of layer slot `slot` of its own sequence.
  if (rows) {
    const int b = blockIdx.z;
    proj += size_t(b) * proj_stride;
    out += size_t(b) * Hv * Dv;
    conv_state = rows[b].conv + size_t(slot) * (KC - 1) * C;
    state = gdn::row_state<ST>(rows[b]) + size_t(slot) * Hv * DK * Dv;
  }

  // 1. This thread's 4 x 4 slice of S, in flight while the rest is computed; warp 0 also fetches
  //    what the final norm needs.
  ST* Sp = state + (size_t(v) * DK + 4 * rg) * Dv + c0 + 4 * cq;
  float4 S[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) S[i] = gdn::load_state4(Sp + size_t(i) * Dv);
  const float* z = proj + C + size_t(v) * Dv;
  float z_l = 0.f, w_l = 0.f;
  if (warp == 0) z_l = z[c0 + lane], w_l = norm_w[c0 + lane];

  // 2. Conv + SiLU. Threads tid < cpr: q/k channel j = rank * cpr + tid of key head kh (j < DK: q
  //    channel j, else k channel j - DK); the last warp: the v channels of this block's columns;
  //    thread 0: the gates.
  float qk_val = 0.f;
  int qk_j = 0;
  if (tid < cpr) {
    qk_j = int(rank) * cpr + tid;
    const int ch = qk_j < DK ? kh * DK + qk_j : Hk * DK + kh * DK + (qk_j - DK);
    float nxt[KC - 1];
    qk_val = conv_silu<KC>(conv_state, taps, proj[ch], ch, C, nxt);
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + ch] = nxt[r];
  }
  if (tid >= NTH - 32) {
    const int l = tid - (NTH - 32);
    const int ch = 2 * Hk * DK + v * Dv + c0 + l;
    float nxt[KC - 1];
    vs[l] = conv_silu<KC>(conv_state, taps, proj[ch], ch, C, nxt);
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + ch] = nxt[r];
  }
  if (tid == 0) {
    const float* ba = proj + C + size_t(Hv) * Dv;  // b [Hv], then a [Hv]
    s_beta = sigmoid(ba[v]);
    const float x = ba[Hv + v] + dt_bias[v];
    s_decay = expf(neg_exp_A[v] * (x > 20.f ? x : log1pf(expf(x))));
  }
  cluster::wait();  // every block of the cluster has started
  if (tid < cpr) {  // whole warps (cpr is a multiple of 32): push value and slice sum of squares
    const float ss = warp_sum(qk_val * qk_val);
    const uint32_t a_val = smem_u32(&qk_all[qk_j]), a_ss = smem_u32(&ss_part[qk_j / 32]);
    for (int r = 0; r < CS; ++r) {
      cluster::st_f32(cluster::map(a_val, uint32_t(r)), qk_val);
      if (lane == 0) cluster::st_f32(cluster::map(a_ss, uint32_t(r)), ss);
    }
  }
  cluster::sync();  // (1) q, k, their sums of squares, vs and the gates are visible

  // 3. l2norm: q by (sum q^2 + 1e-6)^-1/2 * Dk^-1/2, k by (sum k^2 + 1e-6)^-1/2.
  float ssq = 0.f, ssk = 0.f;
#pragma unroll
  for (int w = 0; w < DK / 32; ++w) ssq += ss_part[w], ssk += ss_part[DK / 32 + w];
  const float rq = rsqrtf(ssq + 1e-6f) * rsqrtf(float(DK)), rk = rsqrtf(ssk + 1e-6f);
  const float4 q4 = *reinterpret_cast<const float4*>(&qk_all[4 * rg]);
  const float4 k4 = *reinterpret_cast<const float4*>(&qk_all[DK + 4 * rg]);
  const float kr[4] = {k4.x * rk, k4.y * rk, k4.z * rk, k4.w * rk};
  const float qr[4] = {q4.x * rq, q4.y * rq, q4.z * rq, q4.w * rq};
  const float decay = s_decay, beta = s_beta;

  // 4. kS[c] = sum_i S[i][c] k[i] and u = beta (v - (e^g S)^T k) for this thread's 4 columns
  //    (gated_deltanet_step.cuh).
  const float4 kS = gdn::column_kS<NW>(S, kr, red, warp, lane, cq);
  const float4 v4 = *reinterpret_cast<const float4*>(&vs[4 * cq]);
  const float4 u4 = gdn::delta_u(kS, v4, beta, decay);

  // 5. S' = e^g S + k u^T (stored), o = S'^T q.
  gdn::update_store_o(S, kr, qr, u4, decay, Sp, Dv, red2, warp, lane, cq);

  // 6. Gated RMS norm over the head: out = w * o * rsqrt(mean(o^2) + eps) * silu(z); warp 0's
  //    lanes are this block's 32 columns.
  float ov = 0.f, ss = 0.f;
  if (warp == 0) {
    ov = gdn::block_o<NW>(red2, lane);
    ss = warp_sum(ov * ov);
    if (nsplit > 1 && lane == 0) {
      const uint32_t a_ss = smem_u32(&ss_o[vi * nsplit + cb]);
      for (int r = 0; r < CS; ++r) cluster::st_f32(cluster::map(a_ss, uint32_t(r)), ss);
    }
  }
  if (nsplit > 1) {
    cluster::sync();  // (2) the sums of squares of the head's Dv / 32 blocks are here
    if (warp == 0) {
      ss = 0.f;
      for (int c = 0; c < nsplit; ++c) ss += ss_o[vi * nsplit + c];
    }
  }
  if (warp == 0) {
    const float r = rsqrtf(ss / float(Dv) + eps);
    out[size_t(v) * Dv + c0 + lane] = __float2bfloat16_rn(w_l * (ov * r) * silu(z_l));
  }
#else
  __trap();  // launched only where the cluster kernel was compiled for sm_90 (see cluster_ok)
#endif
}

// The cluster kernel's shape rule: the Hv/Hk value heads x Dv/32 column blocks of a key head form
// one cluster of at most 8 blocks, and its 2 Dk q/k channels split into whole warps per rank.
bool cluster_shape_ok(int Hk, int Hv, int Dk, int Dv) {
  const int cs = Hv / Hk * (Dv / kCols);
  return cs <= kMaxCluster && (2 * Dk) % cs == 0 && (2 * Dk / cs) % 32 == 0;
}

// The cluster kernel exists as machine code for sm_90a only (the compute_80 PTX holds a trap), so
// it runs on compute capability 9.0 devices; read once per device.
bool device_is_cc90() {
  return device_compute_capability() == 90;
}

struct DecodeArgs {
  const float *proj, *taps;
  float* conv_state;
  const float *neg_exp_A, *dt_bias, *norm_w;
  float* state;  // one of the two (the other null; batched: both null, rows[] has them)
  bf16* state_bf16;
  int Hk, Hv, Dv;
  float eps;
  bf16* out;
  const DecodeBatchRow* rows = nullptr;  // batched: B rows, grid z (f32 states)
  int B = 1, slot = 0, proj_stride = 0;
};

template <int DK, int KC>
void launch_gdn_decode(const DecodeArgs& a, cudaStream_t stream) {
  // Clusters of the whole grid row (a head's column blocks) x the value heads of one key head.
  const dim3 cluster{unsigned(a.Dv / kCols), unsigned(a.Hv / a.Hk)},
      grid{unsigned(a.Dv / kCols), unsigned(a.Hv), unsigned(a.B)};
  if (a.state_bf16)
    launch_cluster_kernel(true, cluster, gdn_decode_cluster_kernel<DK, KC, bf16>, grid,
                          dim3(2 * DK), 0, stream, a.proj, a.taps, a.conv_state, a.neg_exp_A,
                          a.dt_bias, a.norm_w, a.state_bf16, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                          a.slot, a.proj_stride);
  else
    launch_cluster_kernel(true, cluster, gdn_decode_cluster_kernel<DK, KC, float>, grid,
                          dim3(2 * DK), 0, stream, a.proj, a.taps, a.conv_state, a.neg_exp_A,
                          a.dt_bias, a.norm_w, a.state, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                          a.slot, a.proj_stride);
}

template <int DK>
void launch_gdn_decode_k(int K, const DecodeArgs& a, cudaStream_t stream) {
  switch (K) {
    case 2:
      launch_gdn_decode<DK, 2>(a, stream);
      break;
    case 3:
      launch_gdn_decode<DK, 3>(a, stream);
      break;
    default:
      launch_gdn_decode<DK, 4>(a, stream);
      break;
  }
}

void launch_gdn_decode_dk(int Dk, int K, const DecodeArgs& a, cudaStream_t stream) {
  switch (Dk) {
    case 32:
      launch_gdn_decode_k<32>(K, a, stream);
      break;
    case 64:
      launch_gdn_decode_k<64>(K, a, stream);
      break;
    default:
      launch_gdn_decode_k<128>(K, a, stream);
      break;
  }
}

// The shapes and the device both launchers accept (`who` names the launcher in the message).
void check_decode(const char* who, int Hk, int Hv, int Dk, int Dv, int K) {
  if (Hk <= 0 || Hv % Hk != 0)
    fail("{}: {} value heads not a multiple of {} key heads", who, Hv, Hk);
  if (Dv <= 0 || Dv % kCols != 0) fail("{}: Dv {} not a multiple of {}", who, Dv, kCols);
  if (K < 2 || K > 4) fail("{}: conv kernel {} not supported (2..4)", who, K);
  if (Dk != 32 && Dk != 64 && Dk != 128) fail("{}: Dk {} not supported (32, 64, 128)", who, Dk);
  if (!cluster_shape_ok(Hk, Hv, Dk, Dv))
    fail("{}: no cluster kernel for Hk {} Hv {} Dk {} Dv {} (at most 8 blocks per key head)", who,
         Hk, Hv, Dk, Dv);
  if (!device_is_cc90())
    fail(
        "{}: the cluster kernel needs a compute capability 9.0 GPU (the counter kernel for other "
        "devices is version 1 of bench/lab/gdn_decode)",
        who);
}

}  // namespace

bool gdn_decode_uses_cluster(int Hk, int Hv, int Dk, int Dv) {
  return Hk > 0 && Hv % Hk == 0 && Dv % kCols == 0 && cluster_shape_ok(Hk, Hv, Dk, Dv) &&
         device_is_cc90();
}

namespace {

// One row; ST: the recurrent state's element type (float or bf16), which picks the kernel.
template <class ST>
void gdn_decode_row(const float* proj, const float* conv_taps, float* conv_state,
                    const float* neg_exp_A, const float* dt_bias, const float* norm_scale,
                    ST* state, int Hk, int Hv, int Dk, int Dv, int K, float eps, bf16* out,
                    cudaStream_t stream) {
  check_decode("gdn_decode", Hk, Hv, Dk, Dv, K);
  if (!state) fail("gdn_decode: null state");
  DecodeArgs a{proj,    conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, nullptr,
               nullptr, Hk,        Hv,         Dv,        eps,     out};
  if constexpr (std::is_same_v<ST, bf16>)
    a.state_bf16 = state;
  else
    a.state = state;
  launch_gdn_decode_dk(Dk, K, a, stream);
}

}  // namespace

void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, float* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, bf16* out, cudaStream_t stream) {
  gdn_decode_row(proj, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state, Hk, Hv, Dk, Dv,
                 K, eps, out, stream);
}

void gdn_decode(const float* proj, const float* conv_taps, float* conv_state,
                const float* neg_exp_A, const float* dt_bias, const float* norm_scale, bf16* state,
                int Hk, int Hv, int Dk, int Dv, int K, float eps, bf16* out, cudaStream_t stream) {
  gdn_decode_row(proj, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state, Hk, Hv, Dk, Dv,
                 K, eps, out, stream);
}

void gdn_decode_batch_cluster(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                              const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                              const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K,
                              float eps, bf16* out, cudaStream_t stream) {
  if (!proj || !rows || !out) fail("gdn_decode_batch_cluster: null pointer");
  if (B < 1 || B > 65535) fail("gdn_decode_batch_cluster: B = {}", B);
  check_decode("gdn_decode_batch_cluster", Hk, Hv, Dk, Dv, K);
  DecodeArgs a{proj,    conv_taps, nullptr, neg_exp_A, dt_bias, norm_scale, nullptr,
               nullptr, Hk,        Hv,      Dv,        eps,     out};
  a.rows = rows;
  a.B = B;
  a.slot = slot;
  a.proj_stride = int(Dk * Hk * 2 + Hv * Dv * 2 + 2 * Hv);
  launch_gdn_decode_dk(Dk, K, a, stream);
}

}  // namespace lilac::cuda
