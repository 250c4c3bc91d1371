// Attention prefill, version 2: causal flash attention on Hopper's warpgroup MMA (wgmma, sm_90a),
// hd 256 only. The same work, block shape, masking, online softmax and output as version 1
// (attention_prefill.cu, FlashAttention-2 on mma.sync), which stays the default and the path for
// other head dims and GPUs; this file is picked by attention_prefill's `version` argument or
// LILAC_ATTN_PREFILL=wgmma (docs/kernels.md, s33: "attention_prefill version 2").
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
// producer warp, no overlap of one warpgroup's softmax with the other's MMAs: that is version 2b).
//
// Per 64-key tile and block: 2 x 128 x 64 x 256 x 2 = 8.4 MFLOP; shared-memory reads by wgmma:
// S 2 x 16 x (2 + 2) KiB = 128 KiB (A re-read per n64 instruction), P V 2 x 4 x 8 KiB = 64 KiB.
// At 2,048 bf16 MACs per clock per SM the tile's MMAs take 2,048 clocks, its S reads 1,024 of
// them at 128 B / clock: the tensor cores, not shared memory, bound it. Predicted (s32 plan):
// 400-450 TFLOP/s at >= 16K tokens on an H100 against version 1's ~300.
#include "cuda/attention.h"
#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm_wgmma.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

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

