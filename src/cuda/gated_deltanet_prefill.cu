// Gated DeltaNet prefill: causal conv, the chunked delta rule (chunks of 64), gated norm.
//
// The chunked form (also cpu::gdn_chunked, tested against the token recurrence on the CPU). Per
// value head and chunk of L = 64 tokens r = 0..63 (rows past T act as g = beta = 0, q = k = v = 0)
// with start state S0 [Dk, Dv]:
//   G_r  = g_0 + ... + g_r                       cumulative log-decay from the chunk start (<= 0)
//   A    = strictly-lower( diag(beta) (K K^T o D) ),   D[r][s] = e^{G_r - G_s} for s <= r
//   W    = (I + A)^{-1} diag(beta e^G) K        [64, Dk]
//   U~   = (I + A)^{-1} diag(beta) V            [64, Dv]    (W, U~ do not depend on S0)
//   P    = lower-incl-diagonal( Q K^T o D )      [64, 64]
//   U    = U~ - W S0;   O = diag(e^G) Q S0 + P U;   S_end = e^{G_63} S0 + (K o e^{G_63 - G})^T U
// (derivation: cpu/gated_deltanet.cpp). Only differences G_r - G_s with s <= r are exponentiated,
// so nothing overflows however strong the decay. The state is carried through every chunk of the
// sequence, and the tests hold it to 1e-4 of its scale against the token recurrence: the matrix
// products run on tensor cores in 3xTF32 (f32-level accuracy, see section 3), the rest in f32.
//
// Version 1 (all f32 on CUDA cores, measured on an H200: T = 4096 1.316 ms, T = 65536 19.7 ms per
// layer) -> version 2 (predicted T = 4096 ~0.42 ms): tensor cores for the sequential state kernel
// and for K K^T / Q K^T, and a prep kernel that reads each input once.
//
// Four launches (real shapes Hk 16, Hv 32, Dk = Dv = 128, C = 8192; per token per layer):
//  1. gdn_prep (grid T/TOK x C/128, TOK = 16 or 64 tokens): conv + SiLU over the C channels
//     (rows before the chunk from conv_state), l2norm of q (x Dk^-0.5) and k, gates g and beta.
//     Reads the 32 KiB qkv row and writes 32 KiB of q, k, v: DRAM-bound, ~15 ns/token.
//  2. gdn_chunk (grid chunks x Hk, or chunks x Hv when those blocks fit one wave at two per SM;
//     256 threads, 128 registers, two blocks per SM): K K^T and Q K^T of the key head (mma.sync,
//     3xTF32), then per value head (of that key head, or the block's one): G by a scan, A and P (P
//     to the workspace), and W and U~ by forward substitution on CUDA cores, one column per thread,
//     64 rows unrolled in registers (U~ overwrites v in place). ~20 ns/token.
//  3. gdn_state (grid Dv/32 x Hv = 128 blocks, 256 threads, ~197 KiB smem): the only sequential
//     part. A block keeps S[:, 32 columns] in registers (mma accumulators) and walks the chunks:
//     [W; Q] S, U = U~ - W S, O = e^G Q S + P U (written over U~), S = e^{G_L} S + K~^T U, all on
//     tensor cores in 3xTF32, the next chunk's operands prefetched by cp.async. 2.75 M MAC per
//     block per chunk: ~3 us per chunk step -> T = 4096 ~0.19 ms per layer, the dominant term.
//  4. gdn_out (grid T + C/256): gated RMS norm per (token, value head) into bf16 out; the blocks
//     past T shift conv_state to the last K-1 pre-conv rows (after step 1 has read it), a thread
//     per channel.
// Workspace (floats): q, k [T, Hk, Dk]; v / U~ / O [T, Hv, Dv]; W [T, Hv, Dk]; g, beta [T, Hv];
// G [Hv, 64 * chunks]; P [Hv, chunks, 64, 64]: ~57 KB per token at the real shapes.
#include <algorithm>

#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "cuda/gated_deltanet.h"
#include "cuda/gated_deltanet_prefill.cuh"
#include "cuda/gated_deltanet_step.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::smem_addr;
using gdn_chunked::a_from_acc;
using gdn_chunked::kBT;
using gdn_chunked::kColsB;
using gdn_chunked::load_k_u_g;
using gdn_chunked::load_state_tiles;
using gdn_chunked::mma3;
using gdn_chunked::split_tf32;
using gdn_chunked::state_partials;
using gdn_chunked::store_state_tiles;
using gdn_chunked::u_from_partials;
using gdn_chunked::update_state;

constexpr int kThreads = 256;  // chunk, state and out kernels

size_t round4(size_t n) {
  return (n + 3) / 4 * 4;
}

struct PrefillWs {
  float *qn, *kn, *vb, *W, *gb, *bb, *Gc, *P;
};

PrefillWs carve(float* ws, int T, int Hk, int Hv, int Dk, int Dv) {
  const size_t NC = size_t(T + kBT - 1) / kBT;
  PrefillWs p;
  p.qn = ws;
  p.kn = p.qn + round4(size_t(T) * Hk * Dk);
  p.vb = p.kn + round4(size_t(T) * Hk * Dk);
  p.W = p.vb + round4(size_t(T) * Hv * Dv);
  p.gb = p.W + round4(size_t(T) * Hv * Dk);
  p.bb = p.gb + round4(size_t(T) * Hv);
  p.Gc = p.bb + round4(size_t(T) * Hv);
  p.P = p.Gc + size_t(Hv) * NC * kBT;
  return p;
}

