// The device code of the grouped 4-bit wgmma expert GEMMs and their launch helpers, templated on
// the block configuration (q4_gemm_wgmma.cuh's QGemmV2Cfg): the design is q4_moe_prefill_wgmma.cu's
// file comment. Included by that file (production's Cfg128 / Cfg64 / Cfg32) and by the kernel
// lab's q_moe_grouped versions that try other configurations. .cu files only.
#pragma once

#include <cstdint>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/launch.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_gemm.h"
#include "cuda/q4_gemm_wgmma.cuh"
#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {

// Named (not anonymous): in a compute_80 pass the kernel bodies are empty (see q4_gemm_wgmma.cu).
namespace qmoe_wgmma {

using qgemm_wgmma::WSrc;

// The block's token tile. Cfg128: one routing tile per block (128 token rows, 8 stages: 165 KB,
// 1 block per SM). The short forms (s20) take a routing tile's rows in passes of 64 or 32 rows,
// for prompts of a few hundred tokens where an expert sees ~8-30 rows: Cfg128's blocks there
// spend ~0.5 us per k-tile whatever n (kernel lab, T = 512), with 6 k-tiles (28 KB of weights)
// in flight per SM; these keep 2 (Cfg64: 8 stages of 12.5 KB) or 3 (Cfg32: 8 stages of 8.5 KB)
// blocks per SM, i.e. 2-3x the weight bytes in flight and the warps to issue them.
using Cfg128 = qgemm_wgmma::Cfg128;
using Cfg64 = qgemm_wgmma::Cfg64;
using Cfg32 = qgemm_wgmma::Cfg32;
static_assert(Cfg128::BT == kMoeTileRows, "one routing tile per Cfg128 block");

// The main loops (q4_gemm_wgmma.cuh): the Cfg128 kernels run KtileLoop (one k-tile per block
// barrier), the short forms PairLoop (two; s21, kernel lab q_moe_grouped v8, v11, v12: rows32 T =
// 256 203.7 -> 180.1 us per layer for gate_up + down, T = 512 218.7 -> 198.4; rows64 T = 4096
// 714.7 -> 663.8); the kernel lab passes other loops with the same contract.
using qgemm_wgmma::GroupLoop;
using qgemm_wgmma::KtileLoop;
using PairLoop = GroupLoop<2>;

// The main loop at the smallest wgmma n that covers the pass's `rows` token rows (uniform over
// the block): 32, 64 or 128 for Cfg128 (ADAPT false: always 128, the kernel lab's version 2);
// 16 up to C::BT for the short forms.
template <class C, bool ADAPT, class Loop>
__device__ __forceinline__ void mainloop_rows(float (&acc)[C::NACC],
                                              const tile::RowSet<C::X_LOADS>& xr, const WSrc& w,
                                              int K, uint32_t sX, uint32_t sW, int rows) {
  if constexpr (ADAPT) {
    if constexpr (C::BT <= 64) {
      if (rows <= 16) return Loop::template run<C, 16>(acc, xr, w, K, sX, sW);
    }
    if constexpr (C::BT > 32) {
      if (rows <= 32) return Loop::template run<C, 32>(acc, xr, w, K, sX, sW);
    }
    if constexpr (C::BT > 64) {
      if (rows <= 64) return Loop::template run<C, 64>(acc, xr, w, K, sX, sW);
    }
  }
  Loop::template run<C, C::BT>(acc, xr, w, K, sX, sW);
}

// A launch's blocks: first the routed experts' (moe_route's tile table x column blocks; blocks
// past num_tiles exit at once), then the shared expert's, if any (its T rows in dense tiles of
// C::BT rows x its column blocks; the shared expert's own launch has only these).
struct Routed {
  const int32_t* sorted_token;
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int max_tiles;  // 0: no routed blocks
  bool y_bf16;    // down: the routed rows of y stored as bf16 [P, H] (s32), else f32
};
struct Shared {
  QMatrix W;       // gate_up [2 Is, H] or down [H, Is] (4-bit)
  int I;           // Is
  int T;           // token rows; 0: no shared blocks
  const bf16* in;  // down: the shared act [T, Is]
  void* out;       // gate_up: act bf16 [T, Is]; down: f32 [T, H]
};

// A block's work: weight matrix, its expert's rows, the pass rows and where they come from / go.
struct Job {
  QMatrix W;
  int I, e, cb, row0, row_end;
  const int32_t* gather;  // gate_up: x row of sorted row s (null: row s itself)
  const bf16* in;         // down: act rows
  void* out;
  bool out_bf16;  // down: out is bf16 (the routed rows under Routed::y_bf16), else f32
};

// down's store of one output: y[s][c] as f32, or rounded to bf16 (out_bf16).
__device__ __forceinline__ void store_y(const Job& j, size_t i, float v) {
  if (j.out_bf16)
    static_cast<bf16*>(j.out)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(j.out)[i] = v;
}

// Block b of a launch whose routed part has n_cb column blocks per tile and whose shared part
// n_cb_s; false when the block has nothing to do. Routing tiles are up to kMoeTileRows rows.
template <class C>
__device__ __forceinline__ bool job_of(int b, const Routed& rt, const Shared& sh, const QMatrix& W,
                                       int I, int n_cb, int n_cb_s, const bf16* in, void* out,
                                       Job& j) {
  const int routed_blocks = rt.max_tiles * n_cb;
  if (b < routed_blocks) {
    const int t = b / n_cb;
    if (t >= *rt.num_tiles) return false;
    j.W = W;
    j.I = I;
    j.cb = b % n_cb;
    j.e = rt.tile_expert[t];
    j.row0 = rt.tile_row0[t];
    j.row_end = min(j.row0 + kMoeTileRows, rt.offsets[j.e + 1]);
    j.gather = rt.sorted_token;
    j.in = in;
    j.out = out;
    j.out_bf16 = rt.y_bf16;
    return true;
  }
  b -= routed_blocks;
  const int t = b / n_cb_s;
  j.W = sh.W;
  j.I = sh.I;
  j.cb = b % n_cb_s;
  j.e = 0;
  j.row0 = t * C::BT;
  j.row_end = min(j.row0 + C::BT, sh.T);
  j.gather = nullptr;
  j.in = sh.in;
  j.out = sh.out;
  j.out_bf16 = false;
  return j.row0 < sh.T;
}

// The pass's token rows: sorted rows row0 + load_row0() + 32 i (i < C::X_LOADS), each the row
// x[sorted_token[s]] (gather) or x[s] (sorted_token null), stride ld; rows >= row_end zero-filled.
template <class C>
__device__ __forceinline__ tile::RowSet<C::X_LOADS> token_rows(const bf16* x, int ld,
                                                               const int32_t* sorted_token,
                                                               int row0, int row_end) {
  tile::RowSet<C::X_LOADS> xr;
  xr.valid = 0;
#pragma unroll
  for (int i = 0; i < C::X_LOADS; ++i) {
    const int row = row0 + tile::load_row0() + i * C::ROW_STEP;
    const bool ok = row < row_end;
    const int src = ok ? (sorted_token ? sorted_token[row] : row) : 0;
    xr.ptr[i] = x + size_t(src) * size_t(ld);
    xr.valid |= uint32_t(ok) << i;
  }
  return xr;
}

// A routing tile's rows in passes of C::BT: each pass runs the main loop over all K (a second
// pass reads the block's weights again, from L2) and stores its rows. Cfg128: one pass, known at
// compile time (the loop is gone: the s7 kernel).
template <class C>
__device__ __forceinline__ int passes(int row0, int row_end) {
  if constexpr (C::BT >= kMoeTileRows) return 1;
  return (row_end - row0 + C::BT - 1) / C::BT;
}

template <class C, bool ADAPT, class Loop = KtileLoop>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix W, int I, Routed rt,
                   bf16* __restrict__ act, Shared sh) {
  static_assert(C::NACC * 128 * 4 <= C::STAGES * C::X_STAGE, "the gate/up exchange fits");
  static_assert(C::BT >= kMoeTileRows || kMoeTileRows % C::BT == 0, "whole passes");
  pdl_launch_dependents();  // PDL (launch.h): the routing tables and x after the wait
  pdl_wait();
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  Job j;
  if (!job_of<C>(int(blockIdx.x), rt, sh, W, I, I / 64, sh.I / 64, nullptr, act, j)) return;
  const int tid = threadIdx.x, P = j.I / kQTileRows, G = j.W.groups(), cb = j.cb, e = j.e;
  // Warp v's row tile: gate tile 4 cb + v (v < 4) or up tile 4 cb + v - 4 of expert e.
  auto tile_of = [&](int v) { return e * 2 * P + (v >> 2) * P + 4 * cb + (v & 3); };
  WSrc w;
  w.codes_ok = w.sb_ok = true;  // I % 64 == 0: every warp's tile exists
  w.codes = j.W.codes + size_t(tile_of(tid >> 5)) * size_t(G) * kQBlockWords + (tid & 31) * 4;
  w.sb = j.W.sb + size_t(tile_of((tid & 31) >> 2)) * size_t(G) * kQSbWords + (tid & 3) * 4;
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  float* xch = reinterpret_cast<float*>(smem);  // [NACC][128] f32 (over the free stages)
  bf16* out = static_cast<bf16*>(j.out);
  const int wt = tid & 127;
  for (int pass = 0; pass < passes<C>(j.row0, j.row_end); ++pass) {
    const int p0 = j.row0 + pass * C::BT, p1 = min(p0 + C::BT, j.row_end);
    const tile::RowSet<C::X_LOADS> xr = token_rows<C>(x, H, j.gather, p0, p1);
    float acc[C::NACC];
    mainloop_rows<C, ADAPT, Loop>(acc, xr, w, H, sX, sW, p1 - p0);

    // Warpgroup 1 (up) -> shared memory -> warpgroup 0 (gate). The stages are free once every
    // warp is past its main loop (its last wgmma retired, its copies landed).
    __syncthreads();
    if (tid >= 128) {
#pragma unroll
      for (int i = 0; i < C::NACC; ++i) xch[i * 128 + wt] = acc[i];
    }
    __syncthreads();
    if (tid < 128) {
      // acc[4 j + q]: gate row (= act column) 16 warp + g + 8 (q >> 1) of the block's 64, token
      // 8 j + 2 t + (q & 1) of the pass.
      const int lane = tid & 31;
      const int col0 = 64 * cb + 16 * (tid >> 5) + (lane >> 2);
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
    // The next pass's copies overwrite the exchange.
    if (p1 < j.row_end) __syncthreads();
  }
#else
  (void)x, (void)H, (void)W, (void)I, (void)rt, (void)act, (void)sh;
  __trap();
#endif
}

template <class C, bool ADAPT, class Loop = KtileLoop>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    down_kernel(const bf16* __restrict__ act, int I, QMatrix W, int H, Routed rt,
                float* __restrict__ y, Shared sh) {
  pdl_launch_dependents();  // PDL (launch.h): the routing tables and act after the wait
  pdl_wait();
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int n_cb = (H + C::BR - 1) / C::BR;
  Job j;
  if (!job_of<C>(int(blockIdx.x), rt, sh, W, I, n_cb, n_cb, act, y, j)) return;
  const int tid = threadIdx.x, TH = H / kQTileRows, G = j.W.groups(), cb = j.cb, e = j.e;
  // Warp v's row tile: 8 cb + v of expert e (clamped: the address stays valid when it is past).
  WSrc w;
  {
    const int ct = 8 * cb + (tid >> 5), st = 8 * cb + ((tid & 31) >> 2);
    w.codes_ok = ct < TH;
    w.sb_ok = st < TH;
    w.codes =
        j.W.codes + size_t(e * TH + min(ct, TH - 1)) * size_t(G) * kQBlockWords + (tid & 31) * 4;
    w.sb = j.W.sb + size_t(e * TH + min(st, TH - 1)) * size_t(G) * kQSbWords + (tid & 3) * 4;
  }
  const uint32_t sX = (tile::smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t sW = sX + uint32_t(C::STAGES * C::X_STAGE);
  const int lane = tid & 31;
  const int c0 = C::BR * cb + 16 * (tid >> 5) + (lane >> 2);
  for (int pass = 0; pass < passes<C>(j.row0, j.row_end); ++pass) {
    const int p0 = j.row0 + pass * C::BT, p1 = min(p0 + C::BT, j.row_end);
    // Every warp is past the previous pass's reads of the stages before they are refilled.
    if (pass > 0) __syncthreads();
    const tile::RowSet<C::X_LOADS> xr = token_rows<C>(j.in, j.I, nullptr, p0, p1);
    float acc[C::NACC];
    mainloop_rows<C, ADAPT, Loop>(acc, xr, w, j.I, sX, sW, p1 - p0);

    // acc[4 j + q]: y column 128 cb + 16 warp + g + 8 (q >> 1), token 8 j + 2 t + (q & 1).
    const int s0 = p0 + 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < C::BT / 8; ++jj)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int c = c0 + 8 * (q >> 1), s = s0 + 8 * jj + (q & 1);
        if (s < p1 && c < H) store_y(j, size_t(s) * size_t(H) + c, acc[4 * jj + q]);
      }
  }
#else
  (void)act, (void)I, (void)W, (void)H, (void)rt, (void)y, (void)sh;
  __trap();
#endif
}

