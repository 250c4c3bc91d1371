// MoE routing on the device (moe_prefill.h): the top-k of each token's router logits and a stable
// counting sort of the (token, slot) pairs by expert, with no host round trip; the tables drive the
// grouped expert kernels of prefill and of the batched decode step (moe_prefill.cu, q4_moe_*.cu).
//
// Routing (moe_route), no host round trip:
//  1. moe_topk_kernel: one warp per token; each lane holds E/32 logits; softmax max and sum by warp
//     reductions; k rounds of warp arg-max over (logit desc, index asc) pick the top-k (selection
//     by logit: softmax is monotonic, so this is the top-k of p with ties to the lower index,
//     without exp rounding creating ties); w_j = p_j / sum of the k selected p.
//  2. moe_rank_kernel: pairs p = t*k + j in chunks of kChunk = 2048 (one block, 8 warps of 256
//     pairs); within a warp, 32 pairs at a time, __match_any_sync groups equal experts, the rank
//     is the count of equal-expert lanes below plus a running per-warp, per-expert count in shared
//     memory; then per-expert prefix over the 8 warps -> rank of p within its chunk (stable: in
//     pair order, hence token order) and the chunk's per-expert counts.
//  3. moe_scan_kernel (one block, a thread per expert): prefix over chunks per expert (chunk
//     bases), then block-wide exclusive scans of the expert totals (-> expert_offsets) and of their
//     tile counts ceil(n_e / 128) (-> the tile table in expert order, num_tiles).
//  4. moe_scatter_kernel: pos = offsets[e] + chunk_base[c][e] + rank -> sorted_token,
//     sorted_weight, pair_position. Deterministic: no atomics anywhere.
//
// Batches and short prompts (T k <= 2,048 pairs, E <= 256) take steps 2-4 in one block
// (moe_route_block_kernel below, 1-2 pairs per thread), and up to 8 rows step 1 as well: two
// launches (one up to 8 rows) instead of four. (s8 run 8 tried
// the block's own top-k up to 1,024 pairs, its warps looping over the tokens: at 64 rows slower
// than the four launches, 19 -> 26 us per layer; s17 split the top-k out instead: kOneBlockMaxT.)
// Prompt chunks of 65-512 rows on sm_90 (E <= 256) take one launch instead: a thread-block cluster
// of up to 16 blocks (16 rows each up to 256, 32 above), a warp per token, each block ranking its
// own pairs and the blocks' counts exchanged through distributed shared memory
// (moe_route_cluster_kernel below; s37).
// The warp arg-max of step 1 is two redux reductions per round (s17: the one-block kernel at 16
// rows 9.4 -> 7.0 us, the top-k kernel at 64 rows 5.8 -> 4.0 us, ncu durations of one graph
// replay).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>

#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/moe_prefill.h"
#include "cuda/moe_topk.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kChunk = 2048;                      // pairs per counting-sort chunk
constexpr int kChunkWarps = 8;                    // warps per chunk block
constexpr int kWarpPairs = kChunk / kChunkWarps;  // 256 pairs per warp
constexpr int kBatches = kWarpPairs / 32;         // 8 batches of 32

// ---- routing (the top-k of a token and the block scan: moe_topk.cuh)
// -------------------------------------------------------------------------------------

template <int PER>
__global__ void __launch_bounds__(256)
    moe_topk_kernel(const float* __restrict__ logits, int stride, int T, int E, int k,
                    int32_t* __restrict__ idx, float* __restrict__ w) {
  pdl_launch_dependents();  // PDL (moe_pdl_enabled): the logits are the previous kernel's
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * 8 + warp;
  if (t >= T) return;
  int my_idx;
  const float my_w = topk_of_token<PER>(logits + size_t(t) * size_t(stride), E, k, my_idx);
  if (lane < k) {
    idx[size_t(t) * k + lane] = my_idx;
    w[size_t(t) * k + lane] = my_w;
  }
}

