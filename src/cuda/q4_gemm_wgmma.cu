// q_gemm's 4-bit path on Hopper (the kernel lab's q_gemm version 3, production since s7; its main
// loop is version 2's, production in s6: in_proj at 4096 tokens 593 -> 354 us, 349 -> 585 TFLOP/s,
// faster than the BF16 wgmma GEMM's 377 us; bench/lab/q_gemm/README.md): the 4-bit prefill GEMM
// on wgmma, the weights dequantised in
// registers as wgmma's A operand (register-sourced "RS" form), the tokens as its n dimension from
// shared memory. C^T = W . A^T as in q4_gemm.cu, so the tiled layout's lane order (q4_layout.h:
// word kb of lane l = the m16n8k16 A fragment of rows g, g + 8 x columns [16 kb, 16 kb + 16)) is
// already the register layout wgmma's A wants: warp w of a warpgroup supplies rows [16 w, 16 w +
// 16) of the 64-row A tile in exactly the m16n8k16 fragment order (a0: row g, k 2t..2t+1; a1: row g
// + 8; a2: row g, k + 8; a3: row g + 8, k + 8). No weight ever goes to shared memory as bf16.
//
// Block: 256 threads = 2 warpgroups, 128 weight rows (8 row tiles of 16: warp w owns tile w) x
// BT tokens (256, or 128 for small M); warpgroup wg computes rows [64 wg, 64 wg + 64) x all BT
// tokens with wgmma.m64nBTk16 (BT / 2 f32 accumulators per thread). Per 64-deep k-tile (= one
// quantization group), one STAGES-deep cp.async pipeline stage holds:
//   X  [BT tokens][64] bf16, 128-byte swizzled (gemm_tile.cuh's layout; the wgmma B descriptor is
//      the BF16 kernel's W descriptor: sw128_desc, +2 per k16)      BT * 128 B (32 KB at 256)
//   codes of the 8 row tiles, [tile][lane][4 words] as in global     8 * 512 B = 4 KB
//   scale/bias of the 8 row tiles, [tile][16 slots]                  8 * 64 B = 512 B
// 36.5 KB per stage at BT = 256; 6 stages = 219 KB (1 block per SM, ~200 registers).
// Per k-tile every thread issues BT / 32 + 1 (+1 for threads < 32) 16-byte cp.async; each warp
// reads its tile's 16 bytes of codes per lane (ld.shared.v4, a contiguous 512 B per warp) and its
// rows' (scale, bias) pair (8 bytes, broadcast over the quad), dequantises the 4 k16 fragments
// (16 registers: per code word 3 SHF + 4 LOP3 + 8 HFMA2, q4_tile.cuh's exact two-FMA form, or
// since s50 one HFMA2 per pair where the matrix's scales allow: q4_gemm_wgmma.cuh dequant_ktile;
// either way w = RNE_bf16(s q + b) as q_gemm and its twin dequantize_row_bf16), then issues 4 wgmma
// (one commit group). The A registers are double-buffered (the loop is unrolled by two k-tiles):
// k-tile kt + 1 is dequantised while group kt runs; wgmma_wait<1> retires group kt - 1.
// Synchronisation is the BF16 wgmma main loop's (gemm_tile.cuh wgmma_mainloop): per k-tile wait
// for its copies, fence.proxy.async, one __syncthreads (which also proves both warpgroups retired
// the group that read the stage refilled next), refill PREFETCH = STAGES - 2 tiles ahead.
//
// Per k-tile at BT = 256 (2 M N K per block = 128 x 256 x 64 MACs = 1024 tensor clocks at the
// H200's 2048 bf16 MAC/clk/SM): L2 -> smem 36.5 KB (BF16 wgmma kernel: 48 KB); smem traffic
// ~105 KB (wgmma reads X once per warpgroup: 64 KB; BF16 kernel: ~128 KB); ALU ~75 instructions
// per thread, 2 warps per scheduler: ~150 issue slots of 1024.
// Tails: token rows past M are zero-filled by cp.async and not stored; row tiles past the matrix
// are zero-filled (codes and scale/bias 0: w = 0) and not stored; rows past N inside the last
// tile are the layout's zero padding.
//
// Version 3 (split-K and the epilogue; v2 was 24-40% of 790 TFLOP/s on the 2048-row projections
// out_proj / o_proj, N = 2048, K = 4096, y += at 512 .. 4096 tokens):
//  1. Split-K over a thread-block cluster: the S blocks (S = 1, 2 or 4; cluster dims (S, 1, 1),
//     consecutive blockIdx.x) of one output tile each run k-tiles [r KT / S, (r + 1) KT / S) of
//     the tile (rank r). M = 512 out_proj: 4 x 16 tiles of 128 tokens -> 128 blocks at S = 2
//     (v2: 64 blocks on 132 SMs). The launcher picks (BT, S) by estimated time (pick below):
//     out_proj M = 512 -> (256, 4) (or (128, 2) if 32 clusters of 4 do not fit), M = 1000 ->
//     (256, 2), M = 4096 -> (256, 1); in_proj / qkv -> S = 1, or since s36 whole tiles first and
//     the last part-empty wave split (in_proj at 512 tokens: 132 whole + 62 in pairs).
//  2. The epilogue through shared memory: each block writes its 128 x BT f32 partial tile into its
//     own (now idle) pipeline memory, token-major [BT][132] (132 floats per token: the 8 lanes of
//     a fragment row g and 4 of t hit 32 distinct banks), then (cluster barrier) rank r sums
//     tokens [r BT / S, (r + 1) BT / S) of the tile over ranks 0 .. S - 1 in rank order (f32,
//     deterministic, no atomics), reading the other ranks' tiles through distributed shared
//     memory, and writes C once: a warp per token, 16 bytes per lane (a token's 128 rows = 512
//     contiguous bytes), for y += the residual's 16-byte loads of up to 8 tokens issued before
//     any of their stores. (v2's epilogue stored from registers, 32-byte segments, and each `+=`
//     was a load the next store waited on.) When N % 4 != 0 or C is not 16-byte aligned the
//     same pass stores element by element.
// y += adds the reduced sum into y once: y = y + ((p_0 + p_1) + ...).
// Lab (s6 run 6, H200): out_proj (+=) M = 4096 217.4 -> 130.1 us, M = 512 44.9 -> 20.9 us, M = 1000
// 45.1 -> 31.9 us; o_proj M = 4096 119.1 us; in_proj as v2 (353.0 / 59.9 / 91.1 us).
// Shared memory: the pipeline (BT = 256: 6 stages, 219 KB + 1 KB; BT = 128: 8 stages, 168 KB +
// 1 KB) reused for the staged tile (BT x 132 x 4 = 132 KB / 66 KB).
// The staged epilogue lives in q4_gemm_wgmma_store.cuh, the stream-K form (s35, off by default) in
// q4_gemm_wgmma_streamk.cu.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/cluster.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_gemm_wgmma_store.cuh"
#include "cuda/q4_tile.cuh"
#include "cuda/vec_util.cuh"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {

