// The Gated DeltaNet prefill's state pass, overlapped form (docs/kernels.md, "Twenty-eighth
// session"): the same results as gated_deltanet_prefill.cu's one-pass gdn_state_kernel (to
// rounding: the sums run in another order), with the chunk outputs taken off the sequential path.
//
// Per chunk of 64 tokens and value head (gated_deltanet_prefill.cu's header has the maths), the
// one-pass block does four products: [W; Q] S, then U = U~ - W S, O = e^G Q S + P U and
// S' = e^{G_L} S + K~^T U. Only W S and K~^T U feed the next chunk; Q S and P U (57% of the tensor
// work) only make that chunk's outputs. s27 split them into a second kernel over all (chunk, head)
// pairs: the loop got faster as predicted (75 -> 52 us per layer at 512 tokens, H200) but the
// output kernel ran after it at one 152 KiB block per SM, loading before computing, and cost more
// than the loop saved (docs/kernels.md, "Twenty-seventh session", item 3).
//
// Here both run in one block, on different warps, so the outputs of chunk c are computed while
// the loop runs chunk c + 1:
//  - warps 0-7 (the loop, 256 threads): S^T [32 columns x Dk] in registers as in the one-pass
//    kernel; per chunk X^T = S^T W^T (partials over the four Dk quarters, summed in a fixed
//    order), U^T = U~^T - X^T, S^T = e^{G_L} S^T + (U e^{G_L - G})^T K~. At the start of chunk c
//    they copy S_c^T into hand-over buffer c % 2, after computing U_c^T they copy that too, and
//    signal "full".
//  - warps 8-11 (the output warps, 128 threads): load Q, P and G of chunk c (cp.async, issued
//    while they wait), wait for "full", compute O^T = e^G (S_c^T Q^T) + U_c^T P^T for the block's
//    32 columns and 64 rows, signal "empty" (the loop may reuse the buffer for chunk c + 2), and
//    store O over U~ in vb (the loop read chunk c's U~ before it signalled).
// The hand-over is in shared memory through named barriers (bar.arrive by the producer, bar.sync
// by the consumer: the producer's shared-memory writes before its arrive are visible to the
// consumer after its sync), so nothing goes through global memory but Q, P and O.
// With the norm fused (kNorm; GdnPrefillStatePass::overlapped_norm) the output warps finish
// gdn_out's work too: a value head's Dv/32 blocks are one thread-block cluster; per chunk each
// block sums o^2 over its 32 columns per row, stores the 64 sums into every block's exchange
// slot (distributed shared memory, each store released by an arrival on that block's mbarrier),
// waits for its own barrier, adds the cluster's partials in rank order and writes
// bf16(w o r silu(z)) with z copied in beside Q and P. O then never goes to global memory (at
// 4,096 tokens 64 MB written and read again per layer) and gdn_out only shifts the conv state.
//
// Budget (sm_90, Dk = Dv = 128): 384 threads, one block per SM (128 blocks), so at most 168
// registers per thread (65,536 / 384); shared memory 208.5 KiB of the 227 available: the loop's
// W, K~, U~, G and partials (108.3 KiB), the output warps' Q, P, G (51.3 KiB) and the two
// hand-over buffers (2 x 24.5 KiB).
// Work per block and chunk: the loop 2 x 64 x 128 x 32 MAC (the one-pass kernel's 2.75 M less Q S
// and P U) x 3 for 3xTF32; the output warps 64 x 128 x 32 + ~(36/64) x 64 x 64 x 32 MAC, x 3.
// Prediction (H200): the state pass at the s27 split loop's time (512 tokens ~52 us per layer,
// 4,096 ~364) plus the last chunk's outputs (~1-2 us), against the one-pass 75 / 528.
#include "cuda/attention_mma.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/cluster.cuh"
#include "cuda/gated_deltanet_prefill.cuh"
#include "cuda/gated_deltanet_step.cuh"
#include "util/error.h"

