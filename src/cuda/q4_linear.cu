// Decode GEMV over 4/8-bit weights (tiled layout, q4_layout.h) and the 4-bit embedding lookup.
//
// Bytes at the real model's shapes (H = 2048; 4.5 bits = 0.5625 bytes per weight at 4 bits, 8.5
// bits at 8 bits; x and y are negligible), floor at 4.3 TB/s:
//   GDN in_proj      12352 x 2048  4-bit   14.23 MB   3.31 us
//   attention qkv     9216 x 2048  4-bit   10.62 MB   2.47 us
//   out_proj/o_proj   2048 x 4096  4-bit    4.72 MB   1.10 us
//   router (+shared gate) 257 x 2048 8-bit  0.58 MB   0.14 us (latency-bound: ~2-3 us)
//   lm_head         248320 x 2048  4-bit  286.1  MB  66.5  us
// Per decode token the dense projections are 1.03 GB (vs 3.6 GB in bf16).
// Work per weight: 2 FLOP of the dot product plus the dequantisation, which at 7.6 T weights/s
// (4.3 TB/s of 4.5-bit weights) is the real ALU cost. Per 8 weights (one code word) a lane
// issues 3 SHF + 4 LOP3 (magic-number bf16 pairs, q4_tile.cuh) + 2 SEL (the B mask) and one
// HMMA (each m16n8k16 consumes one word per lane): 9 ALU + 1 HMMA per 8 weights; at 7.6 T
// weights/s that is 3.6 words per clock per SM, ~28% of its issue slots (the scale/bias
// epilogue is per 64 weights). The f32 FMAs of a CUDA-core dot product (8 per word, plus
// conversions) would need ~2x that; the tensor core also gives exact products and f32 sums.
//
// Design. Block = 8 warps. Work unit = one 16-row tile x one slice of the 8-group sets of its
// columns (a set = 8 groups = 512 columns: one q_set_dot: 8 x 16-byte code loads per lane, all in
// flight before the first MMA, 32 + 4 MMAs). S slices of a tile (S in {1, 2, 4, 8}) are warps of
// the same block; their row sums meet in shared memory and are added in slice order
// (deterministic). The host picks S so that tiles * S >= 16 warps per SM when the rows are few
// (in_proj 772 tiles x 4, qkv 576 x 4, out_proj 128 x 8, router 17 x 4; lm_head 15520 x 1).
// Non-persistent grid: x is read per set through the non-coherent path (4 KB, L1/L2-resident).
// Launched with PDL (launch.h): the launch overlaps the previous kernel's tail; nothing is read
// before griddepcontrol.wait.
// Rows past W.rows (the padding of the last tile) are computed with zero codes and zero scales
// and not stored.
//
// q_embed: one block per token, one thread per element: tiled code position (q4_layout.h),
// scale and bias, h = fmaf(s, q, b) (exact: dequantize_row's arithmetic).
#include "cuda/q4_linear.h"

#include <algorithm>

#include "cuda/bulk_copy.cuh"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

enum : int { kOutF32 = 0, kOutAddF32 = 1, kOutBf16 = 2 };

// Stores (kOutF32), adds (kOutAddF32) or rounds (kOutBf16) the block's row sums: warp `warp`
// holds, after quad_sum, rows g and g + 8 (r0, r1) of slice `slice` of its tile; the S slices of
// a tile are added in slice order through `part`. Every warp of the block calls it (barrier).
template <int kMode>
__device__ __forceinline__ void store_rows(float (&part)[kWarps][kQTileRows], int warp, int lane,
                                           int S, int slice, int tile, int tiles, int rows,
                                           float r0, float r1, void* __restrict__ y) {
  auto put = [&](int row, float v) {
    if (kMode == kOutF32)
      static_cast<float*>(y)[row] = v;
    else if (kMode == kOutAddF32)
      static_cast<float*>(y)[row] += v;
    else
      static_cast<bf16*>(y)[row] = __float2bfloat16_rn(v);
  };
  if (S > 1) {
    const int g = lane >> 2;
    if ((lane & 3) == 0) {
      part[warp][g] = r0;
      part[warp][g + 8] = r1;
    }
    __syncthreads();
    if (slice != 0 || tile >= tiles || lane >= kQTileRows) return;
    float v = 0.f;
    for (int s = 0; s < S; ++s) v += part[warp + s][lane];
    const int row = tile * kQTileRows + lane;
    if (row < rows) put(row, v);
  } else {
    if (tile >= tiles || (lane & 3) != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile * kQTileRows + (lane >> 2) + 8 * h;
      if (row < rows) put(row, h ? r1 : r0);
    }
  }
}