// A named namespace, not an anonymous one: in the compute_80 pass (LILAC_CUDA_PTX) the kernel
// body is empty and nvcc would warn about every unused internal function and member.
namespace qgemm_wgmma {

// NW: the wgmma n, the tokens the main loop computes (C::BT; 64 for the narrow form at M <= 64,
// whose accumulators past token 64 stay 0 and are not stored).
// whole (s36; a multiple of S, 0 with S = 1): blocks [0, whole) each compute tile blockIdx.x alone
// over all of K, as the S = 1 kernel does (a cluster of them: S independent tiles), and the blocks
// after them split tiles whole, whole + 1, ... S ways. The launcher fills the full waves with whole
// tiles and splits only the last, part-empty wave's tiles (pick below).
template <class C, int S, GemmOut MODE, int NW = C::BT>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    q_gemm_wgmma_kernel(const bf16* __restrict__ A, int M, int K, QMatrix W, void* __restrict__ out,
                        int tiles_m, int tiles_n, bool vec, int whole) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int b = int(blockIdx.x);
  const bool alone = S == 1 || b < whole;  // a cluster is all alone or all split (whole % S == 0)
  const int rank = alone ? 0 : int(cluster::ctarank());  // == blockIdx.x % S
  int tm, tn;
  raster(alone ? b : whole + (b - whole) / S, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * C::BT, t0 = tn * (C::BR / kQTileRows);  // first token, first row tile
  // This rank's K range: groups [g0, g0 + KT) (the launcher checks (K / 64) % S == 0).
  const int KT = K / tile::kBK / (alone ? 1 : S), g0 = rank * KT, Kl = KT * tile::kBK;
  tile::RowSet<C::X_LOADS> xr;
  WSrc w;
  tile_sources<C>(A, M, K, W, m0, t0, g0, xr, w);

  // The main loop (q4_gemm_wgmma.cuh) over this rank's KT k-tiles.
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  float acc[C::NACC];
  // The small-M forms (wgmma n <= 64: the tensor work per k-tile is small, the per k-tile
  // bookkeeping is not; s22 ncu, in_proj at 16 rows: ~132 instructions per warp and k-tile, 60
  // of them the dequantisation) pay the barrier and the wgmma wait once per pair of k-tiles.
  // The small-M forms run under PDL (q4_gemm_pdl below): the prologue's weight copies are issued
  // before the wait, and the next kernel may start scheduling once the main loop is done.
  if constexpr (C::BT <= 64) {
    GroupLoop<2>::run<C, NW, true>(acc, xr, w, Kl, sX, sW);
    pdl_launch_dependents();
  } else {
    mainloop<C, NW>(acc, xr, w, Kl, sX, sW);
  }
  __syncthreads();  // both warpgroups' wgmmas retired, every copy landed: the stages are free

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  stage_tile<C>(acc, smem, sX, warp, lane);
  // (A cluster of whole tiles reads no other block's memory: its blocks synchronise alone.)
  if (S > 1 && !alone)
    cluster::sync();  // every rank's tile staged and visible to the cluster
  else
    __syncthreads();
  if (alone)
    store_tile<C, 1, MODE>(0, m0, t0, M, W, out, vec, sX, warp, lane);
  else
    store_tile<C, S, MODE>(rank, m0, t0, M, W, out, vec, sX, warp, lane);
  if (S > 1 && !alone) cluster::sync();  // no block leaves while another still reads its tile
#else
  // Not built for this target (the host launches it only on compute capability 9.x).
  (void)A, (void)M, (void)K, (void)W, (void)out, (void)tiles_m, (void)tiles_n, (void)whole;
  __trap();
#endif
}

// One block per SM for small-M launches (s45 default; LILAC_Q4_SMALL_SPREAD=off is the A/B arm): a
// launch without clusters whose blocks are no more than the SMs asks for more than half an SM's
// shared memory per block, so that each block gets an SM of its own even when it becomes resident
// under PDL while the kernel before still holds some SMs (which would otherwise let up to three of
// these blocks stack on the SMs free at that moment: docs/kernels.md, "Forty-fourth session", item
// 6, and "Forty-fifth session"). The extra shared memory is not used. Measured with the per-SM
// split pick (s45 runs 1-2, H100, 4-bit, bf16 state, against block cost and no spread): c = 2 / 4
// / 8 / 16 / 32 +5.2 / +3.1 / +1.4 / +0.8 / +1.3%, c = 1 and 64 unchanged; in_proj at 16 rows
// 10.9 -> 9.5 us exposed per call. PDL off instead (the other way to place them) lost 1%.
constexpr int kSpreadSmemBytes = 116 * 1024;  // 2 x (116 + 1) KB > 228 KB per SM
bool small_spread() {
  static const bool on =
      env_enum<bool>("LILAC_Q4_SMALL_SPREAD", true, {{"on", true}, {"off", false}});
  return on;
}
template <class C>
constexpr int spread_smem_bytes() {
  return C::SMEM_BYTES > kSpreadSmemBytes ? C::SMEM_BYTES : kSpreadSmemBytes;
}

template <class C, int S, GemmOut MODE, int NW = C::BT>
void set_smem() {
  static std::once_flag once;
  std::call_once(once, [] {
    const bool spread = S == 1 && C::BT <= 64 && small_spread();
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(q_gemm_wgmma_kernel<C, S, MODE, NW>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          spread ? spread_smem_bytes<C>() : C::SMEM_BYTES));
  });
}

