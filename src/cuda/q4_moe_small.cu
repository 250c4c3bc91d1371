// Small-M MoE over 4/8-bit experts: batched decode (B = 2..64 rows) and short prompts, where each
// touched expert sees a few tokens (B k / E: 0.5 at 16 rows, 2 at 64, 8 at a 256-token chunk).
//
// Why (docs/kernels.md, version 5): the decode MoE kernels read the experts per token (at 16 rows,
// 128 expert reads for ~100 distinct experts), and the prefill kernels read each expert once but
// in 128-token tiles, one 256-thread block per 256 rows, dequantising and streaming 128 token
// rows for ~8 real ones. Here the unit of work is a warp on one 16-row weight tile of one expert,
// and the tokens of that expert take the MMA's n dimension in chunks of 8 (q4_tile.cuh's load_qset
// and q_group_dot): the weights are read once per step at the rate of many independent warps, and
// the MMAs grow with ceil(m_e / 8).
//
// Bytes per touched expert: (2I x H + H x I) x 4.5 / 8 = 1.77 MB at I = 512, H = 2048; per layer
// ~100 / 221 / 256 touched experts at 16 / 64 rows / 256 prompt tokens (uniform router).
//
// Grid: x = routed tile (moe_route's tile table: the touched experts in expert order, 128 sorted
// rows per tile, at most max_tiles of them; blocks past num_tiles exit), then the shared expert's
// blocks (expert E: every token, dense rows); y = 4 output tiles per block (one per warp); z = pass
// of 8 tokens (one MMA n-chunk). The host needs no counts: a routed block takes passes z, z + Z,
// ... of its tile's rows until they end (Z: grid_passes, about three times the mean tokens per
// expert, at least 2). Until s6 the grid's x was every expert, touched or not, and z every pass of
// an expert's worst case up to 64 tokens: at 64 rows 7 of 8 blocks of the down kernel (66,000 per
// layer) exited after reading the offsets. A block first copies its pass's
// token rows into shared memory (cp.async, gathered through sorted_token), so a warp's registers
// hold only its weights and the B fragments come from shared memory: more warps per SM, and no L2
// round trip per group. gate_up: the warp holds the gate tile p and the up tile P + p of its expert
// and writes act = bf16(silu(g) u) directly; down: one 16-row tile of down_e per warp against the
// expert's act rows (contiguous sorted rows).
//
// Two implementations of this grid (MoeSmallKernel, q4_moe.h): the "registers" kernels just
// described, and the "streamed" ones further down (Hopper, 4-bit: a producer warp streams the
// weights and x slices into shared memory with the bulk copy engine; passes of 16 or 32 tokens),
// which the launchers take for prompt chunks (T > 64). The kernel lab times both
// (bench/lab/q_moe_small).
#include <algorithm>
#include <vector>

#include "cuda/bulk_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/common.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"
#include "cuda/q4_moe_small.cuh"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using namespace qmoe_small;  // q4_moe_small.cuh: the grid, passes and staging of both forms

constexpr int kDownSet = 8;  // one tile, K = 512: the whole row tile in one set
// Resident 128-thread blocks per SM the register allocation must leave room for: what ptxas's
// own choice gave before the tile table (registers are allocated per warp in units of 256: 4-bit
// down 94 registers, 5 blocks; gate_up 100, 4; 8-bit down 128, 4; gate_up 153, 3). Without the
// bound the tile table's bookkeeping took the down kernels one block below.
template <int BITS>
constexpr int kDownMinBlocks = BITS == 4 ? 5 : 4;
template <int BITS>
constexpr int kGateUpMinBlocks = BITS == 4 ? 4 : 3;

// Adds to y[nt][0..3] (rows g, g + 8 of tile nt x tokens 2t, 2t + 1) the dot products over the
// groups [GS set, GS set + GS) ∩ [0, G), as q_set_dot_tokens (the kernel lab's
// bench/lab/q_gemv_rows/v1_set_dot_tokens.cu) did, with the tokens' x in shared memory (xs: rows of
// `stride` 32-bit words; rows >= count read as zeros).
template <int BITS, int NT, int GS>
__device__ __forceinline__ void set_dot_staged(const uint32_t* const (&codes)[NT],
                                               const uint32_t* const (&sb)[NT], int G, int set,
                                               const uint32_t* xs, int stride, int count,
                                               float (&y)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int grp0 = set * GS;
  const int ng = min(GS, G - grp0);
  qtile::QSet<BITS, NT, GS> w;
  qtile::load_qset(w, codes, sb, grp0, ng);
  const bool has = g < count;
  const uint32_t* xr = xs + g * stride + grp0 * 32;
#pragma unroll
  for (int m = 0; m < GS; ++m) {
    if (m >= ng) continue;  // warp-uniform
    uint32_t X[4][2];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      X[kb][0] = has ? xr[m * 32 + 8 * kb + t] : 0u;
      X[kb][1] = has ? xr[m * 32 + 8 * kb + t + 4] : 0u;
    }
    qtile::q_group_dot(w, m, X, y);
  }
}

