// Gated DeltaNet decode over B rows (the batched decode pass): each row its own sequence's conv
// and recurrent state through DecodeBatchRow pointers (layer slot `slot`). Two kernels per layer.
// Version 3 of the kernel lab's gdn_decode (bench/lab/gdn_decode/README.md, "v3 split"); the
// single-row decode stays on version 2, the cluster kernel of gated_deltanet_decode.cu, which also
// ran this batched pass (grid z = the row) until s6.
//
// Why (H200, s6 run 1, the lab at the real shapes, graphs of 30 layers): the cluster kernel over
// B rows took 35.5 us per layer at 16 rows (2.0 TB/s for 71 MB of state and conv traffic) and
// 122.9 us at 64 (2.3 TB/s). It holds 62 registers, so 4 of its 256-thread blocks fit an SM: 528
// resident blocks, 3.9 waves at 16 rows, 15.5 at 64; every block runs the same chain (state + conv
// loads -> cluster barrier for the q/k conv split -> kS -> update + store -> o -> cluster barrier
// -> output), the waves start in lockstep, and DRAM idles while a wave sits in its barriers. Split
// as below: 26.7 / 96.2 us per layer (2.7 / 3.0 TB/s), outputs and states bit-identical to it.
//
// Kernel 1, prep: grid (Hk, B), 2 Dk threads (Dk threads of two channels each when the grid would
// not fit one wave: gdn_batch_prep_kernel's CPT). Block (kh, b): thread j convolves q/k channel j
// of key head kh (j < Dk: q, else k), shifts its conv state, the warps' sums of squares give the
// l2norm (as v2: per 32-channel slice, slices summed in order); then the Hv/Hk x Dv v channels of
// the key head's value heads (conv + SiLU, conv state shifted) and their gates. It writes row b's
// workspace row: q * (sum q^2 + 1e-6)^-1/2 Dk^-1/2 [Hk Dk], k * (sum k^2 + 1e-6)^-1/2 [Hk Dk],
// v [Hv Dv], z [Hv Dv] (a copy of the gate), beta [Hv], decay = e^g [Hv], f32
// (gdn_decode_batch_workspace_floats: B rows of 2 Hk Dk + 2 Hv Dv + 2 Hv floats rounded up to 4:
// 12,352 floats = 48 KiB per row at the real shapes; 0.8 MiB at 16 rows, 3 MiB at 64, L2-resident).
//
// Kernel 2, state: grid (Dv/32, Hv, B), 2 Dk threads; thread (rg, cq) holds S rows 4rg..4rg+3 x
// columns 4cq..4cq+3 of the block's 32 (as v2), but
//  - no conv work and no cluster barrier before the state update: after the PDL wait it loads its
//    16 KiB of state and the q, k, v, z, beta, decay of its row from the workspace (L2) together,
//    then goes straight to kS, the update + store, o;
//  - the only cross-block step is the gated norm's sum of squares over a head's Dv/32 column
//    blocks: a cluster of Dv/32 = 4 blocks, one cluster barrier after the state stores are issued;
//  - fewer registers: __launch_bounds__(256, kMinBlocks) asks for 5 blocks per SM
//    (48 registers at the real shapes).
// Per-row arithmetic is v2's, operation for operation (the same conv_silu, the same slice sums of
// squares in the same order, the same products kr = k * rk and qr = q * rq, the same kS and o
// reductions and norm): the outputs and states equal gdn_decode's bit for bit
// (tests/cuda/batch_kernels_test.cpp). The rows[] pointers are read before the PDL wait (uploaded
// by the host before the step, written by no kernel).
#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "cuda/bulk_copy.cuh"
#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/gated_deltanet.h"
#include "cuda/gated_deltanet_step.cuh"
#include "cuda/launch.h"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using gdn::conv_silu;
using gdn::kCols;               // value columns per state block
constexpr int kMaxCluster = 8;  // portable cluster size (Dv <= 256)
// The head kernel's block: at most 256 threads, two 16-row groups per thread at the real shapes
// (s16 run 2: 512 threads, one group each, measured the same, 6,342 against 6,358 tok/s at c=64).
constexpr int kHeadMaxThreads = 256;
// State kernel: resident 256-thread blocks per SM asked of ptxas. With the bf16 state a block
// moves half the bytes, so more blocks per SM keep more of them in flight: 6 (40 registers, 20
// bytes of spills; s15: 5 blocks with the bf16 state was the first measurement).
template <class ST>
constexpr int kMinBlocks = std::is_same_v<ST, bf16> ? 6 : 5;