// A launch of `blocks` blocks of config C in clusters of S along x (no cluster attribute at S = 1);
// `attr` holds the attribute cfg points to.
template <class C>
cudaLaunchConfig_t cluster_config(int S, int64_t blocks, cudaStream_t stream,
                                  cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(C::THREADS);
  cfg.dynamicSmemBytes = C::SMEM_BYTES;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(S);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = S > 1 ? 1u : 0u;
  return cfg;
}

// Programmatic dependent launch for the small-M forms (the batched decode step's projections,
// ~80 launches per step): their blocks may become resident while the previous kernel finishes and
// start their weight copies before griddepcontrol.wait (GroupLoop's PDL_WAIT prologue). On with
// the process-wide PDL setting (launch.h); LILAC_Q4_GEMM_PDL=off launches them as before (A/B).
// The wide forms (prefill: one launch per tens of microseconds) do not wait and never use it:
// s39 measured them under PDL slower at 256 tokens (-0.7 to -1.2% with the weights' copies, an
// L2 prefetch of them, or nothing before the wait; H100, docs/kernels.md).
bool q4_gemm_pdl() {
  static const bool on = env_enum<bool>("LILAC_Q4_GEMM_PDL", true, {{"on", true}, {"off", false}});
  return on;
}

// whole: the tiles computed alone before the split ones (the kernel's parameter; a multiple of S).
template <class C, int S, GemmOut MODE, int NW>
void launch(const bf16* A, int M, const QMatrix& W, void* out, bool vec, int whole,
            cudaStream_t stream) {
  set_smem<C, S, MODE, NW>();
  const int tiles_m = ceil_div(M, C::BT), tiles_n = ceil_div(W.rows, C::BR);
  const int64_t tiles = int64_t(tiles_m) * tiles_n;
  if (S == 1) whole = 0;
  if (whole < 0 || whole % S != 0 || whole > tiles)
    fail("q_gemm_wgmma: {} whole tiles of {} at splits {}", whole, tiles, S);
  const int64_t blocks = whole + (tiles - whole) * S;
  if (blocks > 0x7fffffff) fail("q_gemm_wgmma: {} x {} needs {} blocks", M, W.rows, blocks);
  const dim3 cluster(unsigned(S), 1, 1);
  const bool spread = S == 1 && C::BT <= 64 && small_spread() && blocks <= sm_count();
  const size_t smem = size_t(spread ? spread_smem_bytes<C>() : C::SMEM_BYTES);
  launch_with(S > 1 ? &cluster : nullptr, C::BT <= 64 && q4_gemm_pdl(),
              q_gemm_wgmma_kernel<C, S, MODE, NW>, dim3(unsigned(blocks)), dim3(C::THREADS), smem,
              stream, A, M, W.cols, W, out, tiles_m, tiles_n, vec, whole);
}

