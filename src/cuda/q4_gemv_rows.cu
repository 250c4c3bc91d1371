// q_gemv_rows: the 4/8-bit dense projections over T token rows (q4_linear.h). Version 3 of
// the kernel lab's q_gemv_rows (docs/kernels.md's planned "q_gemv_rows v7"), production since s6:
// version 2 (bench/lab/q_gemv_rows/v2_staged.cu, docs' v6) with a block's phases overlapped.
// Measured (s6 run 2, per call): in_proj 16 / 64 rows 16.0 -> 14.2 / 35.5 -> 33.0 us, lm_head 222
// -> 182 / 532 -> 389 us, the router at 64 rows 10.7 -> 8.6 us; out_proj unchanged (7.4 -> 7.6
// / 17.5 -> 17.3).
//
// Version 2's block runs one (row block, K-slice) unit in series: its weights, the staging of x,
// the group sums, the MMAs, the cluster barrier, the reduce; 16 warps per SM, and in_proj's 388
// blocks are 1.47 waves (ncu, s4 run 2). Here a block takes NG consecutive groups of K (several
// register sets of GS groups: 8 at 4 bits, 4 at 8 bits), and both of its inputs are pipelined:
//  * weights, a register set ahead: right after a warp has rebuilt group m's A fragments from its
//    codes, it issues the loads of group m of the next set into the same registers (codes and the
//    scale/bias pair), so a whole set of compute covers each load and the registers stay at one set
//    (48) per lane, as in version 2;
//  * x, a stage ahead: the block's groups are staged in stages of XG groups (XG = 8 at 4 bits, 4 at
//    64 rows or 8 bits: two stages of 64 rows x 256 columns are 69.6 KB, leaving room for 2 blocks
//    per SM) through two shared buffers; stage j + 1 is copied (cp.async) while stage j computes.
// The K ranges of a row block form a cluster of S = ceil(G / NG) ranks reducing through distributed
// shared memory in rank order (version 2's reduce, unchanged: deterministic). The host picks S, the
// smallest power of two (capped at 8 and at the sets of K) giving ~one wave of blocks: in_proj
// (97 row blocks, 4 sets) S = 2, 194 blocks (one wave of 2 per SM), NG = 16; lm_head (1940 row
// blocks) S = 1, no cluster, NG = 32; out_proj and the router stay as version 2 (S = 8).
//
// Per stage j (buffer b = j & 1; x [R][64 XG + 8] bf16 then Sx [XG][R] f32), at its first group:
//   cp.async.wait_all; __syncthreads   (1) stage j landed and is visible; every warp has finished
//                                           stage j - 1, so buffer b ^ 1 (stage j - 1) is free
//   issue stage j + 1 into buffer b ^ 1  (cp.async; rows [T, Rv) zero-filled by it)
//   Sx of stage j into buffer b          (no warp reads it before (2); its last readers, stage
//                                           j - 2, finished before (1) of stage j - 1)
//   __syncthreads                      (2) Sx visible
// (Up to 16 tokens neither Sx nor (2): the group sums come from MMAs in the chunk loop.)
// At most one stage of copies is in flight per thread, so cp.async.wait_all (= commit + wait_group
// 0) is the whole group accounting. Barriers sit outside the `active` branch: every warp, active or
// not, walks the same (block-uniform) group loop.
// Registers (ptxas, sm_90a, __launch_bounds__(256, 2)): 118-128, no spills at 4 bits; 8 bytes of
// spill at 8 bits and 64 rows. Shared memory: 2 stages, 17 / 34 / 69 / 70 KB at 8 / 16 / 32 / 64
// rows. Numerics: version 2's per (row, group) and token, with the groups summed in order within a
// rank's range and the ranks in rank order (only where the f32 sums split differs).
// More than 64 tokens (prompt chunks through an 8-bit matrix, e.g. the router at <= 256 tokens):
// grid z = ceil(T / 64) slabs of 64 tokens side by side, each block as above on its slab (since s7;
// the backend looped over the slabs, one launch each: ~10 us apiece for the router). Since s17 a
// matrix whose 64-token slabs would not fill a wave even at 8 ranks (the router: 3 row blocks)
// takes slabs of 16 tokens (NCH = 2) from 17 tokens on: at 64 rows 4 x 24 blocks with 2-chunk
// loops instead of 24 blocks with 8-chunk loops (ncu, s17 run 3: the router 10.2 us per call at
// 64 rows against 6.4 at 16).
#include <algorithm>