__global__ void __launch_bounds__(kChunkWarps * 32)
    moe_rank_kernel(const int32_t* __restrict__ idx, int P, int E, int32_t* __restrict__ chunk_rank,
                    int32_t* __restrict__ chunk_base) {
  extern __shared__ int32_t cnt[];  // [kChunkWarps][E]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kChunkWarps * E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const uint32_t below = (1u << lane) - 1u;
  const int first = blockIdx.x * kChunk + warp * kWarpPairs;
  int32_t* my_cnt = cnt + warp * E;
  int rank[kBatches], ex[kBatches];
#pragma unroll
  for (int b = 0; b < kBatches; ++b) {
    const int p = first + b * 32 + lane;
    const int e = p < P ? idx[p] : -1;
    const uint32_t peers = __match_any_sync(0xffffffffu, e);
    const int r = __popc(peers & below);
    const int base = e >= 0 ? my_cnt[e] : 0;
    __syncwarp();
    // The last lane of each group of equal experts advances that expert's running count.
    if (e >= 0 && r == __popc(peers) - 1) my_cnt[e] = base + r + 1;
    __syncwarp();
    rank[b] = base + r;
    ex[b] = e;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
#pragma unroll
    for (int w = 0; w < kChunkWarps; ++w) {
      const int c = cnt[w * E + e];
      cnt[w * E + e] = run;
      run += c;
    }
    chunk_base[size_t(blockIdx.x) * E + e] = run;  // the chunk's count; rebased by moe_scan_kernel
  }
  __syncthreads();
#pragma unroll
  for (int b = 0; b < kBatches; ++b)
    if (ex[b] >= 0) chunk_rank[first + b * 32 + lane] = my_cnt[ex[b]] + rank[b];
}

__global__ void __launch_bounds__(1024)
    moe_scan_kernel(int32_t* __restrict__ chunk_base, int num_chunks, int E, int BM,
                    int32_t* __restrict__ offsets, int32_t* __restrict__ tile_expert,
                    int32_t* __restrict__ tile_row0, int32_t* __restrict__ num_tiles) {
  __shared__ int sh[32];
  const int e = threadIdx.x;
  int n = 0;
  if (e < E) {
    for (int c = 0; c < num_chunks; ++c) {
      const int v = chunk_base[size_t(c) * E + e];
      chunk_base[size_t(c) * E + e] = n;
      n += v;
    }
  }
  const int tiles = (n + BM - 1) / BM;
  int pairs_total, tiles_total;
  const int off = block_exclusive_scan(n, sh, pairs_total);
  const int tile0 = block_exclusive_scan(tiles, sh, tiles_total);
  if (e < E) {
    offsets[e] = off;
    for (int i = 0; i < tiles; ++i) {
      tile_expert[tile0 + i] = e;
      tile_row0[tile0 + i] = off + i * BM;
    }
  }
  if (threadIdx.x == 0) {
    offsets[E] = pairs_total;
    *num_tiles = tiles_total;
  }
}

__global__ void __launch_bounds__(256)
    moe_scatter_kernel(const int32_t* __restrict__ idx, const float* __restrict__ w,
                       const int32_t* __restrict__ chunk_rank,
                       const int32_t* __restrict__ chunk_base, const int32_t* __restrict__ offsets,
                       int P, int E, int k, int32_t* __restrict__ sorted_token,
                       float* __restrict__ sorted_weight, int32_t* __restrict__ pair_position) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  const int e = idx[p];
  const int pos = offsets[e] + chunk_base[size_t(p / kChunk) * E + e] + chunk_rank[p];
  sorted_token[pos] = p / k;
  sorted_weight[pos] = w[p];
  pair_position[p] = pos;
}

// ---- one block for a batch or a short prompt (P = T k <= kBlockPairs PPT, E <= kBlockExperts)
//
// The rank, scan and scatter kernels above in one launch of 1024 threads (and up to
// kOneBlockMaxT rows the top-k too), for batched decode steps where each of them is a few
// microseconds of launch and ramp for little work (run 1 of 2026-12-02, per 40 layers: 16 rows 0.7
// -> 0.48 ms): the top-k by warps taking a token each (topk_of_token) or from moe_topk_kernel
// (kTopkGiven), then thread t ranks pairs p = 1024 q + t (q < PPT) as moe_rank_kernel does within
// one chunk, a count row per 32 pairs in pair order (row 32 q + warp: stable), a thread per expert
// sums its count over the rows and the block scans the counts (offsets, tile table), and each
// thread scatters its pairs. PPT = 2 (s22): prompt chunks of 129-256 tokens (up to 2,048 pairs),
// which took the four kernels: a 256-token chunk's routing 732 -> 618 us over 40 layers (s22 run 8,
// per-kernel events), prefill at 256 tokens 17,462 -> 17,547-17,617 tok/s. PPT = 4 (4,096 pairs,
// 512 tokens) was slower than the four kernels there (25,068 -> 24,778-24,836 tok/s): not kept.
// The same tables as the multi-kernel path, bit for bit (the scratch arrays chunk_rank and
// chunk_base are not written). Shared memory (dynamic): the count rows 32 PPT x kBlockExperts, the
// pairs' experts and weights, the offsets: 41 / 81 KB.
constexpr int kBlockPairs = 1024;
constexpr int kBlockExperts = 256;