// ---- The chained pair (MoeSmallKernel::chained, s41; 4-bit, the register kernels) ----
//
// Why: at 16 batched rows gate_up is ~816 blocks on 528 slots (132 SMs x 4): its second wave runs
// a little over half full, and down (whose blocks become resident under PDL once every gate_up
// block has started) waits in griddepcontrol.wait for the whole gate_up grid. Chained, down's
// blocks of tile x (a routed tile's row of the grid, or a shared-expert x-block) wait only for
// gate_up's blocks of the same x: gate_up's block adds 1 to chain[x] once its stores are done
// (released at gpu scope), down's block polls it (acquire) until it holds gate_up's blocks per x
// (Y Z), counts itself on chain[kChainCap + x], and the last of down's blocks of x resets both to
// 0 for the next pair. The counters belong to the caller (kMoeSmallChainCounts int32, zeroed once:
// the backend's Workspace), so that backends on different streams never share them. Both kernels
// take their blocks in tile order (y fastest, then z, then x: block_pos) so that gate_up's tiles
// end in order and down's first blocks find theirs done: down fills the slots gate_up's last wave
// leaves. A chained gate_up triggers its dependents after its own griddepcontrol.wait, so that a
// pair's down is resident only once the last pair's down (and its resets) has completed. Arithmetic
// unchanged (the same bits as `registers`). Measured (s41 run 1, H100, before that fix): c = 16 /
// 64 +1.8% / +3.1%; the fixed form (s44 run 1, H100): +1.8% / +2.4%, the default since (automatic
// chains where counters are given). Only for paired launches on one stream (the engine's: each
// gate_up is followed by its down on the same routing); a down whose gate_up never came traps after
// ~2^24 polls instead of hanging.
constexpr int kChainCap = kMoeSmallChainCounts / 2;  // x-blocks per launch (grid_x); larger grids
                                                     // are not chained

struct BlockPos {
  int x, y, z, Z;
};
template <bool CHAIN>
__device__ __forceinline__ BlockPos block_pos() {
  if constexpr (!CHAIN) {
    return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z), int(gridDim.z)};
  } else {
    const int Y = int(gridDim.y), Z = int(gridDim.z);
    const int b = int(blockIdx.x) + int(gridDim.x) * (int(blockIdx.y) + Y * int(blockIdx.z));
    return {b / (Y * Z), b % Y, (b / Y) % Z, Z};
  }
}

// gate_up's block of x is done: every thread's stores, then one release add.
__device__ __forceinline__ void chain_signal(int32_t* chain, int x) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&chain[x], 1);
  }
}

// down's block of x: waits for gate_up's `want` blocks of x (acquire), counts itself among x's
// `waiters`, the last resetting both counts; then the block may read x's routing and act rows.
__device__ __forceinline__ void chain_wait(int32_t* chain, int x, int want, int waiters) {
  if (threadIdx.x == 0) {
    for (int polls = 0;; ++polls) {
      int v;
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(&chain[x]) : "memory");
      if (v >= want) break;
      if (polls > (1 << 24)) __trap();  // no gate_up before this down: fail rather than hang
      __nanosleep(64);
    }
    if (atomicAdd(&chain[kChainCap + x], 1) == waiters - 1) {
      atomicExch(&chain[x], 0);
      atomicExch(&chain[kChainCap + x], 0);
    }
  }
  __syncthreads();
}

// MINB: resident blocks per SM asked of ptxas. The 4-bit kernel runs at 4 (118 registers) up to 32
// rows and at 5 (96 registers, 8 bytes of spills) above: more warps in flight at 64 rows (~2.3
// tokens per touched expert), more register pressure per warp at 16. s19 run 5 (engine, bf16 state,
// two runs each, ms per step at c = 16 / 32 / 64): 4 blocks 4.900-4.906 / 6.679-6.689 /
// 9.144-9.183, 5 blocks 4.965-4.966 / 6.687-6.693 / 9.041-9.065. LILAC_MOE_GATE_UP_BLOCKS=4|5
// forces one (A/B).
template <int BITS, int MINB = kGateUpMinBlocks<BITS>, bool CHAIN = false>
__global__ void __launch_bounds__(kThreads, MINB)
    q_moe_small_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I,
                               QMatrix shared_gate_up, int Is, Tiles tiles,
                               const int32_t* __restrict__ sorted_token, int E, int T,
                               bf16* __restrict__ act, bf16* __restrict__ shared_act,
                               int32_t* chain) {
  extern __shared__ __align__(16) unsigned char smem[];
  // PDL (moe_pdl_enabled): the routing tables and x come from the kernels before. Chained, the
  // trigger comes after the wait, so that down's blocks become resident only once the kernels
  // before (the last pair's down among them, which resets the counters) have completed: triggered
  // at the top, a gate_up whose blocks all fit beside the last pair's down let this pair's down
  // read that pair's stale counts (s41 run 1: the six-pair test trapped at T = 1).
  if constexpr (CHAIN) {
    pdl_wait();
    pdl_launch_dependents();
  } else {
    pdl_launch_dependents();
    pdl_wait();
  }
  bf16* xs = reinterpret_cast<bf16*>(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = H / kQGroup;
  constexpr int PL = BITS / 4;
  const BlockPos bp = block_pos<CHAIN>();
  Segment seg;
  for (PassIter it(tiles, E, T, bp.x, bp.z, bp.Z); it.segment(seg); it.pass += it.step) {
    const bool shared = it.e == E;
    stage_x(x, H, shared ? nullptr : sorted_token, seg, xs);
    const uint32_t* const wc = shared ? shared_gate_up.codes : gate_up.codes;
    const uint32_t* const ws = shared ? shared_gate_up.sb : gate_up.sb;
    const int n = shared ? Is : I;  // outputs per token
    const int P = n / kQTileRows;   // output tiles
    const int p = bp.y * kWarps + warp;
    if (p < P) {  // warp-uniform
      const int gate_tile = (shared ? 0 : it.e * 2 * P) + p;
      const uint32_t* const codes[2] = {wc + size_t(gate_tile) * G * PL * kQBlockWords,
                                        wc + size_t(gate_tile + P) * G * PL * kQBlockWords};
      const uint32_t* const sb[2] = {ws + size_t(gate_tile) * G * kQSbWords,
                                     ws + size_t(gate_tile + P) * G * kQSbWords};
      float y[2][4] = {};
      for (int set = 0; set * kGateUpSet < G; ++set)
        set_dot_staged<BITS, 2, kGateUpSet>(codes, sb, G, set,
                                            reinterpret_cast<const uint32_t*>(xs), (H + kXPad) / 2,
                                            seg.count, y);
      bf16* out = shared ? shared_act : act;
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int i = p * kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(n) + i] = __float2bfloat16_rn(silu(y[0][q]) * y[1][q]);
      }
    }
    __syncthreads();  // the staged x is re-used by the next pass
  }
  if constexpr (CHAIN) chain_signal(chain, bp.x);
}