#include "cuda/cluster.cuh"
#include "cuda/launch.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_rows.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // row tiles per block
constexpr int kTok = 8;                // tokens per MMA (the n dimension)
constexpr int kSetGroups = 8;          // groups whose codes a warp holds at once (4 bits)
constexpr int kMaxRanks = 8;           // portable cluster size
constexpr int kXPad = 8;               // bf16 past a staged row (rows 16 bytes apart mod 128)
constexpr size_t kMaxSmem = 227 * 1024;

// Groups per x stage: a register set at 4 bits (8), 4 at 64 rows (two 64-row stages of 8 groups
// would be 137 KB: one block per SM) and at 8 bits (the set).
constexpr int stage_groups(int bits, int nch) {
  return bits == 8 || nch == 8 ? 4 : 8;
}

// One stage buffer: x [R][64 XG + kXPad] bf16, then Sx [XG][R] f32 (R = 8 nch; 16-byte multiples).
constexpr size_t stage_bytes(int nch, int xg) {
  return size_t(kTok) * nch * size_t(64 * xg + kXPad) * 2 + size_t(xg) * kTok * nch * 4;
}

// Two stage buffers, or the partial sums [kWarps][nch][4][32] f32 that reuse them.
size_t smem_bytes(int bits, int nch) {
  const size_t partial = size_t(kWarps) * nch * 4 * 32 * 4;
  return std::max(2 * stage_bytes(nch, stage_groups(bits, nch)), partial);
}

