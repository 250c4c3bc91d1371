// The small-M MoE kernels of q4_moe_small.cu, streamed (Hopper, 4-bit): persistent blocks, each a
// producer warp that streams weight tiles and token rows into a ring of shared-memory slots with
// the bulk copy engine (bulk_copy.cuh) and W = 4 consumer warps that run q4_moe_small.cu's MMAs
// on them (q_group_dot: the decode kernels' numerics, exact (128 + q) products, f32 scale and
// offset per group).
//
// Why (docs/kernels.md, "Eighth session"): the register kernels stream 2.3-2.9 TB/s at 16 rows. A
// first streamed version with one block per (expert tile, 4 output tiles) measured the same
// (ncu, s8 run 3): gate_up's blocks of 147 KB ran 2.6 waves (the last third of the time on part
// of the GPU), each block paid its start (barrier set-up, the first copies' round trip) before
// any MMA, and the consumers issued every ~7 cycles with ~3 warps per scheduler. Here:
//   * blocks are persistent (as many as fit on the GPU) and take items round-robin, the producer
//     running ahead across items, so the ring stays full from the first item to the last;
//   * items are small so that the round-robin evens out: gate_up's item is ONE gate/up tile pair
//     (37 KB at H = 2048) whose K groups the four consumer warps share (warp w takes group
//     4 s + w of stage s; the four partial sums are added in shared memory at the end of the
//     pass, warp order fixed: deterministic); down's item is four output tiles (18 KB at
//     I = 512), one per warp, all of K.
// A pass is up to 8 C tokens of the item's expert (C = 1 for batched decode, 2 for prompts);
// an expert with more tokens than a pass loops over passes, streaming its tiles again.
//
// Items, in order: routed tile t < num_tiles (moe_route's tile table: expert tile_expert[t], its
// sorted rows [tile_row0[t], ... + up to 128)) x y < Yr, then the shared expert (every token)
// pass j x y < Ys (one pass per item). Block b takes items b, b + gridDim.x, ...
#include <algorithm>

#include "cuda/bulk_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/common.h"
#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

// Slot layout (bytes): codes [tile i][group m][plane p][512], sb [i][m][64], x [token r][S * 128
// + 16] (row r's columns of the stage's groups; 16 bytes of pad put rows 4 banks apart).
template <int BITS, int TILES, int C_, int R_>
struct Cfg {
  static constexpr int W = 4;  // consumer warps
  static constexpr int S = 4;  // groups per stage
  static constexpr int R = R_;
  static constexpr int C = C_;
  static constexpr int P = BITS / 4;
  static constexpr int kTiles = TILES;  // weight tiles in a stage
  static constexpr int kTokens = 8 * C;
  static constexpr int kCodeBytes = 512 * P;  // per (tile, group)
  static constexpr int kCodes = kTiles * S * kCodeBytes;
  static constexpr int kSb = kTiles * S * 64;
  static constexpr int kXRow = S * 128 + 16;
  static constexpr int kSlot = kCodes + kSb + kTokens * kXRow;
  static constexpr int kThreads = 32 * (W + 1);
};
// gate_up: a stage is the pair's two tiles x 4 groups (one per warp); 6 slots in flight (4 with
// 16-token passes, whose slots are 13 KB: three blocks per SM either way).
template <int C>
using GateUpCfg = Cfg<4, 2, C, C == 1 ? 6 : 4>;
// down: a stage is 4 tiles (one per warp) x 4 groups; K = 512 is two stages; 3 slots.
template <int C>
using DownCfg = Cfg<4, 4, C, 3>;

// gate_up's cross-warp sum: [warp][lane][C x 2 tiles x 4] f32.
template <int C>
constexpr int kRedBytes = 4 * 32 * C * 8 * 4;

template <class K>
constexpr int smem_bytes(int extra) {
  return K::R * K::kSlot + extra + 2 * K::R * 8;
}

struct Tables {
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
};

// What one item streams: its expert's rows (m tokens from row0: x rows ids[row0 + r] or row0 + r)
// and passes pass0, pass0 + step, ... while pass * 8 C < m; tile t of a stage is weight tile
// tile0 + t_of(t) (see the kernels) of codes / sb with Gk groups.
struct Item {
  int e, row0, m, y, pass0, step;
};

