// Attention, per-token parts: qk_norm_rope_store (also used by prefill) and split-K flash decoding.
//
// qk_norm_rope_store — real shapes (heads 16, kv 2, hd 256, R 64), per token: reads the f32 qkv row
// (9216 floats = 36 KiB), writes q + gate (16 KiB bf16) and k, v (2 KiB). Decode (T = 1): ~55 KB,
// latency-bound (~2 us incl. launch). Prefill: ~55 KB/token, bandwidth-bound: T = 8192 in ~0.12 ms.
// Grid T blocks of (heads + kv_heads) warps; warp w < heads takes query head w (+ its gate), warp
// heads + j takes kv head j (k and v). A lane holds hd/32 consecutive elements (16-byte loads);
// RMS-norm by a warp sum; RoPE partners (d +- R/2) come through a per-warp shared-memory row.
//
// attention_decode_qkv — one query, keys [0, n) with n = *d_pos0 + 1, from the token's f32 qkv row
// (version 2 of the decode path: the split kernel's prologue does qk_norm_rope_store's work for its
// GQA group and stores the new key and value; version 1, a qk_norm_rope_store launch before the
// split kernel, lost and lives in bench/lab/attention_decode). Real shapes: K and V of one layer
// are n * 2 kv * 256 * 2 B * 2 = 2 KiB per key: 64 MiB at n = 32K, read once (~15.6 us at 4.3 TB/s;
// the roofline). FLOPs: 16 heads * 4 * 256 per key = 16 KFLOP/key (0.5 GFLOP at 32K: nothing).
// Design: grid (S splits, kv_heads), S fixed from the SM count (one 128-thread block per SM,
// S * kv_heads <= #SMs; graph-safe: a block derives its key range from the device-side n and leaves
// at once when it is empty). A block walks its range in tiles of 64 keys, K and V tiles (64 x hd
// bf16, XOR-swizzled rows) streamed by cp.async through 3 shared-memory stages (192 KiB at hd 256:
// 128 KiB in flight per SM). All query heads of the kv head's group (<= 8) are the rows of one
// m16n8k16 A operand (rows 8..15 zero), so every K/V byte is read from DRAM once and from shared
// memory once: warp w takes keys 16w..16w+15 of each tile, S = Q K^T (hd/16 k-steps x 2 n-tiles,
// ldmatrix), an online softmax in f32 (exp2, running max), O += P V (ldmatrix.trans, hd/8 n-tiles:
// 2 f32 registers per n-tile per lane). At the end the 4 warps merge (m, l, O) through shared
// memory and the block writes its partial (unnormalised O relative to its max M, and M, L) to the
// workspace. The combine kernel (grid heads x hd/64, 256 threads) rescales the splits' partials,
// sums, normalises and applies the gate: out = bf16(attn * sigmoid(gate)). Partials: S * heads * hd
// * 4 B (1 MiB at 32K, L2-resident, ~1.6% of the KV bytes). Predicted: ~18 us at 32K (85% of copy
// bandwidth), ~5 us at short context (two launches + one tile of latency).
#include <algorithm>

#include "cuda/attention.h"
#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "cuda/decode_batch.h"
#include "cuda/launch.h"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using namespace attn;

constexpr unsigned kFull = 0xffffffffu;

// ---- qk_norm_rope_store

template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + i);
      x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
    }
  } else {
    static_assert(N == 2, "elements per lane: 2 or a multiple of 4");
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  }
}

template <int N>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&x)[N]) {
  uint32_t w[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) w[i] = pack_bf16(x[2 * i], x[2 * i + 1]);
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; i += 4)
      *reinterpret_cast<uint4*>(p + 2 * i) = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    static_assert(N == 2, "elements per lane: 2, 4 or a multiple of 8");
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
}

// One head row of hd = 32 * EPL values per warp (lane: EPL consecutive values from d0 = lane *
// EPL): RMS norm (mean over hd, eps) times `scale`, then split-half RoPE on dims [0, rotary_dim)
// at position pos (angle pos * inv_freq[j] in f32, full-precision sincosf). `buf` is a per-warp
// shared row of hd floats for the RoPE partners.
template <int EPL>
__device__ __forceinline__ void norm_rope_row(const float* __restrict__ src,
                                              const float* __restrict__ scale,
                                              const float* __restrict__ inv_freq, int pos,
                                              int rotary_dim, float eps, float* buf,
                                              float (&x)[EPL]) {
  constexpr int HD = 32 * EPL;
  const int d0 = (threadIdx.x & 31) * EPL;
  load_f32(src + d0, x);
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < EPL; ++e) ss += x[e] * x[e];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(HD) + eps);
  __syncwarp();  // the warp's previous readers of buf are done
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    x[e] = x[e] * r * scale[d0 + e];
    buf[d0 + e] = x[e];
  }
  __syncwarp();
  const int half = rotary_dim / 2;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int d = d0 + e;
    if (d < rotary_dim) {
      const bool lo = d < half;
      const int j = lo ? d : d - half;
      float sn, cs;
      sincosf(float(pos) * inv_freq[j], &sn, &cs);  // full-precision sin/cos of the f32 angle
      x[e] = lo ? x[e] * cs - buf[d + half] * sn : x[e] * cs + buf[d - half] * sn;
    }
  }
}

