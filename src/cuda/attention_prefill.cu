// Attention prefill: causal flash attention on tensor cores (mma.sync m16n8k16 bf16, ldmatrix,
// cp.async double buffering), GQA-shared K/V tiles, gated bf16 output.
//
// Work at the real shapes (heads 16, kv 2, hd 256), T queries at pos0.. over keys [0, pos0 + T):
// FLOPs = 4 * hd * heads * (sum over queries of their key counts) = 16384 * T * (pos0 + (T+1)/2):
// T = 8192 from 0: 0.55 TFLOP (1.8 ms at 300 TFLOP/s); the 16th chunk of a 128K prompt: 17.6 TFLOP.
// Bytes: q, gate, out 3 * T * 8 KiB and K/V tiles streamed from L2/DRAM (re-read by each block: see
// below). The roofline is the tensor-core rate.
//
// Design (FlashAttention-2 structure): a block owns 128 rows = (query, head) pairs of one kv head:
// row r is query t0 + r / group, head kvh * group + r % group (group = heads / kv_heads; 16 queries
// x 8 heads at the real shapes), so the 8 heads sharing a kv head share every K/V tile, and the
// block's rows span only 16 positions: the causal boundary costs at most one partly masked tile per
// block. 8 warps x 16 rows; per tile of 64 keys a warp computes S = Q K^T (16 x 64, hd/16 k-steps,
// Q and K fragments by ldmatrix from XOR-swizzled shared memory), masks keys past each row's
// position (only in the last tile), runs the online softmax in f32 (scores in log2 units, running
// max, rescale), and O += P V with P re-packed from the S accumulators as bf16 A fragments and V
// read with ldmatrix.trans (O: 16 x hd f32, 128 registers per lane at hd 256). K/V tiles are
// double-buffered with cp.async (tile j+1 loads while tile j computes). Shared memory: Q 64 KiB + 2
// x (K 32 + V 32) = 192 KiB at hd 256: one 256-thread block per SM. Blocks are issued longest-first
// (the last query tile first) to balance the causal triangle. Rows past T are zero-filled and not
// stored; keys past the range are zero-filled (finite) and masked. Intensity: each 64-key K+V tile
// (64 KiB) feeds 128 x 64 x 256 x 4 = 8.4 MFLOP: 128 FLOP/B from L2; shared memory reads per tile
// are 8 warps x 64 KiB (K and V) + Q, about 1 B per 8 MACs, which bounds mma.sync flash attention
// at hd 256 near 500 TFLOP/s. Predicted: 250-330 TFLOP/s at T >= 4096.
#include <algorithm>

#include "cuda/attention.h"
#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using namespace attn;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kPreRows = 128;  // (query, head) rows per block
constexpr int kPreKeys = 64;   // keys per tile
constexpr int kPreWarps = 8;
constexpr int kPreThreads = 32 * kPreWarps;

template <int HD>
constexpr int pre_smem_bytes() {
  return (kPreRows + 4 * kPreKeys) * HD * 2;  // Q, then 2 stages of K, then 2 of V
}

