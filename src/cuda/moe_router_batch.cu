// moe_router_route (moe_router_batch.h): the batched decode step's post-attention norm, router
// GEMV, top-k and routing tables in one launch, one thread-block cluster of S blocks.
//
// Why: between out_proj and the experts the batched step ran four dependent launches (rms_norm,
// the router's q_gemv_rows, moe_route's top-k kernel and its one-block sort), each paying a kernel
// boundary and its own short chain for little work: at 16 rows 1.6 + 4.4 + 2.8 + 2.6 us exposed
// per layer in s24's timeline, ~0.46 ms of a 4.59 ms step (docs/kernels.md, s38).
//
// Design. Block b of the cluster is rank b of q_gemv_rows' K split of the router at B rows
// (q_gemv_rows_ranks: S ranks of NG groups, one register set each), over every row tile (a warp
// per tile: 17 warps for the real router's 257 rows), so it does exactly that rank's arithmetic
// for all of q_gemv_rows' row blocks:
//  1. Before the wait for h: each warp requests its tile's NG groups (codes, scale/bias) into
//     registers; the count rows are cleared.
//  2. The norm, in rms_norm's order: its 256 threads each square one 8-column chunk (H <= 2,048)
//     and block_sum adds them per warp (a shuffle tree), then the 8 warps' sums (a second tree).
//     Rank b holds the chunks of rms_norm's warps [NG b / 4, NG (b + 1) / 4) (4 groups = 32 chunks
//     = a warp), so it computes those warps' sums per token; the cluster exchanges them through
//     distributed shared memory (barrier 1) and every block finishes the second tree itself: the
//     same rsqrt, so x is rms_norm's bit for bit. Each block normalises its own columns into
//     shared memory as ldmatrix rows (rows B .. 8 NCH zero).
//  3. The GEMV: per tile and group q_gemv_rows' arithmetic (q4_tile.cuh rows_group_a /
//     rows_group_mma with the group sums from MMAs, the same fmaf order), the partial logits
//     [row][token] to shared memory; barrier 2; block b sums, in rank order, the rows of its own
//     tokens ([R b, R b + R), R = ceil(B / S)) over the ranks: q_gemv_rows' reduce, so the same
//     logits.
//  4. The routing: a warp per own token runs moe_route's top-k (moe_topk.cuh topk_of_token) on
//     those logits in shared memory; the block ranks its pairs per expert (a token's k experts are
//     distinct, so a count row per token and a prefix over them); the blocks' counts meet through
//     distributed shared memory (barrier 3); each block scans the totals (offsets, tile table) and
//     scatters its own pairs: moe_route_cluster_kernel's scheme, the same tables (pair order is
//     token order is rank order).
//  5. Every global store last (the logits, x for the expert kernels, the tables): a cluster
//     barrier's release waits for the block's pending global stores (s37's ERRBAR stall).
// The results are rms_norm + q_gemv_rows + moe_route's bit for bit (conformance moe_router_route
// cases). Measured (s38 run 1, H100, three interleaved rounds, 4-bit, bf16 state): slower than
// the four launches, c = 16 2,979 -> 2,814 tok/s (5.37 -> 5.69 ms per step: +7.8 us per layer),
// c = 8 and 32 -7%, one row 477 -> 465; un-graphed, a launch took 15.9 us at one row. Not yet
// profiled (no device time was left): off by default (CudaOptions::fused_router_route).
// Shared memory (dynamic): x rows [8 NCH][64 NG + 8] bf16, partial logits [16 tiles][8 NCH], the
// own tokens' logits [R][16 tiles], the norm's warp sums [8][8 NCH], count rows [R][256], pairs
// [R k]: ~80 KB at 32 rows and S = 8.
#include "cuda/moe_router_batch.h"

#include <algorithm>