template <class C, int S, int NW>
void dispatch_mode(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                   int whole, cudaStream_t s) {
  switch (mode) {
    case GemmOut::StoreF32:
      return launch<C, S, GemmOut::StoreF32, NW>(A, M, W, out, vec, whole, s);
    case GemmOut::StoreBF16:
      return launch<C, S, GemmOut::StoreBF16, NW>(A, M, W, out, vec, whole, s);
    case GemmOut::AccumulateF32:
      return launch<C, S, GemmOut::AccumulateF32, NW>(A, M, W, out, vec, whole, s);
  }
}

template <class C, int NW = C::BT>
void dispatch_splits(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                     int S, cudaStream_t s, int whole = 0) {
  switch (S) {
    case 1:
      return dispatch_mode<C, 1, NW>(A, M, W, out, mode, vec, 0, s);
    case 2:
      return dispatch_mode<C, 2, NW>(A, M, W, out, mode, vec, whole, s);
    case 4:
      return dispatch_mode<C, 4, NW>(A, M, W, out, mode, vec, whole, s);
    case 8:
      // Only the small-M forms: their blocks (2-3 per SM) make clusters of 8 that fit a GPC (s36:
      // of Cfg256's one-per-SM blocks, too few clusters of 8 fit an H100 for out_proj's 16 tiles
      // at 256 tokens to run in one wave).
      if constexpr (C::BT <= 64) return dispatch_mode<C, 8, NW>(A, M, W, out, mode, vec, whole, s);
      [[fallthrough]];
    default:
      fail("q_gemm_wgmma: splits {} (1, 2 or 4; 8 with 16-64 tokens per block)", S);
  }
}

