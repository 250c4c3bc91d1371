// gemv_rows: the BF16 decode GEMV over T <= 64 token rows at once (the dense projections of a
// batched decode step), each weight read once for all rows; the BF16 twin of q_gemv_rows.
//
// Why: at M = 1..64 the prefill GEMM's tiles leave most SMs idle on the 2048-row matrices
// (out_proj 2048 x 4096 at M = 16: 16 blocks, 43 us for 16.8 MB; run 3 of the batch bench).
//
// Design: a warp owns a 16-row tile and a slice of its columns (S slices per tile, S chosen so
// that tiles x S fill the GPU, meeting in shared memory in slice order: deterministic). Blocks
// have 8 warps, or 16 when the tiles are few (S up to 16 at T <= 32: out_proj / o_proj and the
// router, whose 128 or 17 tiles at 8 slices left each warp 4 dependent rounds of loads). Per 64
// columns a lane loads 2 x 16 bytes of row g and of row g + 8 (g = lane / 4, t = lane % 4: columns
// 8t .. 8t + 7 and 32 + 8t .. 32 + 8t + 7, so each load instruction of a quad reads 64 contiguous
// bytes of a row, two whole 32-byte sectors) and uses them as the A operand of four m16n8k16 MMAs
// with the tokens as the n dimension (8 per MMA). The k order inside the MMAs is a permutation of
// the columns (lane t's A elements 2t, 2t+1 | 2t+8, 2t+9 of k-block kb are its words 2kb, 2kb+1:
// columns 8t + 4kb + 0..3 for kb < 2, 32 + 8t + 4(kb - 2) + 0..3 after), applied to the B operand
// alike (token g's x at the same columns), so each product pairs the right weight with the right
// x. Two 64-column steps are in flight per warp (8 x 16-byte loads per lane) before their MMAs.
// f32 accumulation. (Until s11 a lane held columns 16t .. 16t + 15: each instruction then touched
// half of every sector and the sector was requested twice, once per instruction.)
//
// Staged form (sm_90, T <= 32, up to 8 K-slices; `set_gemv_rows_staged_enabled`): the same warps,
// steps and MMAs, but a block is 8 tiles x one K-slice and a cluster of S blocks is the S slices of
// those 8 tiles. Why: above, every warp reads its slice of x for all T tokens from L2 at each step
// (2 KB per 64-column step at 16 tokens: as many bytes as its weights), so at in_proj's shape the
// L2 carries ~100 MB for 50 MB of weights, and each round of a warp's loop waits for its x after
// its weights (s11 kernels bench: in_proj 25.9 us at 16 rows, 34.1 at 32, against 16 us for one row
// through gemv, whose x sits in shared memory). Here a block copies its slice of x (T x
// 64 sps columns, zeros past T) into shared memory once (cp.async; rows padded by 64 bytes so the
// 8 tokens of a load instruction fall in distinct bank halves), each warp's first round of weights
// is requested before the PDL wait (weights are no kernel's output), and the S partial sums of a
// tile meet over distributed shared memory, in slice order (the same sums, in the same order, as
// the form above at the same S: bit for bit; the launcher picks its own S for each form).
#include <algorithm>
#include <atomic>

#include "cuda/cluster.cuh"
#include "cuda/gemm_tile.cuh"
#include "cuda/gemv_rows.h"
#include "cuda/launch.h"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTok = 8;
constexpr int kStep = 64;   // columns per step
constexpr int kUnroll = 2;  // steps in flight

__device__ __forceinline__ uint4 ld_nc16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One round of a warp's weights: kUnroll 64-column steps from step st (clamped to s1 - 1: a
// clamped repeat is loaded, not used) of rows g (w0) and g + 8 (w1), 2 x 16 bytes each.
__device__ __forceinline__ void load_round(uint4 (&wa)[kUnroll][2][2], const bf16* w0,
                                           const bf16* w1, int st, int s1) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = min(st + u, s1 - 1) * kStep;
    wa[u][0][0] = ld_nc16(w0 + c);
    wa[u][0][1] = ld_nc16(w0 + c + 32);
    wa[u][1][0] = ld_nc16(w1 + c);
    wa[u][1][1] = ld_nc16(w1 + c + 32);
  }
}

