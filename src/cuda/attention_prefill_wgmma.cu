// Attention prefill, versions 2 and 3: causal flash attention on Hopper's warpgroup MMA (wgmma,
// sm_90a), hd 256 only. The same work, block shape, masking, online softmax and output as version
// 1 (attention_prefill.cu, FlashAttention-2 on mma.sync), the path for other head dims and GPUs;
// version 3 is the default on Hopper at hd 256 since s34 (LILAC_ATTN_PREFILL=mma | wgmma to pick
// another; docs/kernels.md s33-s34). Version 3 is version 2 with
// one tile's softmax overlapped with the previous tile's P V (see the kernel).
//
// Why: version 1 runs ~290-320 TFLOP/s on an H100 (s32), bounded by shared memory: each of its 8
// warps reads every K and V tile through ldmatrix for its own 16 rows. Here a warpgroup's wgmma
// reads a K or V tile once for 64 rows, a quarter of the shared-memory bytes per MAC.
//
// Block: 128 (query, head) rows of one kv head (row r = query t0 + r / group, head kvh * group + r
// % group; 16 queries x 8 heads at the real shapes), as two warpgroups of 64 rows (256 threads,
// one block per SM). Per tile of 64 keys, warpgroup w:
//   S = Q_w K^T:  16 SS wgmma m64n64k16 (A = the block's Q rows 64w.., B = the K tile, both
//                 K-major: hd contiguous), S in 32 f32 registers per thread;
//   mask + online softmax on those registers (log2 units, running max and sum), exactly as
//                 version 1 (the m64nNk16 accumulator d[4 j + e] is row 16 (warp % 4) + g + 8 (e
//                 >> 1), column 8 j + 2 t + (e & 1): version 1's s[j][e] of the same lane);
//   O += P V:     4 RS wgmma m64n256k16, A = P packed to bf16 from S (the RS A fragment has the
//                 accumulator's row / column ownership), B = the V tile read MN-major (wgmma's
//                 transpose bit: V is keys x hd with hd contiguous), O in 128 f32 registers.
// Shared memory (1024-byte aligned; every tile as 64-column slabs of 128-byte rows in the
// 128-byte swizzle: 16-byte chunk c of row r at c ^ (r % 8), what sw128_desc / sw128_mn_desc
// describe): Q 4 slabs x [128][64] = 64 KiB, then 2 stages of K (4 x [64][64] = 32 KiB) and 2 of
// V: 192 KiB. K / V tiles double-buffered by cp.async as version 1 (all 256 threads copy; no
// producer warp).
//
// Per 64-key tile and block: 2 x 128 x 64 x 256 x 2 = 8.4 MFLOP; shared-memory reads by wgmma:
// S 2 x 16 x (2 + 2) KiB = 128 KiB (A re-read per n64 instruction), P V 2 x 4 x 8 KiB = 64 KiB.
// At 2,048 bf16 MACs per clock per SM the tile's MMAs take 2,048 clocks, its S reads 1,024 of
// them at 128 B / clock: the tensor cores, not shared memory, bound it. Predicted (s32 plan):
// 400-450 TFLOP/s at >= 16K tokens on an H100 against version 1's ~300.
#include "cuda/attention.h"
#include "cuda/attention_mma.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/tensor_map.h"
#include "cuda/wgmma.cuh"
#include "util/error.h"