// J: output tiles per warp, one after another (no loads across them: the registers stay at one
// set), tile (y J + j) kWarps + warp for j < J, so that a block's start (the routing tables, the x
// staging, its first round trip) is paid once per J kWarps tiles (down_tiles_per_warp). s14's
// version with the next tile's weights requested during the current one's MMAs (128 registers, 4
// blocks per SM) lost; here the registers and the 5 blocks per SM stay as at J = 1.
// MINB: resident blocks per SM asked of ptxas, as for the gate_up kernel (kDownMinBlocks: 4-bit 5,
// 8-bit 4). At 5 the 4-bit kernel gets 96 registers and, at J = 2 and 4, spills (ptxas, sm_90a:
// 36 bytes stored, 28 loaded; none at J = 1). s44 run 2 (H100, c = 16, register pair unchained,
// two rounds) measured the J = 2 kernel at 4 blocks (110 registers, no spills) and 6 (80, 32 bytes
// of spills) against 5: 2,988-3,003 and 2,955-2,963 tok/s against 3,006-3,022; both removed.
// CHAIN: the chained pair's down (above): waits for gate_up's chain_want blocks of its x (on
// `chain`) instead of the whole gate_up grid.
template <int BITS, int J, int MINB = kDownMinBlocks<BITS>, bool CHAIN = false>
__global__ void __launch_bounds__(kThreads, MINB)
    q_moe_small_down_kernel(const bf16* __restrict__ act, int I,
                            const bf16* __restrict__ shared_act, int Is, QMatrix down,
                            QMatrix shared_down, int H, Tiles tiles, int E, int T,
                            float* __restrict__ y, float* __restrict__ shared_out, int32_t* chain,
                            int chain_want) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_launch_dependents();
  const BlockPos bp = block_pos<CHAIN>();
  if constexpr (CHAIN)
    chain_wait(chain, bp.x, chain_want, int(gridDim.y * gridDim.z));
  else
    pdl_wait();
  bf16* xs = reinterpret_cast<bf16*>(smem);
  const int TH = H / kQTileRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int PL = BITS / 4;
  Segment seg;
  for (PassIter it(tiles, E, T, bp.x, bp.z, bp.Z); it.segment(seg); it.pass += it.step) {
    const bool shared = it.e == E;
    const int K = shared ? Is : I;
    stage_x(shared ? shared_act : act, K, nullptr, seg, xs);
#pragma unroll 1
    for (int j = 0; j < J; ++j) {
      const int th = (bp.y * J + j) * kWarps + warp;
      if (th >= TH) break;  // warp-uniform
      const uint32_t* const wc = shared ? shared_down.codes : down.codes;
      const uint32_t* const ws = shared ? shared_down.sb : down.sb;
      const int G = K / kQGroup;
      const int tile = (shared ? 0 : it.e * TH) + th;
      const uint32_t* const codes[1] = {wc + size_t(tile) * G * PL * kQBlockWords};
      const uint32_t* const sb[1] = {ws + size_t(tile) * G * kQSbWords};
      float acc[1][4] = {};
      for (int set = 0; set * kDownSet < G; ++set)
        set_dot_staged<BITS, 1, kDownSet>(codes, sb, G, set, reinterpret_cast<const uint32_t*>(xs),
                                          (K + kXPad) / 2, seg.count, acc);
      float* out = shared ? shared_out : y;
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int c = th * kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(H) + c] = acc[0][q];
      }
    }
    __syncthreads();  // the staged x is re-used by the next pass
  }
}