__device__ __forceinline__ Item item_of(const Tables& tb, int i, int Yr, int Ys, int E, int T,
                                        int routed_items) {
  Item it;
  if (i < routed_items) {
    const int t = i / Yr;
    it.y = i - t * Yr;
    it.e = tb.tile_expert[t];
    it.row0 = tb.tile_row0[t];
    it.m = min(kMoeTileRows, tb.offsets[it.e + 1] - it.row0);
    it.pass0 = 0;
    it.step = 1;
  } else {
    const int j = i - routed_items;
    it.pass0 = j / Ys;
    it.y = j - it.pass0 * Ys;
    it.e = E;
    it.row0 = 0;
    it.m = T;
    it.step = 1 << 24;  // one pass
  }
  return it;
}

// Issues a stage into `slot`: `tiles` copies of codes (ng groups from block (tile, grp0)) and of
// sb, then `count` x rows (ng * 128 bytes each from row src(r), column group grp0). Lane l takes
// copies l, l + 32, ...; lane 0 first arms `full` with the byte count.
template <class K, class TileOf, class RowOf>
__device__ __forceinline__ void issue(unsigned char* slot, uint64_t* full, int tiles, int ng,
                                      int grp0, int Gk, const uint32_t* codes, const uint32_t* sb,
                                      const bf16* x, int count, TileOf tile_of, RowOf row_of,
                                      uint64_t policy) {
  const int lane = threadIdx.x & 31;
  if (lane == 0)
    bulk::arrive_expect_tx(full, unsigned(tiles * ng * (K::kCodeBytes + 64) + count * ng * 128));
  __syncwarp();
  for (int c = lane; c < 2 * tiles + count; c += 32) {
    if (c < 2 * tiles) {
      const int i = c < tiles ? c : c - tiles;
      const size_t blk = size_t(tile_of(i)) * size_t(Gk) + size_t(grp0);
      if (c < tiles)
        bulk::copy(slot + i * K::S * K::kCodeBytes, codes + blk * K::P * kQBlockWords,
                   unsigned(ng * K::kCodeBytes), full, policy);
      else
        bulk::copy(slot + K::kCodes + i * K::S * 64, sb + blk * kQSbWords, unsigned(ng * 64), full,
                   policy);
    } else {
      const int r = c - 2 * tiles;
      bulk::copy(slot + K::kCodes + K::kSb + r * K::kXRow,
                 x + (size_t(row_of(r)) * size_t(Gk) + size_t(grp0)) * kQGroup, unsigned(ng * 128),
                 full);
    }
  }
}

// Group m of the slot for tiles i0 .. i0 + NT - 1 against every chunk of the pass's tokens, added
// to y[c] (rows g, g + 8 of each tile x tokens 8 c + 2t, + 1).
template <class K, int NT>
__device__ __forceinline__ void consume_group(const unsigned char* slot, int i0, int m, int count,
                                              float (&y)[K::C][NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  qtile::QSet<4 * K::P, NT, 1> w;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int i = i0 + j;
    const unsigned char* cb = slot + (i * K::S + m) * K::kCodeBytes;
#pragma unroll
    for (int p = 0; p < K::P; ++p)
      w.cw[j][0][p] = *reinterpret_cast<const uint4*>(cb + p * 512 + lane * 16);
    w.sbv[j][0] = *reinterpret_cast<const uint2*>(slot + K::kCodes + (i * K::S + m) * 64 + g * 8);
  }
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(slot + K::kCodes + K::kSb);
#pragma unroll
  for (int c = 0; c < K::C; ++c) {
    if (8 * c >= count) break;  // warp-uniform
    const bool has = 8 * c + g < count;
    const uint32_t* xr = xs + (8 * c + g) * (K::kXRow / 4) + m * 32;
    uint32_t X[4][2];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      X[kb][0] = has ? xr[8 * kb + t] : 0u;
      X[kb][1] = has ? xr[8 * kb + t + 4] : 0u;
    }
    qtile::q_group_dot(w, 0, X, y[c]);
  }
}

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, 128;" ::: "memory");  // the 4 consumer warps (warps 0-3)
}