#include "cuda/cluster.cuh"
#include "cuda/moe_topk.cuh"
#include "cuda/q4_linear.h"
#include "cuda/q4_rows.cuh"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kWarps = 17;  // row tiles: E + 1 <= 272 rows
constexpr int kThreads = kWarps * 32;
constexpr int kTok = 8;                 // tokens per MMA chunk
constexpr int kRmsWarps = 8;            // rms_norm's warps (kRmsThreads / 32)
constexpr int kMaxExperts = 256;        // topk_of_token<8>, the count rows, a thread per expert
constexpr int kMaxRanks = 8;            // q_gemv_rows' largest split (a portable cluster)
constexpr int kXPad = 8;                // bf16 past a staged x row (rows 16 bytes apart mod 128)
constexpr int kMaxH = 8 * kRmsThreads;  // one 8-column chunk per rms_norm thread
static_assert(kRmsThreads == 32 * kRmsWarps, "the norm finishes rms_norm's block_sum");

// Byte offsets of the dynamic shared memory (16-byte aligned pieces).
struct Layout {
  int ldx;   // bf16 per staged x row
  int bt;    // token columns of the partial logits: 8 NCH
  int rows;  // logit rows per token: 16 tiles
  int R;     // own tokens per block
  unsigned xs, part, red, ss, cnt, pe, pw, bn, bs, bytes;
};

__host__ __device__ inline unsigned align16(unsigned n) {
  return (n + 15u) & ~15u;
}

__host__ __device__ inline Layout layout_of(int B, int S, int NG, int tiles, int k, int nch) {
  Layout L;
  L.ldx = 64 * NG + kXPad;
  L.bt = kTok * nch;
  L.rows = 16 * tiles;
  L.R = (B + S - 1) / S;
  unsigned o = 0;
  L.xs = o, o += align16(unsigned(L.bt * L.ldx * 2));
  L.part = o, o += align16(unsigned(L.rows * L.bt * 4));
  L.red = o, o += align16(unsigned(L.R * L.rows * 4));
  L.ss = o, o += align16(unsigned(kRmsWarps * L.bt * 4));
  L.cnt = o, o += align16(unsigned(L.R * kMaxExperts * 4));
  L.pe = o, o += align16(unsigned(L.R * k * 4));
  L.pw = o, o += align16(unsigned(L.R * k * 4));
  L.bn = o, o += align16(unsigned(kMaxExperts * 4));
  L.bs = o, o += align16(unsigned(kMaxExperts * 4));
  L.bytes = o;
  return L;
}