template <int EPL>
__global__ void qk_norm_rope_store_kernel(
    const float* __restrict__ qkv, const int32_t* __restrict__ d_pos0,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
    const float* __restrict__ inv_freq, int heads, int kv_heads, int rotary_dim, float eps,
    bf16* __restrict__ q, bf16* __restrict__ gate, bf16* __restrict__ k_cache,
    bf16* __restrict__ v_cache, int max_ctx) {
  constexpr int HD = 32 * EPL;
  extern __shared__ float rope_rows[];  // [warps][HD]: the normed row, for the RoPE partners
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pos = *d_pos0 + t;
  const size_t row_len = size_t(heads) * 2 * HD + size_t(2) * kv_heads * HD;
  const float* row = qkv + size_t(t) * row_len;
  const bool is_q = warp < heads;
  const int kvh = warp - heads;
  const float* src =
      is_q ? row + size_t(warp) * 2 * HD : row + size_t(heads) * 2 * HD + size_t(kvh) * HD;
  const int d0 = lane * EPL;
  float x[EPL];
  norm_rope_row<EPL>(src, is_q ? q_norm : k_norm, inv_freq, pos, rotary_dim, eps,
                     rope_rows + warp * HD, x);
  if (is_q) {
    const size_t o = (size_t(t) * heads + warp) * HD + d0;
    store_bf16(q + o, x);
    load_f32(src + HD + d0, x);
    store_bf16(gate + o, x);
  } else {
    const size_t o = (size_t(kvh) * max_ctx + pos) * HD + d0;
    store_bf16(k_cache + o, x);
    load_f32(row + size_t(heads) * 2 * HD + size_t(kv_heads) * HD + size_t(kvh) * HD + d0, x);
    store_bf16(v_cache + o, x);
  }
}

// ---- attention_decode

constexpr int kDecKeys = 64;  // keys per tile: 16 per warp
constexpr int kDecWarps = 4;
constexpr int kDecThreads = 32 * kDecWarps;
constexpr int kDecStages = 3;
constexpr int kMaxSplits = 1024;
constexpr int kCombineThreads = 256;

template <int HD>
constexpr int dec_smem_bytes() {
  return 2 * kDecStages * kDecKeys * HD * 2;
}
// The fused prologue's scratch after the stages: RoPE partner rows [warps][HD] f32, the group's
// normed and rotated queries [8][HD] bf16, the new key and value [2][HD] bf16.
template <int HD>
constexpr int dec_fused_smem_bytes() {
  return dec_smem_bytes<HD>() + kDecWarps * HD * 4 + 8 * HD * 2 + 2 * HD * 2;
}

// The one-split form's gates after that: [8][HD] f32.
template <int HD>
constexpr int dec_one_split_smem_bytes() {
  return dec_fused_smem_bytes<HD>() + 8 * HD * 4;
}

// What attention_decode_qkv adds: the projection row and the norm / RoPE parameters; the kernel
// writes the new key and value into the caches.
struct FusedQkv {
  const float* qkv;  // [heads*2*hd + 2*kv_heads*hd] f32
  const float *q_norm, *k_norm, *inv_freq;
  int rotary_dim;
  float eps;
  bf16 *k_cache, *v_cache;
};

// Batched decode (attention_decode_qkv_batch): B rows in grid z, each with its own sequence (rows,
// device memory), qkv row (stride qkv_stride floats) and partials (stride part_stride floats).
// rows == nullptr: the single-sequence launch.
struct BatchArgs {
  const DecodeBatchRow* rows;
  int slot;
  int qkv_stride;
  size_t part_stride;
};

// Keys per split for n keys over S splits: a whole number of tiles, at least one. The split kernel
// and the combine kernel both derive the active splits from it.
__device__ __forceinline__ int dec_keys_per_split(int n, int S) {
  const int k = (n + S - 1) / S;
  return (k + kDecKeys - 1) / kDecKeys * kDecKeys;
}