__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ gate,
                              const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                              int pos0, int T, int heads, int group, int max_ctx,
                              bf16* __restrict__ out) {
#if defined(LILAC_SM90A)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t sQ = (tile::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + kQBytes, sV = sK + 2 * kKvTile;

  const int QB = kRows / group;                         // queries per block
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // longest query tiles first
  const int kvh = blockIdx.y;
  const int t0 = qt * QB;
  const int n_keys = pos0 + min(t0 + QB, T);  // keys [0, n_keys) are needed by this block
  const int ntiles = (n_keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;

  const bf16* kbase = k_cache + size_t(kvh) * max_ctx * kHd;
  const bf16* vbase = v_cache + size_t(kvh) * max_ctx * kHd;
  constexpr int kChunks = kHd / 8;                  // 16-byte chunks per row: 32
  constexpr int kRowsPerPass = kThreads / kChunks;  // 8
  const int ld_ch = tid % kChunks, ld_r0 = tid / kChunks;

  // Q rows (zeros past T), in the same commit group as K / V tile 0.
#pragma unroll 1
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int r = ld_r0 + i * kRowsPerPass, t = t0 + r / group;
    const bool ok = t < T;
    const size_t off =
        ok ? (size_t(t) * heads + size_t(kvh) * group + r % group) * kHd + ld_ch * 8 : 0;
    attn::cp_async16(sQ + slab_chunk(r, ld_ch, kQSlab), q + off, ok ? 16 : 0);
  }
  auto load_kv = [&](int tile, int stage) {
    const int key0 = tile * kKeys;
#pragma unroll 1
    for (int i = 0; i < kKeys / kRowsPerPass; ++i) {
      const int r = ld_r0 + i * kRowsPerPass, key = key0 + r;
      const bool ok = key < n_keys;
      const size_t off = ok ? size_t(key) * kHd + ld_ch * 8 : 0;
      const uint32_t so = uint32_t(stage) * kKvTile + slab_chunk(r, ld_ch, kKvSlab);
      attn::cp_async16(sK + so, kbase + off, ok ? 16 : 0);
      attn::cp_async16(sV + so, vbase + off, ok ? 16 : 0);
    }
  };
  load_kv(0, 0);
  attn::cp_async_commit();

  const float sc = rsqrtf(float(kHd)) * 1.4426950408889634f;  // hd^-0.5 * log2(e)
  // This thread's rows 64 wg + 16 wq + g and + 8: last visible key (causal).
  const int row0 = 64 * wg + 16 * wq + g;
  const int kmax0 = pos0 + t0 + row0 / group, kmax1 = pos0 + t0 + (row0 + 8) / group;
  const int kmax_block = pos0 + t0;  // the smallest over the block's rows
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const uint32_t sQw = sQ + uint32_t(wg) * 64u * 128u;  // this warpgroup's 64 rows of each slab

  for (int jt = 0; jt < ntiles; ++jt) {
    if (jt + 1 < ntiles) load_kv(jt + 1, (jt + 1) & 1);
    attn::cp_async_commit();
    attn::cp_async_wait<1>();  // Q and tile jt have landed (this thread's copies) ...
    tile::fence_proxy_async_smem();
    __syncthreads();  // ... and everyone's, visible to wgmma
    const uint32_t kst = sK + uint32_t(jt & 1) * kKvTile, vst = sV + uint32_t(jt & 1) * kKvTile;

    // S = Q K^T: k-step ks covers hd columns 16 ks .. + 15: slab ks / 4, 32 bytes per step in it.
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    tile::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * kSlabs; ++ks) {
      const uint32_t col = uint32_t(ks & 3) * 32u;
      tile::wgmma_m64n64k16(s, tile::sw128_desc(sQw + uint32_t(ks >> 2) * kQSlab + col),
                            tile::sw128_desc(kst + uint32_t(ks >> 2) * kKvSlab + col));
    }
    tile::wgmma_commit();
    tile::wgmma_wait<0>();
    tile::fence_operands(s);

    // Scale, causal mask (only tiles that cross the block's first position), online softmax.
    const int key0 = jt * kKeys;
    const bool masked = key0 + kKeys - 1 > kmax_block;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[4 * j + e] * sc;
        if (masked && key0 + 8 * j + 2 * tq + (e & 1) > (e < 2 ? kmax0 : kmax1)) v = -INFINITY;
        s[4 * j + e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
    m0 = mn0, m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[4 * j] = exp2f(s[4 * j] - mu0), s[4 * j + 1] = exp2f(s[4 * j + 1] - mu0);
      s[4 * j + 2] = exp2f(s[4 * j + 2] - mu1), s[4 * j + 3] = exp2f(s[4 * j + 3] - mu1);
      rs0 += s[4 * j] + s[4 * j + 1], rs1 += s[4 * j + 2] + s[4 * j + 3];
    }
    l0 = l0 * al0 + rs0, l1 = l1 * al1 + rs1;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      o[4 * j] *= al0, o[4 * j + 1] *= al0, o[4 * j + 2] *= al1, o[4 * j + 3] *= al1;

    // O += P V: k-step ks = keys 16 ks .. + 15 = S columns j = 2 ks, 2 ks + 1. V's slab rows are
    // keys, so the k-step starts 16 rows (2 groups of 8, 2 KiB) into the stage; N = 256 crosses
    // the 4 slabs (leading byte offset one slab), K = 16 the two 8-key groups (stride 1,024).
    uint32_t pa[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = attn::pack_bf16(s[8 * ks], s[8 * ks + 1]);
      pa[ks][1] = attn::pack_bf16(s[8 * ks + 2], s[8 * ks + 3]);
      pa[ks][2] = attn::pack_bf16(s[8 * ks + 4], s[8 * ks + 5]);
      pa[ks][3] = attn::pack_bf16(s[8 * ks + 6], s[8 * ks + 7]);
    }
    tile::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      qgemm_wgmma::wgmma_rs_m64n256k16<1>(
          o, pa[ks], tile::sw128_mn_desc(vst + uint32_t(ks) * 2048u, kKvSlab, 1024u));
    tile::wgmma_commit();
    tile::wgmma_wait<0>();
    tile::fence_operands(o);
    __syncthreads();  // stage jt & 1 is refilled by the next iteration's prefetch
  }

  // out = O / l * sigmoid(gate), rows past T skipped.
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + 8 * half, t = t0 + r / group;
    if (t >= T) continue;
    const float inv = 1.f / (half ? l1 : l0);
    const size_t base = (size_t(t) * heads + size_t(kvh) * group + r % group) * kHd + 2 * tq;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const __nv_bfloat162 gt = *reinterpret_cast<const __nv_bfloat162*>(gate + base + 8 * j);
      const float v0 = o[4 * j + 2 * half] * inv * sigmoid(__low2float(gt));
      const float v1 = o[4 * j + 2 * half + 1] * inv * sigmoid(__high2float(gt));
      *reinterpret_cast<uint32_t*>(out + base + 8 * j) = attn::pack_bf16(v0, v1);
    }
  }
#else
  (void)q, (void)gate, (void)k_cache, (void)v_cache, (void)pos0, (void)T, (void)heads, (void)group,
      (void)max_ctx, (void)out;
#endif
}

}  // namespace

bool attention_prefill_wgmma_supported(int hd) {
  return hd == kHd && device_compute_capability() / 10 == 9;
}

// The caller (attention_prefill) has checked the shapes and the positions.
void attention_prefill_wgmma(const bf16* q, const bf16* gate, const bf16* k_cache,
                             const bf16* v_cache, int pos0, int T, int heads, int kv_heads, int hd,
                             int max_ctx, bf16* out, cudaStream_t stream) {
  if (!attention_prefill_wgmma_supported(hd))
    fail(
        "attention_prefill version 2 (wgmma): needs head_dim {} on a compute capability 9.x GPU "
        "(head_dim {}, compute capability {})",
        kHd, hd, device_compute_capability());
  static const bool attr_set = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_wgmma_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)attr_set;
  const int group = heads / kv_heads, QB = kRows / group;
  const dim3 grid((T + QB - 1) / QB, kv_heads);
  attn_prefill_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(q, gate, k_cache, v_cache, pos0,
                                                                    T, heads, group, max_ctx, out);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