// ---- streamed version (Hopper): the weights through shared memory by the bulk copy engine ----
//
// The kernels above hold a set of weights in registers per warp (4 KB per warp, ~16 warps per SM:
// at most ~64 KB of loads in flight per SM, and each warp's loads and MMAs run in series): 2.8 TB/s
// for gate_up and 2.3 TB/s for down at 16 rows (ncu, s6). Here one producer warp per block
// streams the block's weight tiles, S groups at a time, into a ring of R shared-memory slots with
// `cp.async.bulk` (bulk_copy.cuh), each slot also holding the slice of the pass's token rows that
// those groups multiply; W consumer warps wait for a slot, run the MMAs of the kernels above
// (q_group_dot, group by group in the same order: bit-identical results) and release the slot. A
// block has up to R slots (~22 KB each for gate_up) in flight whatever its registers, and the x
// rows no longer wait in front of the weights. C 8-token chunks share a slot's weights: passes of
// 8 C tokens (C = 2 for prompts, where an expert sees ~8 tokens at 256 and more at 512).
//
// Slot layout (bytes), tile i = w NT + j (warp w, its tile j), group m < S of the stage, plane p:
//   codes [i][m][p][512]  (a tile's groups are contiguous in the tiled layout: one copy per tile)
//   sb    [i][m][64]      (likewise)
//   x     [token r < 8 C][S * 128 + 16]  (row r's columns of the stage's groups; the 16 bytes of
//                                         pad put rows 4 banks apart for the B-fragment loads)
template <int BITS, int NT_, int C_>
struct StreamCfg {
  static constexpr int NT = NT_;  // tiles per consumer warp (gate_up: a gate/up pair)
  static constexpr int C = C_;
  static constexpr int W = 4;  // consumer warps
  static constexpr int S = 4;  // groups per stage
  // Ring slots (down: K = 512 is two stages); gate_up's 32-token slots (35 KB) two, so that three
  // blocks fit on an SM.
  static constexpr int R = NT == 2 ? (C_ == 4 ? 2 : 3) : 2;
  static constexpr int P = BITS / 4;
  static constexpr int kTokens = 8 * C;
  static constexpr int kTiles = W * NT;
  static constexpr int kCodeBytes = 512 * P;  // per (tile, group)
  static constexpr int kCodes = kTiles * S * kCodeBytes;
  static constexpr int kSb = kTiles * S * 64;
  static constexpr int kXRow = S * 128 + 16;
  static constexpr int kSlot = kCodes + kSb + kTokens * kXRow;
  static constexpr int kSmem = R * kSlot + 2 * R * 8;  // the slots, then full and empty barriers
  static constexpr int kThreads = 32 * (W + 1);
};

// What a block streams for one pass: Gk groups of x (K = 64 Gk; row r of the pass is x row
// ids[row0 + r], or row0 + r without ids) against tiles tile0 + y W + w + j step_j of codes/sb
// for the consumer warps w with y W + w < n_out (y = blockIdx.y; n_out output tiles).
struct StreamPass {
  const bf16* x;
  const int32_t* ids;
  int Gk;
  const uint32_t* codes;
  const uint32_t* sb;
  int tile0, step_j, n_out;
};

template <class Cfg>
__device__ __forceinline__ int stream_valid_warps(const StreamPass& sp) {
  return max(0, min(Cfg::W, sp.n_out - int(blockIdx.y) * Cfg::W));
}

// The producer warp: issues stage s (groups [S s, S s + ng)) of a pass into `slot`, lane l taking
// copies l, l + 32, ...: the valid tiles' codes, their sb, then the pass's x slices.
template <class Cfg>
__device__ __forceinline__ void stream_issue(const StreamPass& sp, const Segment& seg, int s,
                                             unsigned char* slot, uint64_t* full, uint64_t policy) {
  const int lane = threadIdx.x & 31;
  const int grp0 = s * Cfg::S, ng = min(Cfg::S, sp.Gk - grp0);
  const int nt = stream_valid_warps<Cfg>(sp) * Cfg::NT;
  if (lane == 0)
    bulk::arrive_expect_tx(full, unsigned(nt * ng * (Cfg::kCodeBytes + 64) + seg.count * ng * 128));
  __syncwarp();
  for (int c = lane; c < 2 * nt + seg.count; c += 32) {
    if (c < 2 * nt) {
      const int i = c < nt ? c : c - nt;
      const int w = i / Cfg::NT, j = i - w * Cfg::NT;
      const size_t tile = size_t(sp.tile0 + int(blockIdx.y) * Cfg::W + w + j * sp.step_j);
      const size_t blk = tile * size_t(sp.Gk) + size_t(grp0);  // (tile, group) block
      if (c < nt)
        bulk::copy(slot + i * Cfg::S * Cfg::kCodeBytes, sp.codes + blk * Cfg::P * kQBlockWords,
                   unsigned(ng * Cfg::kCodeBytes), full, policy);
      else
        bulk::copy(slot + Cfg::kCodes + i * Cfg::S * 64, sp.sb + blk * kQSbWords, unsigned(ng * 64),
                   full, policy);
    } else {
      const int r = c - 2 * nt;
      const int src = sp.ids ? sp.ids[seg.row0 + r] : seg.row0 + r;
      bulk::copy(slot + Cfg::kCodes + Cfg::kSb + r * Cfg::kXRow,
                 sp.x + (size_t(src) * size_t(sp.Gk) + size_t(grp0)) * kQGroup, unsigned(ng * 128),
                 full);
    }
  }
}