// The prologue computes the group's queries from the f32 qkv row (RMS norm, RoPE: norm_rope_row,
// as qk_norm_rope_store) into shared memory, and the block whose range holds the new key (position
// n - 1) computes that key and value, stores them in the caches and patches them into its last tile
// (that row is not read from the cache: zero-filled, then overwritten after the tile has landed).
// (Version 1 read q and gate written by a qk_norm_rope_store launch before it: bench/lab.)
// kOneSplit (launched with one split, gridDim.x == 1: batches of 34 or more rows on 132 SMs): the
// block also does the combine's work, out[h, d] = bf16(O / L * sigmoid(gate)) with the same
// arithmetic (the combine's split weight is 2^(M - M) = 1 and its sums over one split are exact,
// so the same bits), and no combine is launched. An instantiation of its own, so that the split
// form's code is unchanged (in the common body the epilogue made ptxas spill in every form; s17).
template <int HD, bool kOneSplit>
__global__ void __launch_bounds__(kDecThreads, 1)
    attn_decode_split_kernel(const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                             const int32_t* __restrict__ d_pos0, int heads, int kv_heads,
                             int max_ctx, float* __restrict__ part_o, float* __restrict__ part_ml,
                             FusedQkv fz, BatchArgs ba, bf16* __restrict__ out) {
  constexpr int EPL = HD / 32;
  const int group = heads / kv_heads;
  constexpr int RC = HD / 8;   // 16-byte chunks per K/V row
  constexpr int KS = HD / 16;  // k-steps of Q K^T
  constexpr int NT = HD / 8;   // n-tiles of P V
  constexpr uint32_t kStage = kDecKeys * HD * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_launch_dependents();  // PDL (launch.h): q / qkv and the position come from earlier kernels
  pdl_wait();

  int n;
  if (ba.rows) {  // batched (attention_decode_qkv_batch): grid z = the row, its own sequence
    const int b = blockIdx.z;
    const DecodeBatchRow& r = ba.rows[b];
    n = r.pos + 1;
    max_ctx = r.max_ctx;
    bf16* kc = r.kv + size_t(ba.slot) * 2 * kv_heads * size_t(max_ctx) * HD;
    k_cache = fz.k_cache = kc;
    v_cache = fz.v_cache = kc + size_t(kv_heads) * max_ctx * HD;
    fz.qkv += size_t(b) * ba.qkv_stride;
    part_o += size_t(b) * ba.part_stride;
    part_ml += size_t(b) * ba.part_stride;
  } else {
    n = *d_pos0 + 1;
  }
  const int S = gridDim.x, split = blockIdx.x, kvh = blockIdx.y;
  const int kps = dec_keys_per_split(n, S);
  const int start = split * kps;
  if (start >= n) return;  // an empty split (short context): the combine skips it
  const int end = min(n, start + kps);
  const int ntiles = (end - start + kDecKeys - 1) / kDecKeys;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;

  const bf16* kbase = k_cache + size_t(kvh) * max_ctx * HD;
  const bf16* vbase = v_cache + size_t(kvh) * max_ctx * HD;
  const uint32_t sK = smem_addr(smem), sV = sK + kDecStages * kStage;

  // Tile loads: thread tid copies chunk tid % RC of rows tid / RC + i * (kDecThreads / RC).
  constexpr int kRowsPerPass = kDecThreads / RC;
  const int ld_ch = tid % RC, ld_r0 = tid / RC;
  auto load_tile = [&](int tile, int stage) {
    const int key0 = start + tile * kDecKeys;
#pragma unroll 1
    for (int i = 0; i < kDecKeys / kRowsPerPass; ++i) {
      const int r = ld_r0 + i * kRowsPerPass, key = key0 + r;
      // Rows past the range: zeros (finite, masked below); the new key is patched in.
      const bool ok = key < end && key != n - 1;
      const size_t off = ok ? size_t(key) * HD + ld_ch * 8 : 0;
      const uint32_t so = stage * kStage + swz(r, ld_ch, RC);
      cp_async16(sK + so, kbase + off, ok ? 16 : 0);
      cp_async16(sV + so, vbase + off, ok ? 16 : 0);
    }
  };

  // ldmatrix addresses. This lane's K row (B operand of Q K^T) is warp*16 + (lane&7) + 8*(lane>>4)
  // at chunk 2ks + ((lane>>3)&1); its V row (B operand of P V, transposed) is warp*16 + (lane&7) +
  // 8*((lane>>3)&1) at chunk 2pp + (lane>>4). Both rows are = lane (mod 8), so the swizzled chunk
  // of step j is base[j & 3] + 128 bytes * (j >> 2) with four per-lane bases.
  uint32_t koff[4], voff[4];
  {
    const int x = lane & 7, krow = warp * 16 + x + ((lane >> 4) << 3),
              vrow = warp * 16 + x + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      koff[j] = uint32_t(krow * RC * 16 + ((2 * j + ((lane >> 3) & 1)) ^ x) * 16);
      voff[j] = uint32_t(vrow * RC * 16 + ((2 * j + (lane >> 4)) ^ x) * 16);
    }
  }

  // kOneSplit: the gates of the group's heads (group <= 8), [group][HD] f32 after the prologue's
  // scratch (dec_one_split_smem_bytes), copied with the first tile: read only by the epilogue.
  if constexpr (kOneSplit) {
    const uint32_t sG = smem_addr(smem + dec_fused_smem_bytes<HD>());
    for (int c = tid; c < group * HD / 4; c += kDecThreads) {
      const int gg = c / (HD / 4), d4 = c % (HD / 4);
      cp_async16(sG + 16 * c, fz.qkv + size_t(kvh * group + gg) * 2 * HD + HD + 4 * d4, 16);
    }
  }
  // The first tiles' copies, in flight during the prologue.