// The four MMAs of one step for one 8-token chunk: A the step's weights w (rows g, g + 8: the
// words 2kb, 2kb + 1 of each are k-block kb's), B the chunk's x words xw at the same columns.
__device__ __forceinline__ void mma_step(const uint4 (&w)[2][2], const uint32_t (&xw)[8],
                                         float (&acc)[4]) {
  const uint32_t ra[8] = {w[0][0].x, w[0][0].y, w[0][0].z, w[0][0].w,
                          w[0][1].x, w[0][1].y, w[0][1].z, w[0][1].w};
  const uint32_t rb[8] = {w[1][0].x, w[1][0].y, w[1][0].z, w[1][0].w,
                          w[1][1].x, w[1][1].y, w[1][1].z, w[1][1].w};
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    const uint32_t a[4] = {ra[2 * kb], rb[2 * kb], ra[2 * kb + 1], rb[2 * kb + 1]};
    tile::mma_bf16_16816(acc, a, xw[2 * kb], xw[2 * kb + 1]);
  }
}

// Stores (or adds) a warp's 16-row tile of y for the T tokens: acc[ch][q] is row g (q < 2) or
// g + 8 of the tile and token 8 ch + 2t + (q & 1).
template <int NCH, bool kAdd>
__device__ __forceinline__ void store_tile(float* __restrict__ y, const float (&acc)[NCH][4],
                                           int tile, int rows, int T, int g, int t) {
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = tile * 16 + g + (q < 2 ? 0 : 8);
      const int tok = ch * kTok + 2 * t + (q & 1);
      if (row >= rows || tok >= T) continue;
      float* dst = y + size_t(tok) * rows + row;
      *dst = kAdd ? *dst + acc[ch][q] : acc[ch][q];
    }
}

// WARPS warps per block (8, or 16 for matrices of few row tiles: more K-slices per tile).
template <int NCH, bool kAdd, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_rows_kernel(const bf16* __restrict__ W, int rows, int cols, const bf16* __restrict__ x,
                     int T, float* __restrict__ y, int S, int steps_per_slice) {
  __shared__ float part[WARPS][NCH][4][32];
  pdl_launch_dependents();  // PDL (launch.h): x is the previous kernel's output
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tiles = (rows + 15) / 16, steps = cols / kStep;
  const int tile = blockIdx.x * (WARPS / S) + warp / S;
  const int slice = warp % S;
  float acc[NCH][4];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  if (tile < tiles) {  // warp-uniform
    // Rows past the matrix read row rows - 1 (valid memory) and are not stored.
    const int r0 = min(tile * 16 + g, rows - 1), r1 = min(tile * 16 + g + 8, rows - 1);
    const bf16* w0 = W + size_t(r0) * cols + 8 * t;
    const bf16* w1 = W + size_t(r1) * cols + 8 * t;
    const int s0 = slice * steps_per_slice, s1 = min(steps, s0 + steps_per_slice);
    for (int st = s0; st < s1; st += kUnroll) {
      uint4 wa[kUnroll][2][2];  // [step][row g / g + 8][first / second 16 bytes]
      load_round(wa, w0, w1, st, s1);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (st + u >= s1) break;  // warp-uniform
        const int c = (st + u) * kStep + 8 * t;
#pragma unroll
        for (int ch = 0; ch < NCH; ++ch) {
          const int tok = ch * kTok + g;
          const bool has = tok < T;
          const bf16* xr = x + size_t(has ? tok : 0) * cols + c;
          const uint4 xa = has ? ld_nc16(xr) : make_uint4(0, 0, 0, 0);
          const uint4 xb = has ? ld_nc16(xr + 32) : make_uint4(0, 0, 0, 0);
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          mma_step(wa[u], xw, acc[ch]);
        }
      }
    }
  }
  if (S > 1) {
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) part[warp][ch][q][lane] = acc[ch][q];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float v = 0.f;
        for (int s = 0; s < S; ++s) v += part[warp + s][ch][q][lane];  // slice order
        acc[ch][q] = v;
      }
  }
  if (tile >= tiles) return;
  store_tile<NCH, kAdd>(y, acc, tile, rows, T, g, t);
}

// ---- staged form (sm_90): x in shared memory, a cluster per 8 tiles, one K-slice per block ----
constexpr int kStagedTiles = 8;  // tiles per block (a warp each)
constexpr int kStagedMaxS = 8;   // portable cluster size
constexpr int kXPadBytes = 64;   // per token row of the staged x