// The small-M forms (M <= 64). bt 64: s18's 64-token stages, the wgmma n the tokens rounded up to
// 16, 32 or 64; bt 16 / 32: stages of exactly that many tokens (M <= bt).
void dispatch_small(const bf16* A, int M, const QMatrix& W, void* out, GemmOut mode, bool vec,
                    int bt, int S, cudaStream_t s) {
  if (bt == 16) return dispatch_splits<Cfg16>(A, M, W, out, mode, vec, S, s);
  if (bt == 32) return dispatch_splits<Cfg32>(A, M, W, out, mode, vec, S, s);
  if (M <= 16) return dispatch_splits<Cfg64, 16>(A, M, W, out, mode, vec, S, s);
  if (M <= 32) return dispatch_splits<Cfg64, 32>(A, M, W, out, mode, vec, S, s);
  return dispatch_splits<Cfg64, 64>(A, M, W, out, mode, vec, S, s);
}

// Clusters of S blocks resident at once (Cfg256 / Cfg128: one block per SM, ~200 KB / 256 threads
// x 216 registers; Cfg64: two). S = 1: the occupancy query's blocks per SM x the SM count; else the
// runtime's answer (the GPCs decide: a cluster's blocks share one), 0 if it has none.
template <class C, int S>
int max_clusters() {
  static const int n = [] {
    set_smem<C, S, GemmOut::StoreF32>();
    int c = 0;
    if (S == 1) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &c, q_gemm_wgmma_kernel<C, S, GemmOut::StoreF32>, C::THREADS, C::SMEM_BYTES) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        c = 0;
      }
      return c * sm_count();
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config<C>(S, int64_t(S) * 64, nullptr, attr);
    if (cudaOccupancyMaxActiveClusters(&c, q_gemm_wgmma_kernel<C, S, GemmOut::StoreF32>, &cfg) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // clear it: treated as "cannot run"
      c = 0;
    }
    return c;
  }();
  return n;
}

// max_clusters at a runtime split (1, 2, 4; 8 for the small-M forms only), 0 for any other.
template <class C>
int max_clusters_at(int S) {
  switch (S) {
    case 1:
      return max_clusters<C, 1>();
    case 2:
      return max_clusters<C, 2>();
    case 4:
      return max_clusters<C, 4>();
    case 8:
      if constexpr (C::BT <= 64) return max_clusters<C, 8>();
      return 0;
    default:
      return 0;
  }
}

// Blocks per SM of a small-M form's un-clustered launch of at most one block per SM, at the shared
// memory that launch asks for (the spread's when small_spread(); 0 when none fits).
template <class C>
int spread_blocks_per_sm() {
  set_smem<C, 1, GemmOut::StoreF32>();
  const int smem = small_spread() ? spread_smem_bytes<C>() : C::SMEM_BYTES;
  int c = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &c, q_gemm_wgmma_kernel<C, 1, GemmOut::StoreF32>, C::THREADS, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    c = 0;
  }
  return c;
}