namespace lilac::cuda {
// A named namespace, not an anonymous one: in the compute_80 PTX pass (LILAC_CUDA_PTX) the kernel
// body is empty and nvcc would warn about every unused internal device function.
namespace attn_wgmma {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kHd = 256;                               // the only head dim of this version
constexpr int kRows = 128;                             // (query, head) rows per block
constexpr int kKeys = 64;                              // keys per tile
constexpr int kThreads = 256;                          // two warpgroups
constexpr int kSlabs = kHd / 64;                       // 64-column slabs of a row
constexpr uint32_t kQSlab = kRows * 128;               // bytes of one Q slab [128][64]
constexpr uint32_t kKvSlab = kKeys * 128;              // bytes of one K or V slab [64][64]
constexpr uint32_t kKvTile = kSlabs * kKvSlab;         // one stage of K (or V): 32 KiB
constexpr uint32_t kQBytes = kSlabs * kQSlab;          // 64 KiB
constexpr uint32_t kSmemUsed = kQBytes + 4 * kKvTile;  // Q, 2 stages of K, 2 of V: 192 KiB
constexpr uint32_t kSmemBytes = kSmemUsed + 1024;      // + the 1024-byte alignment

// Byte offset of 16-byte chunk `chunk` (of kHd / 8) of row `row` in a tile of `slab_bytes`-byte
// slabs: slab chunk / 8, 128-byte row, the chunk within it XOR row % 8.
__device__ __forceinline__ uint32_t slab_chunk(int row, int chunk, uint32_t slab_bytes) {
  return uint32_t(chunk >> 3) * slab_bytes + uint32_t(row) * 128u +
         uint32_t(((chunk & 7) ^ (row & 7)) << 4);
}

// What every thread of a block knows: the block's rows and keys, this thread's copy slot and rows.
struct BlockCtx {
  uint32_t sQ, sK, sV;  // shared memory: Q, K stages, V stages (1024-byte aligned)
  int t0, QB, kvh, n_keys, ntiles;
  int wg, wq, g, tq;  // warpgroup, warp in it, lane / 4, lane % 4
  int row0;           // this thread's first row (64 wg + 16 wq + g; the second is row0 + 8)
  int kmax0, kmax1;   // the last key each of its two rows sees (causal)
  int kmax_block;     // the smallest of those over the block's rows
  int ld_ch, ld_r0;   // its 16-byte chunk and first row in the copies
  const bf16* kbase;  // this kv head's cache rows
  const bf16* vbase;
};

constexpr int kChunks = kHd / 8;                  // 16-byte chunks per row: 32
constexpr int kRowsPerPass = kThreads / kChunks;  // rows a pass of the block's copies covers: 8

__device__ __forceinline__ BlockCtx block_ctx(unsigned char* smem_raw, const bf16* k_cache,
                                              const bf16* v_cache, int pos0, int T, int group,
                                              int max_ctx) {
  BlockCtx c;
  c.sQ = (attn::smem_addr(smem_raw) + 1023u) & ~1023u;
  c.sK = c.sQ + kQBytes;
  c.sV = c.sK + 2 * kKvTile;
  c.QB = kRows / group;                                 // queries per block
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // longest query tiles first
  c.kvh = blockIdx.y;
  c.t0 = qt * c.QB;
  c.n_keys = pos0 + min(c.t0 + c.QB, T);  // keys [0, n_keys) are needed by this block
  c.ntiles = (c.n_keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, lane = tid & 31;
  c.wg = tid >> 7, c.wq = (tid >> 5) & 3, c.g = lane >> 2, c.tq = lane & 3;
  c.row0 = 64 * c.wg + 16 * c.wq + c.g;
  c.kmax0 = pos0 + c.t0 + c.row0 / group;
  c.kmax1 = pos0 + c.t0 + (c.row0 + 8) / group;
  c.kmax_block = pos0 + c.t0;
  c.ld_ch = tid % kChunks, c.ld_r0 = tid / kChunks;
  c.kbase = k_cache + size_t(c.kvh) * max_ctx * kHd;
  c.vbase = v_cache + size_t(c.kvh) * max_ctx * kHd;
  return c;
}

// The block's 128 Q rows (zeros past T) into the Q slabs.
__device__ __forceinline__ void load_q(const BlockCtx& c, const bf16* q, int T, int heads,
                                       int group) {
#pragma unroll 1
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int r = c.ld_r0 + i * kRowsPerPass, t = c.t0 + r / group;
    const bool ok = t < T;
    const size_t off =
        ok ? (size_t(t) * heads + size_t(c.kvh) * group + r % group) * kHd + c.ld_ch * 8 : 0;
    attn::cp_async16(c.sQ + slab_chunk(r, c.ld_ch, kQSlab), q + off, ok ? 16 : 0);
  }
}

// Keys [64 tile, + 64) of `base` (K or V rows of this kv head; zeros from n_keys on) into the
// stage at `stage_addr`.
__device__ __forceinline__ void load_keys(const BlockCtx& c, const bf16* base, int tile,
                                          uint32_t stage_addr) {
#pragma unroll 1
  for (int i = 0; i < kKeys / kRowsPerPass; ++i) {
    const int r = c.ld_r0 + i * kRowsPerPass, key = tile * kKeys + r;
    const bool ok = key < c.n_keys;
    const size_t off = ok ? size_t(key) * kHd + c.ld_ch * 8 : 0;
    attn::cp_async16(stage_addr + slab_chunk(r, c.ld_ch, kKvSlab), base + off, ok ? 16 : 0);
  }
}

// Issues S = Q_w K^T for the K stage at `kst` (not committed): k-step ks covers hd columns 16 ks
// .. + 15, slab ks / 4, 32 bytes per step inside it.
__device__ __forceinline__ void issue_s(const BlockCtx& c, float (&s)[32], uint32_t kst) {
  const uint32_t sQw = c.sQ + uint32_t(c.wg) * 64u * 128u;  // this warpgroup's rows of each slab
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  tile::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4 * kSlabs; ++ks) {
    const uint32_t col = uint32_t(ks & 3) * 32u;
    tile::wgmma_m64n64k16(s, tile::sw128_desc(sQw + uint32_t(ks >> 2) * kQSlab + col),
                          tile::sw128_desc(kst + uint32_t(ks >> 2) * kKvSlab + col));
  }
}

// The running max and sum of this thread's two rows (log2 units).
struct Softmax {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
};

// Scales S, masks keys past each row's last (only in tiles that cross the block's first
// position), folds the tile into the running max / sum and leaves exp2(S - max) in s; returns
// the factors (al0, al1) the rows' O must be scaled by. Version 1's arithmetic, value for value.
__device__ __forceinline__ float2 softmax_tile(const BlockCtx& c, float (&s)[32], int jt,
                                               Softmax& sm) {
  const float sc = rsqrtf(float(kHd)) * 1.4426950408889634f;  // hd^-0.5 * log2(e)
  const int key0 = jt * kKeys;
  const bool masked = key0 + kKeys - 1 > c.kmax_block;
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[4 * j + e] * sc;
      if (masked && key0 + 8 * j + 2 * c.tq + (e & 1) > (e < 2 ? c.kmax0 : c.kmax1)) v = -INFINITY;
      s[4 * j + e] = v;
    }
    mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
  const float mn0 = fmaxf(sm.m0, mx0), mn1 = fmaxf(sm.m1, mx1);
  const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
  const float al0 = exp2f(sm.m0 - mu0), al1 = exp2f(sm.m1 - mu1);
  sm.m0 = mn0, sm.m1 = mn1;
  float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[4 * j] = exp2f(s[4 * j] - mu0), s[4 * j + 1] = exp2f(s[4 * j + 1] - mu0);
    s[4 * j + 2] = exp2f(s[4 * j + 2] - mu1), s[4 * j + 3] = exp2f(s[4 * j + 3] - mu1);
    rs0 += s[4 * j] + s[4 * j + 1], rs1 += s[4 * j + 2] + s[4 * j + 3];
  }
  sm.l0 = sm.l0 * al0 + rs0, sm.l1 = sm.l1 * al1 + rs1;
  return make_float2(al0, al1);
}

