// The main loop of the kernel lab's q_moe_grouped version 8 (s20; README.md here; run by
// v6_rows32_configs.cu with production's grouped wgmma expert kernels at v6's block configuration,
// QGemmV2Cfg<32, 12, 2>, passes of 32 token rows): the k-tiles two at a time:
// one cp.async wait and one block barrier per pair instead of per k-tile, both tiles' copies
// issued together, 8 wgmmas (n 16 / 32) committed as one group and waited for before the next
// pair (ptxas serialises the wgmmas, C7512, when a pair's group stays in flight across the
// barrier: 87-95 registers, two A register sets). What it tests: whether the
// per-k-tile chain of q_gemm_wgmma's loop (wait, fence, barrier, copies, dequantisation, wgmma,
// wait for the previous group) bounds the short-tile kernels at ~0.78 us per k-tile (s20 run 2,
// rows32 at T = 256).
//
// The pipeline: the 12 stages are 6 pair slots; pair p (k-tiles 2p, 2p + 1) lives in slot p % 6,
// committed as one cp.async group; 5 pairs (10 k-tiles, as v6) are in flight ahead of the one
// computed. Iteration p waits for pair p, passes the barrier, refills slot (p + 5) % 6 = the slot
// of pair p - 1 (its codes read and its wgmma group retired in iteration p - 1, before this
// barrier), dequantises both k-tiles, issues the 8 wgmmas and waits for them. K must be a multiple
// of 128 (an even k-tile count; the real shapes' 2048 and 512 are: q_moe_grouped_*_lab refuse
// others).
#pragma once

#include "cuda/q4_moe_prefill_wgmma.cuh"

namespace lilac::lab::qmoe_lab {

using namespace cuda;

struct PairLoop {
  template <class C>
  static __device__ __forceinline__ void load_pair(const tile::RowSet<C::X_LOADS>& xr,
                                                   const qgemm_wgmma::WSrc& w, uint32_t sX,
                                                   uint32_t sW, int pair, int KT, int K) {
    constexpr int SP = C::STAGES / 2;
    const int s0 = 2 * (pair % SP);
    if (2 * pair < KT) {
      qgemm_wgmma::load_stage<C>(xr, w, sX + uint32_t(s0 * C::X_STAGE),
                                 sW + uint32_t(s0 * C::W_STAGE), 2 * pair, K);
      qgemm_wgmma::load_stage<C>(xr, w, sX + uint32_t((s0 + 1) * C::X_STAGE),
                                 sW + uint32_t((s0 + 1) * C::W_STAGE), 2 * pair + 1, K);
    }
    tile::cp_async_commit();
  }

  template <class C, int N>
  static __device__ __forceinline__ void pair_step(float (&acc)[C::NACC], uint32_t (&a)[2][4][4],
                                                   int pair, int KT, int K, uint32_t sX,
                                                   uint32_t sW, const tile::RowSet<C::X_LOADS>& xr,
                                                   const qgemm_wgmma::WSrc& w) {
    constexpr int SP = C::STAGES / 2, PP = SP - 1;
    tile::cp_async_wait<PP - 1>();  // PP + pair groups committed: pair `pair` landed
    tile::fence_proxy_async_smem();
    __syncthreads();
    load_pair<C>(xr, w, sX, sW, pair + PP, KT, K);
    const int s0 = 2 * (pair % SP);
    qgemm_wgmma::dequant_ktile(sW + uint32_t(s0 * C::W_STAGE), a[0]);
    qgemm_wgmma::dequant_ktile(sW + uint32_t((s0 + 1) * C::W_STAGE), a[1]);
    // Pin the A registers (q4_gemm_wgmma.cuh ktile_step: no dequantisation between the wgmmas).
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[h][kk][i])::"memory");
    tile::wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t db = tile::sw128_desc(sX + uint32_t((s0 + h) * C::X_STAGE));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) qgemm_wgmma::wgmma_rs<N>(acc, a[h][kk], db + uint64_t(2 * kk));
    }
    tile::wgmma_commit();
    tile::wgmma_wait<0>();
    tile::fence_operands(acc);
  }

  template <class C, int N>
  static __device__ __forceinline__ void run(float (&acc)[C::NACC],
                                             const tile::RowSet<C::X_LOADS>& xr,
                                             const qgemm_wgmma::WSrc& w, int K, uint32_t sX,
                                             uint32_t sW) {
    static_assert(C::STAGES % 2 == 0 && C::STAGES >= 4, "pair slots, >= 1 pair in flight ahead");
    const int KT = K / tile::kBK;
    if (KT % 2 != 0) __trap();  // q_moe_grouped_*_lab check K % 128 first
    constexpr int PP = C::STAGES / 2 - 1;
#pragma unroll
    for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
#pragma unroll
    for (int p = 0; p < PP; ++p) load_pair<C>(xr, w, sX, sW, p, KT, K);
    tile::fence_operands(acc);
    uint32_t a[2][4][4];  // the pair's A registers (its group is retired before the next pair)
    for (int p = 0; p < KT / 2; ++p) pair_step<C, N>(acc, a, p, KT, K, sX, sW, xr, w);
    tile::cp_async_wait<0>();
  }
};

}  // namespace lilac::lab::qmoe_lab