#pragma unroll
  for (int s = 0; s < kDecStages - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();
  }

  // The prologue (its loads overlap the first tiles' copies, issued above).
  bf16* qs = reinterpret_cast<bf16*>(smem + dec_smem_bytes<HD>() + kDecWarps * HD * 4);
  bf16* new_kv = qs + 8 * HD;
  const bool has_new = end == n;  // this block's range holds the new key n - 1
  {
    float* rbuf = reinterpret_cast<float*>(smem + dec_smem_bytes<HD>()) + warp * HD;
    const int pos = n - 1, d0 = lane * EPL;
    float x[EPL];
    for (int gg = warp; gg < group; gg += kDecWarps) {
      norm_rope_row<EPL>(fz.qkv + size_t(kvh * group + gg) * 2 * HD, fz.q_norm, fz.inv_freq, pos,
                         fz.rotary_dim, fz.eps, rbuf, x);
      store_bf16(qs + gg * HD + d0, x);
    }
    if (has_new && warp == kDecWarps - 1) {  // k: normed and rotated
      norm_rope_row<EPL>(fz.qkv + size_t(heads) * 2 * HD + size_t(kvh) * HD, fz.k_norm, fz.inv_freq,
                         pos, fz.rotary_dim, fz.eps, rbuf, x);
      store_bf16(new_kv + d0, x);
      store_bf16(fz.k_cache + (size_t(kvh) * max_ctx + pos) * HD + d0, x);
    }
    if (has_new && warp == kDecWarps - 2) {  // v: as it is
      load_f32(fz.qkv + size_t(heads) * 2 * HD + size_t(kv_heads + kvh) * HD + d0, x);
      store_bf16(new_kv + HD + d0, x);
      store_bf16(fz.v_cache + (size_t(kvh) * max_ctx + pos) * HD + d0, x);
    }
    __syncthreads();  // qs, new_kv visible
  }

  // Q as the A operand: row g = query head kvh * group + g (rows >= group and 8..15 are zero).
  uint32_t qa[KS][2];
  {
    const bool row_ok = g < group;
    const bf16* qsrc = qs + (row_ok ? g : 0) * HD;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(qsrc);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qa[ks][0] = row_ok ? qrow[ks * 8 + tq] : 0u;
      qa[ks][1] = row_ok ? qrow[ks * 8 + 4 + tq] : 0u;
    }
  }

  const float sc =
      rsqrtf(float(HD)) * 1.4426950408889634f;  // hd^-0.5 * log2(e): scores in log2 units
  float m = -INFINITY, l = 0.f;  // running max (row g) and this lane's share of the row sum
  float o[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = 0.f;

  for (int i = 0; i < ntiles; ++i) {
    const int pre = i + kDecStages - 1;
    if (pre < ntiles) load_tile(pre, pre % kDecStages);
    cp_async_commit();
    cp_async_wait<kDecStages - 1>();  // tile i has landed
    __syncthreads();
    if (has_new && i == ntiles - 1) {  // the new key and value into their row of the tile
      const int r = n - 1 - (start + i * kDecKeys);
      for (int e = tid; e < 2 * RC; e += kDecThreads) {
        const int which = e / RC, ch = e % RC;  // which 0: K, 1: V; 16-byte chunk ch
        const uint32_t off =
            (which * kDecStages + i % kDecStages) * kStage + swz(r, ch, RC);  // as load_tile
        *reinterpret_cast<uint4*>(smem + off) =
            *reinterpret_cast<const uint4*>(new_kv + which * HD + ch * 8);
      }
      __syncthreads();
    }
    const int key0 = start + i * kDecKeys + warp * 16;
    if (key0 < end) {
      const uint32_t kst = sK + (i % kDecStages) * kStage, vst = sV + (i % kDecStages) * kStage;
      // S = Q K^T for this warp's 16 keys: n-tile 0 keys 0..7, n-tile 1 keys 8..15; even and odd
      // k-steps accumulate separately (two independent mma chains per n-tile).
      float s0[2][2] = {{0.f, 0.f}, {0.f, 0.f}}, s1[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, kst + koff[ks & 3] + (ks >> 2) * 128);
        mma_16816_top(s0[ks & 1][0], s0[ks & 1][1], qa[ks][0], qa[ks][1], b0, b1);
        mma_16816_top(s1[ks & 1][0], s1[ks & 1][1], qa[ks][0], qa[ks][1], b2, b3);
      }
      // Lane (g, tq) holds S[g][2tq], S[g][2tq+1] (keys 0..7) and S[g][8+2tq], S[g][9+2tq].
      float sv[4] = {(s0[0][0] + s0[1][0]) * sc, (s0[0][1] + s0[1][1]) * sc,
                     (s1[0][0] + s1[1][0]) * sc, (s1[0][1] + s1[1][1]) * sc};
      if (key0 + 16 > end) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (key0 + (j >> 1) * 8 + 2 * tq + (j & 1) >= end) sv[j] = -INFINITY;
      }
      float mx = fmaxf(fmaxf(sv[0], sv[1]), fmaxf(sv[2], sv[3]));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
      const float m_new = fmaxf(m, mx);
      const float m_use =
          m_new == -INFINITY ? 0.f : m_new;  // no finite score yet: keep exp2 away from NaN
      const float alpha = exp2f(m - m_use);
      float p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) p[j] = exp2f(sv[j] - m_use);
      l = l * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
      m = m_new;
      // P (row g, keys 2tq.. and 8+2tq..) is the A operand of O += P V as it stands.
      const uint32_t pa0 = pack_bf16(p[0], p[1]), pa2 = pack_bf16(p[2], p[3]);
