// The kernel lab's q_moe_grouped versions 15-18 (s40; README.md here): the rows32 grouped 4-bit
// gate_up with one producer warp per block, device code and launcher (v15_ws.cu instantiates it).
// Measured 2x slower than production's (docs/kernels.md, s40); 939c972 had it in src/cuda behind
// LILAC_ROWS32_GATE_UP_WS with a same-bits test against production's kernel (passed on an H100).
// Production's short-tile gate_up (q4_moe_prefill_wgmma.cuh, rows32: QGemmV2Cfg<32, 12, 2>,
// GroupLoop<4>) is issue-bound at 256 tokens (s21, s29, s30: ~105 instructions per warp and k-tile,
// 67 of them the dequantisation at its floor, ~38 of bookkeeping: each thread's cp.async copies and
// their 64-bit addresses and predicates, the cp.async wait, the proxy fence and the block barrier
// per group of four k-tiles). Here the eight consumer warps (two warpgroups: gate, up) only wait,
// dequantise and multiply; a ninth warp copies every stage: the eight row tiles' 512-byte code
// blocks and 64-byte scale/bias blocks by the bulk copy engine (16 lanes, one `cp.async.bulk` each,
// counted as bytes on the stage's `full` barrier), the pass's token rows by cp.async into the
// 128-byte swizzle (lane l: token row l, eight 16-byte chunks; rows past the pass are not copied at
// all: they only feed accumulator columns that are never stored), each lane's copies counted by
// `cp.async.mbarrier.arrive.noinc`. A consumer warp waits on a stage's `full` barrier, and releases
// the stage (its `empty` barrier, one arrival per warp) once the wgmma group that read it retired;
// no block barrier is left in the main loop. KG k-tiles per wgmma group and wait (1: v15; 2: v16,
// v17, v18; v18 copies the weights by the producer's cp.async instead of bulk copies); with a group
// left in flight across the next stage's wait (KtileLoop's wgmma_wait<1>) ptxas serialises the
// wgmmas (C7512) at this block's register budget. Same arithmetic and summation order as
// production's (one wgmma chain over the k-tiles in order), so the same act bits. Prediction (H200,
// T = 256): ~85-90 instead of ~105 instructions per consumer warp and k-tile, the warpgroups
// decoupled: gate_up 113.7 -> ~100 us per layer (v16); T = 512 about the same.
#pragma once

#include <cstdint>
#include <mutex>

#include "cuda/bulk_copy.cuh"
#include "cuda/q4_moe_prefill_wgmma.cuh"
#include "util/error.h"

namespace lilac::lab {

// Named (not anonymous): in the compute_80 pass the kernel body is empty.
namespace qmoe_ws {

using namespace cuda;

using C = qgemm_wgmma::QGemmV2Cfg<32, 8, 2>;  // BT 32, the stage sizes, NACC 16
constexpr int kConsumerThreads = 256, kThreads = kConsumerThreads + 32;
constexpr int kXch = C::NACC * 128 * 4;  // the gate/up exchange: 8 KB

template <int S>
constexpr int smem_bytes() {
  return 1024 + S * (C::X_STAGE + C::W_STAGE) + kXch + 2 * S * 8;
}

__device__ __forceinline__ void arrive_on_cp_async(uint64_t* bar) {
#if defined(LILAC_SM90A)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bulk::smem_addr(bar))
               : "memory");
#else
  (void)bar;
  __trap();
#endif
}

// bulk::wait with the spin loop in C++ rather than inside the asm statement (a branch inside the
// asm between in-flight wgmmas and their wait).
__device__ __forceinline__ void wait_full(uint64_t* bar, unsigned parity) {
#if defined(LILAC_SM90A)
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bulk::smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  (void)bar, (void)parity;
  __trap();
#endif
}

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

// One group of KG k-tiles of a consumer warp (its running k-tile count `it`): wait for each
// stage, dequantise them into a[0 .. KG), their 4 KG wgmmas as one group, wait for it (a group
// left in flight across the next stage's wait makes ptxas serialise the wgmmas: C7512, as for
// production's loops at these register budgets), then release the KG stages (one arrival per warp
// on each `empty`). PARTS < KG: a last, partial group.
template <int S, int N, int KG, int PARTS = KG>
__device__ __forceinline__ void consume(float (&acc)[C::NACC], uint32_t (&a)[KG][4][4], int it,
                                        uint32_t sX, uint32_t sW, uint64_t* full, uint64_t* empty) {
#pragma unroll
  for (int h = 0; h < PARTS; ++h) {
    const int s = (it + h) % S;
    wait_full(&full[s], unsigned((it + h) / S) & 1u);
    qgemm_wgmma::dequant_ktile<false>(sW + uint32_t(s * C::W_STAGE), a[h]);
  }
  tile::fence_proxy_async_smem();  // the token rows came by cp.async (generic proxy) -> wgmma
#pragma unroll
  for (int h = 0; h < PARTS; ++h)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[h][kk][i])::"memory");
  tile::wgmma_fence();