namespace lilac::cuda::gdn_chunked {
namespace {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::smem_addr;

constexpr int kLoopThreads = 256;
constexpr int kOutThreads = 128;
constexpr int kThreadsAll = kLoopThreads + kOutThreads;
// Named barriers (0 is __syncthreads', which this kernel never uses: the two roles wait apart).
constexpr int kBarLoop = 1;   // the loop's 256 threads
constexpr int kBarOut = 2;    // the output warps' 128
constexpr int kBarFull = 3;   // + buffer: S_c^T and U_c^T written (loop arrives, output syncs)
constexpr int kBarEmpty = 5;  // + buffer: the output warps are done reading it (the reverse)
// The fused norm: a value head's Dv / 32 blocks form one cluster (at most 8: the portable size).
constexpr int kMaxNormRanks = 8;

// What the fused gated norm (kNorm) reads and writes: out[t, v Dv + j] = bf16(norm_w[j] o_j r_t
// silu(z[t, v Dv + j])), r_t = 1 / sqrt(sum_j o_j^2 / Dv + eps) over the head's Dv columns, as
// gdn_out computes it (the sum in another order: per 16 columns, per block, then over the
// cluster's blocks in rank order).
struct NormArgs {
  const float* z;       // proj + C: row t's z at z + t * P
  size_t P;             // proj row length (a multiple of 4: 16-byte copies)
  const float* norm_w;  // [Dv]
  float eps;
  bf16* out;  // [T, Hv Dv]
};

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The fused norm's cluster operations (cluster.cuh: sm_90 only; the compute_80 PTX of the fat
// binary traps there, and the launcher never picks the fused norm below compute capability 9.0).
__device__ __forceinline__ void norm_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster::sync();
#else
  __trap();
#endif
}
// v into slot `slot` (this block's shared address) of every block of the cluster, each store
// released by an arrival on that block's barrier `bar`.
__device__ __forceinline__ void norm_send(const float* slot, uint64_t* bar, float v, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (uint32_t k = 0; k < n; ++k) {
    cluster::st_f32(cluster::map(smem_addr(slot), k), v);
    cluster::mbar_arrive_remote(cluster::map(smem_addr(bar), k));
  }
#else
  (void)slot, (void)bar, (void)v, (void)n;
  __trap();
#endif
}
__device__ __forceinline__ uint32_t norm_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cluster::ctarank();
#else
  __trap();
  return 0;
#endif
}
// A wait that cannot hang: a schedule bug (a block that never sends) traps after ~2^26 polls
// (seconds), so that a test fails with an error instead of stalling the GPU suite.
__device__ __forceinline__ void norm_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (uint32_t n = 0; !cluster::mbar_try_wait_cluster(smem_addr(bar), parity); ++n)
    if (n == (1u << 26)) __trap();
#else
  (void)bar, (void)parity;
  __trap();
#endif
}

template <int DK>
struct OverlapSmem {
  static constexpr int KPW = DK + 8;  // W rows: float2 B loads at (row g, col 2t) conflict-free
  static constexpr int KPK = DK + 4;  // K rows: scalar B loads at (row 2t, col g)
  static constexpr int UP = 36;       // U~ rows: scalar loads at (row 2t, col g)
  static constexpr int QP = DK + 4;   // Q rows: scalar B loads at (row g, col t)
  static constexpr int PP = 68;       // P rows: scalar B loads at (row g, col t)
  static constexpr int SP = DK + 4;   // S^T hand-over rows [32 columns][Dk]: A loads at (g, t)
  static constexpr int HP = 68;       // U^T hand-over rows [32 columns][64]
  static constexpr int kW = 0, kK = kW + 64 * KPW, kU = kK + 64 * KPK, kG = kU + 64 * UP,
                       kPart = kG + 64, kQ = kPart + 2 * 4 * 8 * 32 * 4, kP = kQ + 64 * QP,
                       kGo = kP + 64 * PP, kHS = kGo + 64, kHU = kHS + 2 * kColsB * SP,
                       kFloats = kHU + 2 * kColsB * HP;
  // The fused norm's (kNorm) after that: z of the chunk's rows for the block's 32 columns
  // [64][ZP], the cluster's per-row partial sums of squares [2 buffers][8 ranks][64], this
  // block's two column halves' [2][64], and the two exchange mbarriers (8-byte aligned).
  static constexpr int ZP = 36;
  static constexpr int kZ = kFloats, kXss = kZ + 64 * ZP, kRowss = kXss + 2 * kMaxNormRanks * 64,
                       kXbar = kRowss + 2 * 64, kFloatsNorm = kXbar + 4;
};