__device__ __forceinline__ void scale_o(float (&o)[128], float2 al) {
#pragma unroll
  for (int j = 0; j < 32; ++j)
    o[4 * j] *= al.x, o[4 * j + 1] *= al.x, o[4 * j + 2] *= al.y, o[4 * j + 3] *= al.y;
}

// P (bf16) as the RS A fragments of the 4 k-steps of P V: k-step ks = keys 16 ks .. + 15 = S
// columns j = 2 ks, 2 ks + 1 (version 1's pa0 .. pa3).
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    pa[ks][0] = attn::pack_bf16(s[8 * ks], s[8 * ks + 1]);
    pa[ks][1] = attn::pack_bf16(s[8 * ks + 2], s[8 * ks + 3]);
    pa[ks][2] = attn::pack_bf16(s[8 * ks + 4], s[8 * ks + 5]);
    pa[ks][3] = attn::pack_bf16(s[8 * ks + 6], s[8 * ks + 7]);
  }
}

// Issues O += P V for the V stage at `vst` (not committed, no fence: the caller fences after its
// last register write). V's slab rows are keys, so k-step ks starts 16 rows (two 8-key groups, 2
// KiB) in; N = 256 crosses the 4 slabs (leading byte offset one slab), K = 16 the two groups
// (stride 1,024).
__device__ __forceinline__ void issue_pv(float (&o)[128], const uint32_t (&pa)[4][4],
                                         uint32_t vst) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    tile::wgmma_rs_m64n256k16<1>(o, pa[ks],
                                 tile::sw128_mn_desc(vst + uint32_t(ks) * 2048u, kKvSlab, 1024u));
}