template <int BITS, int kMode>
__global__ void __launch_bounds__(kThreads)
    q_gemv_kernel(QMatrix W, const bf16* __restrict__ x, void* __restrict__ y, int S,
                  int sets_per_slice) {
  __shared__ float part[kWarps][kQTileRows];
  pdl_launch_dependents();  // PDL (launch.h): x is the previous kernel's output
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = W.tiles(), G = W.groups(), sets = (G + 7) / 8;
  const int tile = blockIdx.x * (kWarps / S) + warp / S;
  const int slice = warp % S;
  float y2[1][2] = {{0.f, 0.f}};
  if (tile < tiles) {  // warp-uniform
    const uint32_t* const codes[1] = {W.codes + size_t(tile) * G * (BITS / 4) * kQBlockWords};
    const uint32_t* const sb[1] = {W.sb + size_t(tile) * G * kQSbWords};
    const int s1 = min(sets, (slice + 1) * sets_per_slice);
    for (int set = slice * sets_per_slice; set < s1; ++set)
      qtile::q_set_dot<BITS, 1>(codes, sb, G, set, x, y2);
  }
  store_rows<kMode>(part, warp, lane, S, slice, tile, tiles, W.rows, qtile::quad_sum(y2[0][0]),
                    qtile::quad_sum(y2[0][1]), y);
}

// ---- staged, the norm fused: the block's weights requested before the wait -------------------
// The same grid, warps and sums as q_gemv_kernel with one set per slice (sets_per_slice = 1),
// and x = rms_norm_row(h) in the order rms_norm uses, so the result is bit for bit rms_norm +
// q_gemv's. Before griddepcontrol.wait, thread 0 asks the bulk copy engine for the block's
// kWarps / S tiles (codes and scales, one mbarrier per tile) into shared memory, so the weights
// can stream while the previous kernel finishes (when the SM has room for this block beside the
// previous kernel's: docs/kernels.md, "Tenth session"). After the wait every block normalises h
// into shared memory, and each warp runs its set from shared memory once its tile has landed.
// Shared memory: bars [kWarps] | x [cols] bf16 | scratch [32] | codes [n][G P 128] | sb [n][G 16].
template <int BITS>
constexpr size_t staged_tile_bytes(int G) {
  return size_t(G) * (BITS / 4) * kQBlockWords * 4 + size_t(G) * kQSbWords * 4;
}