// ---- 1. conv + SiLU + l2norm + gates
// Grid (ceil(T/TOK), ceil(C/128)), 128 threads: block (tb, cs) takes tokens [TOK tb, TOK tb + TOK)
// x channels [128 cs, 128 cs + 128), one channel per thread: its K taps in registers, a sliding
// window of the last K-1 inputs (rows before the chunk from conv_state), so each proj element and
// tap is read once (version 1 read 4 proj rows and all taps per token: ~256 KB of L2 traffic per
// token); the post-conv values go to shared memory [TOK][128], then one warp per (token, Dk-wide
// channel group) l2-normalises a q or k head (or copies v). 128 % Dk == 0, so heads never straddle
// blocks. Blocks with cs = 0 also compute the gates of their tokens. DRAM: the 32 KiB of qkv per
// token read, 32 KiB written: ~64 KB/token, ~62 us at T = 4096. TOK = 64 tokens per block from T =
// 2049; below, 16: at T = 256 the 64-token tiles made 256 blocks of 4 warps (8 warps per SM, each
// lane 8 loads at a time: ~8 KB in flight per SM) and the stage took 30 us for ~16 MB; 16-token
// tiles give 4x the blocks, each lane 2 rounds of 8 loads instead of 8 (the K-1 window rows before
// a tile are read again: 3/16 more reads, from L2).
constexpr int kPrepCh = 128;
constexpr int kPrepSmallT = 2048;  // T up to this: 16-token tiles

template <int KC, int kPrepTok>
__global__ void __launch_bounds__(kPrepCh)
    gdn_prep_kernel(const float* __restrict__ proj, const float* __restrict__ taps,
                    const float* __restrict__ conv_state, const float* __restrict__ neg_exp_A,
                    const float* __restrict__ dt_bias, int T, int Hk, int Hv, int Dk, int Dv,
                    float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ vb,
                    float* __restrict__ gb, float* __restrict__ bb) {
  __shared__ __align__(16) float ys[kPrepTok][kPrepCh];  // post-conv values of the tile
  const int tid = threadIdx.x, t0 = blockIdx.x * kPrepTok, ch0 = blockIdx.y * kPrepCh;
  const int QK = Hk * Dk, C = 2 * QK + Hv * Dv;
  const size_t P = size_t(C) + size_t(Hv) * Dv + 2 * size_t(Hv);
  const int n = min(kPrepTok, T - t0);
  const int c = ch0 + tid;
  if (c < C) {
    float tap[KC], win[KC];
#pragma unroll
    for (int j = 0; j < KC; ++j) tap[j] = taps[size_t(c) * KC + j];
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) {  // inputs t0 - (KC-1) + j: conv_state rows before t = 0
      const int r = t0 - (KC - 1) + j;
      win[j] = r < 0 ? conv_state[size_t(r + KC - 1) * C + c] : proj[size_t(r) * P + c];
    }
#pragma unroll 1
    for (int tt = 0; tt < kPrepTok; tt += 8) {
      float xin[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) xin[u] = tt + u < n ? proj[size_t(t0 + tt + u) * P + c] : 0.f;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        win[KC - 1] = xin[u];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < KC; ++j) acc += tap[j] * win[j];
        ys[tt + u][tid] = silu(acc);
#pragma unroll
        for (int j = 0; j + 1 < KC; ++j) win[j] = win[j + 1];
      }
    }
  }
  if (blockIdx.y == 0) {
    for (int e = tid; e < n * Hv; e += kPrepCh) {
      const int tt = e / Hv, h = e % Hv;
      const float* ba = proj + size_t(t0 + tt) * P + C + size_t(Hv) * Dv;  // b [Hv], then a [Hv]
      bb[size_t(t0 + tt) * Hv + h] = sigmoid(ba[h]);
      const float x = ba[Hv + h] + dt_bias[h];
      gb[size_t(t0 + tt) * Hv + h] = neg_exp_A[h] * (x > 20.f ? x : log1pf(expf(x)));
    }
  }
  __syncthreads();
  const int warp = tid >> 5, lane = tid & 31, groups = kPrepCh / Dk;
  for (int p = warp; p < n * groups; p += kPrepCh / 32) {
    const int tt = p / groups, gi = p % groups, cg = ch0 + gi * Dk, t = t0 + tt;
    if (cg >= C) continue;
    const float* row = &ys[tt][gi * Dk];
    if (cg < 2 * QK) {  // a q head (cg < QK) or a k head: l2norm (q also x Dk^-1/2)
      float ss = 0.f;
      for (int i = lane; i < Dk; i += 32) ss += row[i] * row[i];
      ss = warp_sum(ss);
      const bool is_q = cg < QK;
      const float r = (is_q ? rsqrtf(float(Dk)) : 1.f) * rsqrtf(ss + 1e-6f);
      float* dst =
          is_q ? qn + (size_t(t) * Hk + cg / Dk) * Dk : kn + (size_t(t) * Hk + (cg - QK) / Dk) * Dk;
      for (int i = lane; i < Dk; i += 32) dst[i] = row[i] * r;
    } else {
      float* dst = vb + size_t(t) * Hv * Dv + (cg - 2 * QK);
      for (int i = lane; i < Dk && cg + i < C; i += 32) dst[i] = row[i];
    }
  }
}