int max_clusters_of(int bt, int S) {
  switch (bt) {
    case 16:
      return max_clusters_at<Cfg16>(S);
    case 32:
      return max_clusters_at<Cfg32>(S);
    case 64:
      return max_clusters_at<Cfg64>(S);
    case 128:
      return max_clusters_at<Cfg128>(S);
    case 256:
      return max_clusters_at<Cfg256>(S);
    default:
      return 0;
  }
}

// (BT, S) of the least estimated time, in 0.1 us: waves x (k-tiles per block x the cost of one +
// a fixed 3 us for the prologue and the epilogue, 4 us with a cluster reduction). A k-tile taken
// as 0.9 us at 256 tokens and 0.6 us at 128: the lab's v2 per-block rates (in_proj at M = 4096:
// 1552 blocks of 256 tokens, 12 waves of 32 k-tiles in 354 us, 0.92 us each with the C stores; at M
// = 512: 388 blocks of 128, 3 waves in 62.6 us, 0.65 us). Candidates in order of preference on a
// tie (smaller clusters first). M <= 64: the small-M form (64-token blocks, 2 per SM) at S = 1, 2,
// 4 or 8, a k-tile taken as 0.5 us (s17 ncu: the 128-token narrow form's in_proj at 64 rows, 16.6
// us for 32 k-tiles) and the fixed part as 3 us + 1 us per doubling of the cluster (the reduce
// reads S partial tiles). M <= 16 / <= 32 take the narrow-stage forms (16 / 32-token blocks, 3 per
// SM) with the same estimate; LILAC_Q4_SMALL_TOKENS=64 keeps them on the 64-token form (A/B).
// The narrow forms' k-tile cost is per SM (s45 default; LILAC_Q4_SMALL_COST=block, the A/B arm,
// counts it per block): blocks that share an SM share its issue and loads, so the cost is times
// the blocks on the fullest SM of a wave. It picks S = 1 instead of 2 for in_proj at 1-32 rows and
// leaves every other pick. Alone (s44 run 8) it lost in the engine (c = 16 -3.8%: in_proj 20 us
// exposed per call against 10.9, though faster alone in the lab from DRAM, 16 rows: 11.18 against
// 11.40 us): its 1-block-per-tile launches stacked on the SMs PDL left free. With the spread
// placement (small_spread) it wins: see there.
bool narrow_stages() {
  static const bool on = env_choice("LILAC_Q4_SMALL_TOKENS", {64}) != 64;
  return on;
}
bool cost_per_sm() {
  static const bool on =
      env_enum<bool>("LILAC_Q4_SMALL_COST", true, {{"sm", true}, {"block", false}});
  return on;
}