// kSlabs: grid z runs 64-token slabs (kept out of the batched decode step's instantiations, whose
// registers it would raise).
template <int BITS, int NCH, bool kAdd, bool kSlabs>
__global__ void __launch_bounds__(kThreads, 2)
    q_gemv_rows_v3_kernel(QMatrix W, const bf16* __restrict__ x, int T, float* __restrict__ y,
                          int NG) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cuda;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int P = BITS / 4;
  constexpr int R = kTok * NCH;       // token rows a stage has room for
  constexpr int GS = kSetGroups / P;  // groups per register set
  constexpr int XG = stage_groups(BITS, NCH);
  static_assert(GS % XG == 0, "a stage starts at a group m of a set with m % XG == 0");
  constexpr int LDX = 64 * XG + kXPad;  // bf16 per staged row
  constexpr uint32_t kStage = uint32_t(stage_bytes(NCH, XG));
  // 4 bits: A = 128 + q (no conversion), offset 128; 8 bits: A = q rebuilt exactly, offset 0.
  constexpr float kOffset = qtile::kRowsOffset<BITS>;
  // Up to 16 tokens the group sums Sx come from MMAs with an all-ones A on the B fragments the
  // products load anyway (+4 MMAs per chunk and group), not from a pass over the staged x (half
  // the warps summing while all wait at a barrier: a fifth of in_proj's instructions in the s14
  // profile). Measured at 16 tokens (s14 run 8): qkv -7%, the router -6%, lm_head -3%, in_proj
  // unchanged, out_proj +4% (one 4-group stage per rank); the 4-bit batched step ~-1%. At 32-64
  // tokens the pass stays (4-8 chunks would pay 16-32 MMAs per group).
  constexpr bool kMmaSums = NCH <= 2;
  pdl_launch_dependents();  // PDL (launch.h): x is the previous kernel's output
  if constexpr (kSlabs) {   // slab z: tokens [R z, R z + R) of x and y
    x += size_t(blockIdx.z) * R * size_t(W.cols);
    y += size_t(blockIdx.z) * R * size_t(W.rows);
    T = min(T - int(blockIdx.z) * R, R);
  }
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int G = W.groups(), tiles = W.tiles();
  const int S = int(gridDim.y);
  const int s = S > 1 ? int(cluster::ctarank()) : 0;  // this block's rank = its K range
  const int gb = s * NG, ngb = min(NG, G - gb);       // groups [gb, gb + ngb) (>= 1: host plan)
  const int nst = (ngb + XG - 1) / XG;                // stages
  const int Rv = kTok * ((T + kTok - 1) / kTok);      // rows the MMAs read (<= R)
  const int tile = int(blockIdx.x) * kWarps + warp;
  const bool active = tile < tiles;  // warp-uniform
  const qtile::TileRef<BITS> ref(W, active ? tile : tiles - 1);

  // 1. The first set's weights, before the wait.
  qtile::QSet<BITS, 1, GS> w;
  if (active) qtile::load_set(w, ref, gb, ngb);

  const bf16* const xb = x + size_t(gb) * 64;  // x[0, the block's first group]
  // Stage j: x [:, groups gb + XG j ...] into buffer j & 1 by cp.async (a warp per row, lanes
  // along its 16-byte pieces); rows [T, Rv) zero-filled (source size 0: nothing read).
  const uint32_t smem0 = tile::smem_u32(smem);
  auto issue = [&](int j) {
    const int pieces = min(XG, ngb - j * XG) * 8;
    const uint32_t dst0 = smem0 + uint32_t(j & 1) * kStage;
    const bf16* src0 = xb + size_t(j * XG) * 64;
    for (int r = warp; r < Rv; r += kWarps) {
      const uint32_t dst = dst0 + uint32_t(r * LDX * 2);
      const bf16* from = src0 + size_t(r < T ? r : 0) * W.cols;
      for (int v = lane; v < pieces; v += 32)
        tile::cp_async_16(dst + uint32_t(v * 16), from + v * 8, r < T);
    }
  };
  // Begins stage j (its first group): see the header for the two barriers.
  auto begin_stage = [&](int j) {
    cp_async_wait_all();
    __syncthreads();  // (1)
    if (j + 1 < nst) issue(j + 1);
    if constexpr (kMmaSums) return;  // the group sums come from the MMAs (below)
    const int xg = min(XG, ngb - j * XG);
    const bf16* xs = reinterpret_cast<const bf16*>(smem + (j & 1) * kStage);
    float* sxs = reinterpret_cast<float*>(smem + (j & 1) * kStage + size_t(R) * LDX * 2);
    for (int i = int(threadIdx.x); i < xg * R; i += kThreads) {
      const int m = i / R, r = i - m * R;
      if (r >= Rv) continue;
      const uint4* p = reinterpret_cast<const uint4*>(xs + r * LDX + m * 64);
      float sum = 0.f;
      // Two 16-byte loads at a time: the current set's codes (48) and, past stage 0, the
      // accumulators (32 at 64 rows) are live here.
#pragma unroll 2
      for (int v = 0; v < 8; ++v) {
        const uint4 q = p[v];
        sum += (bf16_lo(q.x) + bf16_hi(q.x)) + (bf16_lo(q.y) + bf16_hi(q.y)) +
               ((bf16_lo(q.z) + bf16_hi(q.z)) + (bf16_lo(q.w) + bf16_hi(q.w)));
      }
      sxs[m * R + r] = sum;
    }
    __syncthreads();  // (2)
  };

  pdl_wait();
  issue(0);

  // 2. The groups in order: per group the A fragments once, the next set's group loaded into the
  // freed registers, then every chunk of 8 tokens (version 2's inner loop).
  float acc[NCH][4];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  // ldmatrix.x4 rows: lane supplies token row (lane & 7) of matrix jm = lane / 8, which is k16
  // block 2 pair + jm / 2, half jm % 2 (8 columns): the four registers are the (b0, b1) pairs of
  // two k16 blocks (b0: k 2t, 2t + 1 of token g; b1: k 2t + 8, 2t + 9).
  const int jm = lane >> 3;
  const uint32_t lane_addr =
      smem0 + uint32_t(((lane & 7) * LDX + (jm >> 1) * 16 + (jm & 1) * 8) * 2);
  for (int set0 = 0; set0 < ngb; set0 += GS) {
    const int ng = min(GS, ngb - set0);
    const int nxt = set0 + GS, nng = min(GS, ngb - nxt);  // the next set (nng <= 0: none)
#pragma unroll
    for (int m = 0; m < GS; ++m) {
      if (m >= ng) break;  // block-uniform
      const int grp = set0 + m;
      const int j = grp / XG, mx = grp - j * XG;  // stage, group within it
      if (m % XG == 0) begin_stage(j);            // every warp
      if (!active) continue;                      // warp-uniform
      uint32_t a[4][4];
      qtile::rows_group_a<BITS>(w.cw[0][m], a);
      const float s0 = bf16_lo(w.sbv[0][m].x), b0 = bf16_hi(w.sbv[0][m].x);  // row g
      const float s1 = bf16_lo(w.sbv[0][m].y), b1 = bf16_hi(w.sbv[0][m].y);  // row g + 8
      const float o0 = fmaf(-kOffset, s0, b0), o1 = fmaf(-kOffset, s1, b1);
      if (m < nng) qtile::load_group(w, m, ref.codes, ref.sb, gb + nxt + m);  // a set ahead
      const uint32_t xaddr = lane_addr + uint32_t(j & 1) * kStage + uint32_t(mx * 128);
      const float* sxm =
          reinterpret_cast<const float*>(smem + (j & 1) * kStage + size_t(R) * LDX * 2) + mx * R +
          2 * t;
#pragma unroll
      for (int ch = 0; ch < NCH; ++ch) {
        if (ch * kTok >= T) break;  // warp-uniform
        float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
        qtile::rows_group_mma<kMmaSums>(a, xaddr + uint32_t(ch * kTok * LDX * 2), c, d);
        // The group sums of tokens 2t, 2t + 1: from the MMAs, or from the staged pass.
        const float2 sx =
            kMmaSums ? make_float2(d[0], d[1]) : *reinterpret_cast<const float2*>(sxm + ch * kTok);
        acc[ch][0] = fmaf(o0, sx.x, fmaf(s0, c[0], acc[ch][0]));
        acc[ch][1] = fmaf(o0, sx.y, fmaf(s0, c[1], acc[ch][1]));
        acc[ch][2] = fmaf(o1, sx.x, fmaf(s1, c[2], acc[ch][2]));
        acc[ch][3] = fmaf(o1, sx.y, fmaf(s1, c[3], acc[ch][3]));
      }
    }
  }
  // No copies in flight here: the last stage issued nothing.

  // 3. Store (one rank) or reduce over the cluster's ranks (version 2's reduce).
  const int row0 = int(blockIdx.x) * kWarps * kQTileRows;
  if (S == 1) {
    if (!active) return;
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = tile * kQTileRows + g + (q < 2 ? 0 : 8);
        const int tok = ch * kTok + 2 * t + (q & 1);
        if (row >= W.rows || tok >= T) continue;
        float* dst = y + size_t(tok) * W.rows + row;
        *dst = kAdd ? *dst + acc[ch][q] : acc[ch][q];
      }
    return;
  }
  __syncthreads();                               // every warp is done with the staged x
  float* part = reinterpret_cast<float*>(smem);  // [kWarps][NCH][4][32]
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
    for (int q = 0; q < 4; ++q) part[((warp * NCH + ch) * 4 + q) * 32 + lane] = acc[ch][q];
  cluster::sync();
  // Rank s sums the partials [s per, (s + 1) per) over the ranks, in rank order.
  constexpr int kPart = kWarps * NCH * 4 * 32;
  const int per = (kPart + S - 1) / S;
  const int i1 = min(kPart, (s + 1) * per);
  const uint32_t part_addr = tile::smem_u32(part);
  for (int i = s * per + int(threadIdx.x); i < i1; i += kThreads) {
    // Partial i = ((warp wp * NCH + chunk ch) * 4 + register q) * 32 + lane (gg, tq): row
    // 16 wp + gg + 8 (q >= 2), token 8 ch + 2 tq + (q & 1).
    const int ln = i & 31, q = (i >> 5) & 3, wc = i >> 7;
    const int ch = wc % NCH, wp = wc / NCH;
    const int row = row0 + wp * kQTileRows + (ln >> 2) + (q >> 1) * 8;
    const int tok = ch * kTok + 2 * (ln & 3) + (q & 1);
    if (tok >= T) continue;
    float pv[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r)
      pv[r] = r < S ? cluster::ld_f32(cluster::map(part_addr + 4u * i, uint32_t(r))) : 0.f;
    float v = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) v += r < S ? pv[r] : 0.f;
    if (row < W.rows) {
      float* dst = y + size_t(tok) * W.rows + row;
      *dst = kAdd ? *dst + v : v;
    }
  }
  cluster::sync();  // no block leaves while another still reads its partials