// Grid (Dv/32, Hv) = 128 blocks of 384 threads at the real shapes; block (cb, v) carries
// S[:, c0 .. c0+31] of value head v. The loop warps' layout is the one-pass kernel's (warp w:
// m-tile mt = w & 1, Dk quarter dq = w >> 1, S^T tiles s[j] over Dk rows KQ dq + 8 j + (2t,
// 2t+1), columns colA (c0, c1) and colB (c2, c3)). Output warp ow = w - 8: columns 16 (ow & 1) ..
// +15 (the A rows), chunk rows 8 i .. 8 i + 7 for i = (ow >> 1) + 2 q, q = 0..3 (interleaved, so
// that the two row halves share the triangular P U work about evenly).
// kNorm: the output warps also apply gdn_out's gated RMS norm and write bf16 out (NormArgs), the
// Dv / 32 blocks of a value head being one cluster that exchanges per-row partial sums of squares
// through distributed shared memory; O is then not written to vb, and gdn_out only shifts the
// conv state.
template <int DK, class ST, bool kNorm>
__global__ void __launch_bounds__(kThreadsAll, 1)
    gdn_state_overlap_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                             const float* __restrict__ Wb, const float* __restrict__ Pb,
                             const float* __restrict__ Gc, float* __restrict__ vb,
                             ST* __restrict__ state, int T, int Hk, int Hv, int Dv, NormArgs na) {
  using L = OverlapSmem<DK>;
  constexpr int KQ = DK / 4, NJ = KQ / 8;  // Dk quarter per loop warp; its 8-wide tiles
  extern __shared__ __align__(16) float sm[];
  float* HS = sm + L::kHS;  // [2][32][SP]  S_c^T (buffer c % 2)
  float* HU = sm + L::kHU;  // [2][32][HP]  U_c^T

  const int cb = blockIdx.x, v = blockIdx.y, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int kh = v / (Hv / Hk), c0 = cb * kColsB;
  const int NC = (T + kBT - 1) / kBT;
  const size_t rowW = size_t(Hv) * DK, rowQ = size_t(Hk) * DK, rowV = size_t(Hv) * Dv;
  uint64_t* xbar = reinterpret_cast<uint64_t*>(sm + L::kXbar);
  if constexpr (kNorm) {
    // Every block's exchange barriers initialised before any block of the cluster arrives on them.
    if (tid == 0) {
      bulk::init(&xbar[0], 64u * gridDim.x);
      bulk::init(&xbar[1], 64u * gridDim.x);
      bulk::fence_init();
    }
    norm_cluster_sync();
  }

  if (warp >= kLoopThreads / 32) {
    // ---- the output warps
    float* Qs = sm + L::kQ;   // [64][QP] Q of the chunk
    float* Ps = sm + L::kP;   // [64][PP] P
    float* Go = sm + L::kGo;  // [64]    G
    const int otid = tid - kLoopThreads, ow = warp - kLoopThreads / 32;
    const int omt = ow & 1, nh = ow >> 1;
    auto load_qpg = [&](int c) {
      const int t0 = c * kBT;
      copy_head_rows<DK, L::QP, kOutThreads>(Qs, qn, rowQ, size_t(kh) * DK, t0, T, otid);
      const float* Pc = Pb + (size_t(v) * NC + c) * kBT * kBT;
      for (int e = otid; e < 64 * 16; e += kOutThreads) {
        const int r = e >> 4, i4 = e & 15;
        cp_async16(smem_addr(Ps + r * L::PP + 4 * i4), Pc + r * 64 + 4 * i4, 16);
      }
      if (otid < 16)
        cp_async16(smem_addr(Go + 4 * otid), Gc + (size_t(v) * NC + c) * kBT + 4 * otid, 16);
      if constexpr (kNorm) {  // z of the rows, the block's 32 columns (zeros past T)
        for (int e = otid; e < 64 * 8; e += kOutThreads) {
          const int r = e >> 3, i4 = e & 7, tt = t0 + r;
          const bool ok = tt < T;
          cp_async16(smem_addr(sm + L::kZ + r * L::ZP + 4 * i4),
                     ok ? na.z + size_t(tt) * na.P + size_t(v) * Dv + c0 + 4 * i4 : na.z,
                     ok ? 16 : 0);
        }
      }
    };
    // The norm's weights of this lane's two columns.
    [[maybe_unused]] float nw[2] = {0.f, 0.f};
    if constexpr (kNorm) {
      nw[0] = na.norm_w[c0 + 16 * omt + g];
      nw[1] = na.norm_w[c0 + 16 * omt + g + 8];
    }
    load_qpg(0);
    cp_async_commit();
    for (int c = 0; c < NC; ++c) {
      const int b = c & 1, t0 = c * kBT;
      cp_async_wait<0>();                   // this thread's Q, P, G of chunk c
      bar_sync(kBarFull + b, kThreadsAll);  // ... and everyone's; S_c^T, U_c^T in buffer b
      float acc[4][4];
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
      // e^G (S^T Q^T): A = S^T rows 16 omt + (g, g+8), B[k][n] = Q[row n][k].
      const float* hs = HS + (b * kColsB + 16 * omt + g) * L::SP + t;
#pragma unroll 4
      for (int ks = 0; ks < DK / 8; ++ks) {
        uint32_t ah[4], al[4];
        a_from_smem(hs + 8 * ks, L::SP, ah, al);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float* qb = Qs + (8 * (nh + 2 * q) + g) * L::QP + 8 * ks + t;
          mma3(acc[q], ah, al, qb[0], qb[4]);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = 8 * (nh + 2 * q) + 2 * t;
        const float e0 = expf(Go[r]), e1 = expf(Go[r + 1]);
        acc[q][0] *= e0, acc[q][1] *= e1, acc[q][2] *= e0, acc[q][3] *= e1;
      }
      // + U^T P^T: B[k = s][n = r] = P[r][s], zero for s > r, so row tile i needs k-steps 0..i.
      const float* hu = HU + (b * kColsB + 16 * omt + g) * L::HP + t;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        if (ks > nh + 6) continue;
        uint32_t ah[4], al[4];
        a_from_smem(hu + 8 * ks, L::HP, ah, al);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int i = nh + 2 * q;
          if (ks > i) continue;
          const float* pb = Ps + (8 * i + g) * L::PP + 8 * ks + t;
          mma3(acc[q], ah, al, pb[0], pb[4]);
        }
      }
      if (c + 2 < NC) bar_arrive(kBarEmpty + b, kThreadsAll);  // buffer b free for chunk c + 2
      // Accumulator (c0, c1, c2, c3) = O rows r, r + 1 of columns 16 omt + g, + 8.
      [[maybe_unused]] float zv[4][4];
      if constexpr (kNorm) {
        // z into registers (the next chunk's copies overwrite it), and the per-row sums of
        // squares over this warp's 16 columns (the 8 lanes of one t, by shuffles) into rowss.
        float* rowss = sm + L::kRowss;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = 8 * (nh + 2 * q) + 2 * t;
          const float* zr = sm + L::kZ + r * L::ZP + 16 * omt + g;
          zv[q][0] = zr[0], zv[q][1] = zr[L::ZP], zv[q][2] = zr[8], zv[q][3] = zr[L::ZP + 8];
          float s0 = acc[q][0] * acc[q][0] + acc[q][2] * acc[q][2];
          float s1 = acc[q][1] * acc[q][1] + acc[q][3] * acc[q][3];
#pragma unroll
          for (int m = 4; m < 32; m <<= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, m);
            s1 += __shfl_xor_sync(0xffffffffu, s1, m);
          }
          if (g == 0) rowss[omt * 64 + r] = s0, rowss[omt * 64 + r + 1] = s1;
        }
      }
      bar_sync(kBarOut, kOutThreads);  // every output warp is done with Q, P, G (z) of chunk c
      if (c + 1 < NC) load_qpg(c + 1);
      cp_async_commit();
      if constexpr (kNorm) {
        // The block's partial for row otid, to every block of the cluster (slot: this rank),
        // each store released by its own arrival on that block's barrier for this buffer.
        const uint32_t ranks = gridDim.x, me = norm_rank();
        float* xss = sm + L::kXss + b * kMaxNormRanks * 64;
        if (otid < 64) {
          const float* rowss = sm + L::kRowss;
          norm_send(xss + me * 64 + otid, &xbar[b], rowss[otid] + rowss[64 + otid], ranks);
        }
        // Round c >> 1 of buffer b: every block's 64 partials have landed.
        norm_wait(&xbar[b], uint32_t(c >> 1) & 1u);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = 8 * (nh + 2 * q) + 2 * t;
          float ss0 = 0.f, ss1 = 0.f;
          for (uint32_t k = 0; k < ranks; ++k) ss0 += xss[k * 64 + r], ss1 += xss[k * 64 + r + 1];
          const float r0 = rsqrtf(ss0 / float(Dv) + na.eps), r1 = rsqrtf(ss1 / float(Dv) + na.eps);
          bf16* dst = na.out + size_t(t0 + r) * rowV + size_t(v) * Dv + c0 + 16 * omt + g;
          if (t0 + r < T) {
            dst[0] = __float2bfloat16_rn(nw[0] * (acc[q][0] * r0) * silu(zv[q][0]));
            dst[8] = __float2bfloat16_rn(nw[1] * (acc[q][2] * r0) * silu(zv[q][2]));
          }
          if (t0 + r + 1 < T) {
            dst[rowV] = __float2bfloat16_rn(nw[0] * (acc[q][1] * r1) * silu(zv[q][1]));
            dst[rowV + 8] = __float2bfloat16_rn(nw[1] * (acc[q][3] * r1) * silu(zv[q][3]));
          }
        }
      } else {
        // O over U~.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = 8 * (nh + 2 * q) + 2 * t;
          float* dst = vb + size_t(t0 + r) * rowV + size_t(v) * Dv + c0 + 16 * omt + g;
          if (t0 + r < T) dst[0] = acc[q][0], dst[8] = acc[q][2];
          if (t0 + r + 1 < T) dst[rowV] = acc[q][1], dst[rowV + 8] = acc[q][3];
        }
      }
    }
    cp_async_wait<0>();
    if constexpr (kNorm) norm_cluster_sync();  // no block leaves while the cluster may reach it
    return;
  }

  // ---- the loop warps
  float* Ws = sm + L::kW;  // [64][KPW]  W of the chunk
  float* Ks = sm + L::kK;  // [64][KPK]  K
  float* Ut = sm + L::kU;  // [64][UP]   U~ (this block's 32 columns)
  float* Gs = sm + L::kG;  // [64]       G
  float4* part = reinterpret_cast<float4*>(sm + L::kPart);
  const int mt = warp & 1, dq = warp >> 1;
  const int colA = 16 * mt + g, colB = colA + 8;  // this lane's two value columns (of 32)

  float s[NJ][4];
  load_state_tiles<DK>(state + size_t(v) * DK * Dv + c0, Dv, dq, t, colA, colB, s);

  auto load_w = [&](int c) {  // group A: W rows of chunk c (zeros past T)
    copy_head_rows<DK, L::KPW, kLoopThreads>(Ws, Wb, rowW, size_t(v) * DK, c * kBT, T, tid);
  };
  auto load_rest = [&](int c) {  // group B: K, U~, G of chunk c
    load_k_u_g<DK, L::KPK, L::UP>(tid, c, T, NC, kn, rowQ, kh, vb, rowV, v, Dv, c0, Gc, Ks, Ut, Gs);
  };

  load_w(0);
  cp_async_commit();
  load_rest(0);
  cp_async_commit();
  for (int c = 0; c < NC; ++c) {
    const int b = c & 1;
    cp_async_wait<1>();                // W of chunk c
    bar_sync(kBarLoop, kLoopThreads);  // ... visible to all; chunk c-1's readers of K, U~ done
    // S_c^T into hand-over buffer b, once the output warps are done with chunk c - 2's.
    if (c >= 2) bar_sync(kBarEmpty + b, kThreadsAll);
    {
      float* hs = HS + b * kColsB * L::SP;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int r = KQ * dq + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(hs + colA * L::SP + r) = make_float2(s[j][0], s[j][1]);
        *reinterpret_cast<float2*>(hs + colB * L::SP + r) = make_float2(s[j][2], s[j][3]);
      }
    }

    // 1. X^T partial = S^T W^T over this Dk quarter: x[n] for W rows 8n .. 8n+7.
    float x[8][4];
    state_partials<DK, 8, L::KPW>(s, Ws, dq, g, t, x);
    cp_async_wait<0>();  // K, U~, G of chunk c