template <int PPT>
constexpr size_t block_smem_bytes() {
  return (size_t(32 * PPT) * kBlockExperts + 2 * size_t(kBlockPairs) * PPT + kBlockExperts) * 4;
}

// kTopkGiven: the top-k is already in r.topk_idx / r.topk_weight (moe_topk_kernel, one warp per
// token over many blocks: batches of 9-256 rows, kOneBlockMaxT); the block ranks, scans and
// scatters them (logits and PER unused).
template <int PER, bool kTopkGiven, int PPT>
__global__ void __launch_bounds__(kBlockPairs)
    moe_route_block_kernel(const float* __restrict__ logits, int stride, int T, int E, int k,
                           int BM, MoeRouting r) {
  extern __shared__ int32_t smem[];
  int32_t* cnt = smem;  // [32 PPT][kBlockExperts] per count row and expert: count, then base
  int32_t* pair_e = cnt + 32 * PPT * kBlockExperts;                         // [kBlockPairs PPT]
  float* pair_w = reinterpret_cast<float*>(pair_e + kBlockPairs * PPT);     // [kBlockPairs PPT]
  int32_t* off_s = reinterpret_cast<int32_t*>(pair_w + kBlockPairs * PPT);  // [kBlockExperts]
  __shared__ int sh[32];
  pdl_launch_dependents();  // PDL (moe_pdl_enabled): the logits are the previous kernel's
  pdl_wait();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int P = T * k;
  for (int i = tid; i < 32 * PPT * kBlockExperts; i += kBlockPairs) cnt[i] = 0;
  if constexpr (kTopkGiven) {
#pragma unroll
    for (int q = 0; q < PPT; ++q) {
      const int p = q * kBlockPairs + tid;
      if (p < P) {
        pair_e[p] = r.topk_idx[p];
        pair_w[p] = r.topk_weight[p];
      }
    }
  } else {
    for (int t = warp; t < T; t += kBlockPairs / 32) {
      int my_idx;
      const float my_w = topk_of_token<PER>(logits + size_t(t) * size_t(stride), E, k, my_idx);
      if (lane < k) {
        const int p = t * k + lane;
        pair_e[p] = my_idx;
        pair_w[p] = my_w;
        r.topk_idx[p] = my_idx;
        r.topk_weight[p] = my_w;
      }
    }
  }
  __syncthreads();
  int e[PPT], rank[PPT];
#pragma unroll
  for (int q = 0; q < PPT; ++q) {
    const int p = q * kBlockPairs + tid;
    e[q] = p < P ? pair_e[p] : -1;
    const uint32_t peers = __match_any_sync(0xffffffffu, e[q]);
    rank[q] = __popc(peers & ((1u << lane) - 1u));
    if (e[q] >= 0 && rank[q] == __popc(peers) - 1)
      cnt[(32 * q + warp) * kBlockExperts + e[q]] = rank[q] + 1;
  }
  __syncthreads();
  int n = 0;
  if (tid < E)
    for (int row = 0; row < 32 * PPT; ++row) {
      const int c = cnt[row * kBlockExperts + tid];
      cnt[row * kBlockExperts + tid] = n;
      n += c;
    }
  const int off = route_tables(n, E, BM, true, r, sh);
  if (tid < E) off_s[tid] = off;
  __syncthreads();
#pragma unroll
  for (int q = 0; q < PPT; ++q) {
    if (e[q] < 0) continue;
    const int p = q * kBlockPairs + tid;
    const int pos = off_s[e[q]] + cnt[(32 * q + warp) * kBlockExperts + e[q]] + rank[q];
    r.sorted_token[pos] = p / k;
    r.sorted_weight[pos] = pair_w[p];
    r.pair_position[p] = pos;
  }
}