template <int KC>
void launch_prep(const float* proj, const float* taps, const float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, int T, int Hk, int Hv, int Dk,
                 int Dv, const PrefillWs& w, cudaStream_t stream) {
  const int C = 2 * Hk * Dk + Hv * Dv;
  if (T <= kPrepSmallT)
    gdn_prep_kernel<KC, 16>
        <<<dim3((T + 15) / 16, (C + kPrepCh - 1) / kPrepCh), kPrepCh, 0, stream>>>(
            proj, taps, conv_state, neg_exp_A, dt_bias, T, Hk, Hv, Dk, Dv, w.qn, w.kn, w.vb, w.gb,
            w.bb);
  else
    gdn_prep_kernel<KC, 64>
        <<<dim3((T + 63) / 64, (C + kPrepCh - 1) / kPrepCh), kPrepCh, 0, stream>>>(
            proj, taps, conv_state, neg_exp_A, dt_bias, T, Hk, Hv, Dk, Dv, w.qn, w.kn, w.vb, w.gb,
            w.bb);
  LILAC_CUDA_LAUNCHED();
}

// ---- 2. per chunk: K K^T, Q K^T, then per value head G, A, P, W, U~
template <int DK>
constexpr int chunk_smem_floats() {
  return 64 * (DK + 4) + 64 * std::max(DK + 4, 68) + 2 * 64 * 65 + 3 * 64 + 32;
}