// Floats of one workspace row: q [Hk Dk], k [Hk Dk], v [Hv Dv], z [Hv Dv], beta [Hv], decay [Hv],
// rounded up to 4 (16-byte aligned rows).
int ws_row_floats(int Hk, int Hv, int Dk, int Dv) {
  return (2 * Hk * Dk + 2 * Hv * Dv + 2 * Hv + 3) & ~3;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ---- kernel 1, prep: conv, l2norm, gates -> workspace

// CPT: q/k channels per thread. 1: 2 DK threads, thread j < DK convolves q channel j, thread DK + j
// k channel j. 2: DK threads, thread j both (q_j, then k_j): half the threads, asked to fit 64
// registers (8 blocks of 128 per SM at the real shapes), so that a batch of 64 rows (1,024
// blocks) is one wave instead of the CPT = 1 form's two (64 registers x 256 threads: 4 blocks per
// SM; s19 run 2: 8.6 us per call at 64 rows, 4.8 at 16; run 4, CPT = 2 at 64 rows: 7.8 us). The
// same operations per channel, the same 32-channel slices summed in the same order: the same bits
// either way.
template <int DK, int KC, int CPT>
__global__ void __launch_bounds__(2 * DK / CPT, CPT == 2 ? 8 : 1)
    gdn_batch_prep_kernel(const float* __restrict__ proj, const float* __restrict__ taps,
                          float* __restrict__ conv_state, const float* __restrict__ neg_exp_A,
                          const float* __restrict__ dt_bias, int Hk, int Hv, int Dv,
                          float* __restrict__ ws, int ws_row,
                          const DecodeBatchRow* __restrict__ rows, int slot, int proj_stride) {
  static_assert(CPT == 1 || CPT == 2, "q/k channels per thread: 1 or 2");
  constexpr int NTH = 2 * DK / CPT;
  __shared__ float ss_part[2 * DK / 32];  // sum of squares per 32-channel slice: q, then k slices

  const int kh = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31;
  const int ratio = Hv / Hk;
  const int C = 2 * Hk * DK + Hv * Dv;
  if (rows) {  // host-uploaded before the step: no wait needed
    conv_state = rows[b].conv + size_t(slot) * (KC - 1) * C;
    proj += size_t(b) * proj_stride;
  }
  ws += size_t(b) * ws_row;
  float* ws_q = ws;
  float* ws_k = ws + Hk * DK;
  float* ws_v = ws + 2 * Hk * DK;
  float* ws_z = ws_v + Hv * Dv;
  float* ws_beta = ws_z + Hv * Dv;
  float* ws_decay = ws_beta + Hv;

  pdl_launch_dependents();
  // Everything below reads proj (the previous kernel's output) or writes: after the wait.
  pdl_wait();

  // q/k channel j = tid + c DK of key head kh (j < DK: q channel j, else k channel j - DK).
  float qk[CPT];
#pragma unroll
  for (int c = 0; c < CPT; ++c) {
    const int j = tid + c * DK;
    const int ch = j < DK ? kh * DK + j : Hk * DK + kh * DK + (j - DK);
    float nxt[KC - 1];
    qk[c] = conv_silu<KC>(conv_state, taps, proj[ch], ch, C, nxt);
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + ch] = nxt[r];
    const float ss = warp_sum(qk[c] * qk[c]);
    if (lane == 0) ss_part[j / 32] = ss;  // (j / 32 = warp + c DK / 32)
  }

  // The v channels of the key head's value heads (contiguous: value heads kh*ratio ..), and their
  // gates.
  for (int l = tid; l < ratio * Dv; l += NTH) {
    const int vc = kh * ratio * Dv + l;  // index into v [Hv Dv]
    const int chv = 2 * Hk * DK + vc;
    float nv[KC - 1];
    ws_v[vc] = conv_silu<KC>(conv_state, taps, proj[chv], chv, C, nv);
    ws_z[vc] = proj[C + vc];  // the gate z of the same column (see the state kernel's step 2)
#pragma unroll
    for (int r = 0; r < KC - 1; ++r) conv_state[size_t(r) * C + chv] = nv[r];
  }
  if (tid < ratio) {
    const int v = kh * ratio + tid;
    const float* ba = proj + C + size_t(Hv) * Dv;  // b [Hv], then a [Hv]
    ws_beta[v] = sigmoid(ba[v]);
    const float x = ba[Hv + v] + dt_bias[v];
    ws_decay[v] = expf(neg_exp_A[v] * (x > 20.f ? x : log1pf(expf(x))));
  }
  __syncthreads();

  // l2norm as v2: q by (sum q^2 + 1e-6)^-1/2 * Dk^-1/2, k by (sum k^2 + 1e-6)^-1/2.
  float ssq = 0.f, ssk = 0.f;
#pragma unroll
  for (int w = 0; w < DK / 32; ++w) ssq += ss_part[w], ssk += ss_part[DK / 32 + w];
#pragma unroll
  for (int c = 0; c < CPT; ++c) {
    const int j = tid + c * DK;
    if (j < DK) {
      const float rq = rsqrtf(ssq + 1e-6f) * rsqrtf(float(DK));
      ws_q[kh * DK + j] = qk[c] * rq;
    } else {
      const float rk = rsqrtf(ssk + 1e-6f);
      ws_k[kh * DK + (j - DK)] = qk[c] * rk;
    }
  }
}