// Launches the block kernel with its dynamic shared memory (above 48 KB: the attribute, once).
template <int PER, bool kTopkGiven, int PPT>
void launch_block(const float* logits, int stride, int T, int E, int k, const MoeRouting& r,
                  cudaStream_t stream) {
  auto kernel = moe_route_block_kernel<PER, kTopkGiven, PPT>;
  constexpr size_t smem = block_smem_bytes<PPT>();
  if constexpr (smem > 48 * 1024) {
    static std::once_flag once;
    std::call_once(once, [&] {
      LILAC_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    });
  }
  launch_kernel(moe_pdl_enabled(), kernel, dim3(1), dim3(kBlockPairs), smem, stream, logits, stride,
                T, E, k, int(kMoeTileRows), r);
}

// ---- one cluster for prompt chunks of 65-512 rows (sm_90; E <= 256, k <= 32)
//
// The top-k kernel and the one-block sort above in one launch, without the one block: C =
// ceil(T / R) blocks of R warps in one thread-block cluster, block b's warp w taking token t =
// R b + w (topk_of_token). A token's k experts are distinct, so within a block the pairs need no
// match: cnt[w][e] = 1 when warp w's token chose e, a prefix over the R warps (R / 8 threads per
// expert, eight warps each) gives each pair its rank in the block, and the block's count per
// expert goes to shared memory the cluster reads. After the cluster barrier each block sums the
// counts of the blocks before it and of all (distributed shared memory), scans the totals
// (offsets) and scatters its own pairs: pos = offsets[e] + (e's pairs in the blocks before) +
// (rank in the block). Rank 0 writes the offsets and the tile table. The same tables as the paths
// above, bit for bit (pair order is token order, and so is block, warp order).
// Why (s37, ncu on an H100 at 256 tokens): the one-block sort ran 10.9 us for ~12,600 warp
// instructions (IPC 0.74: its serial count rows, match and block scans on one SM), ~8.8 us exposed
// per layer after the top-k kernel's ~4.1. The first form (R = 32, C <= 8: 12.5 us under ncu, ~10
// us exposed) spent its time in the top-k's arg-max rounds (32 warps per SM: not selected, math)
// and in the release of the cluster barrier (ERRBAR: waiting for the top-k's global stores);
// hence R = 16 (C up to 16, a non-portable cluster size), the global stores after the barrier and
// a relaxed arrive after the remote reads. Measured (s37, H100, three interleaved rounds each):
// prefill at 256 tokens 18,551 -> 18,826 tok/s (+1.5%, run 5; the first form 18,751) and 18,565
// -> 18,931 (+2.0%, run 6), at 128 tokens 10,346 -> 10,463 (+1.1%); the 256-token chunk's routing
// 516 -> 296 us exposed (top-k + one block -> the cluster). At 16 rows (C = 1, the c = 16 step)
// it lost, 2,948.7 -> 2,942.9 tok/s (-0.2%): batches keep the two launches (moe_route). At
// 257-512 rows (R = 32, C <= 16, in place of the four kernels; run 7): 512 tokens 29,707 -> 30,096
// (+1.3%); the chunk's routing 569 -> 426 us exposed (s36 run 6's timeline against run 8's, two
// H100s), ~120 launches fewer.
constexpr int kClusterRows = 16;       // R: tokens per block, one per warp
constexpr int kClusterMaxBlocks = 16;  // the largest cluster (non-portable past 8) on H100 / H200
constexpr int kClusterMinT = 65;       // fewer rows (the batched step's) take the two launches
constexpr int kClusterMaxT = 512;      // 16 blocks of 32 rows