// MINB: blocks per SM the launch bounds ask for. 2 (the default since s31): 128 registers, no
// spills (ptxas -v, sm_90a, every DK), so two blocks (102 KB of shared memory each at Dk 128)
// share an SM: 16 warps to hide the substitution's dependent FMA chains and instruction fetches.
// 1 (LILAC_GDN_CHUNK_BLOCKS=1, the form up to s30): ptxas takes 254 registers and a block has
// its SM to itself (8 warps). The same source, so the same operations in the same order: the
// same bits (GdnPrefill.ChunkBlocksPerSmGiveTheSameBits). Measured (s31 runs 4-6, H100, 4-bit,
// synthetic, uniform router, greedy, warm): the chunk stage per layer 303 -> 205 us at 4,096
// tokens, 4,655 -> 3,109 at 65,536, 31 -> 29 at 512, 22 at 256 either way (the same grid);
// prefill 43,315 -> 44,718 tok/s at 4,096, ten-length mean 32,224 -> 33,116 (+2.8%).
template <int DK, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    gdn_chunk_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                     const float* __restrict__ gb, const float* __restrict__ bb, int T, int Hk,
                     int Hv, int Dv, float* __restrict__ vb, float* __restrict__ Wb,
                     float* __restrict__ Gc, float* __restrict__ Pb) {
  constexpr int KP = DK + 4;  // padded rows (16-byte aligned, bank-shifted)
  constexpr int AP = 68;
  constexpr int XP = 65;
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;            // [64][KP]
  float* Qs = Ks + 64 * KP;  // [64][KP], then A [64][AP] (Q is dead by then)
  float* As = Qs;
  float* KK = Qs + 64 * std::max(KP, AP);  // [64][XP]
  float* QK = KK + 64 * XP;                // [64][XP]
  float* Gs = QK + 64 * XP;                // [64]
  float* Bs = Gs + 64;                     // [64] beta
  float* BG = Bs + 64;                     // [64] beta e^G
  float* wtot = BG + 64;                   // [32]

  // Block (c, y): chunk c; y a key head (all its value heads; grid y = Hk) or one value head
  // (grid y = Hv: the key head's K K^T and Q K^T computed once per value head, for more blocks
  // when the chunks are few).
  const int c = blockIdx.x, tid = threadIdx.x;
  const int t0 = c * kBT, n = min(kBT, T - t0);
  const int NC = gridDim.x, ratio = Hv / Hk;
  const bool per_value_head = int(gridDim.y) == Hv && ratio > 1;
  const int kh = per_value_head ? int(blockIdx.y) / ratio : int(blockIdx.y);
  const int v_begin = per_value_head ? int(blockIdx.y) : kh * ratio;
  const int v_end = per_value_head ? v_begin + 1 : v_begin + ratio;

  for (int e = tid; e < 64 * (DK / 4); e += kThreads) {
    const int r = e / (DK / 4), i4 = e % (DK / 4);
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
    if (r < n) {
      kv = *reinterpret_cast<const float4*>(kn + (size_t(t0 + r) * Hk + kh) * DK + 4 * i4);
      qv = *reinterpret_cast<const float4*>(qn + (size_t(t0 + r) * Hk + kh) * DK + 4 * i4);
    }
    *reinterpret_cast<float4*>(Ks + r * KP + 4 * i4) = kv;
    *reinterpret_cast<float4*>(Qs + r * KP + 4 * i4) = qv;
  }
  __syncthreads();

  // K K^T and Q K^T on tensor cores (3xTF32: A = K K^T feeds the state path): warp w computes
  // rows 16 (w & 3) .. +15 of K K^T (w < 4) or Q K^T (w >= 4), all 64 columns (8 n-tiles), over
  // Dk/8 k-steps. Fragments read straight from the padded rows (stride KP = Dk + 4: the 8 rows x 4
  // columns of an A or B fragment hit 32 distinct banks).
  {
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mtile = warp & 3;
    const float* X = warp < 4 ? Ks : Qs;
    float acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll 2
    for (int ks = 0; ks < DK / 8; ++ks) {
      const float* xa = X + (16 * mtile + g) * KP + 8 * ks + t;
      uint32_t ah[4], al[4];
      split_tf32(xa[0], ah[0], al[0]);
      split_tf32(xa[8 * KP], ah[1], al[1]);
      split_tf32(xa[4], ah[2], al[2]);
      split_tf32(xa[8 * KP + 4], ah[3], al[3]);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float* kb = Ks + (8 * nt + g) * KP + 8 * ks + t;
        mma3(acc[nt], ah, al, kb[0], kb[4]);
      }
    }
    float* dst = (warp < 4 ? KK : QK) + (16 * mtile + g) * XP + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      dst[8 * nt] = acc[nt][0];
      dst[8 * nt + 1] = acc[nt][1];
      dst[8 * XP + 8 * nt] = acc[nt][2];
      dst[8 * XP + 8 * nt + 1] = acc[nt][3];
    }
  }

  for (int v = v_begin; v < v_end; ++v) {
    __syncthreads();  // KK/QK written; the previous head's users of Gs, Bs, BG, As are done
    // G = inclusive cumsum of g over the chunk (warps 0 and 1), beta.
    float gv = 0.f, bv = 0.f;
    if (tid < 64 && tid < n) {
      gv = gb[size_t(t0 + tid) * Hv + v];
      bv = bb[size_t(t0 + tid) * Hv + v];
    }
    const int lane = tid & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, gv, o);
      if (lane >= o) gv += y;
    }
    if (tid == 31) wtot[0] = gv;
    __syncthreads();
    if (tid < 64) {
      if (tid >= 32) gv += wtot[0];
      Gs[tid] = gv;
      Bs[tid] = bv;
      BG[tid] = bv * expf(gv);
      Gc[size_t(v) * NC * kBT + t0 + tid] = gv;
    }
    __syncthreads();
    // A[r][s] = beta_r e^{G_r - G_s} (k_r . k_s) for s < r; P[r][s] = e^{G_r - G_s} (q_r . k_s) for
    // s <= r.
    float* Pc = Pb + (size_t(v) * NC + c) * kBT * kBT;
    for (int e = tid; e < kBT * kBT; e += kThreads) {
      const int r = e >> 6, s = e & 63;
      const float d = s <= r ? expf(Gs[r] - Gs[s]) : 0.f;
      As[r * AP + s] = s < r ? Bs[r] * d * KK[r * XP + s] : 0.f;
      Pc[e] = d * QK[r * XP + s];
    }
    __syncthreads();
    // Forward substitution, one column of [diag(beta e^G) K | diag(beta) V] per thread:
    // x_r = rhs_r - sum_{s<r} A[r][s] x_s, in place, rows unrolled.
    // Rows of v / U~ and of W are Hv Dv / Hv Dk floats apart: each row's address is the last
    // one's plus the stride (s29's SASS recomputed a 64-bit product per row: ~9 instructions per
    // load or store, a fifth of the kernel's code).
    const size_t v_stride = size_t(Hv) * size_t(Dv), w_stride = size_t(Hv) * size_t(DK);
    for (int col = tid; col < DK + Dv; col += kThreads) {
      float x[kBT];
      float* vcol = vb + (size_t(t0) * Hv + v) * Dv + (col - DK);
      if (col < DK) {
#pragma unroll
        for (int r = 0; r < kBT; ++r) x[r] = BG[r] * Ks[r * KP + col];
      } else {
        const float* vp = vcol;
#pragma unroll
        for (int r = 0; r < kBT; ++r, vp += v_stride) x[r] = r < n ? Bs[r] * *vp : 0.f;
      }
      // Two accumulators per row (groups of 4 alternate): the dependent chain of a row halves.
#pragma unroll
      for (int r = 1; r < kBT; ++r) {
        float acc[2] = {x[r], 0.f};
        const float* a = As + r * AP;
#pragma unroll
        for (int s = 0; s < (r & ~3); s += 4) {
          const float4 a4 = lds_f4(a + s);
          float& c = acc[(s >> 2) & 1];
          c -= a4.x * x[s];
          c -= a4.y * x[s + 1];
          c -= a4.z * x[s + 2];
          c -= a4.w * x[s + 3];
        }
#pragma unroll
        for (int s = r & ~3; s < r; ++s) acc[0] -= a[s] * x[s];
        x[r] = acc[0] + acc[1];
      }
      float* out = col < DK ? Wb + (size_t(t0) * Hv + v) * DK + col : vcol;
      const size_t out_stride = col < DK ? w_stride : v_stride;
#pragma unroll
      for (int r = 0; r < kBT; ++r, out += out_stride)
        if (r < n) *out = x[r];
    }
  }
}

// ---- 3. the state through the chunks, on tensor cores (3xTF32)
//
// The fragment layouts, 3xTF32 and the accumulator-as-A-operand permutation: the comment at the
// top of gated_deltanet_prefill.cuh.
template <int DK>
struct StateSmem {
  static constexpr int KPW = DK + 8;  // W/Q rows: float2 B loads at (row g, col 2t) conflict-free
  static constexpr int KPK = DK + 4;  // K rows: scalar B loads at (row 2t, col g) conflict-free
  static constexpr int PP = 72;       // P rows: float2 B loads at (row g, col 2t)
  static constexpr int UP = 36;       // U~ rows: scalar loads at (row 2t, col g)
  static constexpr int kWQ = 0, kK = kWQ + 128 * KPW, kP = kK + 64 * KPK, kU = kP + 64 * PP,
                       kG = kU + 64 * UP, kPart = kG + 64;
  static constexpr int kFloats = kPart + 2 * 4 * 16 * 32 * 4;  // partials [mt][dq][16 tiles][lane]
};