// ---- kernel 2, state: the state pass and the gated norm

// ST: the recurrent state's element type (float, or bf16: model/state_format.h); rows[b].rec or
// rows[b].rec_bf16 (decode_batch.h).
template <int DK, class ST>
__global__ void __launch_bounds__(2 * DK, kMinBlocks<ST>)
    gdn_batch_state_kernel(const float* __restrict__ ws, int ws_row,
                           const float* __restrict__ norm_w, int Hk, int Hv, int Dv, float eps,
                           bf16* __restrict__ out, const DecodeBatchRow* __restrict__ rows,
                           int slot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NTH = 2 * DK, NW = NTH / 32;
  __shared__ __align__(16) float red[NW][kCols];   // per-warp partial column sums: S^T k
  __shared__ __align__(16) float red2[NW][kCols];  // ... and S'^T q
  __shared__ float ss_o[kMaxCluster];              // o's sum of squares per column block of head v

  const int cb = blockIdx.x, v = blockIdx.y, nsplit = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ratio = Hv / Hk, kh = v / ratio;
  const int c0 = cb * kCols;
  const int cq = tid & 7, rg = tid >> 3;  // columns 4cq..4cq+3 (of 32), rows 4rg..4rg+3
  // Batched: grid z = the row. Only the state pointer is formed before the wait (rows[] is
  // uploaded by the host before the step); the other row offsets are formed where they are used,
  // from the kernel parameters, so they hold no registers across the state pass.
  const size_t b = blockIdx.z;
  ST* const state = gdn::row_state<ST>(rows[b]) + size_t(slot) * Hv * DK * Dv;

  pdl_launch_dependents();
  // 1. The norm weights before the wait; the cluster's blocks all start before any remote store
  //    below (the cluster wait sits before the push). Then this thread's 4 x 4 slice of S. (The
  //    lab's v3 issued these loads before the wait, written by no kernel of the step; after it
  //    they measured faster, s6: 29.1 -> 26.5 us per layer at 16 rows, 107.8 -> 91.2 at 64.)
  if (nsplit > 1) cluster::arrive_relaxed();
  float w_l = 0.f;
  if (warp == 0) w_l = norm_w[c0 + lane];
  pdl_wait();
  ST* Sp = state + (size_t(v) * DK + 4 * rg) * Dv + c0 + 4 * cq;
  float4 S[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) S[i] = gdn::load_state4(Sp + size_t(i) * Dv);

  // 2. The workspace row (kernel 1's output, L2) and z.
  // Besides the state (last written a pass earlier), everything read after the wait comes from the
  // workspace, i.e. from kernel 1, this kernel's PDL prerequisite, whose writes the wait makes
  // visible. z is in it as a copy: read from proj (the
  // in_proj kernel's output, two launches back), it would depend on the wait's transitive
  // ordering, which the PDL contract does not state.
  const float* wsr = ws + b * ws_row;
  float z_l = 0.f;
  if (warp == 0) z_l = wsr[2 * Hk * DK + Hv * Dv + size_t(v) * Dv + c0 + lane];
  const float4 q4 = *reinterpret_cast<const float4*>(wsr + kh * DK + 4 * rg);
  const float4 k4 = *reinterpret_cast<const float4*>(wsr + Hk * DK + kh * DK + 4 * rg);
  const float4 v4 = *reinterpret_cast<const float4*>(wsr + 2 * Hk * DK + v * Dv + c0 + 4 * cq);
  const float beta = wsr[2 * Hk * DK + 2 * Hv * Dv + v];
  const float decay = wsr[2 * Hk * DK + 2 * Hv * Dv + Hv + v];
  const float kr[4] = {k4.x, k4.y, k4.z, k4.w};
  const float qr[4] = {q4.x, q4.y, q4.z, q4.w};

  // 3. kS[c] = sum_i S[i][c] k[i] and u = beta (v - e^g S^T k) for this thread's 4 columns, in
  //    v2's order (gated_deltanet_step.cuh).
  const float4 u4 = gdn::delta_u(gdn::column_kS<NW>(S, kr, red, warp, lane, cq), v4, beta, decay);

  // 4. S' = e^g S + k u^T (stored in place), o = S'^T q.
  gdn::update_store_o(S, kr, qr, u4, decay, Sp, Dv, red2, warp, lane, cq);

  // 5. Gated RMS norm over the head: out = w * o * rsqrt(mean(o^2) + eps) * silu(z); warp 0's
  //    lanes are this block's 32 columns; the head's Dv/32 blocks (the cluster) swap their sums of
  //    squares, summed in column-block order as v2 does.
  float ov = 0.f, ss = 0.f;
  if (warp == 0) {
    ov = gdn::block_o<NW>(red2, lane);
    ss = warp_sum(ov * ov);
  }
  if (nsplit > 1) {
    cluster::wait();  // every block of the cluster has started
    if (warp == 0 && lane == 0) {
      const uint32_t a_ss = smem_u32(&ss_o[cb]);
      for (int r = 0; r < nsplit; ++r) cluster::st_f32(cluster::map(a_ss, uint32_t(r)), ss);
    }
    cluster::sync();  // the head's Dv / 32 sums of squares are here
    if (warp == 0) {
      ss = 0.f;
      for (int c = 0; c < nsplit; ++c) ss += ss_o[c];
    }
  }
  if (warp == 0) {
    const float r = rsqrtf(ss / float(Dv) + eps);
    out[(b * Hv + v) * Dv + c0 + lane] = __float2bfloat16_rn(w_l * (ov * r) * silu(z_l));
  }
#else
  __trap();  // sm_90 only (check_batch refuses other devices)
#endif
}