// Bytes of the staged x rows: NCH * 8 token rows of 64 sps columns plus the pad.
__host__ __device__ constexpr int staged_row_bytes(int sps) {
  return sps * kStep * 2 + kXPadBytes;
}
// Dynamic shared memory of a staged block: the x rows, then the partial sums [8 warps][NCH][4][32].
constexpr size_t staged_smem(int nch, int sps) {
  return size_t(nch) * kTok * size_t(staged_row_bytes(sps)) +
         sizeof(float) * size_t(kStagedTiles) * size_t(nch) * 4 * 32;
}
constexpr size_t kStagedMaxSmem = 112 * 1024;  // else the other form (out_proj at 64 rows: 102 KB)

template <int NCH, bool kAdd>
__global__ void __launch_bounds__(kThreads, NCH <= 4 ? 3 : 2)  // <= 80 registers up to 32 rows
    gemv_rows_staged_kernel(const bf16* __restrict__ W, int rows, int cols,
                            const bf16* __restrict__ x, int T, float* __restrict__ y, int S,
                            int steps_per_slice) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slice = int(cluster::ctarank());  // == blockIdx.x % S
  const int tile = int(blockIdx.x) / S * kStagedTiles + warp;
  const int tiles = (rows + 15) / 16, steps = cols / kStep;
  const int s0 = min(steps, slice * steps_per_slice), s1 = min(steps, s0 + steps_per_slice);
  const int row_bytes = staged_row_bytes(steps_per_slice);
  unsigned char* const xs = smem;  // [NCH * 8][row_bytes]
  float(*part)[NCH][4][32] =
      reinterpret_cast<float(*)[NCH][4][32]>(smem + size_t(NCH) * kTok * row_bytes);
  const bool active = tile < tiles && s0 < s1;  // warp-uniform
  const int r0 = min(tile * 16 + g, rows - 1), r1 = min(tile * 16 + g + 8, rows - 1);
  const bf16* const w0 = W + size_t(r0) * cols + 8 * t;
  const bf16* const w1 = W + size_t(r1) * cols + 8 * t;
  uint4 wa[kUnroll][2][2];  // [step][row g / g + 8][first / second 16 bytes]
  pdl_launch_dependents();
  if (active) load_round(wa, w0, w1, s0, s1);  // weights: no kernel writes them, so before the wait
  pdl_wait();
  {  // x[tok][64 s0 .. 64 s1) -> xs, 16 bytes per copy; rows past T zero
    const int per_row = (s1 - s0) * kStep / 8;
    const uint32_t base = uint32_t(__cvta_generic_to_shared(xs));
    for (int i = threadIdx.x; i < NCH * kTok * per_row; i += kThreads) {
      const int tok = i / per_row, c = i - tok * per_row;
      const bool has = tok < T;
      const bf16* src = x + size_t(has ? tok : 0) * cols + size_t(s0) * kStep + 8 * c;
      tile::cp_async_16(base + uint32_t(tok * row_bytes + 16 * c), src, has);
    }
    tile::cp_async_commit();
    tile::cp_async_wait<0>();
    __syncthreads();
  }
  float acc[NCH][4];
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  if (active) {
    for (int st = s0; st < s1; st += kUnroll) {
      if (st != s0) load_round(wa, w0, w1, st, s1);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (st + u >= s1) break;                       // warp-uniform
        const int lc = (st + u - s0) * kStep + 8 * t;  // column within the slice
#pragma unroll
        for (int ch = 0; ch < NCH; ++ch) {
          const unsigned char* xr = xs + (ch * kTok + g) * row_bytes + 2 * lc;
          const uint4 xa = *reinterpret_cast<const uint4*>(xr);
          const uint4 xb = *reinterpret_cast<const uint4*>(xr + 64);
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          mma_step(wa[u], xw, acc[ch]);
        }
      }
    }
  }
  bool owner = true;  // this warp stores its tile
  if (S > 1) {
    // The S slices' partials of tile `warp` of the group meet at block rank warp % S, summed in
    // slice order from 0 (as the form above does).
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
      for (int q = 0; q < 4; ++q) part[warp][ch][q][lane] = acc[ch][q];
    cluster::sync();
    owner = warp % S == slice;
    if (owner) {
      const uint32_t a = uint32_t(__cvta_generic_to_shared(&part[warp][0][0][lane]));
#pragma unroll
      for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float v[kStagedMaxS];
#pragma unroll
          for (int r = 0; r < kStagedMaxS; ++r)  // all loads first, then the sum in order
            v[r] = r < S ? cluster::ld_f32(
                               cluster::map(a + uint32_t((ch * 4 + q) * 32 * 4), uint32_t(r)))
                         : 0.f;
          float sum = 0.f;
#pragma unroll
          for (int r = 0; r < kStagedMaxS; ++r)
            if (r < S) sum += v[r];
          acc[ch][q] = sum;
        }
    }
    cluster::sync();  // no block leaves while another reads its partials
  }
  if (!owner || tile >= tiles) return;
  store_tile<NCH, kAdd>(y, acc, tile, rows, T, g, t);