// Grid (Dv/32, Hv) = 128 blocks of 256 threads, ~197 KiB of shared memory (one per SM); block
// (cb, v) carries S[:, c0 .. c0+31] of value head v through the chunks. Orientation: S^T
// [value column x Dk]. Warp w: m-tile mt = w & 1 (columns c0 + 16 mt + 0..15), Dk quarter
// dq = w >> 1 (rows KQ dq .. KQ dq + KQ - 1, KQ = Dk/4); it holds that 16 x KQ piece of S^T as
// accumulator tiles (KQ/8 tiles, 4 floats each per lane). Per chunk (L = 64 rows):
//  1. X^T = S^T [W; Q]^T over the warp's Dk quarter (16 n-tiles: W rows 0..63, Q rows 0..63;
//     KQ/8 k-steps; 3 mma each): partial sums, written to shared memory and summed over the 4
//     quarters in a fixed order (every warp of an m-tile gets bitwise the same U).
//  2. U^T = U~^T - (W S)^T (16 cols x 64 rows, in registers); O^T = e^G (Q S)^T + U^T P^T for the
//     warp's 16 output rows 16 dq .. 16 dq + 15 (P lower triangular: k-steps up to the diagonal),
//     stored over U~ in the workspace.
//  3. S^T = e^{G_L} S^T + (U e^{G_L - G})^T K[:, quarter] (8 k-steps over the chunk rows, KQ/8
//     n-tiles).
// The next chunk's W and Q stream in (cp.async) during steps 2-3, its K, P, U~, G during the
// next step 1. Work per chunk and block: (2 x 64 x 128 x 32 + 64 x 128 x 32 + ~half of 64 x 64 x
// 32) x 3 = 2.75 M MAC in 2688 mma.sync (~5400 cycles at ~512 tf32 MAC/clk/SM); L2 reads 120 KB.
// ST: the recurrent state's element type (float, or bf16: model/state_format.h); the chunks carry
// it in f32 registers, so a bf16 state is rounded once, at the final store.
template <int DK, class ST, bool TRUNC>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_state_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
                     const float* __restrict__ Wb, const float* __restrict__ Pb,
                     const float* __restrict__ Gc, float* __restrict__ vb, ST* __restrict__ state,
                     int T, int Hk, int Hv, int Dv) {
  using L = StateSmem<DK>;
  constexpr int KQ = DK / 4, NJ = KQ / 8;  // Dk quarter per warp; its 8-wide tiles
  extern __shared__ __align__(16) float sm[];
  float* WQ = sm + L::kWQ;  // [128][KPW]  rows 0..63 W, 64..127 Q of the chunk
  float* Ks = sm + L::kK;   // [64][KPK]   K
  float* Ps = sm + L::kP;   // [64][PP]    P
  float* Ut = sm + L::kU;   // [64][UP]    U~ (this block's 32 columns)
  float* Gs = sm + L::kG;   // [64]        G
  float4* part = reinterpret_cast<float4*>(sm + L::kPart);

  const int cb = blockIdx.x, v = blockIdx.y, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int mt = warp & 1, dq = warp >> 1;
  const int kh = v / (Hv / Hk), c0 = cb * kColsB;
  const int NC = (T + kBT - 1) / kBT;
  const size_t rowW = size_t(Hv) * DK, rowQ = size_t(Hk) * DK, rowV = size_t(Hv) * Dv;
  const int colA = 16 * mt + g, colB = colA + 8;  // this lane's two value columns (of 32)

  // S^T tiles: s[j] covers Dk rows KQ dq + 8 j + (2t, 2t+1), columns colA (c0, c1), colB (c2, c3).
  float s[NJ][4];
  load_state_tiles<DK>(state + size_t(v) * DK * Dv + c0, Dv, dq, t, colA, colB, s);

  auto load_wq = [&](int c) {  // group A: W and Q rows of chunk c (zeros past T)
    const int t0 = c * kBT;
    for (int e = tid; e < 64 * (DK / 4); e += kThreads) {
      const int r = e / (DK / 4), i4 = e % (DK / 4), tt = t0 + r;
      const bool ok = tt < T;
      cp_async16(smem_addr(WQ + r * L::KPW + 4 * i4),
                 ok ? Wb + size_t(tt) * rowW + size_t(v) * DK + 4 * i4 : Wb, ok ? 16 : 0);
      cp_async16(smem_addr(WQ + (64 + r) * L::KPW + 4 * i4),
                 ok ? qn + size_t(tt) * rowQ + size_t(kh) * DK + 4 * i4 : qn, ok ? 16 : 0);
    }
  };
  auto load_rest = [&](int c) {  // group B: P, K, U~, G of chunk c
    const float* Pc = Pb + (size_t(v) * NC + c) * kBT * kBT;
    for (int e = tid; e < 64 * 16; e += kThreads) {
      const int r = e >> 4, i4 = e & 15;
      cp_async16(smem_addr(Ps + r * L::PP + 4 * i4), Pc + r * 64 + 4 * i4, 16);
    }
    load_k_u_g<DK, L::KPK, L::UP>(tid, c, T, NC, kn, rowQ, kh, vb, rowV, v, Dv, c0, Gc, Ks, Ut, Gs);
  };

  load_wq(0);
  cp_async_commit();
  load_rest(0);
  cp_async_commit();
  for (int c = 0; c < NC; ++c) {
    const int t0 = c * kBT;
    cp_async_wait<1>();  // W, Q of chunk c
    __syncthreads();     // ... visible to all; the previous chunk's readers of P, K, U~ are done

    // 1. X^T partial = S^T [W; Q]^T over this Dk quarter: x[n] for rows 8n .. 8n+7 of [W; Q].
    float x[16][4];
    state_partials<DK, 16, L::KPW, TRUNC>(s, WQ, dq, g, t, x);
    cp_async_wait<0>();  // P, K, U~, G of chunk c
#pragma unroll
    for (int n = 0; n < 16; ++n)
      part[((mt * 4 + dq) * 16 + n) * 32 + lane] = make_float4(x[n][0], x[n][1], x[n][2], x[n][3]);
    __syncthreads();  // partials, P, K, U~, G visible; every warp is done reading W, Q
    if (c + 1 < NC) load_wq(c + 1);
    cp_async_commit();

    // 2. U^T = U~^T - (W S)^T: tiles u[n] for chunk rows 8n + (2t, 2t+1), columns colA, colB.
    const float GL = Gs[kBT - 1];
    float u[8][4];
    u_from_partials<16, L::UP>(part, mt, lane, t, Ut, colA, colB, u);
    // O^T for output rows 16 dq + 8 i + (2t, 2t+1): e^G (Q S)^T, then + U^T P^T.
    float o[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float4 q4 = part[((mt * 4 + 0) * 16 + 8 + 2 * dq + i) * 32 + lane];
#pragma unroll
      for (int q = 1; q < 4; ++q) {
        const float4 p4 = part[((mt * 4 + q) * 16 + 8 + 2 * dq + i) * 32 + lane];
        q4.x += p4.x, q4.y += p4.y, q4.z += p4.z, q4.w += p4.w;
      }
      const int r = 16 * dq + 8 * i + 2 * t;
      const float e0 = expf(Gs[r]), e1 = expf(Gs[r + 1]);
      o[i][0] = q4.x * e0, o[i][1] = q4.y * e1, o[i][2] = q4.z * e0, o[i][3] = q4.w * e1;
    }
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      if (ks > 2 * dq + 1) continue;  // P[r][s] = 0 for s > r
      uint32_t ah[4], al[4];
      a_from_acc<TRUNC>(u[ks], ah, al);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (ks > 2 * dq + i) continue;
        const float2 b =
            *reinterpret_cast<const float2*>(Ps + (16 * dq + 8 * i + g) * L::PP + 8 * ks + 2 * t);
        mma3<TRUNC>(o[i], ah, al, b.x, b.y);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * dq + 8 * i + 2 * t;
      float* dst = vb + size_t(t0 + r) * rowV + size_t(v) * Dv + c0;
      if (t0 + r < T) dst[colA] = o[i][0], dst[colB] = o[i][2];
      if (t0 + r + 1 < T) dst[rowV + colA] = o[i][1], dst[rowV + colB] = o[i][3];
    }

    // 3. S^T = e^{G_L} S^T + (U e^{G_L - G})^T K[:, quarter].
    update_state<DK, L::KPK, TRUNC>(s, u, Gs, Ks, GL, dq, g, t);
    __syncthreads();  // every warp is done with P, K, U~, G and the partials
    if (c + 1 < NC) load_rest(c + 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
  store_state_tiles<DK>(state + size_t(v) * DK * Dv + c0, Dv, dq, t, colA, colB, s);
}

// ---- 4. gated norm, conv state
// Grid T + ceil(C / 256) (with K > 1), 256 threads: block t < T normalises token t's Hv heads, a
// warp per head; the blocks past T shift the conv state. Up to Dv = 32 kOutPerLane (the model's
// 128) a lane loads its head's elements at once (s31): the stage had taken 13 us per layer at 256
// tokens for ~10 MB, each warp waiting on ~8 dependent loads per head. Measured (s31 run 8, H100,
// the seq bench): 13 / 16 / 94 / 1,326 -> 7 / 11 / 62 / 878 us per layer at 256 / 512 / 4,096 /
// 65,536 tokens; tiny-a's logits through `lilac logits --device cuda` the same bits (run 9).
constexpr int kOutPerLane = 4;
__global__ void __launch_bounds__(kThreads)
    gdn_out_kernel(const float* __restrict__ proj, int T, const float* __restrict__ o_all,
                   const float* __restrict__ norm_w, int Hk, int Hv, int Dk, int Dv, int K,
                   float eps, float* __restrict__ conv_state, bf16* __restrict__ out) {
  const int tid = threadIdx.x;
  const int C = 2 * Hk * Dk + Hv * Dv;
  const size_t P = size_t(C) + size_t(Hv) * Dv + 2 * size_t(Hv);
  if (int(blockIdx.x) >= T) {
    // New conv state row r = row T + r of [old state (K-1 rows); proj (T rows)], a thread per
    // channel over the blocks past T (one block did all C channels until s12: 96 dependent
    // load-store rounds per thread, ~20 us). A channel's K-1 sources are read before any is
    // written (with T < K-1 some are its own old rows).
    const int c = (int(blockIdx.x) - T) * kThreads + tid;
    if (c >= C) return;
    float v[7];  // K <= 8
#pragma unroll
    for (int r = 0; r < 7; ++r) {
      const int idx = T + r;
      if (r < K - 1)
        v[r] = idx < K - 1 ? conv_state[size_t(idx) * C + c] : proj[size_t(idx - (K - 1)) * P + c];
    }
#pragma unroll
    for (int r = 0; r < 7; ++r)
      if (r < K - 1) conv_state[size_t(r) * C + c] = v[r];
    return;
  }
  const int t = blockIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int h = warp; h < Hv; h += kThreads / 32) {
    const float* o = o_all + (size_t(t) * Hv + h) * Dv;
    const float* z = proj + size_t(t) * P + C + size_t(h) * Dv;
    bf16* dst = out + (size_t(t) * Hv + h) * Dv;
    if (Dv <= 32 * kOutPerLane) {
      // A lane's elements j = lane + 32 i: o, z and norm_w loaded together before any use (one
      // round trip per head; the loop below waited on each o[j] in turn, then on z[j]), the same
      // sums in the same order (ss from 0 over i ascending), so the same bits.
      float ov[kOutPerLane], zv[kOutPerLane], wv[kOutPerLane];
#pragma unroll
      for (int i = 0; i < kOutPerLane; ++i) {
        const int j = lane + 32 * i;
        const bool in = j < Dv;
        ov[i] = in ? o[j] : 0.f;
        zv[i] = in ? z[j] : 0.f;
        wv[i] = in ? norm_w[j] : 0.f;
      }
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kOutPerLane; ++i)
        if (lane + 32 * i < Dv) ss += ov[i] * ov[i];
      const float r = rsqrtf(warp_sum(ss) / float(Dv) + eps);
#pragma unroll
      for (int i = 0; i < kOutPerLane; ++i)
        if (lane + 32 * i < Dv)
          dst[lane + 32 * i] = __float2bfloat16_rn(wv[i] * (ov[i] * r) * silu(zv[i]));
      continue;
    }
    float ss = 0.f;
    for (int j = lane; j < Dv; j += 32) ss += o[j] * o[j];
    const float r = rsqrtf(warp_sum(ss) / float(Dv) + eps);
    for (int j = lane; j < Dv; j += 32)
      dst[j] = __float2bfloat16_rn(norm_w[j] * (o[j] * r) * silu(z[j]));
  }
}