// ---- kernel 2, version 6 ("head"): persistent blocks over (row, value head) items, no cluster
//
// Why (docs/kernels.md, "Sixteenth session"): the split kernel above keeps a block's 4 x 4 state
// slice in registers, so the state bytes an SM has in flight are bounded by its resident blocks
// (6 x 8 KiB in bf16), and every block lives through a DRAM round trip, two block barriers and a
// cluster barrier: at 64 rows 10 waves, ~1.7 TB/s. Here a block owns whole heads: item (b, v) is
// row b's head v, its Dk x Dv state contiguous in memory (32 KiB in bf16, 64 in f32). One thread
// per block streams the next items' states and their workspace values (q, k of the key head, v, z
// of the head) into a ring of `stages` shared-memory slots with the bulk copy engine
// (bulk_copy.cuh), while the block computes the current item from shared memory: the bytes in
// flight are bounded by shared memory, and the head's gated norm needs no cluster (the block has
// all Dv columns).
//
// Threads: (cp, rs), cp = tid % (Dv/2) the column pair 2cp, 2cp + 1, rs = tid / (Dv/2) a slice of
// gpt consecutive 16-row groups (group w: rows 16w..16w+15; Dk/16 groups). The split kernel's
// warp w holds exactly group w, so the sums below are its sums, in its order: per column, t(rg) =
// the 4-row FMA chain from 0, a group's partial (t0 + t1) + (t2 + t3) (its two xor shuffles), the
// groups summed from 0 in order (its red/red2 loop), the norm's sum of squares warp_sum over each
// 32-column block and those summed in block order (its cluster exchange). Outputs and states equal
// gdn_decode's bit for bit (tests/cuda/batch_kernels_test.cpp).
// Shared memory: stages x slot (state [Dk][Dv] ST, then q [Dk], k [Dk], v [Dv], z [Dv] f32), red
// and red2 [Dk/16][Dv] f32, the 32-column blocks' sums of squares, the slots' barriers.
template <int DK, class ST>
struct HeadLayout {
  int Dv, stages;
  __host__ __device__ size_t state_bytes() const { return size_t(DK) * Dv * sizeof(ST); }
  __host__ __device__ size_t slot_bytes() const {
    return state_bytes() + size_t(2 * DK + 2 * Dv) * sizeof(float);
  }
  __host__ __device__ size_t red_offset() const { return size_t(stages) * slot_bytes(); }
  __host__ __device__ size_t ss_offset() const {
    return red_offset() + 2 * size_t(DK / 16) * Dv * sizeof(float);
  }
  __host__ __device__ size_t bar_offset() const {
    return ss_offset() + kMaxCluster * sizeof(float);
  }
  __host__ __device__ size_t bytes() const { return bar_offset() + size_t(stages) * 8; }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (the kernel is sm_90 only)
// Two consecutive columns of one state row (8 bytes in f32, 4 in bf16), widened to f32; and back,
// rounded as store_state4 rounds.
__device__ __forceinline__ float2 load_state2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 load_state2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ void store_state2(float* p, float2 v) {
  *reinterpret_cast<float2*>(p) = v;
}
__device__ __forceinline__ void store_state2(bf16* p, float2 v) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v.x, v.y);
}
#endif