#else
  __trap();  // thread-block clusters need sm_90 (the host refuses older devices)
#endif
}

template <int BITS, int NCH, bool kAdd, bool kSlabs = false>
void launch(const QMatrix& W, const bf16* x, int T, float* y, int S, int NG, int grid, int Z,
            cudaStream_t stream) {
  auto kernel = q_gemv_rows_v3_kernel<BITS, NCH, kAdd, kSlabs>;
  const size_t smem = smem_bytes(BITS, NCH);
  if (smem > kMaxSmem) fail("lab::q_gemv_rows_v3: {} bytes of staged x", smem);
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // Clusters of the S ranks of a row block along y (none at S = 1).
  const dim3 blocks{unsigned(grid), unsigned(S), unsigned(Z)};
  if (S > 1)
    launch_cluster_kernel(true, dim3(1, unsigned(S), 1), kernel, blocks, dim3(kThreads), smem,
                          stream, W, x, T, y, NG);
  else
    launch_kernel(true, kernel, blocks, dim3(kThreads), smem, stream, W, x, T, y, NG);
}

template <int BITS, bool kAdd>
void launch_nch(int nch, const QMatrix& W, const bf16* x, int T, float* y, int S, int NG, int grid,
                int Z, cudaStream_t stream) {
  switch (nch) {
    case 1:
      return launch<BITS, 1, kAdd>(W, x, T, y, S, NG, grid, Z, stream);
    case 2:
      if (Z > 1) return launch<BITS, 2, kAdd, true>(W, x, T, y, S, NG, grid, Z, stream);
      return launch<BITS, 2, kAdd>(W, x, T, y, S, NG, grid, Z, stream);
    case 4:
      if (Z > 1) return launch<BITS, 4, kAdd, true>(W, x, T, y, S, NG, grid, Z, stream);
      return launch<BITS, 4, kAdd>(W, x, T, y, S, NG, grid, Z, stream);
    default:
      if (Z > 1) return launch<BITS, 8, kAdd, true>(W, x, T, y, S, NG, grid, Z, stream);
      return launch<BITS, 8, kAdd>(W, x, T, y, S, NG, grid, Z, stream);
  }
}

}  // namespace