template <int BITS>
__global__ void __launch_bounds__(kThreads)
    q_gemv_rms_staged_kernel(QMatrix W, const float* __restrict__ h,
                             const float* __restrict__ norm_scale, float eps, float* __restrict__ y,
                             int S) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float part[kWarps][kQTileRows];
  constexpr int P = BITS / 4;
  const int tiles = W.tiles(), G = W.groups(), n = kWarps / S;
  const int tile0 = blockIdx.x * n, nt = min(n, tiles - tile0);
  const size_t code_words = size_t(G) * P * kQBlockWords, sb_words = size_t(G) * kQSbWords;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem + kWarps * 8);
  float* scratch = reinterpret_cast<float*>(xs + W.cols / 2);
  uint32_t* codes_s = reinterpret_cast<uint32_t*>(scratch + 32);
  uint32_t* sb_s = codes_s + size_t(n) * code_words;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {  // weights only: allowed before the wait
    for (int i = 0; i < nt; ++i) bulk::init(&bars[i], 1);
    bulk::fence_init();
    const uint64_t policy = bulk::evict_first_policy();
    for (int i = 0; i < nt; ++i) {
      const size_t tile = size_t(tile0 + i);
      bulk::arrive_expect_tx(&bars[i], unsigned((code_words + sb_words) * 4));
      bulk::copy(codes_s + i * code_words, W.codes + tile * code_words, unsigned(code_words * 4),
                 &bars[i], policy);
      bulk::copy(sb_s + i * sb_words, W.sb + tile * sb_words, unsigned(sb_words * 4), &bars[i],
                 policy);
    }
  }
  pdl_wait();
  rms_norm_row(h, norm_scale, W.cols, eps, reinterpret_cast<uint4*>(xs), scratch);
  __syncthreads();  // x, and the barriers' initialisation, visible to every warp
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tl = warp / S, slice = warp % S, tile = tile0 + tl;
  float y2[1][2] = {{0.f, 0.f}};
  if (tl < nt && slice < (G + 7) / 8) {  // warp-uniform; S may exceed the set count
    bulk::wait(&bars[tl], 0);
    const uint32_t* const codes[1] = {codes_s + size_t(tl) * code_words};
    const uint32_t* const sb[1] = {sb_s + size_t(tl) * sb_words};
    qtile::q_set_dot<BITS, 1, true>(codes, sb, G, slice, reinterpret_cast<const bf16*>(xs), y2);
  }
  store_rows<kOutF32>(part, warp, lane, S, slice, tile, tiles, W.rows, qtile::quad_sum(y2[0][0]),
                      qtile::quad_sum(y2[0][1]), y);
}

__global__ void __launch_bounds__(256)
    q_embed_kernel(const int32_t* __restrict__ ids, QMatrix table, float* __restrict__ h) {
  const int64_t r = ids[blockIdx.x];
  const int G = table.groups(), P = table.planes(), H = table.cols;
  float* dst = h + size_t(blockIdx.x) * size_t(H);
  for (int k = threadIdx.x; k < H; k += blockDim.x) {
    uint32_t q = 0;
    for (int p = 0; p < P; ++p) {
      size_t word;
      int shift;
      q_code_position(G, P, r, k, p, word, shift);
      q |= ((table.codes[word] >> shift) & 15u) << (4 * p);
    }
    const uint32_t sb = table.sb[q_sb_position(G, r, k / kQGroup)];
    dst[k] = fmaf(bf16_lo(sb), float(q), bf16_hi(sb));
  }
}

void check(const char* what, const QMatrix& W, const void* x, const void* y) {
  if (!W || !W.sb || !x || !y) fail("cuda::{}: null pointer", what);
  if (W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.cols > 65536 ||
      (W.bits != 4 && W.bits != 8))
    fail("cuda::{}: unsupported [{}, {}] at {} bits (cols a multiple of 64 in [64, 65536])", what,
         W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(x) % 4 != 0) fail("cuda::{}: x must be 4-byte aligned", what);
}

// The split of q_gemv's grid: S warps (slices) per tile, chosen so that tiles x S >= 16 warps per
// SM when the rows are few; each slice takes sets_per_slice 8-group sets.
struct Split {
  int S, sets_per_slice, grid;
};
Split split_for(const QMatrix& W) {
  const int tiles = W.tiles(), sets = (W.groups() + 7) / 8;
  const long long target = 16LL * sm_count();
  int S = 1;
  while (S < kWarps && S < sets && (long long)tiles * S < target) S *= 2;
  return {S, (sets + S - 1) / S, ceil_div(tiles, kWarps / S)};
}