// A consumer warp: adds the stage's ng groups of its NT tiles against every chunk of the pass's
// tokens to y[c] (rows g, g + 8 of tile j x tokens 8 c + 2t, + 1), as set_dot_staged does.
template <class Cfg, int BITS>
__device__ __forceinline__ void stream_consume(const unsigned char* slot, int ng, int count,
                                               float (&y)[Cfg::C][Cfg::NT][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(slot + Cfg::kCodes + Cfg::kSb);
  constexpr int kXWords = Cfg::kXRow / 4;
  for (int m = 0; m < ng; ++m) {
    qtile::QSet<BITS, Cfg::NT, 1> w;
#pragma unroll
    for (int j = 0; j < Cfg::NT; ++j) {
      const int i = warp * Cfg::NT + j;
      const unsigned char* cb = slot + (i * Cfg::S + m) * Cfg::kCodeBytes;
#pragma unroll
      for (int p = 0; p < Cfg::P; ++p)
        w.cw[j][0][p] = *reinterpret_cast<const uint4*>(cb + p * 512 + lane * 16);
      w.sbv[j][0] =
          *reinterpret_cast<const uint2*>(slot + Cfg::kCodes + (i * Cfg::S + m) * 64 + g * 8);
    }
#pragma unroll
    for (int c = 0; c < Cfg::C; ++c) {
      if (8 * c >= count) break;  // warp-uniform
      const bool has = 8 * c + g < count;
      const uint32_t* xr = xs + (8 * c + g) * kXWords + m * 32;
      uint32_t X[4][2];
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        X[kb][0] = has ? xr[8 * kb + t] : 0u;
        X[kb][1] = has ? xr[8 * kb + t + 4] : 0u;
      }
      qtile::q_group_dot(w, 0, X, y[c]);
    }
  }
}

// The block's loop over its passes, shared by both kernels: warp W produces, warps < W consume
// and hand each finished pass's accumulators to `store(it, seg, y)`. `pass_of(it)` gives a pass's
// StreamPass. Producer and consumers walk the same passes and stages, so the ring's slot and
// round follow from a running stage count.
template <int BITS, class Cfg, class PassOf, class Store>
__device__ __forceinline__ void stream_block(const Tiles& tiles, int E, int T, PassOf pass_of,
                                             Store store) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::R * Cfg::kSlot);
  uint64_t* empty = full + Cfg::R;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::R; ++s) {
      bulk::init(&full[s], 1);
      bulk::init(&empty[s], Cfg::W);
    }
    bulk::fence_init();
  }
  __syncthreads();
  Segment seg;
  int stage = 0;
  if (warp == Cfg::W) {  // the producer
    const uint64_t policy = bulk::evict_first_policy();
    for (PassIterT<Cfg::kTokens> it(tiles, E, T); it.segment(seg); it.pass += it.step) {
      const StreamPass sp = pass_of(it);
      for (int s = 0; s * Cfg::S < sp.Gk; ++s, ++stage) {
        const int slot = stage % Cfg::R, round = stage / Cfg::R;
        if (round > 0) bulk::wait(&empty[slot], unsigned(round - 1) & 1u);
        stream_issue<Cfg>(sp, seg, s, smem + slot * Cfg::kSlot, &full[slot], policy);
      }
    }
    return;
  }
  for (PassIterT<Cfg::kTokens> it(tiles, E, T); it.segment(seg); it.pass += it.step) {
    const StreamPass sp = pass_of(it);
    const bool valid = warp < stream_valid_warps<Cfg>(sp);
    float y[Cfg::C][Cfg::NT][4] = {};
    for (int s = 0; s * Cfg::S < sp.Gk; ++s, ++stage) {
      const int slot = stage % Cfg::R, round = stage / Cfg::R;
      bulk::wait(&full[slot], unsigned(round) & 1u);
      if (valid)
        stream_consume<Cfg, BITS>(smem + slot * Cfg::kSlot, min(Cfg::S, sp.Gk - s * Cfg::S),
                                  seg.count, y);
      __syncwarp();
      if ((threadIdx.x & 31) == 0) bulk::arrive(&empty[slot]);
    }
    if (valid) store(it, seg, y);
  }
}