inline Routed routed_of(const MoeRouting& r, bool y_bf16 = false) {
  return {r.sorted_token, r.expert_offsets, r.tile_expert, r.tile_row0,
          r.num_tiles,    r.max_tiles,      y_bf16};
}

template <class C, class Kernel>
void prepare(Kernel kernel, std::once_flag& once) {
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES));
  });
}

inline void check(const char* what, const MoeRouting* r, const QMatrix& m, int rows_multiple,
                  int cols, int H, int I, const void* in, const void* out) {
  if (r && (!r->topk_idx || r->T < 1)) fail("{}: routing workspace not laid out", what);
  if (!m || !m.sb || !in || !out) fail("{}: null pointer", what);
  if (H < 64 || H % 64 || I < 64 || I % 64)
    fail("{}: H {} and I {} must be positive multiples of 64", what, H, I);
  if (m.bits != 4 || m.cols != cols || m.rows < rows_multiple || m.rows % rows_multiple != 0)
    fail("{}: weights [{}, {}] at {} bits (4-bit, rows a multiple of {}, {} columns)", what, m.rows,
         m.cols, m.bits, rows_multiple, cols);
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0) fail("{}: input must be 16-byte aligned", what);
}

// The shared part of a launch (none when `part` is null): its matrix checked against H and Is.
inline Shared shared_of(const char* what, const QMoeSharedPart* part, bool gate_up, int T, int H) {
  if (!part) return Shared{QMatrix{}, 64, 0, nullptr, nullptr};
  const QMatrix& m = gate_up ? part->gate_up : part->down;
  const int Is = gate_up ? m.rows / 2 : m.cols;
  if (!m || !m.sb || m.bits != 4 || Is < 64 || Is % 64 != 0 ||
      (gate_up ? (m.cols != H || m.rows != 2 * Is) : (m.rows != H)))
    fail(
        "{}: shared expert weights [{}, {}] at {} bits (4-bit [2 Is, {}] / [{}, Is], Is a "
        "positive multiple of 64)",
        what, m.rows, m.cols, m.bits, H, H);
  if (!part->act || (!gate_up && !part->out)) fail("{}: shared expert null pointer", what);
  if (!gate_up && reinterpret_cast<uintptr_t>(part->act) % 16 != 0)
    fail("{}: the shared act must be 16-byte aligned", what);
  return Shared{m, Is, T, part->act, gate_up ? static_cast<void*>(part->act) : part->out};
}

