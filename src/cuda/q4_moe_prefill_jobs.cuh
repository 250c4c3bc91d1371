// The grouped 4-bit down kernel's column-block job form (s30; measured in s31): a block takes J
// consecutive column blocks of one routing tile (or shared tile) as one stream of k-tile groups,
// so the block's fixed part (the job lookup, whose dependent loads come before any weight copy,
// the pipeline's fill and drain, the x staging) is paid once per J column blocks and the next
// column block's weights are in flight while this one's last group computes and its outputs are
// stored. Each output is the same chain of wgmmas (k-tiles in order, the same n) as in the
// one-column-block kernel of q4_moe_prefill_wgmma.cuh, so the results are the same bits
// (tests/cuda/conformance/q4_moe.cpp). Why, the prediction and the measurements (down 68.0 ->
// 64.2 us per layer at 256 tokens, H100; the gate_up form and J = 4 lost and were removed):
// docs/kernels.md, "Thirtieth session" and "Thirty-first session". Included by
// q4_moe_prefill_wgmma.cu after q4_moe_prefill_wgmma.cuh.
#pragma once

#include <mutex>

#include "cuda/q4_moe_prefill_wgmma.cuh"

namespace lilac::cuda {
namespace qmoe_wgmma {

using qgemm_wgmma::group_mma;
using qgemm_wgmma::load_stage;
using qgemm_wgmma::load_stage_w;
using qgemm_wgmma::load_stage_x;

template <class C>
__device__ __forceinline__ void zero_acc(float (&acc)[C::NACC]) {
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
  tile::fence_operands(acc);
}

// ---- down (LILAC_ROWS32_DOWN_JOBS)
//
// Why: the rows32 down kernel's blocks are short (K = I = 512: 8 k-tiles, 4 pairs) and each pays a
// fixed part of ~400 instructions per warp (the routing-table reads that the weight copies wait
// on, the x copies, the pipeline's fill and drain, the stores) against ~840 in its main loop; in
// s29's ncu (H100, 256 tokens) 40% of its instructions and of its stall samples fall outside the
// loop. Here a block takes J consecutive column blocks cb = J jb .. J jb + J - 1 of one routing
// tile (or shared tile) as one stream of weight groups: the pass's x (the same act rows for every
// column block) is copied once, into stage kt for k-tile kt (so K / 64 <= STAGES), and the weight
// ring runs on across the column blocks, so the next column block's weights are in flight while
// this one's last groups compute and its results are stored. Each output is the same chain of
// wgmmas as down_kernel's (k-tiles in order, the same n): the same bits.
// Pipeline: group q (flattened: column block q / GPJ, its k-tiles G (q % GPJ) ..) lives in weight
// slot q % SG; PG = SG - 1 groups in flight ahead; x rides in group 0's commit.
template <class C, int G, int N>
__device__ __forceinline__ void down_jobs_pass(const tile::RowSet<C::X_LOADS>& xr, const Job& j,
                                               int cb0, int jobs, int H, uint32_t sX, uint32_t sW,
                                               int p0, int p1) {
  constexpr int SG = C::STAGES / G, PG = SG - 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int TH = H / kQTileRows, Gq = j.W.groups(), KT = j.I / tile::kBK;
  const int GPJ = KT / G, NP = jobs * GPJ;
  // This thread's copy sources for column block cb (down_kernel's, clamped past TH).
  auto w_of = [&](int cb) {
    WSrc w;
    const int ct = 8 * cb + warp, st = 8 * cb + (lane >> 2);
    w.codes_ok = ct < TH;
    w.sb_ok = st < TH;
    w.codes = j.W.codes + size_t(j.e * TH + min(ct, TH - 1)) * size_t(Gq) * kQBlockWords + lane * 4;
    w.sb = j.W.sb + size_t(j.e * TH + min(st, TH - 1)) * size_t(Gq) * kQSbWords + (tid & 3) * 4;
    return w;
  };
  int load_job = 0, load_group = 0;  // the next group to copy: its column block and group in it
  auto load_next = [&](int q) {
    if (q < NP) {
      const WSrc w = w_of(cb0 + load_job);
      const int s0 = G * (q % SG);
#pragma unroll
      for (int h = 0; h < G; ++h)
        load_stage_w<C>(w, sW + uint32_t((s0 + h) * C::W_STAGE), G * load_group + h);
      if (++load_group == GPJ) load_group = 0, ++load_job;
    }
    tile::cp_async_commit();
  };
  for (int kt = 0; kt < KT; ++kt) load_stage_x<C>(xr, sX + uint32_t(kt * C::X_STAGE), kt);
#pragma unroll
  for (int q = 0; q < PG; ++q) load_next(q);

  float acc[C::NACC];
  zero_acc<C>(acc);
  uint32_t a[G][4][4];
  const int s_lane = p0 + 2 * (lane & 3);
  int job = 0, kt0 = 0;  // the group computed: its column block and first k-tile
  for (int q = 0; q < NP; ++q) {
    tile::cp_async_wait<PG - 1>();  // PG + q groups committed: group q (and x) landed
    tile::fence_proxy_async_smem();
    __syncthreads();
    load_next(q + PG);  // into group q - 1's slot: read before the barrier above
    group_mma<C, G, G, N>(acc, a, sX, sW, G * (q % SG), kt0);
    kt0 += G;
    if (kt0 == KT) {
      // Column block cb0 + job done: acc[4 jj + q] is y column 128 cb + 16 warp + g + 8 (q >> 1),
      // token 8 jj + 2 t + (q & 1) (down_kernel's store; tokens past N are past p1).
      const int c0 = C::BR * (cb0 + job) + 16 * warp + (lane >> 2);
#pragma unroll
      for (int jj = 0; jj < N / 8; ++jj)
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
          const int c = c0 + 8 * (qq >> 1), s = s_lane + 8 * jj + (qq & 1);
          if (s < p1 && c < H) store_y(j, size_t(s) * size_t(H) + c, acc[4 * jj + qq]);
        }
      zero_acc<C>(acc);
      kt0 = 0;
      ++job;
    }
  }
  tile::cp_async_wait<0>();
}

// Block b: job block jb = b % n_jb of tile b / n_jb (job_of with n_jb for n_cb): column blocks
// J jb .. min(J jb + J, n_cb) - 1. The host (launch_down_jobs) guarantees K / 64 <= STAGES and a
// multiple of G for the routed and the shared part.
template <class C, int G, int J>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    down_jobs_kernel(const bf16* __restrict__ act, int I, QMatrix W, int H, Routed rt,
                     float* __restrict__ y, Shared sh) {
  pdl_launch_dependents();  // PDL (launch.h): the routing tables and act after the wait
  pdl_wait();
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_cb = (H + C::BR - 1) / C::BR, n_jb = (n_cb + J - 1) / J;
  Job j;
  if (!job_of<C>(int(blockIdx.x), rt, sh, W, I, n_jb, n_jb, act, y, j)) return;
  const int cb0 = J * j.cb, jobs = min(J, n_cb - cb0);
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  for (int pass = 0; pass < passes<C>(j.row0, j.row_end); ++pass) {
    const int p0 = j.row0 + pass * C::BT, p1 = min(p0 + C::BT, j.row_end);
    // Every warp is past the previous pass's reads of the stages before they are refilled.
    if (pass > 0) __syncthreads();
    const tile::RowSet<C::X_LOADS> xr = token_rows<C>(j.in, j.I, nullptr, p0, p1);
    if constexpr (C::BT > 16) {
      if (p1 - p0 <= 16) {
        down_jobs_pass<C, G, 16>(xr, j, cb0, jobs, H, sX, sW, p0, p1);
        continue;
      }
    }
    down_jobs_pass<C, G, C::BT>(xr, j, cb0, jobs, H, sX, sW, p0, p1);
  }
#else
  (void)act, (void)I, (void)W, (void)H, (void)rt, (void)y, (void)sh;
  __trap();
#endif
}

// Whether down_jobs_kernel<C, G> takes a down of K = I (and Is, with a shared part): every
// k-tile's x in its own stage, whole groups per column block.
template <class C, int G>
bool down_jobs_fit(int I, int Is) {
  auto fits = [](int K) { return K / 64 <= C::STAGES && (K / 64) % G == 0; };
  return fits(I) && (Is <= 0 || fits(Is));
}

// launch_down's contract with J column blocks per block (down_jobs_kernel); the caller checks
// down_jobs_fit first.
template <class C, int G, int J>
void launch_down_jobs(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r,
                      float* y, const QMoeSharedPart* shared, cudaStream_t stream,
                      bool y_bf16 = false) {
  const char* what = "q_moe_grouped_down (wgmma, column-block jobs)";
  check(what, &r, down, H, I, H, I, act, y);
  const Shared sh = shared_of(what, shared, false, r.T, H);
  if (!down_jobs_fit<C, G>(I, sh.T > 0 ? sh.I : 0))
    fail("{}: I {} / Is {} needs more than {} stages or a part group", what, I, sh.I, C::STAGES);
  auto kernel = down_jobs_kernel<C, G, J>;
  static std::once_flag once;
  prepare<C>(kernel, once);
  const int64_t n_cb = (H + C::BR - 1) / C::BR, n_jb = (n_cb + J - 1) / J;
  const int64_t blocks = (int64_t(r.max_tiles) + ceil_div(sh.T, C::BT)) * n_jb;
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
  launch_kernel(pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(C::THREADS), C::SMEM_BYTES,
                stream, act, I, down, H, routed_of(r, y_bf16), y, sh);
}

}  // namespace qmoe_wgmma
}  // namespace lilac::cuda