template <int BITS, int NCH>
__global__ void __launch_bounds__(kThreads, 1)
    moe_router_route_kernel(QMatrix W, const float* __restrict__ h,
                            const float* __restrict__ norm_scale, float eps, int B, int E, int k,
                            int NG, float* __restrict__ logits, bf16* __restrict__ x_out,
                            MoeRouting r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int P = BITS / 4;
  constexpr int GS = 8 / P;  // groups of a register set (q_gemv_rows' kSetGroups / P) = NG
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int sh[32];
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int S = int(gridDim.x), rank = int(cluster::ctarank());  // the grid is one cluster
  const int H = W.cols, G = W.groups(), tiles = W.tiles(), E1 = E + 1;
  const int gb = rank * NG, ngb = min(NG, G - gb);  // this rank's groups [gb, gb + ngb)
  const Layout L = layout_of(B, S, NG, tiles, k, NCH);
  bf16* const xs = reinterpret_cast<bf16*>(smem + L.xs);
  float* const part = reinterpret_cast<float*>(smem + L.part);
  float* const red = reinterpret_cast<float*>(smem + L.red);
  float* const ssp = reinterpret_cast<float*>(smem + L.ss);
  int32_t* const cnt = reinterpret_cast<int32_t*>(smem + L.cnt);
  int32_t* const pair_e = reinterpret_cast<int32_t*>(smem + L.pe);
  float* const pair_w = reinterpret_cast<float*>(smem + L.pw);
  int32_t* const block_n = reinterpret_cast<int32_t*>(smem + L.bn);
  int32_t* const base_s = reinterpret_cast<int32_t*>(smem + L.bs);
  pdl_launch_dependents();  // PDL (launch.h): h is the previous kernel's output

  // 1. This warp's tile, the rank's groups, before the wait (weights are no kernel's output).
  const bool active = warp < tiles;  // warp-uniform
  const qtile::TileRef<BITS> ref(W, active ? warp : tiles - 1);
  qtile::QSet<BITS, 1, GS> w;
  if (active) qtile::load_set(w, ref, gb, ngb);
  for (int i = tid; i < L.R * kMaxExperts; i += kThreads) cnt[i] = 0;
  // x rows past B: zeros (the MMAs read them; their columns of the products are not used).
  for (int i = tid; i < (L.bt - B) * (L.ldx / 8); i += kThreads)
    reinterpret_cast<uint4*>(xs + size_t(B) * L.ldx)[i] = make_uint4(0, 0, 0, 0);
  pdl_wait();

  // 2. The norm. Rank `rank` holds rms_norm's warps [ow0, ow0 + NG / 4); a lane one chunk of each.
  const int nch8 = H / 8, ow0 = gb / 4, now = NG / 4;
  constexpr int kTokPerWarp = (kMoeRouterRouteMaxRows + kWarps - 1) / kWarps;  // 2
  float4 hv[kTokPerWarp][2][2];
#pragma unroll
  for (int j = 0; j < kTokPerWarp; ++j) {
    const int t = warp + kWarps * j;
    if (t >= B) break;  // warp-uniform
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      if (o >= now) break;
      const int c = 32 * (ow0 + o) + lane;
      const float4* p = reinterpret_cast<const float4*>(h + size_t(t) * H + 8 * size_t(c));
      hv[j][o][0] = c < nch8 ? __ldcg(p) : make_float4(0.f, 0.f, 0.f, 0.f);
      hv[j][o][1] = c < nch8 ? __ldcg(p + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float s = warp_sum(sumsq8(hv[j][o][0], hv[j][o][1], 0.f));
      if (lane == 0) ssp[(ow0 + o) * L.bt + t] = s;
    }
  }
  cluster::sync();  // 1: every rank's warp sums
  const uint32_t ssp_addr = uint32_t(__cvta_generic_to_shared(ssp));
#pragma unroll
  for (int j = 0; j < kTokPerWarp; ++j) {
    const int t = warp + kWarps * j;
    if (t >= B) break;
    // block_sum's second tree: lane ow < 8 holds rms_norm warp ow's sum (0 past the ranks).
    float v = 0.f;
    if (lane < kRmsWarps) {
      const int rk = lane * 4 / NG;
      if (rk < S) v = cluster::ld_f32(cluster::map(ssp_addr + 4u * unsigned(lane * L.bt + t), rk));
    }
    const float rs = rsqrtf(warp_sum(v) / float(H) + eps);
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      if (o >= now) break;
      const int c = 32 * (ow0 + o) + lane;
      if (c >= nch8) continue;
      const float4* s4 = reinterpret_cast<const float4*>(norm_scale) + 2 * c;
      *reinterpret_cast<uint4*>(xs + size_t(t) * L.ldx + 8 * (c - 8 * gb)) =
          rms_pack8(hv[j][o][0], hv[j][o][1], __ldg(s4), __ldg(s4 + 1), rs);
    }
  }
  __syncthreads();  // x staged

  // 3. The GEMV: the tile's groups in order, each over the chunks of 8 tokens.
  float acc[NCH][4];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  if (active) {
    constexpr float kOffset = qtile::kRowsOffset<BITS>;
    const int jm = lane >> 3;  // ldmatrix.x4: lane gives row lane & 7 of matrix jm
    const uint32_t lane_addr =
        tile::smem_u32(xs) + uint32_t(((lane & 7) * L.ldx + (jm >> 1) * 16 + (jm & 1) * 8) * 2);
#pragma unroll
    for (int m = 0; m < GS; ++m) {
      if (m >= ngb) break;
      uint32_t a[4][4];
      qtile::rows_group_a<BITS>(w.cw[0][m], a);
      const float s0 = bf16_lo(w.sbv[0][m].x), b0 = bf16_hi(w.sbv[0][m].x);  // row g
      const float s1 = bf16_lo(w.sbv[0][m].y), b1 = bf16_hi(w.sbv[0][m].y);  // row g + 8
      const float o0 = fmaf(-kOffset, s0, b0), o1 = fmaf(-kOffset, s1, b1);
#pragma unroll
      for (int ch = 0; ch < NCH; ++ch) {
        if (ch * kTok >= B) break;
        float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
        qtile::rows_group_mma<true>(a, lane_addr + uint32_t(m * 128 + ch * kTok * L.ldx * 2), c, d);
        acc[ch][0] = fmaf(o0, d[0], fmaf(s0, c[0], acc[ch][0]));
        acc[ch][1] = fmaf(o0, d[1], fmaf(s0, c[1], acc[ch][1]));
        acc[ch][2] = fmaf(o1, d[0], fmaf(s1, c[2], acc[ch][2]));
        acc[ch][3] = fmaf(o1, d[1], fmaf(s1, c[3], acc[ch][3]));
      }
    }
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        part[(16 * warp + g + (q < 2 ? 0 : 8)) * L.bt + ch * kTok + 2 * t4 + (q & 1)] = acc[ch][q];
  }
  cluster::sync();                                           // 2: every rank's partial logits
  const int t0 = rank * L.R, tn = max(0, min(L.R, B - t0));  // this block's own tokens
  const uint32_t part_addr = tile::smem_u32(part);
  for (int i = tid; i < tn * E1; i += kThreads) {
    const int tr = i / E1, row = i - tr * E1;
    const unsigned at = unsigned(row * L.bt + t0 + tr);
    float v;
    if (S == 1) {
      v = part[at];  // q_gemv_rows stores a lone rank's sums as they are
    } else {
      float pv[kMaxRanks];
#pragma unroll
      for (int rr = 0; rr < kMaxRanks; ++rr)
        pv[rr] = rr < S ? cluster::ld_f32(cluster::map(part_addr + 4u * at, unsigned(rr))) : 0.f;
      v = 0.f;
#pragma unroll
      for (int rr = 0; rr < kMaxRanks; ++rr) v += rr < S ? pv[rr] : 0.f;
    }
    red[tr * L.rows + row] = v;
  }
  __syncthreads();

  // 4. The routing: the top-k of each own token, its pairs ranked per expert in token order.
  for (int tr = warp; tr < tn; tr += kWarps) {
    int idx;
    const float wt = topk_of_token<kMaxExperts / 32>(red + tr * L.rows, E, k, idx);
    if (lane < k) {
      pair_e[tr * k + lane] = idx;
      pair_w[tr * k + lane] = wt;
      cnt[tr * kMaxExperts + idx] = 1;
    }
  }
  __syncthreads();
  if (tid < E) {
    int run = 0;
    for (int tr = 0; tr < tn; ++tr) {
      const int c = cnt[tr * kMaxExperts + tid];
      cnt[tr * kMaxExperts + tid] = run;
      run += c;
    }
    block_n[tid] = run;
  }
  cluster::sync();  // 3: every block's counts
  int n = 0, below = 0;
  if (tid < E) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(&block_n[tid]));
    for (int b = 0; b < S; ++b) {
      const int v = cluster::ld_s32(cluster::map(a, uint32_t(b)));
      below += b < rank ? v : 0;
      n += v;
    }
  }
  // Done reading the other blocks' shared memory (n depends on every remote load).
  cluster::arrive_relaxed_after(n);
  const int off = route_tables(n, E, kMoeTileRows, rank == 0, r, sh);
  if (tid < E) base_s[tid] = off + below;
  __syncthreads();

  // 5. The stores: pairs, logits, x.
  for (int i = tid; i < tn * k; i += kThreads) {
    const int tr = i / k, e = pair_e[i];
    const int pos = base_s[e] + cnt[tr * kMaxExperts + e];
    const size_t p = size_t(t0) * k + size_t(i);  // pair (t0 + tr) k + j
    r.sorted_token[pos] = t0 + tr;
    r.sorted_weight[pos] = pair_w[i];
    r.pair_position[p] = pos;
    r.topk_idx[p] = e;
    r.topk_weight[p] = pair_w[i];
  }
  for (int i = tid; i < tn * E1; i += kThreads) {
    const int tr = i / E1, row = i - tr * E1;
    logits[size_t(t0 + tr) * E1 + row] = red[tr * L.rows + row];
  }
  const int pieces = ngb * 8;  // 16-byte pieces of this rank's columns per row
  for (int i = tid; i < B * pieces; i += kThreads) {
    const int t = i / pieces, v = i - t * pieces;
    *reinterpret_cast<uint4*>(x_out + size_t(t) * H + 64 * size_t(gb) + 8 * v) =
        *reinterpret_cast<const uint4*>(xs + size_t(t) * L.ldx + 8 * v);
  }
  cluster::wait();  // no block leaves while another may still read its shared memory
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)W, (void)h, (void)norm_scale, (void)eps, (void)B, (void)E, (void)k, (void)NG, (void)logits,
      (void)x_out, (void)r;
  __trap();