#pragma unroll
  for (int h = 0; h < PARTS; ++h) {
    const uint64_t db = tile::sw128_desc(sX + uint32_t(((it + h) % S) * C::X_STAGE));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) qgemm_wgmma::wgmma_rs<N>(acc, a[h][kk], db + uint64_t(2 * kk));
  }
  tile::wgmma_commit();
  tile::wgmma_wait<0>();
  tile::fence_operands(acc);
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int h = 0; h < PARTS; ++h) bulk::arrive(&empty[(it + h) % S]);
  }
}

// The consumers' main loop over K (KT k-tiles; `it` advances by KT).
template <int S, int N, int KG>
__device__ __forceinline__ void consume_all(float (&acc)[C::NACC], int KT, int& it, uint32_t sX,
                                            uint32_t sW, uint64_t* full, uint64_t* empty) {
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.f;
  tile::fence_operands(acc);
  uint32_t a[KG][4][4];
  int kt = 0;
  for (; kt + KG <= KT; kt += KG, it += KG) consume<S, N, KG>(acc, a, it, sX, sW, full, empty);
  if constexpr (KG == 2) {
    if (kt < KT) consume<S, N, KG, 1>(acc, a, it++, sX, sW, full, empty);
  }
}

// BULK_W: the weights by the bulk copy engine (16 copies of 512 / 64 bytes per stage); false: by
// the producer's lanes with cp.async (9 x 16 bytes each per stage), counted like the token rows.
template <int S, int KG, bool BULK_W = true>
__global__ void __launch_bounds__(kThreads, 2)
    ws_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix W, int I, qmoe_wgmma::Routed rt,
                      bf16* __restrict__ act, qmoe_wgmma::Shared sh) {
  pdl_launch_dependents();
  pdl_wait();
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  qmoe_wgmma::Job j;
  if (!qmoe_wgmma::job_of<C>(int(blockIdx.x), rt, sh, W, I, I / 64, sh.I / 64, nullptr, act, j))
    return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int P = j.I / kQTileRows, G = j.W.groups(), cb = j.cb, e = j.e, KT = H / 64;
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(S * C::X_STAGE);
  unsigned char* base = smem + (sX - tile::smem_u32(smem));
  float* xch = reinterpret_cast<float*>(base + S * (C::X_STAGE + C::W_STAGE));
  uint64_t* full = reinterpret_cast<uint64_t*>(base + S * (C::X_STAGE + C::W_STAGE) + kXch);
  uint64_t* empty = full + S;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      // The producer lane 0's expect_tx (BULK_W) + 32 lanes' cp.async arrivals.
      bulk::init(&full[s], BULK_W ? 33 : 32);
      bulk::init(&empty[s], 8);  // one per consumer warp
    }
    bulk::fence_init();
  }
  __syncthreads();
  const int npass = qmoe_wgmma::passes<C>(j.row0, j.row_end);

  if (warp == 8) {  // the producer
    // Lane l < 8: the code block of row tile l; 8 <= l < 16: the scale/bias block of tile l - 8.
    const int v = lane & 7;
    const int row_tile = e * 2 * P + (v >> 2) * P + 4 * cb + (v & 3);
    const uint32_t* wsrc = lane < 8 ? j.W.codes + size_t(row_tile) * size_t(G) * kQBlockWords
                                    : j.W.sb + size_t(row_tile) * size_t(G) * kQSbWords;
    const int wstep = lane < 8 ? kQBlockWords : kQSbWords;  // words per k-tile
    const uint32_t wdst = lane < 8 ? uint32_t(v * 512) : uint32_t(C::C_BYTES + v * 64);
    const unsigned wbytes = lane < 8 ? 512u : 64u;
    unsigned char* sw_gen = base + S * C::X_STAGE;
    // !BULK_W: lane l copies 16-byte chunk l of each row tile's code block (m = 0..7) and chunk
    // l & 3 of tile l >> 2's scale/bias block: production's copy geometry (load_stage_w).
    const uint32_t* ctile[8];
#pragma unroll
    for (int m = 0; m < 8; ++m)
      ctile[m] = j.W.codes +
                 size_t(e * 2 * P + (m >> 2) * P + 4 * cb + (m & 3)) * size_t(G) * kQBlockWords +
                 lane * 4;
    const int sbt = lane >> 2;
    const uint32_t* sbsrc =
        j.W.sb + size_t(e * 2 * P + (sbt >> 2) * P + 4 * cb + (sbt & 3)) * size_t(G) * kQSbWords +
        (lane & 3) * 4;
    int it = 0;
    for (int pass = 0; pass < npass; ++pass) {
      const int row = j.row0 + pass * C::BT + lane;
      const bool valid = row < min(j.row0 + (pass + 1) * C::BT, j.row_end);
      const bf16* xrow = x + size_t(valid ? (j.gather ? j.gather[row] : row) : 0) * size_t(H);
      const uint32_t xdst = uint32_t(lane * 128);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = it % S;
        if (it >= S) bulk::wait(&empty[s], unsigned(it / S - 1) & 1u);
        if constexpr (BULK_W) {
          if (lane == 0) bulk::arrive_expect_tx(&full[s], unsigned(C::W_STAGE));
          if (lane < 16)
            bulk::copy(sw_gen + s * C::W_STAGE + wdst, wsrc + size_t(kt) * wstep, wbytes, &full[s]);
        } else {
          const uint32_t dw = sW + uint32_t(s * C::W_STAGE);
#pragma unroll
          for (int m = 0; m < 8; ++m)
            tile::cp_async_16(dw + uint32_t(m * 512 + lane * 16),
                              ctile[m] + size_t(kt) * kQBlockWords, true);
          tile::cp_async_16(dw + uint32_t(C::C_BYTES + lane * 16), sbsrc + size_t(kt) * kQSbWords,
                            true);
        }
        if (valid) {
          const uint32_t d = sX + uint32_t(s * C::X_STAGE) + xdst;
#pragma unroll
          for (int c = 0; c < 8; ++c)
            tile::cp_async_16(d + uint32_t((c ^ (lane & 7)) << 4), xrow + kt * 64 + c * 8, true);
        }
        arrive_on_cp_async(&full[s]);
      }
    }
    return;
  }

  // The consumers: warp v < 4 the gate tile 4 cb + v, warp v >= 4 the up tile 4 cb + v - 4.
  bf16* out = static_cast<bf16*>(j.out);
  const int wt = tid & 127;
  int it = 0;
  for (int pass = 0; pass < npass; ++pass) {
    const int p0 = j.row0 + pass * C::BT, p1 = min(p0 + C::BT, j.row_end);
    float acc[C::NACC];
    if (p1 - p0 <= 16)
      consume_all<S, 16, KG>(acc, KT, it, sX, sW, full, empty);
    else
      consume_all<S, 32, KG>(acc, KT, it, sX, sW, full, empty);
    if (tid >= 128) {
#pragma unroll
      for (int i = 0; i < C::NACC; ++i) xch[i * 128 + wt] = acc[i];
    }
    consumers_sync();
    if (tid < 128) {
      const int col0 = 64 * cb + 16 * warp + (lane >> 2);
      const int s0 = p0 + 2 * (lane & 3);
#pragma unroll
      for (int jj = 0; jj < C::BT / 8; ++jj)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int col = col0 + 8 * (q >> 1), s = s0 + 8 * jj + (q & 1);
          if (s < p1) {
            const float gv = acc[4 * jj + q], uv = xch[(4 * jj + q) * 128 + wt];
            out[size_t(s) * size_t(j.I) + col] = __float2bfloat16_rn(silu(gv) * uv);
          }
        }
    }
    if (pass + 1 < npass) consumers_sync();  // the next pass's exchange overwrites xch
  }