template <int PER, int R = kClusterRows>
__global__ void __launch_bounds__(R * 32)
    moe_route_cluster_kernel(const float* __restrict__ logits, int stride, int T, int E, int k,
                             int BM, MoeRouting r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int THREADS = R * 32, Q = R / 8;
  static_assert(R % 8 == 0 && THREADS >= kBlockExperts, "R / 8 threads per expert");
  __shared__ int32_t cnt[R][kBlockExperts];   // per warp: chose e (1), then its rank base
  __shared__ int32_t part[Q][kBlockExperts];  // per eight warps: their count
  __shared__ int32_t block_n[kBlockExperts];  // this block's pairs per expert (the cluster reads)
  __shared__ int32_t base_s[kBlockExperts];   // offsets[e] + e's pairs in the blocks before
  __shared__ int sh[32];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < R * kBlockExperts; i += THREADS) (&cnt[0][0])[i] = 0;
  pdl_launch_dependents();  // PDL (moe_pdl_enabled): the logits are the previous kernel's
  pdl_wait();
  const int rank = int(cluster::ctarank()), blocks = int(gridDim.x);  // the grid is one cluster
  const int t = rank * R + warp;
  int my_e = -1;
  float my_w = 0.f;
  if (t < T) {
    int idx;
    const float w = topk_of_token<PER>(logits + size_t(t) * size_t(stride), E, k, idx);
    if (lane < k) {
      my_e = idx;
      my_w = w;
      cnt[warp][idx] = 1;
    }
  }
  __syncthreads();
  // Exclusive prefix over the warps, per expert: thread group q takes warps 8q .. 8q + 7.
  const int e = tid % kBlockExperts, q = tid / kBlockExperts;
  int run = 0;
  if (e < E) {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const int c = cnt[8 * q + w][e];
      cnt[8 * q + w][e] = run;
      run += c;
    }
    part[q][e] = run;
  }
  __syncthreads();
  if (e < E) {
    int before = 0;
    for (int i = 0; i < q; ++i) before += part[i][e];
    if (before) {
#pragma unroll
      for (int w = 0; w < 8; ++w) cnt[8 * q + w][e] += before;
    }
    if (q == 0) {
      int n_e = 0;
#pragma unroll
      for (int i = 0; i < Q; ++i) n_e += part[i][e];
      block_n[e] = n_e;
    }
  }
  // Every block's block_n written and visible. No global store is pending here: the barrier's
  // release would wait for it (the first form's ERRBAR).
  cluster::sync();
  int n = 0, below = 0;
  if (tid < E) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(&block_n[tid]));
    for (int b = 0; b < blocks; ++b) {
      const int v = cluster::ld_s32(cluster::map(a, uint32_t(b)));
      below += b < rank ? v : 0;
      n += v;
    }
  }
  // Done reading the other blocks' shared memory (their exit waits for this arrive; n depends on
  // every remote load, so the arrive cannot pass them).
  cluster::arrive_relaxed_after(n);
  if (my_e >= 0) {
    r.topk_idx[size_t(t) * k + lane] = my_e;
    r.topk_weight[size_t(t) * k + lane] = my_w;
  }
  const int off = route_tables(n, E, BM, rank == 0, r, sh);
  if (tid < E) base_s[tid] = off + below;
  __syncthreads();
  if (my_e >= 0) {
    const int pos = base_s[my_e] + cnt[warp][my_e];
    r.sorted_token[pos] = t;
    r.sorted_weight[pos] = my_w;
    r.pair_position[size_t(t) * k + lane] = pos;
  }
  cluster::wait();  // no block leaves while another may still read its block_n
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)logits, (void)stride, (void)T, (void)E, (void)k, (void)BM, (void)r;
  __trap();
#endif
}