#pragma unroll
      for (int pp = 0; pp < NT / 2; ++pp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_trans(b0, b1, b2, b3, vst + voff[pp & 3] + (pp >> 2) * 128);
        o[2 * pp][0] *= alpha, o[2 * pp][1] *= alpha;
        o[2 * pp + 1][0] *= alpha, o[2 * pp + 1][1] *= alpha;
        mma_16816_top(o[2 * pp][0], o[2 * pp][1], pa0, pa2, b0, b1);
        mma_16816_top(o[2 * pp + 1][0], o[2 * pp + 1][1], pa0, pa2, b2, b3);
      }
    }
    __syncthreads();  // every warp is done with stage i % kDecStages before it is refilled
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the 4 warps: (m_w, l_w, O_w) -> (M, L = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M)).
  float lsum = l + __shfl_xor_sync(kFull, l, 1);
  lsum += __shfl_xor_sync(kFull, lsum, 2);
  constexpr int OS = HD + 4;                    // padded row of the merge buffer
  float* sml = reinterpret_cast<float*>(smem);  // [warps][8][2]
  float* so = sml + kDecWarps * 16;             // [warps][8][OS]
  if (tq == 0) {
    sml[(warp * 8 + g) * 2] = m;
    sml[(warp * 8 + g) * 2 + 1] = lsum;
  }
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, sml[(w * 8 + g) * 2]);
  const float f = m == -INFINITY ? 0.f : exp2f(m - M);
#pragma unroll
  for (int j = 0; j < NT; ++j)
    *reinterpret_cast<float2*>(so + (warp * 8 + g) * OS + 8 * j + 2 * tq) =
        make_float2(o[j][0] * f, o[j][1] * f);
  if constexpr (kOneSplit) {
    static_assert((kDecWarps * 16 + kDecWarps * 8 * OS + 8) * 4 <= dec_smem_bytes<HD>(),
                  "the merge buffers and L fit in the stages");
    float* sL = so + kDecWarps * 8 * OS;  // [group]: L of each head
    const float* sG = reinterpret_cast<const float*>(smem + dec_fused_smem_bytes<HD>());
    if (tid < group) {
      float Mg = -INFINITY, L = 0.f;
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) Mg = fmaxf(Mg, sml[(w * 8 + tid) * 2]);
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) {
        const float mw = sml[(w * 8 + tid) * 2];
        if (mw != -INFINITY) L += sml[(w * 8 + tid) * 2 + 1] * exp2f(mw - Mg);
      }
      sL[tid] = L;
    }
    // The batched row's output (formed here: a pointer kept across the main loop cost spills).
    if (ba.rows) out += size_t(blockIdx.z) * heads * HD;
    cp_async_wait<0>();
    __syncthreads();  // so, sL and the gates
    constexpr int kGateIters = 8 * HD / kDecThreads;