template <int HD>
__global__ void __launch_bounds__(kPreThreads, 1)
    attn_prefill_kernel(const bf16* __restrict__ q, const bf16* __restrict__ gate,
                        const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                        int pos0, int T, int heads, int group, int max_ctx,
                        bf16* __restrict__ out) {
  constexpr int RC = HD / 8;   // 16-byte chunks per row
  constexpr int KS = HD / 16;  // k-steps of Q K^T
  constexpr int NT = HD / 8;   // n-tiles of O
  constexpr uint32_t kRowBytes = RC * 16;
  constexpr uint32_t kTile = kPreKeys * HD * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_addr(smem), sK = sQ + kPreRows * HD * 2, sV = sK + 2 * kTile;

  const int QB = kPreRows / group;                      // queries per block
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // longest query tiles first
  const int kvh = blockIdx.y;
  const int t0 = qt * QB;
  const int n_keys = pos0 + min(t0 + QB, T);  // keys [0, n_keys) are needed by this block
  const int ntiles = (n_keys + kPreKeys - 1) / kPreKeys;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;

  const bf16* kbase = k_cache + size_t(kvh) * max_ctx * HD;
  const bf16* vbase = v_cache + size_t(kvh) * max_ctx * HD;
  constexpr int kRowsPerPass = kPreThreads / RC;
  const int ld_ch = tid % RC, ld_r0 = tid / RC;

  // Q rows (zeros past T).
#pragma unroll 1
  for (int i = 0; i < kPreRows / kRowsPerPass; ++i) {
    const int r = ld_r0 + i * kRowsPerPass, t = t0 + r / group;
    const bool ok = t < T;
    const size_t off =
        ok ? (size_t(t) * heads + size_t(kvh) * group + r % group) * HD + ld_ch * 8 : 0;
    cp_async16(sQ + swz(r, ld_ch, RC), q + off, ok ? 16 : 0);
  }
  auto load_kv = [&](int tile, int stage) {
    const int key0 = tile * kPreKeys;
#pragma unroll 1
    for (int i = 0; i < kPreKeys / kRowsPerPass; ++i) {
      const int r = ld_r0 + i * kRowsPerPass, key = key0 + r;
      const bool ok = key < n_keys;
      const size_t off = ok ? size_t(key) * HD + ld_ch * 8 : 0;
      const uint32_t so = stage * kTile + swz(r, ld_ch, RC);
      cp_async16(sK + so, kbase + off, ok ? 16 : 0);
      cp_async16(sV + so, vbase + off, ok ? 16 : 0);
    }
  };
  load_kv(0, 0);
  cp_async_commit();

  // ldmatrix addresses (every row below is = lane (mod 8), so the swizzled chunk of step j is
  // base[j & 3] + 128 bytes * (j >> 2)):
  //   Q, A operand:          row warp*16 + (lane&7) + 8*((lane>>3)&1), chunk 2ks + (lane>>4)
  //   K, B operand:          row 16p + (lane&7) + 8*(lane>>4),         chunk 2ks + ((lane>>3)&1)
  //   V, B operand (trans):  row 16ks + (lane&7) + 8*((lane>>3)&1),    chunk 2pp + (lane>>4)
  uint32_t qoff[4], koff[4], voff[4];
  {
    const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      qoff[j] = uint32_t((warp * 16 + x + 8 * mid) * kRowBytes + ((2 * j + hi) ^ x) * 16);
      koff[j] = uint32_t((x + 8 * hi) * kRowBytes + ((2 * j + mid) ^ x) * 16);
      voff[j] = uint32_t((x + 8 * mid) * kRowBytes + ((2 * j + hi) ^ x) * 16);
    }
  }

  const float sc = rsqrtf(float(HD)) * 1.4426950408889634f;  // hd^-0.5 * log2(e)
  // This lane's rows warp*16 + g and + 8: last visible key (causal).
  const int kmax0 = pos0 + t0 + (warp * 16 + g) / group,
            kmax1 = pos0 + t0 + (warp * 16 + g + 8) / group;
  const int kmax_block = pos0 + t0;  // the smallest over the block's rows
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  for (int jt = 0; jt < ntiles; ++jt) {
    if (jt + 1 < ntiles) load_kv(jt + 1, (jt + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // Q and tile jt have landed
    __syncthreads();
    const uint32_t kst = sK + (jt & 1) * kTile, vst = sV + (jt & 1) * kTile;

    // S = Q K^T: 16 rows x 64 keys per warp, n-tile nt = keys 8nt..8nt+7.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a0, a1, a2, a3;
      ldsm_x4(a0, a1, a2, a3, sQ + qoff[ks & 3] + (ks >> 2) * 128);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, kst + p * 16 * kRowBytes + koff[ks & 3] + (ks >> 2) * 128);
        mma_16816(s[2 * p], a0, a1, a2, a3, b0, b1);
        mma_16816(s[2 * p + 1], a0, a1, a2, a3, b2, b3);
      }
    }

    // Scale, causal mask (only tiles that cross the block's first position), online softmax.
    const int key0 = jt * kPreKeys;
    const bool masked = key0 + kPreKeys - 1 > kmax_block;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * sc;
        if (masked && key0 + 8 * nt + 2 * tq + (e & 1) > (e < 2 ? kmax0 : kmax1)) v = -INFINITY;
        s[nt][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
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
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - mu0), s[nt][1] = exp2f(s[nt][1] - mu0);
      s[nt][2] = exp2f(s[nt][2] - mu1), s[nt][3] = exp2f(s[nt][3] - mu1);
      rs0 += s[nt][0] + s[nt][1], rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * al0 + rs0, l1 = l1 * al1 + rs1;