#endif
}

// The 8-token chunks the GEMV runs: 1, 2 or 4.
int chunks_of(int B) {
  const int c = (B + kTok - 1) / kTok;
  return c <= 1 ? 1 : c <= 2 ? 2 : 4;
}

template <int BITS, int NCH>
void launch(const QMatrix& W, const float* h, const float* scale, float eps, int B, int E, int k,
            int S, int NG, float* logits, bf16* x, const MoeRouting& r, cudaStream_t stream) {
  auto kernel = moe_router_route_kernel<BITS, NCH>;
  const unsigned smem = layout_of(B, S, NG, W.tiles(), k, NCH).bytes;
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_cluster_kernel(true, dim3(unsigned(S), 1, 1), kernel, dim3(unsigned(S)), dim3(kThreads),
                        smem, stream, W, h, scale, eps, B, E, k, NG, logits, x, r);
}

template <int BITS>
void launch_bits(const QMatrix& W, const float* h, const float* scale, float eps, int B, int E,
                 int k, int S, int NG, float* logits, bf16* x, const MoeRouting& r,
                 cudaStream_t stream) {
  switch (chunks_of(B)) {
    case 1:
      return launch<BITS, 1>(W, h, scale, eps, B, E, k, S, NG, logits, x, r, stream);
    case 2:
      return launch<BITS, 2>(W, h, scale, eps, B, E, k, S, NG, logits, x, r, stream);
    default:
      return launch<BITS, 4>(W, h, scale, eps, B, E, k, S, NG, logits, x, r, stream);
  }
}

}  // namespace