#pragma unroll
    for (int i = 0; i < kGateIters; ++i) {
      const int idx = tid + i * kDecThreads;
      if (idx < group * HD) {
        const int gg = idx / HD, d = idx % HD;
        float acc = 0.f;
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) acc += so[(w * 8 + gg) * OS + d];
        const float gv = __bfloat162float(__float2bfloat16_rn(sG[idx]));
        out[size_t(kvh * group + gg) * HD + d] = __float2bfloat16_rn(acc / sL[gg] * sigmoid(gv));
      }
    }
    return;
  }
  __syncthreads();
  const size_t head0 = size_t(split) * heads + size_t(kvh) * group;
  for (int idx = tid; idx < group * HD; idx += kDecThreads) {
    const int gg = idx / HD, d = idx % HD;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) acc += so[(w * 8 + gg) * OS + d];
    part_o[(head0 + gg) * HD + d] = acc;
  }
  if (tid < group) {
    float Mg = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) Mg = fmaxf(Mg, sml[(w * 8 + tid) * 2]);
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float mw = sml[(w * 8 + tid) * 2];
      if (mw != -INFINITY) L += sml[(w * 8 + tid) * 2 + 1] * exp2f(mw - Mg);
    }
    part_ml[(head0 + tid) * 2] = Mg;
    part_ml[(head0 + tid) * 2 + 1] = L;
  }
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// out[h, d] = bf16(sum_s 2^(m_s - M) O_s[h, d] / sum_s 2^(m_s - M) l_s * sigmoid(gate[h, d])) over
// the active splits. Grid (heads, hd / 64); thread (sg, qd) sums splits sg, sg + 16, ... for dims
// 4qd..4qd+3 of its 64-dim slice, then the 16 split groups are summed through shared memory.
// The gate comes from the f32 qkv row (rounded to bf16 as qk_norm_rope_store stores it).
template <int HD>
__global__ void __launch_bounds__(kCombineThreads)
    attn_decode_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                               const float* __restrict__ qkv, const int32_t* __restrict__ d_pos0,
                               int S, int heads, bf16* __restrict__ out, BatchArgs ba) {
  __shared__ float w_s[kMaxSplits];
  __shared__ __align__(16) float red[16][64];
  __shared__ float scratch[32];
  pdl_launch_dependents();  // PDL (launch.h): the split kernel's partials
  pdl_wait();
  int n;
  if (ba.rows) {  // batched: grid z = the row
    const int b = blockIdx.z;
    n = ba.rows[b].pos + 1;
    qkv += size_t(b) * ba.qkv_stride;
    part_o += size_t(b) * ba.part_stride;
    part_ml += size_t(b) * ba.part_stride;
    out += size_t(b) * heads * HD;
  } else {
    n = *d_pos0 + 1;
  }
  const int kps = dec_keys_per_split(n, S), na = (n + kps - 1) / kps;
  const int h = blockIdx.x, d0 = blockIdx.y * 64, tid = threadIdx.x;
  float mx = -INFINITY;
  for (int s = tid; s < na; s += kCombineThreads)
    mx = fmaxf(mx, part_ml[(size_t(s) * heads + h) * 2]);
  const float M = block_max(mx, scratch);
  float lsum = 0.f;
  for (int s = tid; s < na; s += kCombineThreads) {
    const float e = exp2f(part_ml[(size_t(s) * heads + h) * 2] - M);
    w_s[s] = e;
    lsum += part_ml[(size_t(s) * heads + h) * 2 + 1] * e;
  }
  const float L = block_sum(lsum, scratch);  // its barriers also publish w_s
  __syncthreads();
  const int qd = tid & 15, sg = tid >> 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = sg; s < na; s += 16) {
    const float4 v =
        *reinterpret_cast<const float4*>(part_o + (size_t(s) * heads + h) * HD + d0 + 4 * qd);
    const float w = w_s[s];
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  *reinterpret_cast<float4*>(&red[sg][4 * qd]) = acc;
  __syncthreads();
  if (tid < 64) {
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) o += red[i][tid];
    const size_t idx = size_t(h) * HD + d0 + tid;
    const float gv = __bfloat162float(__float2bfloat16_rn(qkv[size_t(h) * 2 * HD + HD + d0 + tid]));
    out[idx] = __float2bfloat16_rn(o / L * sigmoid(gv));
  }
}