// Launches the cluster of ceil(T / R) blocks of R rows; false when T needs more blocks than this
// GPU's largest cluster of them holds (the caller then routes otherwise). Clusters past 8 blocks
// need the non-portable attribute, set once with the occupancy query; should either call fail
// (a GPU or driver without them), its error is cleared and only portable clusters are launched.
template <int PER, int R>
bool launch_cluster(const float* logits, int stride, int T, int E, int k, const MoeRouting& r,
                    cudaStream_t stream) {
  auto kernel = moe_route_cluster_kernel<PER, R>;
  static const bool fits = [&] {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    cudaLaunchAttribute attr[2];
    const dim3 cluster(unsigned(kClusterMaxBlocks), 1, 1);
    const cudaLaunchConfig_t cfg = launch_config(kernel, dim3(kClusterMaxBlocks), dim3(R * 32), 0,
                                                 stream, &cluster, false, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return clusters >= 1;
  }();
  const int blocks = ceil_div(T, R);
  if (blocks > kClusterMaxBlocks || (!fits && blocks > 8)) return false;
  const dim3 cluster(unsigned(blocks), 1, 1);
  launch_cluster_kernel(moe_pdl_enabled(), cluster, kernel, dim3(unsigned(blocks)), dim3(R * 32), 0,
                        stream, logits, stride, T, E, k, int(kMoeTileRows), r);
  return true;
}

// 65-256 rows in blocks of 16, 257-512 in blocks of 32.
template <int PER>
bool route_by_cluster(const float* logits, int stride, int T, int E, int k, const MoeRouting& r,
                      cudaStream_t stream) {
  return T <= kClusterRows * kClusterMaxBlocks
             ? launch_cluster<PER, kClusterRows>(logits, stride, T, E, k, r, stream)
             : launch_cluster<PER, 2 * kClusterRows>(logits, stride, T, E, k, r, stream);
}

// ---- host

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

struct Sizes {
  int P, chunks, max_tiles;
};
Sizes sizes_of(int T, int E, int k) {
  if (T < 1 || E < 1 || k < 1 || k > E) fail("moe routing: bad sizes T {} E {} k {}", T, E, k);
  const int64_t P = int64_t(T) * k;
  if (P > (int64_t(1) << 30)) fail("moe routing: {} pairs", P);
  const int64_t nonempty = std::min<int64_t>(E, P);
  Sizes s;
  s.P = int(P);
  s.chunks = int(ceil_div(P, int64_t(kChunk)));
  s.max_tiles = int((P + nonempty * (kMoeTileRows - 1)) / kMoeTileRows);
  return s;
}

void check_routing(const MoeRouting& r, const char* what) {
  if (!r.topk_idx || r.T < 1) fail("{}: routing workspace not laid out", what);
}

// Up to 8 rows the routing is one block (its warps take a token each for the top-k); from 9 rows
// while the pairs fit the block (P <= 1,024) the top-k kernel (a warp per token over T / 8 blocks)
// then the block's rank, scan and scatter (kTopkGiven): two PDL launches. s17 runs 2 and 4 (4-bit,
// bf16 state, engine A/B): 64 rows four kernels -> two 10.04-10.11 -> 9.89-9.93 ms per step, 32
// rows one block -> two 4,221-4,234 -> 4,293-4,305 tok/s, 16 rows +0.3%, 2-8 rows no better
// (-0.1 to -0.5%). s22: up to 2,048 pairs (prompt chunks up to 256 tokens) the block takes 2
// pairs per thread; above, the four kernels. LILAC_MOE_ROUTE_PPT=1 keeps the block at 1,024 pairs
// (A/B; 2 is the default).
constexpr int kOneBlockMaxT = 8;

// moe_route_cluster_kernel's switch (moe_prefill.h): the environment's answer until set.
std::atomic<int> g_route_cluster{-1};

int max_pairs_per_thread() {
  static const int forced = env_choice("LILAC_MOE_ROUTE_PPT", {1, 2});
  return forced ? forced : 2;
}

}  // namespace

void set_moe_route_cluster(bool on) {
  g_route_cluster = on ? 1 : 0;
}
bool moe_route_cluster_enabled() {
  if (g_route_cluster < 0)
    g_route_cluster =
        env_enum<bool>("LILAC_MOE_ROUTE_CLUSTER", true, {{"on", true}, {"off", false}});
  return g_route_cluster == 1 && device_compute_capability() / 10 == 9;
}

size_t moe_routing_workspace_bytes(int T, int E, int k) {
  const Sizes s = sizes_of(T, E, k);
  const size_t P = size_t(s.P);
  return 6 * align256(P * 4) + align256(size_t(s.chunks) * E * 4) + align256(size_t(E + 1) * 4) +
         2 * align256(size_t(s.max_tiles) * 4) + align256(4);
}