#pragma unroll
    for (int j = 0; j < NT; ++j) o[j][0] *= al0, o[j][1] *= al0, o[j][2] *= al1, o[j][3] *= al1;

      // O += P V: k-step ks = keys 16ks..16ks+15 = S n-tiles 2ks, 2ks+1.
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t pa0 = pack_bf16(s[2 * ks][0], s[2 * ks][1]),
                     pa1 = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
      const uint32_t pa2 = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      const uint32_t pa3 = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
      for (int pp = 0; pp < NT / 2; ++pp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_trans(b0, b1, b2, b3, vst + ks * 16 * kRowBytes + voff[pp & 3] + (pp >> 2) * 128);
        mma_16816(o[2 * pp], pa0, pa1, pa2, pa3, b0, b1);
        mma_16816(o[2 * pp + 1], pa0, pa1, pa2, pa3, b2, b3);
      }
    }
    __syncthreads();  // stage jt & 1 is refilled by the next iteration's prefetch
  }

  // out = O / l * sigmoid(gate), rows past T skipped.
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + 8 * half, t = t0 + r / group;
    if (t >= T) continue;
    const float inv = 1.f / (half ? l1 : l0);
    const size_t base = (size_t(t) * heads + size_t(kvh) * group + r % group) * HD + 2 * tq;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const __nv_bfloat162 gt = *reinterpret_cast<const __nv_bfloat162*>(gate + base + 8 * nt);
      const float v0 = o[nt][2 * half] * inv * sigmoid(__low2float(gt));
      const float v1 = o[nt][2 * half + 1] * inv * sigmoid(__high2float(gt));
      *reinterpret_cast<uint32_t*>(out + base + 8 * nt) = pack_bf16(v0, v1);
    }
  }
}

template <int HD>
void launch_prefill(const bf16* q, const bf16* gate, const bf16* k_cache, const bf16* v_cache,
                    int pos0, int T, int heads, int kv_heads, int max_ctx, bf16* out,
                    cudaStream_t stream) {
  static const bool attr_set = [] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<HD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          pre_smem_bytes<HD>()));
    return true;
  }();
  (void)attr_set;
  const int group = heads / kv_heads, QB = kPreRows / group;
  const dim3 grid((T + QB - 1) / QB, kv_heads);
  attn_prefill_kernel<HD><<<grid, kPreThreads, pre_smem_bytes<HD>(), stream>>>(
      q, gate, k_cache, v_cache, pos0, T, heads, group, max_ctx, out);
  LILAC_CUDA_LAUNCHED();
}

// LILAC_ATTN_PREFILL: the version it names (1 mma, 2 wgmma, 3 wgmma-overlap, 4 wgmma-ws, 5
// wgmma-pingpong), 5 when unset: the fastest at every length measured (s34 run 2, H100, 8,192
// queries from position 122,880: 622 / 563 / 429 / 416 / 319 TFLOP/s for versions 5 / 4 / 3 / 2 /
// 1; docs/kernels.md s34).
int env_version() {
  static const int v = env_enum(
      "LILAC_ATTN_PREFILL", 5,
      {{"mma", 1}, {"wgmma", 2}, {"wgmma-overlap", 3}, {"wgmma-ws", 4}, {"wgmma-pingpong", 5}});
  return v;
}

}  // namespace

void attention_prefill(const bf16* q, const bf16* gate, const bf16* k_cache, const bf16* v_cache,
                       int pos0, int T, int heads, int kv_heads, int hd, int max_ctx, bf16* out,
                       cudaStream_t stream, int version) {
  if (version < 0 || version > 5) fail("attention_prefill: version {} (0 .. 5)", version);
  if (hd != 64 && hd != 128 && hd != 256)
    fail("attention_prefill: head_dim {} not supported (64, 128, 256)", hd);
  if (kv_heads <= 0 || heads % kv_heads != 0)
    fail("attention_prefill: {} heads, {} kv heads", heads, kv_heads);
  const int group = heads / kv_heads;
  if (kPreRows % group != 0)
    fail("attention_prefill: GQA group {} does not divide {}", group, kPreRows);
  if (pos0 < 0 || pos0 + T > max_ctx)
    fail("attention_prefill: positions [{}, {}) outside the cache ({})", pos0, pos0 + T, max_ctx);
  if (T <= 0) return;
  if (version == 0) {
    version = env_version();
    if (version > 1 && !attention_prefill_wgmma_supported(hd)) version = 1;
  }
  if (version > 1)
    return attention_prefill_wgmma(q, gate, k_cache, v_cache, pos0, T, heads, kv_heads, hd, max_ctx,
                                   out, stream, version);
  switch (hd) {
    case 64:
      launch_prefill<64>(q, gate, k_cache, v_cache, pos0, T, heads, kv_heads, max_ctx, out, stream);
      break;
    case 128:
      launch_prefill<128>(q, gate, k_cache, v_cache, pos0, T, heads, kv_heads, max_ctx, out,
                          stream);
      break;
    default:
      launch_prefill<256>(q, gate, k_cache, v_cache, pos0, T, heads, kv_heads, max_ctx, out,
                          stream);
      break;
  }
}

}  // namespace lilac::cuda