template <int HD>
void launch_decode(const int32_t* d_pos0, int heads, int kv_heads, int max_ctx, int S,
                   float* part_o, float* part_ml, const FusedQkv& fz, bf16* out,
                   cudaStream_t stream, const BatchArgs& ba = BatchArgs{nullptr, 0, 0, 0},
                   int B = 1) {
  constexpr int smem = dec_fused_smem_bytes<HD>();
  static const bool attr_set = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_split_kernel<HD, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_split_kernel<HD, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          dec_one_split_smem_bytes<HD>()));
    return true;
  }();
  (void)attr_set;
  if (S == 1) {  // the split kernel writes out: no combine
    launch_kernel(true, attn_decode_split_kernel<HD, true>, dim3(1, kv_heads, B), dim3(kDecThreads),
                  size_t(dec_one_split_smem_bytes<HD>()), stream, fz.k_cache, fz.v_cache, d_pos0,
                  heads, kv_heads, max_ctx, part_o, part_ml, fz, ba, out);
    return;
  }
  launch_kernel(true, attn_decode_split_kernel<HD, false>, dim3(S, kv_heads, B), dim3(kDecThreads),
                size_t(smem), stream, fz.k_cache, fz.v_cache, d_pos0, heads, kv_heads, max_ctx,
                part_o, part_ml, fz, ba, out);
  launch_kernel(true, attn_decode_combine_kernel<HD>, dim3(heads, HD / 64, B),
                dim3(kCombineThreads), 0, stream, part_o, part_ml, fz.qkv, d_pos0, S, heads, out,
                ba);
}

void check_attention_shape(int heads, int kv_heads, int hd, int max_ctx) {
  if (hd != 64 && hd != 128 && hd != 256)
    fail("attention: head_dim {} not supported (64, 128, 256)", hd);
  if (kv_heads <= 0 || heads % kv_heads != 0)
    fail("attention: {} heads not a multiple of {} kv heads", heads, kv_heads);
  const int group = heads / kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8)
    fail("attention: GQA group {} not supported (1, 2, 4, 8)", group);
  if (max_ctx <= 0) fail("attention: max_ctx {}", max_ctx);
}

}  // namespace

void qk_norm_rope_store(const float* qkv, int T, const int32_t* d_pos0, const float* q_norm,
                        const float* k_norm, const float* inv_freq, int heads, int kv_heads, int hd,
                        int rotary_dim, float eps, bf16* q, bf16* gate, bf16* k_cache,
                        bf16* v_cache, int max_ctx, cudaStream_t stream) {
  check_attention_shape(heads, kv_heads, hd, max_ctx);
  if (rotary_dim < 0 || rotary_dim > hd || rotary_dim % 2)
    fail("qk_norm_rope_store: rotary_dim {}", rotary_dim);
  if (heads + kv_heads > 32)
    fail("qk_norm_rope_store: {} + {} heads exceed one block", heads, kv_heads);
  if (T <= 0) return;
  const int threads = 32 * (heads + kv_heads);
  const size_t smem = size_t(heads + kv_heads) * hd * sizeof(float);
#define LILAC_QKROPE(EPL)                                                                    \
  qk_norm_rope_store_kernel<EPL>                                                             \
      <<<T, threads, smem, stream>>>(qkv, d_pos0, q_norm, k_norm, inv_freq, heads, kv_heads, \
                                     rotary_dim, eps, q, gate, k_cache, v_cache, max_ctx)
  switch (hd) {
    case 64:
      LILAC_QKROPE(2);
      break;
    case 128:
      LILAC_QKROPE(4);
      break;
    default:
      LILAC_QKROPE(8);
      break;
  }
#undef LILAC_QKROPE
  LILAC_CUDA_LAUNCHED();
}

namespace {
// The SM count, read once per device (no device query while a graph is being captured).
int device_sm_count() {
  static int sm_count[64] = {};
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) fail("attention_decode: device {}", dev);
  if (sm_count[dev] == 0)
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count[dev], cudaDevAttrMultiProcessorCount, dev));
  return sm_count[dev];
}
}  // namespace

int attention_decode_splits(int kv_heads, int max_ctx) {
  // One block per SM (the K/V stages take most of its shared memory), all resident in one wave.
  const int by_sm = std::max(1, device_sm_count() / std::max(1, kv_heads));
  const int by_ctx = std::max(1, (max_ctx + kDecKeys - 1) / kDecKeys);
  return std::min({by_sm, by_ctx, kMaxSplits});
}