__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int R, int W) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < R; ++s) {
      bulk::init(&full[s], 1);
      bulk::init(&empty[s], unsigned(W));
    }
    bulk::fence_init();
  }
  __syncthreads();
}

// gate_up: item = (expert tile, gate/up pair y); warp w accumulates groups w, w + 4, ...
template <int C>
__global__ void __launch_bounds__(GateUpCfg<C>::kThreads)
    q_moe_stream_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I,
                                QMatrix shared_gate_up, int Is, Tables tb,
                                const int32_t* __restrict__ sorted_token, int E, int T,
                                bf16* __restrict__ act, bf16* __restrict__ shared_act) {
  using K = GateUpCfg<C>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem + K::R * K::kSlot);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + K::R * K::kSlot + kRedBytes<C>);
  uint64_t* empty = full + K::R;
  init_ring(full, empty, K::R, K::W);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = H / kQGroup;
  const int Yr = I / kQTileRows, Ys = Is / kQTileRows;
  const int routed = *tb.num_tiles * Yr;
  const int total = routed + (T + K::kTokens - 1) / K::kTokens * Ys;
  int stage = 0;
  if (warp == K::W) {  // the producer
    const uint64_t policy = bulk::evict_first_policy();
    for (int i = int(blockIdx.x); i < total; i += int(gridDim.x)) {
      const Item it = item_of(tb, i, Yr, Ys, E, T, routed);
      const bool shared = it.e == E;
      const int P = shared ? Ys : Yr;
      const int tile0 = (shared ? 0 : it.e * 2 * P) + it.y;
      auto tile_of = [=](int j) { return tile0 + j * P; };
      for (int pass = it.pass0; pass * K::kTokens < it.m; pass += it.step) {
        const int base = it.row0 + pass * K::kTokens;
        const int count = min(K::kTokens, it.m - pass * K::kTokens);
        auto row_of = [=](int r) { return shared ? base + r : sorted_token[base + r]; };
        for (int s = 0; s * K::S < G; ++s, ++stage) {
          const int slot = stage % K::R, round = stage / K::R;
          if (round > 0) bulk::wait(&empty[slot], unsigned(round - 1) & 1u);
          issue<K>(smem + slot * K::kSlot, &full[slot], 2, min(K::S, G - s * K::S), s * K::S, G,
                   shared ? shared_gate_up.codes : gate_up.codes,
                   shared ? shared_gate_up.sb : gate_up.sb, x, count, tile_of, row_of, policy);
        }
      }
    }
    return;
  }
  for (int i = int(blockIdx.x); i < total; i += int(gridDim.x)) {
    const Item it = item_of(tb, i, Yr, Ys, E, T, routed);
    const bool shared = it.e == E;
    const int n = shared ? Is : I;
    for (int pass = it.pass0; pass * K::kTokens < it.m; pass += it.step) {
      const int count = min(K::kTokens, it.m - pass * K::kTokens);
      float y[K::C][2][4] = {};
      for (int s = 0; s * K::S < G; ++s, ++stage) {
        const int slot = stage % K::R, round = stage / K::R;
        bulk::wait(&full[slot], unsigned(round) & 1u);
        if (s * K::S + warp < G) consume_group<K, 2>(smem + slot * K::kSlot, 0, warp, count, y);
        __syncwarp();
        if (lane == 0) bulk::arrive(&empty[slot]);
      }
      // The four warps' partial sums, added in warp order by warp 0.
      float* mine = red + (warp * 32 + lane) * (K::C * 8);
#pragma unroll
      for (int c = 0; c < K::C; ++c)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) mine[(c * 2 + j) * 4 + q] = y[c][j][q];
      consumer_sync();
      if (warp == 0) {
        const int g = lane >> 2, t = lane & 3;
        bf16* out = shared ? shared_act : act;
        const int row_base = it.row0 + pass * K::kTokens;
#pragma unroll
        for (int c = 0; c < K::C; ++c)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int tok = 8 * c + 2 * t + (q & 1);
            if (tok >= count) continue;
            float gs = 0.f, us = 0.f;
#pragma unroll
            for (int w = 0; w < K::W; ++w) {
              gs += red[(w * 32 + lane) * (K::C * 8) + (c * 2 + 0) * 4 + q];
              us += red[(w * 32 + lane) * (K::C * 8) + (c * 2 + 1) * 4 + q];
            }
            const int row = it.y * kQTileRows + g + (q < 2 ? 0 : 8);
            out[size_t(row_base + tok) * size_t(n) + row] = __float2bfloat16_rn(silu(gs) * us);
          }
      }
      consumer_sync();  // red is written again by the next pass
    }
  }
}