template <int BITS, int C>
__global__ void __launch_bounds__(StreamCfg<BITS, 2, C>::kThreads)
    q_moe_stream_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I,
                                QMatrix shared_gate_up, int Is, Tiles tiles,
                                const int32_t* __restrict__ sorted_token, int E, int T,
                                bf16* __restrict__ act, bf16* __restrict__ shared_act) {
  using Cfg = StreamCfg<BITS, 2, C>;
  const int G = H / kQGroup;
  auto pass_of = [=](const PassIterT<Cfg::kTokens>& it) {
    const bool shared = it.e == E;
    const int P = (shared ? Is : I) / kQTileRows;  // gate tiles (= up tiles)
    return StreamPass{x,
                      shared ? nullptr : sorted_token,
                      G,
                      shared ? shared_gate_up.codes : gate_up.codes,
                      shared ? shared_gate_up.sb : gate_up.sb,
                      shared ? 0 : it.e * 2 * P,
                      P,
                      P};
  };
  auto store = [=](const PassIterT<Cfg::kTokens>& it, const Segment& seg,
                   const float(&y)[Cfg::C][2][4]) {
    const bool shared = it.e == E;
    const int n = shared ? Is : I;
    bf16* out = shared ? shared_act : act;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p = int(blockIdx.y) * Cfg::W + (threadIdx.x >> 5);
#pragma unroll
    for (int c = 0; c < Cfg::C; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 8 * c + 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int i = p * kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(n) + i] =
            __float2bfloat16_rn(silu(y[c][0][q]) * y[c][1][q]);
      }
  };
  stream_block<BITS, Cfg>(tiles, E, T, pass_of, store);
}

template <int BITS, int C>
__global__ void __launch_bounds__(StreamCfg<BITS, 1, C>::kThreads)
    q_moe_stream_down_kernel(const bf16* __restrict__ act, int I,
                             const bf16* __restrict__ shared_act, int Is, QMatrix down,
                             QMatrix shared_down, int H, Tiles tiles, int E, int T,
                             float* __restrict__ y, float* __restrict__ shared_out) {
  using Cfg = StreamCfg<BITS, 1, C>;
  const int TH = H / kQTileRows;
  auto pass_of = [=](const PassIterT<Cfg::kTokens>& it) {
    const bool shared = it.e == E;
    return StreamPass{shared ? shared_act : act,
                      nullptr,
                      (shared ? Is : I) / kQGroup,
                      shared ? shared_down.codes : down.codes,
                      shared ? shared_down.sb : down.sb,
                      shared ? 0 : it.e * TH,
                      0,
                      TH};
  };
  auto store = [=](const PassIterT<Cfg::kTokens>& it, const Segment& seg,
                   const float(&acc)[Cfg::C][1][4]) {
    float* out = it.e == E ? shared_out : y;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int th = int(blockIdx.y) * Cfg::W + (threadIdx.x >> 5);
#pragma unroll
    for (int c = 0; c < Cfg::C; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 8 * c + 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        out[size_t(seg.row0 + tok) * size_t(H) + th * kQTileRows + g + (q < 2 ? 0 : 8)] =
            acc[c][0][q];
      }
  };
  stream_block<BITS, Cfg>(tiles, E, T, pass_of, store);
}

// The streamed kernels' grid z: as many passes as the mean tokens per touched expert need (an
// expert past them loops; its weights come again from L2 or DRAM), at least 1. With weights in a
// shared-memory ring a block with no pass costs a launch slot but no weight traffic.
int stream_grid_passes(int T, int E, int k, int pass_tokens) {
  const int all = std::min(ceil_div(T, pass_tokens), ceil_div(kMoeTileRows, pass_tokens));
  return std::min(all, std::max(1, ceil_div(T * k, E * pass_tokens)));
}

unsigned stream_grid_x(const MoeRouting& r, int Z, int pass_tokens) {
  return unsigned(r.max_tiles + ceil_div(ceil_div(r.T, pass_tokens), Z));
}

// 8-token chunks per pass: 1 for batched decode (~1-2 tokens per touched expert), 2 for prompts
// up to 256 tokens (~8 per expert), 4 above (~16 per expert at 512: one pass of 32 reads an
// expert's weights once where passes of 16 read half of them twice).
constexpr int kStreamDecodeMaxT = 64;
constexpr int kStreamC2MaxT = 256;

// Opts a kernel in to `bytes` of dynamic shared memory when past the default 48 KB.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 227 * 1024) fail("cuda::q_moe_small: {} bytes of staged x", bytes);
  if (bytes > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

void check_sizes(const char* what, const MoeRouting& r, int H, int I, int Is) {
  if (!r.expert_offsets || !r.sorted_token || !r.tile_expert || !r.tile_row0 || !r.num_tiles ||
      r.T < 1 || r.E < 1 || r.max_tiles < 1)
    fail("cuda::{}: routing workspace not laid out", what);
  if (H < 64 || H % 64 || I < 64 || I % 64 || Is < 64 || Is % 64)
    fail("cuda::{}: H {}, I {} and Is {} must be positive multiples of 64", what, H, I, Is);
  if (int64_t(r.T) > 65535LL * kPassTokens) fail("cuda::{}: {} tokens", what, r.T);
}

void check_matrix(const char* what, const QMatrix& m, int64_t rows, int cols, int bits) {
  if (!m || !m.sb) fail("cuda::{}: null weights", what);
  if (m.rows != rows || m.cols != cols || m.bits != bits)
    fail("cuda::{}: weights [{}, {}] at {} bits, expected [{}, {}] at {}", what, m.rows, m.cols,
         m.bits, rows, cols, bits);
}

// Streamed launches: grid x = routed tiles, then the shared expert's blocks; y = groups of W
// output tiles; z = passes (stream_grid_passes).
template <int C>
void launch_stream_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                           const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                           bf16* shared_act, cudaStream_t stream) {
  using Cfg = StreamCfg<4, 2, C>;
  const int Z = stream_grid_passes(T, r.E, r.k, Cfg::kTokens);
  const dim3 grid(stream_grid_x(r, Z, Cfg::kTokens),
                  unsigned(ceil_div(std::max(I, Is) / kQTileRows, Cfg::W)), unsigned(Z));
  allow_smem(q_moe_stream_gate_up_kernel<4, C>, Cfg::kSmem);
  q_moe_stream_gate_up_kernel<4, C><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(
      x, H, gate_up, I, shared_gate_up, Is, tiles_of(r), r.sorted_token, r.E, T, act, shared_act);
  LILAC_CUDA_LAUNCHED();
}