// out = O / l * sigmoid(gate) for this thread's two rows, rows past T skipped.
__device__ __forceinline__ void store_out(const BlockCtx& c, const float (&o)[128], Softmax sm,
                                          const bf16* gate, int T, int heads, int group,
                                          bf16* out) {
  sm.l0 += __shfl_xor_sync(kFull, sm.l0, 1);
  sm.l0 += __shfl_xor_sync(kFull, sm.l0, 2);
  sm.l1 += __shfl_xor_sync(kFull, sm.l1, 1);
  sm.l1 += __shfl_xor_sync(kFull, sm.l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = c.row0 + 8 * half, t = c.t0 + r / group;
    if (t >= T) continue;
    const float inv = 1.f / (half ? sm.l1 : sm.l0);
    const size_t base = (size_t(t) * heads + size_t(c.kvh) * group + r % group) * kHd + 2 * c.tq;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const __nv_bfloat162 gt = *reinterpret_cast<const __nv_bfloat162*>(gate + base + 8 * j);
      const float v0 = o[4 * j + 2 * half] * inv * sigmoid(__low2float(gt));
      const float v1 = o[4 * j + 2 * half + 1] * inv * sigmoid(__high2float(gt));
      *reinterpret_cast<uint32_t*>(out + base + 8 * j) = attn::pack_bf16(v0, v1);
    }
  }
}