// Group w's partial sums for the thread's two columns: row(r, f) gives row r's two values and
// sets f, its factor (k or q); each 4-row block's FMA chain from 0, then (t0 + t1) + (t2 + t3),
// the split kernel's in-thread chain and its two xor shuffles.
template <class Row>
__device__ __forceinline__ float2 group_dot(int w, Row row) {
  float t[4][2];
#pragma unroll
  for (int rg = 0; rg < 4; ++rg) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f;
      const float2 sv = row(16 * w + 4 * rg + i, f);
      a0 += sv.x * f;
      a1 += sv.y * f;
    }
    t[rg][0] = a0, t[rg][1] = a1;
  }
  return make_float2((t[0][0] + t[1][0]) + (t[2][0] + t[3][0]),
                     (t[0][1] + t[1][1]) + (t[2][1] + t[3][1]));
}

template <int DK, class ST>
__global__ void __launch_bounds__(kHeadMaxThreads)
    gdn_batch_head_kernel(const float* __restrict__ ws, int ws_row,
                          const float* __restrict__ norm_w, int Hk, int Hv, int Dv, float eps,
                          bf16* __restrict__ out, const DecodeBatchRow* __restrict__ rows, int slot,
                          int items, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int NG = DK / 16;           // 16-row groups
  constexpr size_t kCopyBytes = 16384;  // a state is copied in pieces of at most 16 KiB
  const HeadLayout<DK, ST> L{Dv, stages};
  float* red = reinterpret_cast<float*>(smem + L.red_offset());  // [NG][Dv]: S^T k partials
  float* red2 = red + NG * Dv;                                   // [NG][Dv]: S'^T q partials
  float* ss_part = reinterpret_cast<float*>(smem + L.ss_offset());
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bar_offset());
  const int tid = threadIdx.x, lane = tid & 31;
  const int nc2 = Dv / 2, cp = tid % nc2, rs = tid / nc2;
  const int gpt = NG / (int(blockDim.x) / nc2);  // groups per thread
  const int ratio = Hv / Hk;
  const int step = int(gridDim.x);

  if (tid == 0) {
    for (int s = 0; s < stages; ++s) bulk::init(&full[s], 1);
    bulk::fence_init();
  }
  const float w_l = tid < Dv ? norm_w[tid] : 0.f;  // no kernel of the step writes it
  __syncthreads();
  pdl_launch_dependents();
  pdl_wait();  // the workspace is the prep kernel's output

  // Thread 0 issues item `item` into slot s: its state, then q, k, v, z from the workspace row.
  auto issue = [&](int item, int s) {
    const int b = item / Hv, v = item - b * Hv, kh = v / ratio;
    unsigned char* d = smem + size_t(s) * L.slot_bytes();
    const ST* src = gdn::row_state<ST>(rows[b]) + (size_t(slot) * Hv + v) * DK * Dv;
    const float* wsr = ws + size_t(b) * ws_row;
    bulk::arrive_expect_tx(&full[s], unsigned(L.slot_bytes()));
    for (size_t off = 0; off < L.state_bytes(); off += kCopyBytes)  // copies of <= 16 KiB
      bulk::copy(d + off, reinterpret_cast<const unsigned char*>(src) + off,
                 unsigned(L.state_bytes() - off < kCopyBytes ? L.state_bytes() - off : kCopyBytes),
                 &full[s]);
    float* f = reinterpret_cast<float*>(d + L.state_bytes());
    bulk::copy(f, wsr + kh * DK, DK * 4, &full[s]);
    bulk::copy(f + DK, wsr + Hk * DK + kh * DK, DK * 4, &full[s]);
    bulk::copy(f + 2 * DK, wsr + 2 * Hk * DK + v * Dv, unsigned(Dv) * 4, &full[s]);
    bulk::copy(f + 2 * DK + Dv, wsr + 2 * Hk * DK + Hv * Dv + v * Dv, unsigned(Dv) * 4, &full[s]);
  };
  if (tid == 0)
    for (int s = 0; s < stages && int(blockIdx.x) + s * step < items; ++s)
      issue(int(blockIdx.x) + s * step, s);

  for (int it = 0, item = int(blockIdx.x); item < items; ++it, item += step) {
    const int s = it % stages;
    const int b = item / Hv, v = item - b * Hv;
    const float* wsr = ws + size_t(b) * ws_row;
    const float beta = wsr[2 * Hk * DK + 2 * Hv * Dv + v];
    const float decay = wsr[2 * Hk * DK + 2 * Hv * Dv + Hv + v];
    bulk::wait(&full[s], unsigned(it / stages) & 1u);
    const unsigned char* d = smem + size_t(s) * L.slot_bytes();
    const ST* S = reinterpret_cast<const ST*>(d);
    const float* qs = reinterpret_cast<const float*>(d + L.state_bytes());
    const float* ks = qs + DK;
    const float* vs = ks + DK;
    const float z_l = tid < Dv ? vs[Dv + tid] : 0.f;

    // 1. S^T k: the groups' partials of columns 2cp, 2cp + 1 into red.
    for (int j = 0; j < gpt; ++j) {
      const int w = rs * gpt + j;
      *reinterpret_cast<float2*>(&red[w * Dv + 2 * cp]) = group_dot(w, [&](int r, float& f) {
        f = ks[r];
        return load_state2(S + size_t(r) * Dv + 2 * cp);
      });
    }
    __syncthreads();

    // 2. u = beta (v - e^g S^T k) for the two columns (every slice of them computes the same).
    float kS0 = 0.f, kS1 = 0.f;
    for (int w = 0; w < NG; ++w) {
      const float2 r2 = *reinterpret_cast<const float2*>(&red[w * Dv + 2 * cp]);
      kS0 += r2.x, kS1 += r2.y;
    }
    const float4 u4 = gdn::delta_u(make_float4(kS0, kS1, 0.f, 0.f),
                                   make_float4(vs[2 * cp], vs[2 * cp + 1], 0.f, 0.f), beta, decay);

    // 3. S' = e^g S + k u^T, stored in place in global memory; S'^T q partials into red2.
    ST* Sg = gdn::row_state<ST>(rows[b]) + (size_t(slot) * Hv + v) * DK * Dv;
    for (int j = 0; j < gpt; ++j) {
      const int w = rs * gpt + j;
      *reinterpret_cast<float2*>(&red2[w * Dv + 2 * cp]) = group_dot(w, [&](int r, float& f) {
        float2 sv = load_state2(S + size_t(r) * Dv + 2 * cp);
        const float kr = ks[r];
        sv.x = decay * sv.x + kr * u4.x;
        sv.y = decay * sv.y + kr * u4.y;
        store_state2(Sg + size_t(r) * Dv + 2 * cp, sv);
        f = qs[r];
        return sv;
      });
    }
    __syncthreads();  // red2 complete; slot s is read no more (z is in z_l)
    if (tid == 0 && item + stages * step < items) issue(item + stages * step, s);

    // 4. Gated RMS norm over the head: thread c < Dv takes column c.
    float ov = 0.f;
    if (tid < Dv) {
      for (int w = 0; w < NG; ++w) ov += red2[w * Dv + tid];
      const float ss = warp_sum(ov * ov);
      if (lane == 0) ss_part[tid / 32] = ss;
    }
    __syncthreads();
    if (tid < Dv) {
      float ss = 0.f;
      for (int c = 0; c < Dv / 32; ++c) ss += ss_part[c];
      const float r = rsqrtf(ss / float(Dv) + eps);
      out[(size_t(b) * Hv + v) * Dv + tid] = __float2bfloat16_rn(w_l * (ov * r) * silu(z_l));
    }
  }