template <int C>
void launch_stream_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                        const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                        float* shared_out, cudaStream_t stream) {
  using Cfg = StreamCfg<4, 1, C>;
  const int Z = stream_grid_passes(r.T, r.E, r.k, Cfg::kTokens);
  const dim3 grid(stream_grid_x(r, Z, Cfg::kTokens), unsigned(ceil_div(H / kQTileRows, Cfg::W)),
                  unsigned(Z));
  allow_smem(q_moe_stream_down_kernel<4, C>, Cfg::kSmem);
  q_moe_stream_down_kernel<4, C><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(
      act, I, shared_act, Is, down, shared_down, H, tiles_of(r), r.E, r.T, y, shared_out);
  LILAC_CUDA_LAUNCHED();
}

// automatic: streamed for prompt chunks (T > 64) only. Measured on the H200 (s8 run 2, A/B): the
// 256- and 512-token prefills 14,355 -> 14,858 and 17,242 -> 19,137 tok/s (the 16-token passes
// read an expert's weights once where the register kernels' 8-token passes read them twice),
// while the batched decode passes were no faster (16 rows 5.82 -> 5.89 ms per step, 64 rows
// 11.58 -> 11.54).
bool use_streamed(MoeSmallKernel kernel, int bits, int T) {
  if (kernel == MoeSmallKernel::registers) return false;
  if (kernel == MoeSmallKernel::streamed) {
    if (!q_moe_small_streamed_available(bits))
      fail("cuda::q_moe_small: the streamed kernels need 4-bit weights on a cc 9.x GPU ({} bits)",
           bits);
    return true;
  }
  return T > kStreamDecodeMaxT && q_moe_small_streamed_available(bits);
}

// Output tiles per warp of the register down kernel (J): 2 up to 16 rows, 4 above. Measured (s17
// run 5, 4-bit, bf16 state; engine tok/s at c = 16 / 32 / 64, two runs each): J = 1 3,150-3,157 /
// 4,292-4,300 / 6,454-6,519; J = 2 3,164-3,166 / 4,334-4,343 / 6,642-6,658; J = 4 3,103-3,108 /
// 4,368-4,376 / 6,724-6,750. Lab (down alone, us per layer at T = 16 / 64): 22.88 / 55.03, 22.50 /
// 48.51, 23.85 / 45.83. LILAC_MOE_DOWN_TILES=1|2|4|8 overrides it (A/B).
int down_tiles_per_warp(int T) {
  static const int forced = env_choice("LILAC_MOE_DOWN_TILES", {1, 2, 4, 8});
  return forced ? forced : T <= 16 ? 2 : 4;
}

// Whether this pair runs chained (both launchers ask, with the same answers): counters given
// (`chained` fails without them) and `automatic` or `chained`, the 4-bit register kernels taken,
// down at J = 2 or 4 (the forms built chained), and a grid within the counters.
bool use_chain(MoeSmallKernel kernel, int bits, const MoeRouting& r, const int32_t* chain,
               const char* who) {
  if (kernel == MoeSmallKernel::chained && !chain)
    fail("cuda::{}: the chained kernels need the pair's counters (kMoeSmallChainCounts)", who);
  const bool asked = kernel == MoeSmallKernel::chained || kernel == MoeSmallKernel::automatic;
  if (!chain || !asked || bits != 4 || use_streamed(kernel, bits, r.T)) return false;
  const int J = down_tiles_per_warp(r.T);
  return (J == 2 || J == 4) && grid_x(r, grid_passes(r.T, r.E, r.k)) <= unsigned(kChainCap);
}

}  // namespace

bool q_moe_small_chain_idle(const int32_t* chain) {
  std::vector<int32_t> counts(kMoeSmallChainCounts);
  LILAC_CUDA_CHECK(cudaMemcpy(counts.data(), chain, counts.size() * 4, cudaMemcpyDeviceToHost));
  return std::all_of(counts.begin(), counts.end(), [](int32_t v) { return v == 0; });
}

bool q_moe_small_streamed_available(int bits) {
  return bits == 4 && device_compute_capability() / 10 == 9;
}

bool q_moe_small_supported(const QMatrix& gate_up, const QMatrix& down,
                           const QMatrix& shared_gate_up, const QMatrix& shared_down) {
  const int b = gate_up.bits;
  return gate_up && down && shared_gate_up && shared_down && (b == 4 || b == 8) && down.bits == b &&
         shared_gate_up.bits == b && shared_down.bits == b;
}