// Blocks per SM of gdn_chunk: `arg` (1 or 2), else (arg 0) LILAC_GDN_CHUNK_BLOCKS, else 2.
int chunk_blocks_per_sm(int arg) {
  if (arg == 0) {
    static const int env = env_choice("LILAC_GDN_CHUNK_BLOCKS", {1, 2});
    return env ? env : 2;
  }
  if (arg != 1 && arg != 2) fail("gdn_prefill: {} chunk blocks per SM (1 or 2)", arg);
  return arg;
}

// The state pass's 3xTF32 split (split_tf32): `arg` 1 rounded, 2 truncated; else (arg 0)
// LILAC_GDN_TF32_SPLIT (round | trunc), else truncated. Truncated measured faster (s32, H100, three
// interleaved rounds: the state stage -9 to -11% at 256-65,536 tokens, prefill +0.8 / +1.3 /
// +1.1 / +1.7 / +0.7% at 256 / 512 / 1,024 / 4,096 / 16,384 tokens, within the twin's
// tolerances); the default since s34, when the whole GPU suite passed with it (H200; s32's
// failure was the old full-size test's, docs/kernels.md s32-s34). True: truncated.
bool state_split_truncated(int arg) {
  if (arg == 0) {
    static const bool env =
        env_enum("LILAC_GDN_TF32_SPLIT", true, {{"round", false}, {"trunc", true}});
    return env;
  }
  if (arg != 1 && arg != 2) fail("gdn_prefill: tf32 split {} (1 rounded, 2 truncated)", arg);
  return arg == 2;
}