#else
  __trap();  // sm_90 only (check_batch refuses other devices)
#endif
}

struct BatchArgs {
  const float *proj, *taps;
  float* conv_state;
  const float *neg_exp_A, *dt_bias, *norm_w;
  GdnStateFormat state_format;
  int Hk, Hv, Dv;
  float eps;
  bf16* out;
  float* ws;
  const DecodeBatchRow* rows;
  int B, slot, proj_stride;
  bool head;  // the state pass on gdn_batch_head_kernel (else gdn_batch_state_kernel)
};

// The head kernel's shape: (Dv / 2) column pairs x row slices, each slice whole 16-row groups (a
// power of two dividing Dk / 16, at least 2 so that Dv threads exist), at most kHeadMaxThreads
// threads.
int head_threads(int Dk, int Dv) {
  const int nc2 = Dv / 2, ng = Dk / 16;
  int slices = 2;
  while (slices * 2 <= ng && nc2 * slices * 2 <= kHeadMaxThreads) slices *= 2;
  return nc2 * slices;
}

// Ring slots: 3 where they fit in 227 KB (the real shapes: 3 x 34 KB in bf16, two blocks per SM;
// 3 x 66 KB in f32, one), else 2.
template <int DK, class ST>
HeadLayout<DK, ST> head_layout(int Dv) {
  HeadLayout<DK, ST> L{Dv, 3};
  if (L.bytes() > 227 * 1024) L.stages = 2;
  return L;
}