#pragma unroll
    for (int n = 0; n < 8; ++n)
      part[((mt * 4 + dq) * 8 + n) * 32 + lane] = make_float4(x[n][0], x[n][1], x[n][2], x[n][3]);
    bar_sync(kBarLoop, kLoopThreads);  // partials, K, U~, G visible; every warp is done with W
    if (c + 1 < NC) load_w(c + 1);
    cp_async_commit();

    // 2. U^T = U~^T - (W S)^T: tiles u[n] for chunk rows 8n + (2t, 2t+1), columns colA, colB.
    float u[8][4];
    u_from_partials<8, L::UP>(part, mt, lane, t, Ut, colA, colB, u);
    // U_c^T into buffer b: the four warps of an m-tile hold the same U (summed in one order);
    // warp dq writes chunk rows 16 dq .. 16 dq + 15. Then the buffer is full.
    {
      float* hu = HU + b * kColsB * L::HP;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        if ((n >> 1) != dq) continue;
        const int r = 8 * n + 2 * t;
        *reinterpret_cast<float2*>(hu + colA * L::HP + r) = make_float2(u[n][0], u[n][1]);
        *reinterpret_cast<float2*>(hu + colB * L::HP + r) = make_float2(u[n][2], u[n][3]);
      }
    }
    bar_arrive(kBarFull + b, kThreadsAll);

    // 3. S^T = e^{G_L} S^T + (U e^{G_L - G})^T K[:, quarter].
    const float GL = Gs[kBT - 1];
    update_state<DK, L::KPK>(s, u, Gs, Ks, GL, dq, g, t);
    bar_sync(kBarLoop, kLoopThreads);  // every loop warp is done with K, U~, G, the partials
    if (c + 1 < NC) load_rest(c + 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
  store_state_tiles<DK>(state + size_t(v) * DK * Dv + c0, Dv, dq, t, colA, colB, s);
  if constexpr (kNorm) norm_cluster_sync();
}