// down: item = (expert tile, 4 output tiles y); warp w owns output tile 4 y + w, all of K.
template <int C>
__global__ void __launch_bounds__(DownCfg<C>::kThreads)
    q_moe_stream_down_kernel(const bf16* __restrict__ act, int I,
                             const bf16* __restrict__ shared_act, int Is, QMatrix down,
                             QMatrix shared_down, int H, Tables tb, int E, int T,
                             float* __restrict__ y_out, float* __restrict__ shared_out) {
  using K = DownCfg<C>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + K::R * K::kSlot);
  uint64_t* empty = full + K::R;
  init_ring(full, empty, K::R, K::W);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int TH = H / kQTileRows;
  const int Y = (TH + K::W - 1) / K::W;
  const int routed = *tb.num_tiles * Y;
  const int total = routed + (T + K::kTokens - 1) / K::kTokens * Y;
  int stage = 0;
  if (warp == K::W) {  // the producer
    const uint64_t policy = bulk::evict_first_policy();
    for (int i = int(blockIdx.x); i < total; i += int(gridDim.x)) {
      const Item it = item_of(tb, i, Y, Y, E, T, routed);
      const bool shared = it.e == E;
      const int Gk = (shared ? Is : I) / kQGroup;
      const int tile0 = (shared ? 0 : it.e * TH) + it.y * K::W;
      const int tiles = min(K::W, TH - it.y * K::W);
      auto tile_of = [=](int j) { return tile0 + j; };
      const bf16* xs = shared ? shared_act : act;
      for (int pass = it.pass0; pass * K::kTokens < it.m; pass += it.step) {
        const int base = it.row0 + pass * K::kTokens;
        const int count = min(K::kTokens, it.m - pass * K::kTokens);
        auto row_of = [=](int r) { return base + r; };
        for (int s = 0; s * K::S < Gk; ++s, ++stage) {
          const int slot = stage % K::R, round = stage / K::R;
          if (round > 0) bulk::wait(&empty[slot], unsigned(round - 1) & 1u);
          issue<K>(smem + slot * K::kSlot, &full[slot], tiles, min(K::S, Gk - s * K::S), s * K::S,
                   Gk, shared ? shared_down.codes : down.codes, shared ? shared_down.sb : down.sb,
                   xs, count, tile_of, row_of, policy);
        }
      }
    }
    return;
  }
  for (int i = int(blockIdx.x); i < total; i += int(gridDim.x)) {
    const Item it = item_of(tb, i, Y, Y, E, T, routed);
    const bool shared = it.e == E;
    const int Gk = (shared ? Is : I) / kQGroup;
    const bool valid = it.y * K::W + warp < TH;
    for (int pass = it.pass0; pass * K::kTokens < it.m; pass += it.step) {
      const int count = min(K::kTokens, it.m - pass * K::kTokens);
      float acc[K::C][1][4] = {};
      for (int s = 0; s * K::S < Gk; ++s, ++stage) {
        const int slot = stage % K::R, round = stage / K::R;
        bulk::wait(&full[slot], unsigned(round) & 1u);
        const int ng = min(K::S, Gk - s * K::S);
        if (valid) {
#pragma unroll
          for (int m = 0; m < K::S; ++m)
            if (m < ng) consume_group<K, 1>(smem + slot * K::kSlot, warp, m, count, acc);
        }
        __syncwarp();
        if (lane == 0) bulk::arrive(&empty[slot]);
      }
      if (valid) {
        float* out = shared ? shared_out : y_out;
        const int g = lane >> 2, t = lane & 3;
        const int col = (it.y * K::W + warp) * kQTileRows + g;
        const int row_base = it.row0 + pass * K::kTokens;
#pragma unroll
        for (int c = 0; c < K::C; ++c)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int tok = 8 * c + 2 * t + (q & 1);
            if (tok >= count) continue;
            out[size_t(row_base + tok) * size_t(H) + col + (q < 2 ? 0 : 8)] = acc[c][0][q];
          }
      }
    }
  }
}