// OVERLAP = false (version 2): per tile, S, its softmax, then P V, each waited for; K and V tile
// j + 1 copied during tile j.
// OVERLAP = true (version 3): S of tile j and P V of tile j - 1 are issued together, and tile j's
// softmax runs while the tensor cores do that P V (FlashAttention-3's overlap within a warpgroup);
// O is rescaled after that P V retires. K runs one tile ahead of V: during iteration j the copies
// bring K j + 1 (into the stage K j - 1 left) and V j (into V j - 2's). One barrier per tile.
// Registers: S, P and O live together (32 + 16 + 128).
template <bool OVERLAP>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ gate,
                              const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                              int pos0, int T, int heads, int group, int max_ctx,
                              bf16* __restrict__ out) {
#if defined(LILAC_SM90A)
  extern __shared__ unsigned char smem_raw[];
  const BlockCtx c = block_ctx(smem_raw, k_cache, v_cache, pos0, T, group, max_ctx);
  auto kstage = [&](int tile) { return c.sK + uint32_t(tile & 1) * kKvTile; };
  auto vstage = [&](int tile) { return c.sV + uint32_t(tile & 1) * kKvTile; };
  Softmax sm;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];
  uint32_t pa[4][4];

  if constexpr (!OVERLAP) {
    load_q(c, q, T, heads, group);  // in the same commit group as K / V tile 0
    load_keys(c, c.kbase, 0, kstage(0));
    load_keys(c, c.vbase, 0, vstage(0));
    attn::cp_async_commit();
    for (int jt = 0; jt < c.ntiles; ++jt) {
      if (jt + 1 < c.ntiles) {
        load_keys(c, c.kbase, jt + 1, kstage(jt + 1));
        load_keys(c, c.vbase, jt + 1, vstage(jt + 1));
      }
      attn::cp_async_commit();
      attn::cp_async_wait<1>();  // Q and tile jt have landed (this thread's copies) ...
      tile::fence_proxy_async_smem();
      __syncthreads();  // ... and everyone's, visible to wgmma
      issue_s(c, s, kstage(jt));
      tile::wgmma_commit();
      tile::wgmma_wait<0>();
      tile::fence_operands(s);
      scale_o(o, softmax_tile(c, s, jt, sm));
      pack_p(s, pa);
      tile::wgmma_fence();
      issue_pv(o, pa, vstage(jt));
      tile::wgmma_commit();
      tile::wgmma_wait<0>();
      tile::fence_operands(o);
      __syncthreads();  // the stages of tile jt are refilled by the next iteration's copies
    }
  } else {
    // Prologue: Q and K 0 (group 0); S 0 and its softmax while K 1 and V 0 load (group 1).
    load_q(c, q, T, heads, group);
    load_keys(c, c.kbase, 0, kstage(0));
    attn::cp_async_commit();
    attn::cp_async_wait<0>();
    tile::fence_proxy_async_smem();
    __syncthreads();
    issue_s(c, s, kstage(0));
    tile::wgmma_commit();
    if (c.ntiles > 1) load_keys(c, c.kbase, 1, kstage(1));
    load_keys(c, c.vbase, 0, vstage(0));
    attn::cp_async_commit();
    tile::wgmma_wait<0>();
    tile::fence_operands(s);
    softmax_tile(c, s, 0, sm);  // O is still zero: nothing to rescale
    pack_p(s, pa);
    for (int jt = 1; jt < c.ntiles; ++jt) {
      // K jt and V jt - 1 have landed (this thread's, then everyone's); every warpgroup has
      // retired S jt - 1 and P V jt - 2, so K jt - 1's and V jt - 2's stages can be refilled.
      attn::cp_async_wait<0>();
      tile::fence_proxy_async_smem();
      __syncthreads();
      if (jt + 1 < c.ntiles) load_keys(c, c.kbase, jt + 1, kstage(jt + 1));
      load_keys(c, c.vbase, jt, vstage(jt));
      attn::cp_async_commit();
      issue_s(c, s, kstage(jt));  // fences: s zeroed, O rescaled and P packed since the last
      tile::wgmma_commit();
      issue_pv(o, pa, vstage(jt - 1));
      tile::wgmma_commit();
      tile::wgmma_wait<1>();  // S jt retired; P V jt - 1 may still run
      tile::fence_operands(s);
      const float2 al = softmax_tile(c, s, jt, sm);
      tile::wgmma_wait<0>();  // P V jt - 1 retired: O and P's registers are free
      tile::fence_operands(o);
      scale_o(o, al);
      pack_p(s, pa);
    }
    // The last tile's P V.
    attn::cp_async_wait<0>();
    tile::fence_proxy_async_smem();
    __syncthreads();
    tile::wgmma_fence();
    issue_pv(o, pa, vstage(c.ntiles - 1));
    tile::wgmma_commit();
    tile::wgmma_wait<0>();
    tile::fence_operands(o);
  }
  store_out(c, o, sm, gate, T, heads, group, out);
#else
  (void)q, (void)gate, (void)k_cache, (void)v_cache, (void)pos0, (void)T, (void)heads, (void)group,
      (void)max_ctx, (void)out;
#endif
}

// ---- version 4: warp-specialised ----------------------------------------------------------------
// FlashAttention-3's block shape: a producer warpgroup whose one thread copies Q once and the K
// and V tiles by TMA (tensor_map.h; the 128-byte swizzle is TMA's own, the layout above), and the
// two consumer warpgroups of version 3 (S j and P V j - 1 issued together, softmax j under P V j -
// 1), which no longer copy and never meet at a block barrier: each waits for its tiles on mbarriers
// and hands a stage back when its wgmma has read it. Rows past T and keys past pos0 + T are the
// tensor maps' zeros. setmaxnreg: the producer keeps 24 registers, each consumer 240 (version 3
// needs 207).
constexpr int kWsThreads = 384;  // producer warpgroup + two consumer warpgroups