template <int DK, class ST, class Mark>
void launch_chunked(const PrefillWs& w, int T, int Hk, int Hv, int Dv, ST* state,
                    cudaStream_t stream, const Mark& mark, int per_sm, bool trunc) {
  constexpr size_t smemA = chunk_smem_floats<DK>() * sizeof(float),
                   smemB = StateSmem<DK>::kFloats * sizeof(float);
  static const bool attr_set = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel<DK, 1>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smemA)));
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel<DK, 2>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smemA)));
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_kernel<DK, ST, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smemB)));
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_kernel<DK, ST, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smemB)));
    return true;
  }();
  (void)attr_set;
  const int NC = (T + kBT - 1) / kBT;
  // A block per (chunk, value head) where those blocks fit one wave (one per SM, or two with
  // per_sm = 2), else per (chunk, key head) (H200, s12 run 3, the chunk stage: T = 256 39
  // -> 29 us with 128 value-head blocks instead of 64 key-head blocks; T = 512 47 -> 58 us with
  // 256, two per SM, against 128, when the kernel took fewer registers than today's 254).
  const int heads = int64_t(NC) * Hv <= int64_t(per_sm) * sm_count() ? Hv : Hk;
  const dim3 grid(NC, heads);
  if (per_sm == 2)
    gdn_chunk_kernel<DK, 2><<<grid, kThreads, smemA, stream>>>(w.qn, w.kn, w.gb, w.bb, T, Hk, Hv,
                                                               Dv, w.vb, w.W, w.Gc, w.P);
  else
    gdn_chunk_kernel<DK, 1><<<grid, kThreads, smemA, stream>>>(w.qn, w.kn, w.gb, w.bb, T, Hk, Hv,
                                                               Dv, w.vb, w.W, w.Gc, w.P);
  LILAC_CUDA_LAUNCHED();
  mark(2);
  const dim3 grid_s(Dv / kColsB, Hv);
  if (trunc)
    gdn_state_kernel<DK, ST, true><<<grid_s, kThreads, smemB, stream>>>(w.qn, w.kn, w.W, w.P, w.Gc,
                                                                        w.vb, state, T, Hk, Hv, Dv);
  else
    gdn_state_kernel<DK, ST, false><<<grid_s, kThreads, smemB, stream>>>(
        w.qn, w.kn, w.W, w.P, w.Gc, w.vb, state, T, Hk, Hv, Dv);
  LILAC_CUDA_LAUNCHED();
  mark(3);
}

}  // namespace