// Blocks per SM that fit (registers, shared memory), asked once per kernel and cached: the first
// call is made at backend construction (q_moe_small_stream_warm), outside any graph capture.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, int smem) {
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int n = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, size_t(smem)));
  if (n < 1) fail("cuda::q_moe_stream: a {}-byte block does not fit on an SM", smem);
  return n;
}

template <int C>
int gate_up_blocks() {
  static const int n = resident_blocks(q_moe_stream_gate_up_kernel<C>, GateUpCfg<C>::kThreads,
                                       smem_bytes<GateUpCfg<C>>(kRedBytes<C>));
  return n;
}
template <int C>
int down_blocks() {
  static const int n = resident_blocks(q_moe_stream_down_kernel<C>, DownCfg<C>::kThreads,
                                       smem_bytes<DownCfg<C>>(0));
  return n;
}

Tables tables_of(const MoeRouting& r) {
  return Tables{r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles};
}

// The grid: every resident block, but no more than the items can use (max_tiles x Y routed items
// at most, plus the shared expert's).
unsigned grid_of(int resident, int max_items) {
  return unsigned(std::max(1, std::min(resident * sm_count(), max_items)));
}

template <int C>
void launch_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                    const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                    bf16* shared_act, cudaStream_t stream) {
  using K = GateUpCfg<C>;
  const int max_items = r.max_tiles * (I / kQTileRows) + ceil_div(T, K::kTokens) * (Is / kQTileRows);
  q_moe_stream_gate_up_kernel<C>
      <<<grid_of(gate_up_blocks<C>(), max_items), K::kThreads, smem_bytes<K>(kRedBytes<C>),
         stream>>>(x, H, gate_up, I, shared_gate_up, Is, tables_of(r), r.sorted_token, r.E, T, act,
                   shared_act);
  LILAC_CUDA_LAUNCHED();
}

template <int C>
void launch_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                 const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                 float* shared_out, cudaStream_t stream) {
  using K = DownCfg<C>;
  const int Y = ceil_div(H / kQTileRows, K::W);
  const int max_items = (r.max_tiles + ceil_div(r.T, K::kTokens)) * Y;
  q_moe_stream_down_kernel<C>
      <<<grid_of(down_blocks<C>(), max_items), K::kThreads, smem_bytes<K>(0), stream>>>(
          act, I, shared_act, Is, down, shared_down, H, tables_of(r), r.E, r.T, y, shared_out);
  LILAC_CUDA_LAUNCHED();
}

// 8-token chunks per pass: 1 for batched decode (~1-2 tokens per touched expert), 2 for prompts.
constexpr int kDecodeMaxT = 64;

}  // namespace

void q_moe_small_stream_warm() {
  (void)gate_up_blocks<1>();
  (void)gate_up_blocks<2>();
  (void)down_blocks<1>();
  (void)down_blocks<2>();
}

void q_moe_stream_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                          const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                          bf16* shared_act, cudaStream_t stream) {
  if (gate_up.bits != 4 || shared_gate_up.bits != 4)
    fail("cuda::q_moe_stream_gate_up: {} bits (4 only)", gate_up.bits);
  if (T <= kDecodeMaxT)
    launch_gate_up<1>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
  else
    launch_gate_up<2>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
}

void q_moe_stream_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                       const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                       float* shared_out, cudaStream_t stream) {
  if (down.bits != 4 || shared_down.bits != 4)
    fail("cuda::q_moe_stream_down: {} bits (4 only)", down.bits);
  if (r.T <= kDecodeMaxT)
    launch_down<1>(act, I, shared_act, Is, down, shared_down, H, r, y, shared_out, stream);
  else
    launch_down<2>(act, I, shared_act, Is, down, shared_down, H, r, y, shared_out, stream);
}

}  // namespace lilac::cuda