// One mbarrier per (tile kind, stage) and direction; after the data in shared memory.
struct WsBarriers {
  uint64_t q_full, k_full[2], v_full[2], k_empty[2], v_empty[2];
};
constexpr uint32_t kWsSmemBytes = kSmemBytes + 128;  // + the barriers

__device__ __forceinline__ uint32_t bar_addr(const uint64_t& b) {
  return attn::smem_addr(&b);
}

// Turn taking between the two consumer warpgroups (256 threads: one waits, the other arrives).
// Barrier 1 + w is warpgroup w's turn; 0 is __syncthreads'.
__device__ __forceinline__ void wait_turn(int wg) {
  if (wg == 0)
    asm volatile("bar.sync 1, 256;" ::: "memory");
  else
    asm volatile("bar.sync 2, 256;" ::: "memory");
}
__device__ __forceinline__ void pass_turn(int wg) {
  if (wg == 0)
    asm volatile("bar.arrive 2, 256;" ::: "memory");
  else
    asm volatile("bar.arrive 1, 256;" ::: "memory");
}

// PINGPONG (version 5): FlashAttention-3's inter-warpgroup schedule on top: the consumers take
// turns issuing their MMAs (named barriers 1 and 2: a warpgroup waits for its turn, issues S j and
// P V j - 1, then passes the turn), so one's softmax, rescale and packing run while the other's
// MMAs occupy the tensor cores, instead of both asking for them at once.
template <bool PINGPONG>
__global__ void __launch_bounds__(kWsThreads, 1)
    attn_prefill_ws_kernel(const __grid_constant__ CUtensorMap q_map,
                           const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, const bf16* __restrict__ gate,
                           int pos0, int T, int heads, int group, bf16* __restrict__ out) {
#if defined(LILAC_SM90A)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = attn::smem_addr(smem_raw);
  BlockCtx c{};
  c.sQ = (raw + 1023u) & ~1023u;
  c.sK = c.sQ + kQBytes;
  c.sV = c.sK + 2 * kKvTile;
  WsBarriers& bar = *reinterpret_cast<WsBarriers*>(smem_raw + (c.sQ - raw) + kSmemUsed);
  c.QB = kRows / group;
  c.t0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * c.QB;  // longest query tiles first
  c.kvh = blockIdx.y;
  c.n_keys = pos0 + min(c.t0 + c.QB, T);
  c.ntiles = (c.n_keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x;
  auto kstage = [&](int tile) { return c.sK + uint32_t(tile & 1) * kKvTile; };
  auto vstage = [&](int tile) { return c.sV + uint32_t(tile & 1) * kKvTile; };
  if (tid == 0) {
    bulk::init(&bar.q_full, 1);
    for (int i = 0; i < 2; ++i) {
      bulk::init(&bar.k_full[i], 1), bulk::init(&bar.v_full[i], 1);
      bulk::init(&bar.k_empty[i], 2), bulk::init(&bar.v_empty[i], 2);  // one per consumer
    }
    bulk::fence_init();
  }
  __syncthreads();  // the only block barrier

  if (tid < 128) {  // producer warpgroup: thread 0 copies, the rest leave
    bulk::release_registers<24>();
    if (tid != 0) return;
    bulk::arrive_expect_tx(&bar.q_full, kQBytes);
    for (int sl = 0; sl < kSlabs; ++sl)  // rows (query t0 + r / group, head kvh group + r % group)
      bulk::copy_tensor_3d(c.sQ + uint32_t(sl) * kQSlab, &q_map, 64 * sl, c.kvh * group, c.t0,
                           bar_addr(bar.q_full));
    for (int jt = 0; jt < c.ntiles; ++jt) {
      const int st = jt & 1;
      const unsigned prev_round = unsigned((jt >> 1) - 1) & 1u;  // the round that last used st
      if (jt >= 2) bulk::wait(&bar.k_empty[st], prev_round);
      bulk::arrive_expect_tx(&bar.k_full[st], kKvTile);
      for (int sl = 0; sl < kSlabs; ++sl)
        bulk::copy_tensor_3d(kstage(jt) + uint32_t(sl) * kKvSlab, &k_map, 64 * sl, jt * kKeys,
                             c.kvh, bar_addr(bar.k_full[st]));
      if (jt >= 2) bulk::wait(&bar.v_empty[st], prev_round);
      bulk::arrive_expect_tx(&bar.v_full[st], kKvTile);
      for (int sl = 0; sl < kSlabs; ++sl)
        bulk::copy_tensor_3d(vstage(jt) + uint32_t(sl) * kKvSlab, &v_map, 64 * sl, jt * kKeys,
                             c.kvh, bar_addr(bar.v_full[st]));
    }
    return;
  }

  // Consumer warpgroups: rows 64 wg .. + 63 of the block, as version 3.
  bulk::claim_registers<240>();  // 128 x 24 + 256 x 240 <= 65,536
  const int ct = tid - 128, lane = ct & 31;
  c.wg = ct >> 7, c.wq = (ct >> 5) & 3, c.g = lane >> 2, c.tq = lane & 3;
  c.row0 = 64 * c.wg + 16 * c.wq + c.g;
  c.kmax0 = pos0 + c.t0 + c.row0 / group;
  c.kmax1 = pos0 + c.t0 + (c.row0 + 8) / group;
  c.kmax_block = pos0 + c.t0;
  const bool signals = (ct & 127) == 0;  // one arrival per warpgroup on the empty barriers
  auto parity = [](int tile) { return unsigned(tile >> 1) & 1u; };
  Softmax sm;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];
  uint32_t pa[4][4];

  // Turns: each warpgroup has ntiles + 1 issue phases; warpgroup 0 gives itself the first turn,
  // and warpgroup 1 does not pass the turn after its last phase (no one would take it).
  if (PINGPONG && c.wg == 0) asm volatile("bar.arrive 1, 256;" ::: "memory");
  bulk::wait(&bar.q_full, 0);
  bulk::wait(&bar.k_full[0], 0);
  if (PINGPONG) wait_turn(c.wg);
  issue_s(c, s, kstage(0));
  tile::wgmma_commit();
  if (PINGPONG) pass_turn(c.wg);
  tile::wgmma_wait<0>();
  tile::fence_operands(s);
  if (signals) bulk::arrive(&bar.k_empty[0]);
  softmax_tile(c, s, 0, sm);  // O is still zero: nothing to rescale
  pack_p(s, pa);
  for (int jt = 1; jt < c.ntiles; ++jt) {
    // V jt - 1 was copied before K jt; both waits before the MMAs, which then issue back to back
    // (a wait between them made ptxas fence the registers again).
    bulk::wait(&bar.v_full[(jt - 1) & 1], parity(jt - 1));
    bulk::wait(&bar.k_full[jt & 1], parity(jt));
    if (PINGPONG) wait_turn(c.wg);
    issue_s(c, s, kstage(jt));  // fences: s zeroed, O rescaled and P packed since the last
    tile::wgmma_commit();
    issue_pv(o, pa, vstage(jt - 1));
    tile::wgmma_commit();
    if (PINGPONG) pass_turn(c.wg);
    tile::wgmma_wait<1>();  // S jt retired: K jt's stage is free
    tile::fence_operands(s);
    if (signals) bulk::arrive(&bar.k_empty[jt & 1]);
    const float2 al = softmax_tile(c, s, jt, sm);
    tile::wgmma_wait<0>();  // P V jt - 1 retired: V jt - 1's stage, O and P's registers are free
    tile::fence_operands(o);
    if (signals) bulk::arrive(&bar.v_empty[(jt - 1) & 1]);
    scale_o(o, al);
    pack_p(s, pa);
  }
  const int last = c.ntiles - 1;
  bulk::wait(&bar.v_full[last & 1], parity(last));
  if (PINGPONG) wait_turn(c.wg);
  tile::wgmma_fence();
  issue_pv(o, pa, vstage(last));
  tile::wgmma_commit();
  if (PINGPONG && c.wg == 0) pass_turn(c.wg);
  tile::wgmma_wait<0>();
  tile::fence_operands(o);
  store_out(c, o, sm, gate, T, heads, group, out);
#else
  (void)q_map, (void)k_map, (void)v_map, (void)gate, (void)pos0, (void)T, (void)heads, (void)group,
      (void)out;
#endif
}

}  // namespace attn_wgmma