template <int kMode>
void launch(const char* what, const QMatrix& W, const bf16* x, void* y, cudaStream_t stream) {
  check(what, W, x, y);
  const Split sp = split_for(W);
  launch_kernel(true, W.bits == 4 ? q_gemv_kernel<4, kMode> : q_gemv_kernel<8, kMode>,
                dim3(sp.grid), dim3(kThreads), 0, stream, W, x, y, sp.S, sp.sets_per_slice);
}

// Staged launches: the dynamic shared memory of one block (0 when the matrix does not qualify:
// more than one set per slice, or more than kStagedMaxSmem for the block's tiles).
constexpr size_t kStagedMaxSmem = 80 * 1024;
size_t staged_smem(const QMatrix& W) {
  const Split sp = split_for(W);
  if (sp.sets_per_slice != 1) return 0;
  const int G = W.groups(), n = kWarps / sp.S;
  const size_t tile = W.bits == 4 ? staged_tile_bytes<4>(G) : staged_tile_bytes<8>(G);
  const size_t bytes = kWarps * 8 + size_t(W.cols) * 2 + 32 * 4 + size_t(n) * tile;
  return bytes <= kStagedMaxSmem ? bytes : 0;
}

template <int BITS>
void launch_rms_staged(const QMatrix& W, const float* h, const float* scale, float eps, float* y,
                       size_t smem, cudaStream_t stream) {
  auto* kernel = q_gemv_rms_staged_kernel<BITS>;
  static const bool attr_set = [&] {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(kStagedMaxSmem)));
    return true;
  }();
  (void)attr_set;
  launch_kernel(true, kernel, dim3(split_for(W).grid), dim3(kThreads), smem, stream, W, h, scale,
                eps, y, split_for(W).S);
}

}  // namespace

void q_gemv(const QMatrix& W, const bf16* x, float* y, GemvOut mode, cudaStream_t stream) {
  if (mode == GemvOut::Store)
    launch<kOutF32>("q_gemv", W, x, y, stream);
  else
    launch<kOutAddF32>("q_gemv", W, x, y, stream);
}

bool q_gemv_staged_available(const QMatrix& W) {
  static const bool hopper = device_compute_capability() == 90;
  return hopper && W && (W.bits == 4 || W.bits == 8) && W.cols >= kQGroup &&
         W.cols % kQGroup == 0 && W.cols <= 65536 && staged_smem(W) > 0;
}

void q_gemv_rms_staged(const QMatrix& W, const float* h, const float* norm_scale, float eps,
                       float* y, cudaStream_t stream) {
  check("q_gemv_rms_staged", W, h, y);
  if (!norm_scale || !is_aligned(h, 16) || !is_aligned(norm_scale, 16))
    fail("cuda::q_gemv_rms_staged: h and the norm scale must be 16-byte aligned");
  if (!q_gemv_staged_available(W))
    fail(
        "cuda::q_gemv_rms_staged: [{}, {}] at {} bits does not run staged "
        "(q_gemv_staged_available)",
        W.rows, W.cols, W.bits);
  const size_t smem = staged_smem(W);
  if (W.bits == 4)
    launch_rms_staged<4>(W, h, norm_scale, eps, y, smem, stream);
  else
    launch_rms_staged<8>(W, h, norm_scale, eps, y, smem, stream);
}

void q_gemv_bf16out(const QMatrix& W, const bf16* x, bf16* y, cudaStream_t stream) {
  launch<kOutBf16>("q_gemv_bf16out", W, x, y, stream);
}

void q_embed(const int32_t* ids, const QMatrix& table, float* h, int T, cudaStream_t stream) {
  if (!ids || !table || !table.sb || !h) fail("cuda::q_embed: null pointer");
  if (T < 1 || table.cols % kQGroup != 0 || (table.bits != 4 && table.bits != 8))
    fail("cuda::q_embed: unsupported T {} table [{}, {}] at {} bits", T, table.rows, table.cols,
         table.bits);
  q_embed_kernel<<<T, 256, 0, stream>>>(ids, table, h);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