MoeRouting moe_routing_layout(void* workspace, int T, int E, int k) {
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    fail("moe routing: workspace must be 256-byte aligned");
  const Sizes s = sizes_of(T, E, k);
  char* p = static_cast<char*>(workspace);
  auto take = [&](size_t bytes) {
    char* q = p;
    p += align256(bytes);
    return q;
  };
  const size_t P = size_t(s.P);
  MoeRouting r;
  r.T = T;
  r.E = E;
  r.k = k;
  r.max_tiles = s.max_tiles;
  r.num_chunks = s.chunks;
  r.topk_idx = reinterpret_cast<int32_t*>(take(P * 4));
  r.topk_weight = reinterpret_cast<float*>(take(P * 4));
  r.chunk_rank = reinterpret_cast<int32_t*>(take(P * 4));
  r.chunk_base = reinterpret_cast<int32_t*>(take(size_t(s.chunks) * E * 4));
  r.expert_offsets = reinterpret_cast<int32_t*>(take(size_t(E + 1) * 4));
  r.sorted_token = reinterpret_cast<int32_t*>(take(P * 4));
  r.sorted_weight = reinterpret_cast<float*>(take(P * 4));
  r.pair_position = reinterpret_cast<int32_t*>(take(P * 4));
  r.tile_expert = reinterpret_cast<int32_t*>(take(size_t(s.max_tiles) * 4));
  r.tile_row0 = reinterpret_cast<int32_t*>(take(size_t(s.max_tiles) * 4));
  r.num_tiles = reinterpret_cast<int32_t*>(take(4));
  return r;
}

void moe_route(const float* logits, int stride, int T, int E, int k, const MoeRouting& r,
               cudaStream_t stream) {
  check_routing(r, "moe_route");
  if (r.T != T || r.E != E || r.k != k)
    fail("moe_route: workspace laid out for T {} E {} k {}", r.T, r.E, r.k);
  if (E > 512 || k > 32 || stride < E)
    fail("moe_route: E {} (<= 512), k {} (<= 32), stride {}", E, k, stride);
  const int P = T * k;
  // Pairs per thread of the one-block kernel (0: the four kernels).
  const int ppt = E > kBlockExperts                                     ? 0
                  : P <= kBlockPairs                                    ? 1
                  : P <= 2 * kBlockPairs && max_pairs_per_thread() == 2 ? 2
                                                                        : 0;
  if (ppt == 1 && T <= kOneBlockMaxT) {  // one launch: a warp per token
    if (E <= 128)
      launch_block<4, false, 1>(logits, stride, T, E, k, r, stream);
    else
      launch_block<8, false, 1>(logits, stride, T, E, k, r, stream);
    return;
  }
  // One launch for prompt chunks of 65-512 rows: a cluster of ceil(T / 16) or ceil(T / 32) blocks.
  if (T >= kClusterMinT && T <= kClusterMaxT && E <= kBlockExperts && moe_route_cluster_enabled() &&
      (E <= 128 ? route_by_cluster<4>(logits, stride, T, E, k, r, stream)
                : route_by_cluster<8>(logits, stride, T, E, k, r, stream)))
    return;
  const unsigned topk_blocks = unsigned(ceil_div(T, 8));
  const bool pdl = moe_pdl_enabled();
  if (E <= 128)
    launch_kernel(pdl, moe_topk_kernel<4>, dim3(topk_blocks), dim3(256), 0, stream, logits, stride,
                  T, E, k, r.topk_idx, r.topk_weight);
  else if (E <= 256)
    launch_kernel(pdl, moe_topk_kernel<8>, dim3(topk_blocks), dim3(256), 0, stream, logits, stride,
                  T, E, k, r.topk_idx, r.topk_weight);
  else
    launch_kernel(pdl, moe_topk_kernel<16>, dim3(topk_blocks), dim3(256), 0, stream, logits, stride,
                  T, E, k, r.topk_idx, r.topk_weight);
  // Two launches: the top-k over T / 8 blocks, then the rest in one block.
  if (ppt == 1) return launch_block<8, true, 1>(logits, stride, T, E, k, r, stream);
  if (ppt == 2) return launch_block<8, true, 2>(logits, stride, T, E, k, r, stream);
  moe_rank_kernel<<<unsigned(r.num_chunks), kChunkWarps * 32, size_t(kChunkWarps) * E * 4,
                    stream>>>(r.topk_idx, P, E, r.chunk_rank, r.chunk_base);
  LILAC_CUDA_LAUNCHED();
  moe_scan_kernel<<<1, 1024, 0, stream>>>(r.chunk_base, r.num_chunks, E, kMoeTileRows,
                                          r.expert_offsets, r.tile_expert, r.tile_row0,
                                          r.num_tiles);
  LILAC_CUDA_LAUNCHED();
  moe_scatter_kernel<<<unsigned(ceil_div(P, 256)), 256, 0, stream>>>(
      r.topk_idx, r.topk_weight, r.chunk_rank, r.chunk_base, r.expert_offsets, P, E, k,
      r.sorted_token, r.sorted_weight, r.pair_position);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