void pick(int M, int N, int KT, bool streamk_ok, int& bt, int& S, int& whole) {
  whole = 0;
  int64_t best = INT64_MAX;
  const int64_t row_blocks = ceil_div(N, 128);
  if (M <= 64) {
    bt = M <= 16 && narrow_stages() ? 16 : M <= 32 && narrow_stages() ? 32 : 64;
    S = 1;
    for (int s = 1, lg = 0; s <= 8; s *= 2, ++lg) {
      if (KT % s != 0) continue;
      const int64_t maxc = max_clusters_of(bt, s);
      if (maxc <= 0) continue;
      // Blocks on the fullest SM in the fullest wave (1 under LILAC_Q4_SMALL_COST=block).
      const int64_t share = bt < 64 && cost_per_sm()
                                ? ceil_div(std::min(row_blocks, maxc) * s, int64_t(sm_count()))
                                : 1;
      const int64_t cost =
          ceil_div(row_blocks, maxc) * (int64_t(KT / s) * 5 * share + 30 + 10 * lg);
      if (cost < best) {
        best = cost;
        S = s;
      }
    }
    return;
  }
  constexpr int kCand[][2] = {{256, 1}, {128, 1}, {256, 2}, {128, 2}, {256, 4}, {128, 4}};
  bt = 256;
  S = 1;
  for (const auto& c : kCand) {
    const int b = c[0], s = c[1];
    if (KT % s != 0) continue;
    const int64_t maxc = max_clusters_of(b, s);
    if (maxc <= 0) continue;
    const int64_t tiles = int64_t(ceil_div(M, b)) * row_blocks;
    const int64_t waves = ceil_div(tiles, maxc);
    const int64_t ktile = b == 256 ? 9 : 6, fixed = s > 1 ? 40 : 30;
    const int64_t cost = waves * (int64_t(KT / s) * ktile + fixed);
    if (cost < best) {
      best = cost;
      bt = b;
      S = s;
      whole = 0;
    }
    // s36: the full waves' tiles whole and only the last, part-empty wave's split s ways (one
    // launch, the kernel's `whole`), when that wave's split tiles fit the GPU at once: in_proj at
    // 512 tokens, 194 tiles, = 132 whole + 62 split 2 ways (124 blocks): 32 + 16 k-tiles per SM
    // instead of 32 + 32 (the plain split: 3 waves of 16); qkv there, 144 tiles, = a wave of
    // whole tiles (as many as the clusters of 4 that fit the GPCs hold) + the rest split 4 ways.
    if (s > 1) {
      const int64_t per_wave = maxc * s, full = tiles / per_wave, rest = tiles - full * per_wave;
      const int64_t hybrid = full * (int64_t(KT) * ktile + 30) + int64_t(KT / s) * ktile + fixed;
      if (full >= 1 && rest > 0 && rest * s <= per_wave && hybrid < best) {
        best = hybrid;
        bt = b;
        S = s;
        whole = int(full * per_wave);
      }
    }
  }
  // The stream-K form (S = -1; only with LILAC_Q4_GEMM_STREAMK=auto): every block ~U / P k-tiles
  // in ~U / P / KT + 1 segments (1.5 us of prologue and staging each), a partial tile written per
  // contributor and read by its owner (~1 us per 128 KB tile); taken when its estimate beats the
  // best by 10%: in_proj / qkv at 256 and 512 tokens (predicted 27.1 / 21.8 and 48.3 / 36.5 us
  // against 31.8 and 63.6), not out_proj at 256 (KT 64 over 16 tiles: ~10 segments per tile)
  // nor 1,024 and above (waves of 2.9 and 11.8). Measured (s35 runs 2-3, H100, the chunks'
  // timelines): 36.8 us per call at 256 tokens against the one-block form's 30.5, 59.1 at 512
  // against 54.5; prefill -2.1% / -1.0% at 256 / 512, even at 1,024; where the ~12-15 us per
  // call go is not yet profiled (docs/kernels.md, s35).
  if (!streamk_ok || !q_gemm_streamk_auto()) return;
  const int64_t P = streamk_blocks();
  const int64_t U = int64_t(ceil_div(M, 256)) * row_blocks * KT;
  if (P < 1 || U < P) return;
  const int64_t per = U / P, L = ceil_div(U, P), segs = L / KT + 2;
  const int64_t contributors = ceil_div(int64_t(KT), per);
  const int64_t cost = L * 9 + 15 * segs + 10 * contributors + 5;
  if (10 * cost < 9 * best) {
    bt = 256;
    S = -1;
  }
}

}  // namespace qgemm_wgmma

bool q_gemm_wgmma_available() {
  return device_compute_capability() / 10 == 9;
}

int q_gemm_wgmma_max_clusters(int tokens_per_block, int splits) {
  return qgemm_wgmma::max_clusters_of(tokens_per_block, splits);
}

bool q_gemm_wgmma_small_spread() {
  return qgemm_wgmma::small_spread();
}

int q_gemm_wgmma_small_blocks_per_sm(int tokens_per_block) {
  using namespace qgemm_wgmma;
  switch (tokens_per_block) {
    case 16:
      return spread_blocks_per_sm<Cfg16>();
    case 32:
      return spread_blocks_per_sm<Cfg32>();
    case 64:
      return spread_blocks_per_sm<Cfg64>();
    default:
      return 0;
  }
}