// Persistent grid: the blocks resident at once (occupancy at this shape), at most one per item.
template <int DK, class ST>
void launch_head(const BatchArgs& a, int ws_row, cudaStream_t stream) {
  const auto kernel = gdn_batch_head_kernel<DK, ST>;
  const HeadLayout<DK, ST> L = head_layout<DK, ST>(a.Dv);
  const int threads = head_threads(DK, a.Dv);
  if (L.bytes() > 227 * 1024) fail("gdn_decode_batch: Dv {} too wide for the head kernel", a.Dv);
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> resident;  // (device, Dv) -> blocks at once
  int device = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&device));
  int blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = resident.find({device, a.Dv});
    if (it == resident.end()) {
      // The attribute is the kernel's, whatever Dv: allow every size this kernel may take (a
      // narrower head's smaller value set later would refuse a wider head's launches).
      LILAC_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
      int per_sm = 0, sms = 0;
      LILAC_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, L.bytes()));
      LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      if (per_sm < 1) fail("gdn_decode_batch: the head kernel does not fit an SM (Dv {})", a.Dv);
      it = resident.emplace(std::make_pair(device, a.Dv), per_sm * sms).first;
    }
    blocks = it->second;
  }
  const int items = a.B * a.Hv;
  launch_kernel(true, kernel, dim3(unsigned(std::min(items, blocks))), dim3(unsigned(threads)),
                L.bytes(), stream, a.ws, ws_row, a.norm_w, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                a.slot, items, L.stages);
}

// The prep kernel's q/k channels per thread: 1 while its Hk x B blocks fit in one wave of the
// 1-channel form, else 2 (see gdn_batch_prep_kernel). LILAC_GDN_PREP_CHANNELS=1|2 forces one (A/B).
template <int DK, int KC>
int prep_channels_per_thread(int blocks) {
  static const int forced = env_choice("LILAC_GDN_PREP_CHANNELS", {1, 2});
  if (forced) return forced;
  static std::mutex mu;
  static std::map<int, int> resident;  // device -> blocks of the 1-channel form at once
  int device = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto it = resident.find(device);
  if (it == resident.end()) {
    int per_sm = 0, sms = 0;
    LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, gdn_batch_prep_kernel<DK, KC, 1>, 2 * DK, 0));
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    it = resident.emplace(device, per_sm * sms).first;
  }
  return blocks > it->second ? 2 : 1;
}

template <int DK, int KC>
void launch_batch(const BatchArgs& a, bool prep_only, cudaStream_t stream) {
  const int ws_row = ws_row_floats(a.Hk, a.Hv, DK, a.Dv);
  const dim3 prep_grid(unsigned(a.Hk), unsigned(a.B));
  if (prep_channels_per_thread<DK, KC>(a.Hk * a.B) == 2)
    launch_kernel(true, gdn_batch_prep_kernel<DK, KC, 2>, prep_grid, dim3(DK), 0, stream, a.proj,
                  a.taps, a.conv_state, a.neg_exp_A, a.dt_bias, a.Hk, a.Hv, a.Dv, a.ws, ws_row,
                  a.rows, a.slot, a.proj_stride);
  else
    launch_kernel(true, gdn_batch_prep_kernel<DK, KC, 1>, prep_grid, dim3(2 * DK), 0, stream,
                  a.proj, a.taps, a.conv_state, a.neg_exp_A, a.dt_bias, a.Hk, a.Hv, a.Dv, a.ws,
                  ws_row, a.rows, a.slot, a.proj_stride);
  if (prep_only) return;
  if (a.head) {
    if (a.state_format == GdnStateFormat::bf16)
      launch_head<DK, bf16>(a, ws_row, stream);
    else
      launch_head<DK, float>(a, ws_row, stream);
    return;
  }
  // Clusters of a head's column blocks.
  const dim3 cluster{unsigned(a.Dv / kCols)},
      grid{unsigned(a.Dv / kCols), unsigned(a.Hv), unsigned(a.B)};
  if (a.state_format == GdnStateFormat::bf16)
    launch_cluster_kernel(true, cluster, gdn_batch_state_kernel<DK, bf16>, grid, dim3(2 * DK), 0,
                          stream, a.ws, ws_row, a.norm_w, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                          a.slot);
  else
    launch_cluster_kernel(true, cluster, gdn_batch_state_kernel<DK, float>, grid, dim3(2 * DK), 0,
                          stream, a.ws, ws_row, a.norm_w, a.Hk, a.Hv, a.Dv, a.eps, a.out, a.rows,
                          a.slot);
}

template <int DK>
void launch_batch_k(int K, const BatchArgs& a, bool prep_only, cudaStream_t stream) {
  switch (K) {
    case 2:
      launch_batch<DK, 2>(a, prep_only, stream);
      break;
    case 3:
      launch_batch<DK, 3>(a, prep_only, stream);
      break;
    default:
      launch_batch<DK, 4>(a, prep_only, stream);
      break;
  }
}