#else
  (void)x, (void)H, (void)W, (void)I, (void)rt, (void)act, (void)sh;
  __trap();
#endif
}

// Launches the routed experts' blocks (moe_route's tile table x I / 64 column blocks) and, with
// `shared`, the shared expert's (its T rows in passes of 32 x Is / 64 column blocks), as
// qmoe_wgmma::launch_gate_up does.
template <int S, int KG, bool BULK_W = true>
void launch_ws_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const MoeRouting& r,
                       bf16* act, const QMoeSharedPart* shared, cudaStream_t stream) {
  static_assert(2 * (smem_bytes<S>() + 1024) <= 233472, "two blocks per SM");
  const char* what = "q_moe_grouped_gate_up (wgmma, producer warp)";
  qmoe_wgmma::check(what, &r, gate_up, 2 * I, H, H, I, x, act);
  const qmoe_wgmma::Shared sh = qmoe_wgmma::shared_of(what, shared, true, r.T, H);
  auto kernel = ws_gate_up_kernel<S, KG, BULK_W>;
  static std::once_flag once;
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<S>()));
  });
  const int64_t blocks =
      int64_t(r.max_tiles) * (I / 64) + int64_t(ceil_div(sh.T, C::BT)) * (sh.I / 64);
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
  launch_kernel(pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(kThreads), smem_bytes<S>(),
                stream, x, H, gate_up, I, qmoe_wgmma::routed_of(r), act, sh);
}

}  // namespace qmoe_ws

}  // namespace lilac::lab