#else
  __trap();  // launched only on sm_90 devices (gemv_rows checks)
#endif
}

template <int NCH, bool kAdd>
void launch_staged_kernel(int groups, int S, int sps, const bf16* W, int rows, int cols,
                          const bf16* x, int T, float* y, cudaStream_t stream) {
  auto kernel = gemv_rows_staged_kernel<NCH, kAdd>;
  const size_t smem = staged_smem(NCH, sps);
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_cluster_kernel(true, dim3(unsigned(S)), kernel, dim3(unsigned(groups * S)), dim3(kThreads),
                        smem, stream, W, rows, cols, x, T, y, S, sps);
}

template <bool kAdd>
void launch_staged(int nch, int groups, int S, int sps, const bf16* W, int rows, int cols,
                   const bf16* x, int T, float* y, cudaStream_t stream) {
  switch (nch) {
    case 1:
      return launch_staged_kernel<1, kAdd>(groups, S, sps, W, rows, cols, x, T, y, stream);
    case 2:
      return launch_staged_kernel<2, kAdd>(groups, S, sps, W, rows, cols, x, T, y, stream);
    case 4:
      return launch_staged_kernel<4, kAdd>(groups, S, sps, W, rows, cols, x, T, y, stream);
    default:
      return launch_staged_kernel<8, kAdd>(groups, S, sps, W, rows, cols, x, T, y, stream);
  }
}

std::atomic<bool> g_staged{true};

int chunk_count(int T) {  // 8-token chunks, rounded up to the kernels' instantiations
  const int chunks = (T + kTok - 1) / kTok;
  return chunks <= 1 ? 1 : chunks <= 2 ? 2 : chunks <= 4 ? 4 : 8;
}

// The staged form's K-slice count for this call, or 0 where it does not apply (off, not sm_90,
// or its shared memory too large). Its own count: the smallest power of two up to 8 giving ~1.4
// blocks of 8 tiles per SM. Alone (kernels bench, s13 run 1, 16 rows, staged at each S): in_proj
// best at S = 2 (194 blocks, 16.6 us; 20.9 at S = 4), qkv at S = 4 (288 blocks, 13.0 us; 16.1 at
// S = 2), out_proj at 8 (11.1 us; 12.2 unstaged at 16, 15.0 staged as 16-warp blocks of two
// slices), the router at 8 (4.1 us; 5.4 unstaged).
int staged_slices(int rows, int cols, int T, int slices) {
  if (!g_staged.load(std::memory_order_relaxed) || device_compute_capability() != 90) return 0;
  const int tiles = (rows + 15) / 16, steps = cols / kStep;
  const int groups = ceil_div(tiles, kStagedTiles);
  int S = 1;
  while (S < kStagedMaxS && S * kUnroll < steps && (long long)groups * S * 10 < 14LL * sm_count())
    S *= 2;
  if (slices != 0) S = slices;
  if (S > kStagedMaxS || staged_smem(chunk_count(T), (steps + S - 1) / S) > kStagedMaxSmem)
    return 0;
  return S;
}

template <bool kAdd, int WARPS>
void launch_add(int nch, dim3 grid, const bf16* W, int rows, int cols, const bf16* x, int T,
                float* y, int S, int sps, cudaStream_t stream) {
  const dim3 b(WARPS * 32);
  switch (nch) {
    case 1:
      launch_kernel(true, gemv_rows_kernel<1, kAdd, WARPS>, grid, b, 0, stream, W, rows, cols, x, T,
                    y, S, sps);
      break;
    case 2:
      launch_kernel(true, gemv_rows_kernel<2, kAdd, WARPS>, grid, b, 0, stream, W, rows, cols, x, T,
                    y, S, sps);
      break;
    case 4:
      launch_kernel(true, gemv_rows_kernel<4, kAdd, WARPS>, grid, b, 0, stream, W, rows, cols, x, T,
                    y, S, sps);
      break;
    default:
      if constexpr (WARPS == kWarps)  // 16 warps x 8 chunks would need 64 KB of partials
        launch_kernel(true, gemv_rows_kernel<8, kAdd, WARPS>, grid, b, 0, stream, W, rows, cols, x,
                      T, y, S, sps);
      else
        fail("cuda::gemv_rows: 16-warp blocks take at most 32 rows");
      break;
  }
}

}  // namespace