bool attention_prefill_wgmma_supported(int hd) {
  return hd == attn_wgmma::kHd && device_compute_capability() / 10 == 9;
}

// The caller (attention_prefill) has checked the shapes and the positions.
void attention_prefill_wgmma(const bf16* q, const bf16* gate, const bf16* k_cache,
                             const bf16* v_cache, int pos0, int T, int heads, int kv_heads, int hd,
                             int max_ctx, bf16* out, cudaStream_t stream, int version) {
  using namespace attn_wgmma;
  if (version < 2 || version > 5) fail("attention_prefill_wgmma: version {} (2 .. 5)", version);
  if (!attention_prefill_wgmma_supported(hd))
    fail(
        "attention_prefill versions 2-4 (wgmma): need head_dim {} on a compute capability 9.x "
        "GPU (head_dim {}, compute capability {})",
        kHd, hd, device_compute_capability());
  static const bool attr_set = [] {
    for (const void* k : {reinterpret_cast<const void*>(attn_prefill_wgmma_kernel<false>),
                          reinterpret_cast<const void*>(attn_prefill_wgmma_kernel<true>)})
      LILAC_CUDA_CHECK(
          cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    for (const void* k : {reinterpret_cast<const void*>(attn_prefill_ws_kernel<false>),
                          reinterpret_cast<const void*>(attn_prefill_ws_kernel<true>)})
      LILAC_CUDA_CHECK(
          cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmemBytes));
    return true;
  }();
  (void)attr_set;
  const int group = heads / kv_heads, QB = kRows / group;
  const dim3 grid((T + QB - 1) / QB, kv_heads);
  if (version >= 4) {
    // q [T][heads][hd] in boxes of (64 columns, the group's heads, QB queries): 128 rows, query
    // major; the caches [kv_heads][max_ctx][hd] seen as [kv_heads][pos0 + T][hd] (keys past the
    // chunk read as zeros) in boxes of (64 columns, 64 keys, one kv head).
    const uint64_t row = uint64_t(hd) * sizeof(bf16);
    const CUtensorMap q_map =
        bf16_tensor_map_3d(q, {uint64_t(hd), uint64_t(heads), uint64_t(T)},
                           {row, row * uint64_t(heads)}, {64, uint32_t(group), uint32_t(QB)});
    const uint64_t cache_dims[3] = {uint64_t(hd), uint64_t(pos0 + T), uint64_t(kv_heads)};
    const uint64_t cache_strides[2] = {row, row * uint64_t(max_ctx)};
    const CUtensorMap k_map = bf16_tensor_map_3d(k_cache, cache_dims, cache_strides, {64, 64, 1});
    const CUtensorMap v_map = bf16_tensor_map_3d(v_cache, cache_dims, cache_strides, {64, 64, 1});
    auto kernel = version == 5 ? attn_prefill_ws_kernel<true> : attn_prefill_ws_kernel<false>;
    kernel<<<grid, kWsThreads, kWsSmemBytes, stream>>>(q_map, k_map, v_map, gate, pos0, T, heads,
                                                       group, out);
  } else {
    auto kernel = version == 3 ? attn_prefill_wgmma_kernel<true> : attn_prefill_wgmma_kernel<false>;
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(q, gate, k_cache, v_cache, pos0, T, heads, group,
                                                   max_ctx, out);
  }
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