void q_gemm_wgmma(const bf16* A, int M, const QMatrix& W, void* C, GemmOut mode,
                  cudaStream_t stream, int tokens_per_block, int splits,
                  const QGemmScratch& scratch, int whole_tiles) {
  if (!A || !C || !W || !W.sb) fail("q_gemm_wgmma: null pointer");
  if (M < 1 || W.rows < 1 || W.cols < kQGroup || W.cols % kQGroup != 0 || W.bits != 4)
    fail(
        "q_gemm_wgmma: unsupported M {} W [{}, {}] at {} bits (4-bit, K a positive multiple of 64)",
        M, W.rows, W.cols, W.bits);
  if (reinterpret_cast<uintptr_t>(A) % 16 != 0) fail("q_gemm_wgmma: A must be 16-byte aligned");
  // The 16-byte epilogue needs whole groups of 4 rows and an aligned C; else element stores.
  const bool vec = W.rows % 4 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0;
  const int KT = W.cols / kQGroup;
  int bt = tokens_per_block, S = splits, whole = whole_tiles;
  if (whole_tiles != 0 &&
      (splits < 2 || (bt != 256 && bt != 128) || whole_tiles < 0 || whole_tiles % splits != 0 ||
       int64_t(whole_tiles) > int64_t(ceil_div(M, bt)) * ceil_div(W.rows, 128)))
    fail(
        "q_gemm_wgmma: {} whole tiles (a multiple of splits {} >= 2, at most the tiles of 256 or "
        "128 tokens per block, {} here)",
        whole_tiles, splits, bt);
  const bool streamk_ok = scratch.ptr != nullptr && M > 64;
  if (bt == 0 && S == 0) {
    qgemm_wgmma::pick(M, W.rows, KT, streamk_ok, bt, S, whole);
  } else {
    if (bt == 0) bt = 256;
    if (S == 0) S = 1;
  }
  if (S == -1) {
    if (bt != 256) fail("q_gemm_wgmma: the stream-K form (splits -1) has 256-token tiles");
    return qgemm_wgmma::dispatch_streamk(A, M, W, C, mode, vec, scratch, stream);
  }
  if (S < 1 || KT % S != 0) fail("q_gemm_wgmma: {} k-tiles do not split {} ways", KT, S);
  // The prefill forms in dequant_ktile's one-FMA form where the scales allow (OneFma). The
  // small-M forms below keep the two-FMA one (s50, H100: one FMA there gave the batched step at
  // c = 16 / 64 only +0.5%; not yet worth doubling their instantiations).
  using qgemm_wgmma::Cfg128, qgemm_wgmma::Cfg256, qgemm_wgmma::OneFma;
  const bool one = W.small_scales;
  if (bt == 256 && one)
    qgemm_wgmma::dispatch_splits<OneFma<Cfg256>>(A, M, W, C, mode, vec, S, stream, whole);
  else if (bt == 256)
    qgemm_wgmma::dispatch_splits<Cfg256>(A, M, W, C, mode, vec, S, stream, whole);
  else if (bt == 128 && M <= 64)  // s7's narrow form: wgmma n = 64 (kept for the lab's A/B)
    qgemm_wgmma::dispatch_splits<Cfg128, 64>(A, M, W, C, mode, vec, S, stream);
  else if (bt == 128 && one)
    qgemm_wgmma::dispatch_splits<OneFma<Cfg128>>(A, M, W, C, mode, vec, S, stream, whole);
  else if (bt == 128)
    qgemm_wgmma::dispatch_splits<Cfg128>(A, M, W, C, mode, vec, S, stream, whole);
  else if ((bt == 64 && M <= 64) || (bt == 32 && M <= 32) || (bt == 16 && M <= 16))
    qgemm_wgmma::dispatch_small(A, M, W, C, mode, vec, bt, S, stream);
  else
    fail("q_gemm_wgmma: tokens_per_block {} (256, 128; 64 / 32 / 16 up to that many tokens; or 0)",
         bt);
}

}  // namespace lilac::cuda