void q_moe_small_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                         const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                         bf16* shared_act, cudaStream_t stream, MoeSmallKernel kernel,
                         int32_t* chain) {
  check_sizes("q_moe_small_gate_up", r, H, I, Is);
  if (T != r.T) fail("cuda::q_moe_small_gate_up: {} tokens, routing laid out for {}", T, r.T);
  const int bits = gate_up.bits;
  check_matrix("q_moe_small_gate_up", gate_up, int64_t(r.E) * 2 * I, H, bits);
  check_matrix("q_moe_small_gate_up (shared)", shared_gate_up, 2 * Is, H, bits);
  if (!x || !act || !shared_act) fail("cuda::q_moe_small_gate_up: null pointer");
  if (use_streamed(kernel, bits, T)) {
    if (T <= kStreamDecodeMaxT)
      launch_stream_gate_up<1>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
    else if (T <= kStreamC2MaxT)
      launch_stream_gate_up<2>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
    else
      launch_stream_gate_up<4>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
    return;
  }
  const int Z = grid_passes(T, r.E, r.k);
  const dim3 grid(grid_x(r, Z), unsigned(ceil_div(std::max(I, Is) / kQTileRows, kWarps)),
                  unsigned(Z));
  const size_t smem = staged_x_bytes(H);
  if (bits != 4 && bits != 8) fail("cuda::q_moe_small_gate_up: {} bits", bits);
  static const int forced = env_choice("LILAC_MOE_GATE_UP_BLOCKS", {4, 5});
  const bool five = forced ? forced == 5 : T > 32;
  const bool chained = use_chain(kernel, bits, r, chain, "q_moe_small_gate_up");
  auto fn =
      bits == 8 ? q_moe_small_gate_up_kernel<8>
      : five ? (chained ? q_moe_small_gate_up_kernel<4, 5, true> : q_moe_small_gate_up_kernel<4, 5>)
             : (chained ? q_moe_small_gate_up_kernel<4, 4, true> : q_moe_small_gate_up_kernel<4>);
  allow_smem(fn, smem);
  launch_kernel(moe_pdl_enabled(), fn, grid, dim3(kThreads), smem, stream, x, H, gate_up, I,
                shared_gate_up, Is, tiles_of(r), r.sorted_token, r.E, T, act, shared_act, chain);
}

void q_moe_small_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                      const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                      float* shared_out, cudaStream_t stream, MoeSmallKernel kernel,
                      int32_t* chain) {
  check_sizes("q_moe_small_down", r, H, I, Is);
  const int bits = down.bits;
  check_matrix("q_moe_small_down", down, int64_t(r.E) * H, I, bits);
  check_matrix("q_moe_small_down (shared)", shared_down, H, Is, bits);
  if (!act || !shared_act || !y || !shared_out) fail("cuda::q_moe_small_down: null pointer");
  if (use_streamed(kernel, bits, r.T)) {
    if (r.T <= kStreamDecodeMaxT)
      launch_stream_down<1>(act, I, shared_act, Is, down, shared_down, H, r, y, shared_out, stream);
    else if (r.T <= kStreamC2MaxT)
      launch_stream_down<2>(act, I, shared_act, Is, down, shared_down, H, r, y, shared_out, stream);
    else
      launch_stream_down<4>(act, I, shared_act, Is, down, shared_down, H, r, y, shared_out, stream);
    return;
  }
  const int J = down_tiles_per_warp(r.T);
  const bool chained = use_chain(kernel, bits, r, chain, "q_moe_small_down");
  const int Z = grid_passes(r.T, r.E, r.k);
  const dim3 grid(grid_x(r, Z), unsigned(ceil_div(H / kQTileRows, kWarps * J)), unsigned(Z));
  const size_t smem = staged_x_bytes(std::max(I, Is));
  if (bits != 4 && bits != 8) fail("cuda::q_moe_small_down: {} bits", bits);
  auto fn = q_moe_small_down_kernel<4, 1>;
  switch (J) {
    case 1:
      fn = bits == 4 ? q_moe_small_down_kernel<4, 1> : q_moe_small_down_kernel<8, 1>;
      break;
    case 2:
      fn = bits == 8 ? q_moe_small_down_kernel<8, 2>
           : chained ? q_moe_small_down_kernel<4, 2, kDownMinBlocks<4>, true>
                     : q_moe_small_down_kernel<4, 2>;
      break;
    case 4:
      fn = bits == 8 ? q_moe_small_down_kernel<8, 4>
           : chained ? q_moe_small_down_kernel<4, 4, kDownMinBlocks<4>, true>
                     : q_moe_small_down_kernel<4, 4>;
      break;
    default:
      fn = bits == 4 ? q_moe_small_down_kernel<4, 8> : q_moe_small_down_kernel<8, 8>;
  }
  allow_smem(fn, smem);
  // Chained: gate_up's blocks per x (its grid's y x z), which this grid's blocks of x wait for.
  const int chain_want = int(ceil_div(std::max(I, Is) / kQTileRows, kWarps)) * Z;
  launch_kernel(moe_pdl_enabled(), fn, grid, dim3(kThreads), smem, stream, act, I, shared_act, Is,
                down, shared_down, H, tiles_of(r), r.E, r.T, y, shared_out, chain, chain_want);
}

}  // namespace lilac::cuda