void gemv_rows(const bf16* W, int rows, int cols, const bf16* x, int T, float* y, GemvOut mode,
               cudaStream_t stream, int slices) {
  if (!W || !x || !y) fail("cuda::gemv_rows: null pointer");
  if (T < 1 || T > kGemvRowsMax) fail("cuda::gemv_rows: T = {} outside [1, {}]", T, kGemvRowsMax);
  if (rows < 1 || cols < kStep || cols % kStep != 0)
    fail("cuda::gemv_rows: unsupported [{}, {}] (cols a positive multiple of {})", rows, cols,
         kStep);
  if (!is_aligned(W, 16) || !is_aligned(x, 16))
    fail("cuda::gemv_rows: W and x must be 16-byte aligned");
  const int nch = chunk_count(T);
  const int tiles = (rows + 15) / 16, steps = cols / kStep;
  // 16 warps per SM. Alone (lilac_cuda_bench_kernels --filter gemv_rows, s11 run 4) in_proj and
  // qkv at 16 and 32 rows ran faster at S = 8 (32 warps per SM: in_proj 25.95 -> 23.66 us at 16
  // rows), but in the batched step it lost (BF16 c=16 1,342 tok/s with S = 8 in s11 run 5, 1,369
  // with S = 4 in runs 1 and 6); likely: in_proj's 772 blocks no longer all fit at once.
  const long long target = 16LL * sm_count();
  // Up to 16 slices per tile (16-warp blocks) when the tiles are few (out_proj / o_proj: 128
  // tiles of 64 steps; the router: 17 tiles), so that more warps' loads are in flight and each
  // walks fewer dependent steps.
  const int max_s = nch <= 4 ? 2 * kWarps : kWarps;
  int S = 1;
  while (S < max_s && S * kUnroll < steps && (long long)tiles * S < target) S *= 2;
  if (slices != 0) {
    if (slices < 1 || slices > max_s || (slices & (slices - 1)) != 0)
      fail("cuda::gemv_rows: {} slices (a power of two <= {} at T = {})", slices, max_s, T);
    S = slices;
  }
  if (const int Ss = staged_slices(rows, cols, T, slices); Ss > 0) {
    const int groups = ceil_div(tiles, kStagedTiles), sps_s = (steps + Ss - 1) / Ss;
    if (mode == GemvOut::Accumulate)
      launch_staged<true>(nch, groups, Ss, sps_s, W, rows, cols, x, T, y, stream);
    else
      launch_staged<false>(nch, groups, Ss, sps_s, W, rows, cols, x, T, y, stream);
    return;
  }
  const int sps = (steps + S - 1) / S;
  const bool wide = S > kWarps;
  const dim3 grid(ceil_div(tiles, (wide ? 2 * kWarps : kWarps) / S));
  if (mode == GemvOut::Accumulate) {
    if (wide)
      launch_add<true, 2 * kWarps>(nch, grid, W, rows, cols, x, T, y, S, sps, stream);
    else
      launch_add<true, kWarps>(nch, grid, W, rows, cols, x, T, y, S, sps, stream);
  } else {
    if (wide)
      launch_add<false, 2 * kWarps>(nch, grid, W, rows, cols, x, T, y, S, sps, stream);
    else
      launch_add<false, kWarps>(nch, grid, W, rows, cols, x, T, y, S, sps, stream);
  }
}

void set_gemv_rows_staged_enabled(bool on) {
  g_staged.store(on);
}
bool gemv_rows_staged_enabled() {
  return g_staged.load();
}

bool gemv_rows_staged_takes(int rows, int cols, int T) {
  return T >= 1 && T <= kGemvRowsMax && rows >= 1 && cols >= kStep && cols % kStep == 0 &&
         staged_slices(rows, cols, T, 0) > 0;
}

}  // namespace lilac::cuda