void launch_batch_dk(int Dk, int K, const BatchArgs& a, bool prep_only, cudaStream_t stream) {
  switch (Dk) {
    case 32:
      launch_batch_k<32>(K, a, prep_only, stream);
      break;
    case 64:
      launch_batch_k<64>(K, a, prep_only, stream);
      break;
    default:
      launch_batch_k<128>(K, a, prep_only, stream);
      break;
  }
}

void check_batch(int Hk, int Hv, int Dk, int Dv, int K) {
  if (Hk <= 0 || Hv % Hk != 0) fail("gdn_decode_batch: Hv {} not a multiple of Hk {}", Hv, Hk);
  if (Dv <= 0 || Dv % kCols != 0 || Dv / kCols > kMaxCluster)
    fail("gdn_decode_batch: Dv {} not a multiple of {} up to {}", Dv, kCols, kCols * kMaxCluster);
  if (K < 2 || K > 4) fail("gdn_decode_batch: conv kernel {} not supported (2..4)", K);
  if (Dk != 32 && Dk != 64 && Dk != 128) fail("gdn_decode_batch: Dk {} not supported", Dk);
  if (!gdn_decode_uses_cluster(Hk, Hv, Dk, Dv))
    fail(
        "gdn_decode_batch: needs a compute capability 9.0 GPU and Hv/Hk x Dv/32 <= 8 (Hk {} Hv {} "
        "Dk {} Dv {})",
        Hk, Hv, Dk, Dv);
}

}  // namespace

size_t gdn_decode_batch_workspace_floats(int B, int Hk, int Hv, int Dk, int Dv) {
  return size_t(B) * size_t(ws_row_floats(Hk, Hv, Dk, Dv));
}

namespace {

// automatic: the head kernel, but for an f32 state at 16 rows or fewer (one 206 KB block per SM,
// ~4 items each), where it measured no better than the split kernel (s16 run 4, BF16 weights,
// c=16: 1,399-1,400 against 1,409-1,415 tok/s; 4-bit: 2,952 against 2,910).
bool use_head_kernel(GdnBatchKernel kernel, GdnStateFormat state_format, int B) {
  if (kernel != GdnBatchKernel::automatic) return kernel == GdnBatchKernel::head;
  return state_format == GdnStateFormat::bf16 || B > 16;
}

void gdn_decode_batch_impl(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                           const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                           const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K,
                           float eps, float* workspace, bf16* out, GdnStateFormat state_format,
                           GdnBatchKernel kernel, bool prep_only, cudaStream_t stream) {
  if (!proj || !rows || !workspace || (!out && !prep_only)) fail("gdn_decode_batch: null pointer");
  if (B < 1 || B > 65535) fail("gdn_decode_batch: B = {}", B);
  check_batch(Hk, Hv, Dk, Dv, K);
  const BatchArgs a{proj,
                    conv_taps,
                    nullptr,
                    neg_exp_A,
                    dt_bias,
                    norm_scale,
                    state_format,
                    Hk,
                    Hv,
                    Dv,
                    eps,
                    out,
                    workspace,
                    rows,
                    B,
                    slot,
                    2 * Hk * Dk + 2 * Hv * Dv + 2 * Hv,
                    use_head_kernel(kernel, state_format, B)};
  launch_batch_dk(Dk, K, a, prep_only, stream);
}

}  // namespace

void gdn_decode_batch(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                      const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                      const float* norm_scale, int Hk, int Hv, int Dk, int Dv, int K, float eps,
                      float* workspace, bf16* out, cudaStream_t stream, GdnStateFormat state_format,
                      GdnBatchKernel kernel) {
  gdn_decode_batch_impl(proj, B, rows, slot, conv_taps, neg_exp_A, dt_bias, norm_scale, Hk, Hv, Dk,
                        Dv, K, eps, workspace, out, state_format, kernel, false, stream);
}

void gdn_decode_batch_prep(const float* proj, int B, const DecodeBatchRow* rows, int slot,
                           const float* conv_taps, const float* neg_exp_A, const float* dt_bias,
                           int Hk, int Hv, int Dk, int Dv, int K, float* workspace,
                           cudaStream_t stream) {
  gdn_decode_batch_impl(proj, B, rows, slot, conv_taps, neg_exp_A, dt_bias, nullptr, Hk, Hv, Dk, Dv,
                        K, 0.f, workspace, nullptr, GdnStateFormat::f32, GdnBatchKernel::split,
                        true, stream);
}

}  // namespace lilac::cuda