bool q_gemv_rows_available() {
  return device_compute_capability() >= 90;  // thread-block clusters
}

void q_gemv_rows(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                 cudaStream_t stream) {
  if (!W || !W.sb || !x || !y) fail("cuda::q_gemv_rows: null pointer");
  if (T < 1 || T > 65535 * kQGemvRowsMax) fail("cuda::q_gemv_rows: T = {}", T);
  if (W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.cols > 65536 ||
      (W.bits != 4 && W.bits != 8))
    fail("cuda::q_gemv_rows: unsupported [{}, {}] at {} bits", W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    fail("cuda::q_gemv_rows: x must be 16-byte aligned");
  if (!q_gemv_rows_available()) fail("cuda::q_gemv_rows: needs thread-block clusters (sm_90)");
  // Slabs of 64 tokens; or of 16 where even 8 ranks of 64-token slabs leave the GPU mostly idle
  // (the router: 3 row blocks, 24 blocks at 64 rows), so that the slabs run side by side and each
  // block's chunk loop is 2 long instead of 8 (its weights then come from L2 for all but one slab).
  // Above 64 tokens (s36: prompt chunks through the 8-bit router) the largest slab, 64 or 32
  // tokens, whose blocks at 8 ranks reach 0.7 of a wave: each slab dequantises every weight of
  // its rows again, so 16-token slabs did 4x the dequantisation of 64-token ones (the router at
  // 256 / 512 tokens: 16 / 32 slabs of 16 until s36, now 8 of 32 / 8 of 64).
  // LILAC_Q_GEMV_ROWS_SLAB=16|32|64 forces the slab above 16 tokens (A/B; the batched decode
  // step's 8-bit router rows too).
  const int grid_rows = ceil_div(W.tiles(), kWarps);
  auto blocks_at = [&](int slab_tokens) {
    return int64_t(grid_rows) * ceil_div(T, slab_tokens) * kMaxRanks;
  };
  const int64_t wave = 2LL * sm_count();
  int slab = kQGemvRowsMax;
  if (T > 2 * kTok && blocks_at(kQGemvRowsMax) < wave) {
    slab = 2 * kTok;
    if (T > kQGemvRowsMax) {
      if (10 * blocks_at(kQGemvRowsMax) >= 7 * wave)
        slab = kQGemvRowsMax;
      else if (10 * blocks_at(4 * kTok) >= 7 * wave)
        slab = 4 * kTok;
    }
  }
  static const int forced = env_choice("LILAC_Q_GEMV_ROWS_SLAB", {16, 32, 64});
  if (forced && T > 2 * kTok) slab = forced;
  const int Z = ceil_div(T, slab);
  const int chunks = (std::min(T, slab) + kTok - 1) / kTok;
  const int nch = chunks <= 1 ? 1 : chunks <= 2 ? 2 : chunks <= 4 ? 4 : 8;
  // Ranks: the smallest power of two S (at most 8 and the number of register sets) for which the
  // grid x S x Z blocks reach ~0.7 of a wave of 2 blocks per SM; each rank takes NG groups, whole
  // sets, and S is recomputed so that every rank has at least one group.
  const int G = W.groups(), GS = kSetGroups / (W.bits / 4);
  const int sets = (G + GS - 1) / GS;
  const int grid = ceil_div(W.tiles(), kWarps);
  const long long slots = 2LL * sm_count();
  const int max_s = std::min(kMaxRanks, sets);
  int S = 1;
  while (S < max_s && 10LL * grid * S * Z < 7 * slots) S *= 2;
  S = std::min(S, max_s);
  const int NG = ceil_div(sets, S) * GS;
  S = ceil_div(G, NG);
  const bool add = mode == GemvOut::Accumulate;
  if (W.bits == 4)
    add ? launch_nch<4, true>(nch, W, x, T, y, S, NG, grid, Z, stream)
        : launch_nch<4, false>(nch, W, x, T, y, S, NG, grid, Z, stream);
  else
    add ? launch_nch<8, true>(nch, W, x, T, y, S, NG, grid, Z, stream)
        : launch_nch<8, false>(nch, W, x, T, y, S, NG, grid, Z, stream);
}

}  // namespace lilac::cuda