size_t gdn_prefill_workspace_floats(int T, int Hk, int Hv, int Dk, int Dv) {
  const size_t NC = size_t(T + kBT - 1) / kBT;
  return 2 * round4(size_t(T) * Hk * Dk) + round4(size_t(T) * Hv * Dv) +
         round4(size_t(T) * Hv * Dk) + 2 * round4(size_t(T) * Hv) + size_t(Hv) * NC * kBT +
         size_t(Hv) * NC * kBT * kBT;
}

namespace {

template <class ST>
void gdn_prefill_impl(const float* proj, int T, const float* conv_taps, float* conv_state,
                      const float* neg_exp_A, const float* dt_bias, const float* norm_scale,
                      ST* state, int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace,
                      bf16* out, cudaStream_t stream, const cudaEvent_t* stage_events,
                      int chunk_blocks, int tf32_split) {
  if (Hk <= 0 || Hv % Hk != 0)
    fail("gdn_prefill: {} value heads not a multiple of {} key heads", Hv, Hk);
  if (Dv <= 0 || Dv % kColsB != 0) fail("gdn_prefill: Dv {} not a multiple of {}", Dv, kColsB);
  if (Dk != 32 && Dk != 64 && Dk != 128) fail("gdn_prefill: Dk {} not supported (32, 64, 128)", Dk);
  if (K < 1 || K > 8) fail("gdn_prefill: conv kernel {} not supported (1..8)", K);
  const int per_sm = chunk_blocks_per_sm(chunk_blocks);  // before any launch: they may refuse
  const bool trunc = state_split_truncated(tf32_split);
  if (T <= 0) return;
  const PrefillWs w = carve(workspace, T, Hk, Hv, Dk, Dv);
  auto mark = [&](int i) {
    if (stage_events) LILAC_CUDA_CHECK(cudaEventRecord(stage_events[i], stream));
  };
  mark(0);
  switch (K) {
#define LILAC_GDN_PREP(KC)                                                                 \
  case KC:                                                                                 \
    launch_prep<KC>(proj, conv_taps, conv_state, neg_exp_A, dt_bias, T, Hk, Hv, Dk, Dv, w, \
                    stream);                                                               \
    break;
    LILAC_GDN_PREP(1)
    LILAC_GDN_PREP(2)
    LILAC_GDN_PREP(3)
    LILAC_GDN_PREP(4)
    LILAC_GDN_PREP(5)
    LILAC_GDN_PREP(6)
    LILAC_GDN_PREP(7)
    default:
      launch_prep<8>(proj, conv_taps, conv_state, neg_exp_A, dt_bias, T, Hk, Hv, Dk, Dv, w, stream);
      break;
#undef LILAC_GDN_PREP
  }
  mark(1);
  switch (Dk) {
    case 32:
      launch_chunked<32, ST>(w, T, Hk, Hv, Dv, state, stream, mark, per_sm, trunc);
      break;
    case 64:
      launch_chunked<64, ST>(w, T, Hk, Hv, Dv, state, stream, mark, per_sm, trunc);
      break;
    default:
      launch_chunked<128, ST>(w, T, Hk, Hv, Dv, state, stream, mark, per_sm, trunc);
      break;
  }
  const int C = 2 * Hk * Dk + Hv * Dv;
  gdn_out_kernel<<<T + (K > 1 ? (C + kThreads - 1) / kThreads : 0), kThreads, 0, stream>>>(
      proj, T, w.vb, norm_scale, Hk, Hv, Dk, Dv, K, eps, conv_state, out);
  LILAC_CUDA_LAUNCHED();
  mark(4);
}

}  // namespace

void gdn_prefill(const float* proj, int T, const float* conv_taps, float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, const float* norm_scale,
                 float* state, int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace,
                 bf16* out, cudaStream_t stream, const cudaEvent_t* stage_events, int chunk_blocks,
                 int tf32_split) {
  gdn_prefill_impl(proj, T, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state, Hk, Hv,
                   Dk, Dv, K, eps, workspace, out, stream, stage_events, chunk_blocks, tf32_split);
}

void gdn_prefill(const float* proj, int T, const float* conv_taps, float* conv_state,
                 const float* neg_exp_A, const float* dt_bias, const float* norm_scale, bf16* state,
                 int Hk, int Hv, int Dk, int Dv, int K, float eps, float* workspace, bf16* out,
                 cudaStream_t stream, const cudaEvent_t* stage_events, int chunk_blocks,
                 int tf32_split) {
  gdn_prefill_impl(proj, T, conv_taps, conv_state, neg_exp_A, dt_bias, norm_scale, state, Hk, Hv,
                   Dk, Dv, K, eps, workspace, out, stream, stage_events, chunk_blocks, tf32_split);
}

}  // namespace lilac::cuda