template <class C, bool ADAPT, class Loop = KtileLoop>
void launch_gate_up(const bf16* x, int H, const QMatrix& gate_up, int I, const MoeRouting& r,
                    bf16* act, const QMoeSharedPart* shared, cudaStream_t stream) {
  const char* what = "q_moe_grouped_gate_up (wgmma)";
  check(what, &r, gate_up, 2 * I, H, H, I, x, act);
  const Shared sh = shared_of(what, shared, true, r.T, H);
  auto kernel = gate_up_kernel<C, ADAPT, Loop>;
  static std::once_flag once;
  prepare<C>(kernel, once);
  const int64_t blocks =
      int64_t(r.max_tiles) * (I / 64) + int64_t(ceil_div(sh.T, C::BT)) * (sh.I / 64);
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
  launch_kernel(pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(C::THREADS), C::SMEM_BYTES,
                stream, x, H, gate_up, I, routed_of(r), act, sh);
}

// y_bf16: the routed rows of y stored as bf16 [P, H] in y's memory (the shared part's out stays
// f32).
template <class C, bool ADAPT, class Loop = KtileLoop>
void launch_down(const bf16* act, int I, const QMatrix& down, int H, const MoeRouting& r, float* y,
                 const QMoeSharedPart* shared, cudaStream_t stream, bool y_bf16 = false) {
  const char* what = "q_moe_grouped_down (wgmma)";
  check(what, &r, down, H, I, H, I, act, y);
  const Shared sh = shared_of(what, shared, false, r.T, H);
  auto kernel = down_kernel<C, ADAPT, Loop>;
  static std::once_flag once;
  prepare<C>(kernel, once);
  const int64_t n_cb = (H + C::BR - 1) / C::BR;
  const int64_t blocks = (int64_t(r.max_tiles) + ceil_div(sh.T, C::BT)) * n_cb;
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
  launch_kernel(pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(C::THREADS), C::SMEM_BYTES,
                stream, act, I, down, H, routed_of(r, y_bf16), y, sh);
}

template <class C, class Loop = KtileLoop>
void launch_shared_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int Is, bf16* act,
                           cudaStream_t stream) {
  const char* what = "q_moe_shared_gate_up (wgmma)";
  check(what, nullptr, gate_up, 2 * Is, H, H, Is, x, act);
  if (gate_up.rows != 2 * Is || T < 1)
    fail("{}: {} rows for Is {}, T {}", what, gate_up.rows, Is, T);
  auto kernel = gate_up_kernel<C, true, Loop>;
  static std::once_flag once;
  prepare<C>(kernel, once);
  const int64_t blocks = int64_t(ceil_div(T, C::BT)) * (Is / 64);
  if (blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
  const Routed none{nullptr, nullptr, nullptr, nullptr, nullptr, 0, false};
  const Shared sh{gate_up, Is, T, nullptr, act};
  launch_kernel(pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(C::THREADS), C::SMEM_BYTES,
                stream, x, H, gate_up, Is, none, act, sh);
}

}  // namespace qmoe_wgmma

}  // namespace lilac::cuda