size_t attention_decode_workspace_floats(int heads, int kv_heads, int hd, int max_ctx) {
  return size_t(attention_decode_splits(kv_heads, max_ctx)) * heads * (hd + 2);
}

void attention_decode_qkv(const float* qkv, const int32_t* d_pos0, const float* q_norm,
                          const float* k_norm, const float* inv_freq, int heads, int kv_heads,
                          int hd, int rotary_dim, float eps, bf16* k_cache, bf16* v_cache,
                          int max_ctx, float* partial, bf16* out, cudaStream_t stream) {
  check_attention_shape(heads, kv_heads, hd, max_ctx);
  if (rotary_dim < 0 || rotary_dim > hd || rotary_dim % 2)
    fail("attention_decode_qkv: rotary_dim {}", rotary_dim);
  const FusedQkv fz{qkv, q_norm, k_norm, inv_freq, rotary_dim, eps, k_cache, v_cache};
  const int S = attention_decode_splits(kv_heads, max_ctx);
  float* part_o = partial;                            // [S][heads][hd]
  float* part_ml = partial + size_t(S) * heads * hd;  // [S][heads][2]
  switch (hd) {
    case 64:
      launch_decode<64>(d_pos0, heads, kv_heads, max_ctx, S, part_o, part_ml, fz, out, stream);
      break;
    case 128:
      launch_decode<128>(d_pos0, heads, kv_heads, max_ctx, S, part_o, part_ml, fz, out, stream);
      break;
    default:
      launch_decode<256>(d_pos0, heads, kv_heads, max_ctx, S, part_o, part_ml, fz, out, stream);
      break;
  }
}

int attention_decode_batch_splits(int kv_heads) {
  return attention_decode_splits(kv_heads, 1 << 30);
}

// One wave of blocks over the whole batch: floor(SMs / (kv_heads B)) splits per row, at least one.
// With the single-sequence count (66 at 2 kv heads) every row had 66 x 2 blocks of one SM each
// (192 KiB of K/V stages) and at 1,024 keys only 16 of them had a 64-key tile: 16 rows made 2,112
// blocks, ~16 block waves of mostly empty blocks (54 us per layer, s5 run 2, against ~8 us for the
// 33.5 MB of K/V). Now 16 rows take 4 splits (128 blocks of 4 tiles), 64 rows one split each.
int attention_decode_batch_splits(int B, int kv_heads) {
  const int wave = device_sm_count() / std::max(1, kv_heads * std::max(1, B));
  return std::clamp(wave, 1, attention_decode_batch_splits(kv_heads));
}

size_t attention_decode_batch_workspace_floats(int B, int heads, int kv_heads, int hd) {
  return size_t(B) * size_t(attention_decode_batch_splits(kv_heads)) * heads * (hd + 2);
}

void attention_decode_qkv_batch(const float* qkv, int B, const DecodeBatchRow* rows, int slot,
                                const float* q_norm, const float* k_norm, const float* inv_freq,
                                int heads, int kv_heads, int hd, int rotary_dim, float eps,
                                float* partial, bf16* out, cudaStream_t stream) {
  check_attention_shape(heads, kv_heads, hd, 1);
  if (!qkv || !rows || !partial || !out) fail("attention_decode_qkv_batch: null pointer");
  if (B < 1 || B > 65535) fail("attention_decode_qkv_batch: B = {}", B);
  if (rotary_dim < 0 || rotary_dim > hd || rotary_dim % 2)
    fail("attention_decode_qkv_batch: rotary_dim {}", rotary_dim);
  // Every row uses the same split count, fixed by B (its key ranges follow its own length; empty
  // splits exit): one graph per batch size serves any mix of context sizes.
  const int S = attention_decode_batch_splits(B, kv_heads);
  const size_t row = size_t(S) * heads * (hd + 2);
  const FusedQkv fz{qkv, q_norm, k_norm, inv_freq, rotary_dim, eps, nullptr, nullptr};
  const BatchArgs ba{rows, slot, heads * 2 * hd + 2 * kv_heads * hd, row};
  float* part_o = partial;
  float* part_ml = partial + size_t(S) * heads * hd;
  switch (hd) {
    case 64:
      launch_decode<64>(nullptr, heads, kv_heads, 1, S, part_o, part_ml, fz, out, stream, ba, B);
      break;
    case 128:
      launch_decode<128>(nullptr, heads, kv_heads, 1, S, part_o, part_ml, fz, out, stream, ba, B);
      break;
    default:
      launch_decode<256>(nullptr, heads, kv_heads, 1, S, part_o, part_ml, fz, out, stream, ba, B);
      break;
  }
}

}  // namespace lilac::cuda