bool moe_router_route_supported(const QMatrix& router, int B, int E, int k) {
  if (!router || !router.sb || (router.bits != 4 && router.bits != 8)) return false;
  if (B < 1 || B > kMoeRouterRouteMaxRows || E < 1 || E > kMaxExperts || k < 1 ||
      k > std::min(E, 32))
    return false;
  if (router.rows != E + 1 || router.cols < kQGroup || router.cols % kQGroup != 0 ||
      router.cols > kMaxH || router.tiles() > kWarps)
    return false;
  if (device_compute_capability() < 90) return false;  // thread-block clusters
  const QGemvRowsRanks rk = q_gemv_rows_ranks(router, B);
  const int GS = 8 / (router.bits / 4);
  if (rk.NG != GS || rk.S < 1 || rk.S > kMaxRanks || !rk.mma_sums) return false;
  return layout_of(B, rk.S, rk.NG, router.tiles(), k, chunks_of(B)).bytes <= 200u * 1024u;
}

void moe_router_route(const QMatrix& router, const float* h, const float* norm_scale, float eps,
                      int B, int E, int k, float* logits, bf16* x, const MoeRouting& r,
                      cudaStream_t stream) {
  if (!h || !norm_scale || !logits || !x) fail("cuda::moe_router_route: null pointer");
  if (!is_aligned(h, 16) || !is_aligned(norm_scale, 16) || !is_aligned(x, 16))
    fail("cuda::moe_router_route: h, norm_scale and x must be 16-byte aligned");
  if (!r.topk_idx || r.T != B || r.E != E || r.k != k)
    fail("cuda::moe_router_route: routing laid out for T {} E {} k {}, not {} {} {}", r.T, r.E, r.k,
         B, E, k);
  if (!moe_router_route_supported(router, B, E, k))
    fail("cuda::moe_router_route: unsupported router [{}, {}] at {} bits for B {} E {} k {}",
         router.rows, router.cols, router.bits, B, E, k);
  const QGemvRowsRanks rk = q_gemv_rows_ranks(router, B);
  if (router.bits == 4)
    launch_bits<4>(router, h, norm_scale, eps, B, E, k, rk.S, rk.NG, logits, x, r, stream);
  else
    launch_bits<8>(router, h, norm_scale, eps, B, E, k, rk.S, rk.NG, logits, x, r, stream);
}

}  // namespace lilac::cuda