template <int DK, class ST, bool kNorm>
void launch(const float* qn, const float* kn, const float* W, const float* P, const float* Gc,
            float* vb, ST* state, int T, int Hk, int Hv, int Dv, const NormArgs& na,
            cudaStream_t stream) {
  constexpr size_t smem =
      (kNorm ? OverlapSmem<DK>::kFloatsNorm : OverlapSmem<DK>::kFloats) * sizeof(float);
  static const bool attr_set = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_overlap_kernel<DK, ST, kNorm>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)attr_set;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(Dv / kColsB), unsigned(Hv));
  cfg.blockDim = dim3(kThreadsAll);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;  // a value head's column blocks: one cluster
  attr.val.clusterDim.x = unsigned(Dv / kColsB);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = kNorm ? 1u : 0u;
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gdn_state_overlap_kernel<DK, ST, kNorm>, qn, kn, W, P,
                                      Gc, vb, state, T, Hk, Hv, Dv, na));
}

template <class ST>
void launch_any(const float* qn, const float* kn, const float* W, const float* P, const float* Gc,
                float* vb, ST* state, int T, int Hk, int Hv, int Dk, int Dv,
                const OverlapNorm* norm, cudaStream_t stream) {
  NormArgs na{};
  if (norm) {
    const int C = norm->C;
    na.z = norm->proj + C;
    na.P = size_t(C) + size_t(Hv) * Dv + 2 * size_t(Hv);
    na.norm_w = norm->norm_w;
    na.eps = norm->eps;
    na.out = norm->out;
    if (!overlapped_norm_supported(Hv, Dv, C))
      fail("gdn_prefill: the fused norm does not support Hv {} Dv {} C {}", Hv, Dv, C);
  }
#define LILAC_GDN_OVERLAP(DK)                                                        \
  case DK:                                                                           \
    if (norm)                                                                        \
      launch<DK, ST, true>(qn, kn, W, P, Gc, vb, state, T, Hk, Hv, Dv, na, stream);  \
    else                                                                             \
      launch<DK, ST, false>(qn, kn, W, P, Gc, vb, state, T, Hk, Hv, Dv, na, stream); \
    break;
  switch (Dk) {
    LILAC_GDN_OVERLAP(32)
    LILAC_GDN_OVERLAP(64)
    LILAC_GDN_OVERLAP(128)
    default:
      fail("gdn_prefill: Dk {} not supported (32, 64, 128)", Dk);
  }
#undef LILAC_GDN_OVERLAP
}

}  // namespace

bool overlapped_norm_supported(int Hv, int Dv, int C) {
  const size_t P = size_t(C) + size_t(Hv) * Dv + 2 * size_t(Hv);
  return device_compute_capability() >= 90 && Dv % kColsB == 0 && Dv / kColsB <= kMaxNormRanks &&
         P % 4 == 0 && C % 4 == 0;
}

void launch_state_overlapped(const float* qn, const float* kn, const float* W, const float* P,
                             const float* Gc, float* vb, float* state, int T, int Hk, int Hv,
                             int Dk, int Dv, const OverlapNorm* norm, cudaStream_t stream) {
  launch_any(qn, kn, W, P, Gc, vb, state, T, Hk, Hv, Dk, Dv, norm, stream);
}
void launch_state_overlapped(const float* qn, const float* kn, const float* W, const float* P,
                             const float* Gc, float* vb, bf16* state, int T, int Hk, int Hv, int Dk,
                             int Dv, const OverlapNorm* norm, cudaStream_t stream) {
  launch_any(qn, kn, W, P, Gc, vb, state, T, Hk, Hv, Dk, Dv, norm, stream);
}

}  // namespace lilac::cuda::gdn_chunked
