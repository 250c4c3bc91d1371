// MoE prefill: routing with a device-side stable counting sort, grouped expert GEMMs, combine.
//
// Work per layer at the real shapes (T = 8192 tokens, E = 256, k = 8, I = Is = 512, H = 2048;
// P = T*k = 65536 (token, expert) pairs, about 256 per expert with a uniform router):
//   kernel             FLOPs      bytes (min)                                 @790 TF/s  @4.3 TB/s
//   route (4 kernels)  -          logits 8.4 MB + 10 small arrays ~3 MB        -          3 us
//   grouped gate_up    275 G      weights 1074 MB + x 34 MB + act 67 MB        348 us     272 us
//   grouped down       137 G      weights 537 MB + act 67 MB + y 537 MB (f32)  174 us     265 us
//   shared gate_up      34 G      4 MB + 34 MB + 8 MB                           44 us      11 us
//   shared down (gemm)  17 G      2 MB + 8 MB + 67 MB                           22 us      18 us
//   combine            -          y 537 MB + shared 67 MB + h 134 MB           -          172 us
// So a layer's MoE is about 0.6 ms of tensor work and 0.75 ms of bytes: neither dominates, the
// f32 y round trip (1.07 GB) is the largest byte term (a bf16 y would halve it; the contract keeps
// f32). At T = 512 the weights dominate: 1.6 GB per layer = 375 us for 26 GFLOP.
//
// Routing (moe_route, the tables below read): moe_route.cu.
// Grouped GEMMs: grid = max_tiles x (column tiles), block g -> (tile g / n_nt, column tile
// g % n_nt); blocks past num_tiles (read on the device) exit at once. Consecutive blocks share the
// tile's gathered A rows and the expert's weight panel (L2). The tile engine of gemm_tile.cuh:
//  * gate_up: the B tile interleaves gate and up rows of the same outputs (mma.sync: per 64-column
//    warp tile, 32 gate rows then the 32 matching up rows; wgmma: 128 gate then 128 up rows of
//    the 256-wide tile), so every thread holds gate and up accumulators of the same (row, column)
//    and the epilogue writes act = bf16(silu(g) * u) directly. A rows gathered through
//    sorted_token in the cp.async loads. mma.sync 128x128 (64 act columns), wgmma 128x256 (128).
//  * down: A = act rows of the tile (contiguous), B = down_e, y f32 rows in sorted order.
//    mma.sync 128x128, wgmma 128x128 (3 stages, 2 blocks/SM: K = I = 512 is only 8 k-tiles, so
//    two resident blocks overlap one's prologue/epilogue with the other's MMAs).
// Shared expert: its own launches (moe_shared_gate_up, dense tiles of the same kernel; down as a
// GEMM by the caller) or, with a MoeSharedPart, as the first row tiles of the grouped launches
// (s11: the BF16 batched step's shared expert had three launches of its own, ~22 us per layer at
// 16 rows for 6 MB of weights; inside the grouped grids its tiles run beside the routed ones).
// Combine: one block per token, float4 over H, pairs summed in slot order (deterministic).
#include "cuda/moe_prefill.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <mutex>

#include "cuda/gemm_tile.cuh"
#include "cuda/vec_util.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using tile::Config;
using tile::RowSet;
using tile::WgConfig;

// ---- grouped GEMMs
// -------------------------------------------------------------------------------

using GateUpMma = Config<128, 128, 64, 3, 2>;  // 64 act columns per block
using DownMma = Config<128, 128, 64, 3, 2>;
using GateUpWg = WgConfig<256, 4, 1, 1>;  // 128 act columns per block
using DownWg = WgConfig<128, 3, 0, 2>;

// The rows [row0, row_end) of one tile: an expert's slice of the sorted pairs (GROUPED), or a
// dense block of tokens (the shared expert). False when the block has no work.
struct TileWork {
  int e, row0, row_end;
};
template <int BM, bool GROUPED>
__device__ __forceinline__ bool tile_work(int tile, int dense_rows, const int32_t* offsets,
                                          const int32_t* tile_expert, const int32_t* tile_row0,
                                          const int32_t* num_tiles, TileWork& w) {
  if constexpr (GROUPED) {
    if (tile >= *num_tiles) return false;
    w.e = tile_expert[tile];
    w.row0 = tile_row0[tile];
    w.row_end = offsets[w.e + 1];
  } else {
    w.e = 0;
    w.row0 = tile * BM;
    w.row_end = dense_rows;
  }
  return true;
}

// A rows of the tile: sorted rows s in [row0, row_end), each the x row of token sorted_token[s]
// (or of token s when sorted_token is null).
template <class Cfg>
__device__ __forceinline__ RowSet<Cfg::A_LOADS> gather_rows(const bf16* x, int ld,
                                                            const int32_t* sorted_token,
                                                            const TileWork& w) {
  RowSet<Cfg::A_LOADS> s;
  s.valid = 0;
#pragma unroll
  for (int i = 0; i < Cfg::A_LOADS; ++i) {
    const int row = w.row0 + tile::load_row0() + i * Cfg::ROW_STEP;
    const bool ok = row < w.row_end;
    const int src = ok ? (sorted_token ? sorted_token[row] : row) : 0;
    s.ptr[i] = x + size_t(src) * size_t(ld);
    s.valid |= uint32_t(ok) << i;
  }
  return s;
}

// B rows of a gate_up tile: local row r -> group r / (2 HALF); the first HALF rows of a group are
// gate rows of outputs n0 + group * HALF + [0, HALF), the next HALF the up rows of the same
// outputs.
template <class Cfg, int HALF>
__device__ __forceinline__ RowSet<Cfg::B_LOADS> gate_up_rows(const bf16* w_e, int I, int H,
                                                             int n0) {
  RowSet<Cfg::B_LOADS> s;
  s.valid = 0;
#pragma unroll
  for (int i = 0; i < Cfg::B_LOADS; ++i) {
    const int r = tile::load_row0() + i * Cfg::ROW_STEP;
    const int q = r % (2 * HALF);
    const int col = n0 + (r / (2 * HALF)) * HALF + q % HALF;
    const bool ok = col < I;
    const int wrow = (q >= HALF ? I : 0) + col;
    s.ptr[i] = w_e + size_t(ok ? wrow : 0) * size_t(H);
    s.valid |= uint32_t(ok) << i;
  }
  return s;
}

template <class Cfg>
__device__ __forceinline__ RowSet<Cfg::B_LOADS> plain_rows(const bf16* w_e, int rows, int K,
                                                           int n0) {
  RowSet<Cfg::B_LOADS> s;
  s.valid = 0;
#pragma unroll
  for (int i = 0; i < Cfg::B_LOADS; ++i) {
    const int r = n0 + tile::load_row0() + i * Cfg::ROW_STEP;
    const bool ok = r < rows;
    s.ptr[i] = w_e + size_t(ok ? r : 0) * size_t(K);
    s.valid |= uint32_t(ok) << i;
  }
  return s;
}

__device__ __forceinline__ void store_act(bf16* act, int I, int row, int row_end, int col, float g0,
                                          float u0, float g1, float u1) {
  if (row < row_end && col < I)  // I even and col even: the pair is whole
    *reinterpret_cast<__nv_bfloat162*>(act + size_t(row) * size_t(I) + col) =
        __floats2bfloat162_rn(silu(g0) * u0, silu(g1) * u1);
}

struct GroupArgs {
  const int32_t* sorted_token;  // null: dense (shared expert)
  const int32_t* offsets;
  const int32_t* tile_expert;
  const int32_t* tile_row0;
  const int32_t* num_tiles;
  int dense_rows;  // tokens of the dense block (the shared expert), alone or as the prefix below
  // A grouped launch's shared-expert prefix: its first shared_tiles row tiles are the dense block
  // of dense_rows tokens through shared_w (the shared expert's gate_up [2 I, H] or down [H, I]),
  // reading shared_in (down: the shared act [T, I]; gate_up: x itself) and writing shared_out
  // (gate_up: bf16 act [T, I]; down: f32 [T, H]); the routed tiles follow. 0: no prefix.
  int shared_tiles;
  const bf16* shared_w;
  const bf16* shared_in;
  void* shared_out;
};

// What a tile reads and writes: the weights (expert 0's; w.e selects), the input rows, the
// gather table (null: rows in order) and the output.
struct TileIo {
  const bf16* w;
  const bf16* in;
  const int32_t* gather;
  void* out;
};

// The block's tile of a grouped launch with an optional shared-expert prefix (GroupArgs): its
// work, and in io the shared expert's operands for a prefix tile (io unchanged otherwise).
template <int BM, bool GROUPED>
__device__ __forceinline__ bool prefixed_tile(int tile, const GroupArgs& g, TileIo& io,
                                              TileWork& w) {
  if (GROUPED && tile < g.shared_tiles) {
    w = {0, tile * BM, g.dense_rows};
    io = {g.shared_w, g.shared_in, nullptr, g.shared_out};
    return true;
  }
  return tile_work<BM, GROUPED>(tile - (GROUPED ? g.shared_tiles : 0), g.dense_rows, g.offsets,
                                g.tile_expert, g.tile_row0, g.num_tiles, w);
}

template <class Cfg, bool GROUPED>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    moe_gate_up_mma_kernel(const bf16* __restrict__ x, int H, const bf16* __restrict__ gate_up,
                           int I, GroupArgs g, bf16* __restrict__ act) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // PDL (moe_pdl_enabled): everything below may depend on the previous kernel (the routing
  // tables, x). No early trigger for the next kernel: its blocks, resident while these tiles
  // run, cost them more than their launch saves (s11 run 5: BF16 c=16 1,342 -> 1,323 tok/s).
  pdl_wait();
  constexpr int HALF = 32, COLS = Cfg::BN / 2;
  const int n_nt = (I + COLS - 1) / COLS;
  const int tile = blockIdx.x / n_nt, nt = blockIdx.x % n_nt;
  TileWork w;
  TileIo io{gate_up, x, g.sorted_token, act};
  if (!prefixed_tile<Cfg::BM, GROUPED>(tile, g, io, w)) return;
  bf16* const out = static_cast<bf16*>(io.out);
  const int n0 = nt * COLS;
  const auto a_rows = gather_rows<Cfg>(io.in, H, io.gather, w);
  const auto b_rows =
      gate_up_rows<Cfg, HALF>(io.w + size_t(w.e) * 2 * size_t(I) * size_t(H), I, H, n0);
  float acc[Cfg::MT][Cfg::NT][4];
  tile::mainloop<Cfg>(acc, a_rows, b_rows, H, reinterpret_cast<bf16*>(smem));

  // Warp (wm, wn): n-tiles 0-3 hold gate outputs n0 + wn*32 + [0, 32), n-tiles 4-7 the up ones.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row_base = w.row0 + (warp / Cfg::WARPS_N) * Cfg::WM + (lane >> 2);
  const int col_base = n0 + (warp % Cfg::WARPS_N) * HALF + 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < Cfg::MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = row_base + i * 16, col = col_base + j * 8;
      store_act(out, I, row, w.row_end, col, acc[i][j][0], acc[i][j + 4][0], acc[i][j][1],
                acc[i][j + 4][1]);
      store_act(out, I, row + 8, w.row_end, col, acc[i][j][2], acc[i][j + 4][2], acc[i][j][3],
                acc[i][j + 4][3]);
    }
}

template <class Cfg, bool GROUPED>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    moe_gate_up_wgmma_kernel(const bf16* __restrict__ x, int H, const bf16* __restrict__ gate_up,
                             int I, GroupArgs g, bf16* __restrict__ act) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  pdl_wait();  // PDL: see moe_gate_up_mma_kernel
  constexpr int HALF = Cfg::BN / 2, COLS = Cfg::BN / 2;
  const int n_nt = (I + COLS - 1) / COLS;
  const int tile = blockIdx.x / n_nt, nt = blockIdx.x % n_nt;
  TileWork w;
  TileIo io{gate_up, x, g.sorted_token, act};
  if (!prefixed_tile<Cfg::BM, GROUPED>(tile, g, io, w)) return;
  bf16* const out = static_cast<bf16*>(io.out);
  const int n0 = nt * COLS;
  const auto a_rows = gather_rows<Cfg>(io.in, H, io.gather, w);
  const auto b_rows =
      gate_up_rows<Cfg, HALF>(io.w + size_t(w.e) * 2 * size_t(I) * size_t(H), I, H, n0);
  float acc[Cfg::NACC];
  tile::wgmma_mainloop<Cfg>(acc, a_rows, b_rows, H, smem);

  // Columns [0, HALF) of the tile are gate outputs n0 + c, [HALF, BN) the up outputs n0 + c - HALF.
  const tile::WarpOrigin o = tile::wgmma_origin();
  const int row = w.row0 + o.row;
  constexpr int JH = HALF / 8;
#pragma unroll
  for (int j = 0; j < JH; ++j) {
    const int col = n0 + o.col + j * 8;
    const float* gt = acc + 4 * j;
    const float* up = acc + 4 * (j + JH);
    store_act(out, I, row, w.row_end, col, gt[0], up[0], gt[1], up[1]);
    store_act(out, I, row + 8, w.row_end, col, gt[2], up[2], gt[3], up[3]);
  }
#else
  (void)x, (void)H, (void)gate_up, (void)I, (void)g, (void)act;
  __trap();
#endif
}

__device__ __forceinline__ void store_y(float* y, int H, int row, int row_end, int col, float v0,
                                        float v1) {
  if (row < row_end && col < H)  // H even
    *reinterpret_cast<float2*>(y + size_t(row) * size_t(H) + col) = make_float2(v0, v1);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    moe_down_mma_kernel(const bf16* __restrict__ act, int I, const bf16* __restrict__ down, int H,
                        GroupArgs g, float* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem[];
  pdl_wait();  // PDL: see moe_gate_up_mma_kernel
  const int n_nt = (H + Cfg::BN - 1) / Cfg::BN;
  const int tile = blockIdx.x / n_nt, nt = blockIdx.x % n_nt;
  TileWork w;
  TileIo io{down, act, nullptr, y};  // act rows are already in sorted order
  if (!prefixed_tile<Cfg::BM, true>(tile, g, io, w)) return;
  float* const out = static_cast<float*>(io.out);
  const int n0 = nt * Cfg::BN;
  const auto a_rows = gather_rows<Cfg>(io.in, I, nullptr, w);
  const auto b_rows = plain_rows<Cfg>(io.w + size_t(w.e) * size_t(H) * size_t(I), H, I, n0);
  float acc[Cfg::MT][Cfg::NT][4];
  tile::mainloop<Cfg>(acc, a_rows, b_rows, I, reinterpret_cast<bf16*>(smem));

  const tile::WarpOrigin o = tile::warp_origin<Cfg>();
#pragma unroll
  for (int i = 0; i < Cfg::MT; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::NT; ++j) {
      const int row = w.row0 + o.row + i * 16, col = n0 + o.col + j * 8;
      store_y(out, H, row, w.row_end, col, acc[i][j][0], acc[i][j][1]);
      store_y(out, H, row + 8, w.row_end, col, acc[i][j][2], acc[i][j][3]);
    }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    moe_down_wgmma_kernel(const bf16* __restrict__ act, int I, const bf16* __restrict__ down, int H,
                          GroupArgs g, float* __restrict__ y) {
#if defined(LILAC_SM90A)
  extern __shared__ __align__(1024) unsigned char smem[];
  pdl_wait();  // PDL: see moe_gate_up_mma_kernel
  const int n_nt = (H + Cfg::BN - 1) / Cfg::BN;
  const int tile = blockIdx.x / n_nt, nt = blockIdx.x % n_nt;
  TileWork w;
  TileIo io{down, act, nullptr, y};  // act rows are already in sorted order
  if (!prefixed_tile<Cfg::BM, true>(tile, g, io, w)) return;
  float* const out = static_cast<float*>(io.out);
  const int n0 = nt * Cfg::BN;
  const auto a_rows = gather_rows<Cfg>(io.in, I, nullptr, w);
  const auto b_rows = plain_rows<Cfg>(io.w + size_t(w.e) * size_t(H) * size_t(I), H, I, n0);
  float acc[Cfg::NACC];
  tile::wgmma_mainloop<Cfg>(acc, a_rows, b_rows, I, smem);

  const tile::WarpOrigin o = tile::wgmma_origin();
  const int row = w.row0 + o.row;
#pragma unroll
  for (int j = 0; j < Cfg::BN / 8; ++j) {
    const int col = n0 + o.col + j * 8;
    store_y(out, H, row, w.row_end, col, acc[4 * j + 0], acc[4 * j + 1]);
    store_y(out, H, row + 8, w.row_end, col, acc[4 * j + 2], acc[4 * j + 3]);
  }
#else
  (void)act, (void)I, (void)down, (void)H, (void)g, (void)y;
  __trap();
#endif
}

// ---- combine
// -------------------------------------------------------------------------------------

// acc += s v, per component (f32, as the combine has always summed).
__device__ __forceinline__ void add_scaled(float4& acc, float s, const float4& v) {
  acc.x += s * v.x;
  acc.y += s * v.y;
  acc.z += s * v.z;
  acc.w += s * v.w;
}

// h + (experts + gate shared): the combined row's four columns, in the combine's order.
__device__ __forceinline__ float4 combined(float4 experts, float gate, const float4& shared,
                                           const float4& h) {
  add_scaled(experts, gate, shared);
  float4 o = h;
  o.x += experts.x;
  o.y += experts.y;
  o.z += experts.z;
  o.w += experts.w;
  return o;
}

// Four columns of an expert row: f32, or bf16 widened (exactly) to f32.
__device__ __forceinline__ float4 y4(const float* y, size_t row, size_t H, int c) {
  return reinterpret_cast<const float4*>(y + row * H)[c];
}
__device__ __forceinline__ float4 y4(const bf16* y, size_t row, size_t H, int c) {
  const uint2 u = reinterpret_cast<const uint2*>(y + row * H)[c];
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// Grid: a block per token row t (256 threads). KT > 0 (the model's k = 8 at H <= 2048): each
// thread's PER columns (float4) and their KT expert rows, the shared row and h are all loaded
// before the first sum, so a thread waits for one L2 round trip instead of one per column pass and
// per few experts (the generic loop, KT = 0: k and the columns at run time). The same sums in the
// same order either way (bit for bit).
// Y: the expert rows' type (float, or bf16 under y_bf16).
template <int KT, int PER, class Y>
__global__ void __launch_bounds__(256)
    moe_combine_kernel(const Y* __restrict__ y, const float* __restrict__ w,
                       const int32_t* __restrict__ pos, int k, const float* __restrict__ logits,
                       int stride, int E, const float* __restrict__ shared, int H,
                       float* __restrict__ h, const float* __restrict__ norm_scale,
                       bf16* __restrict__ norm_out, float eps) {
  __shared__ int sp[32];
  __shared__ float sw[32];
  __shared__ float scratch[32];
  // PDL (launch.h): every input is an earlier kernel's output; launching the next kernel early
  // lets its blocks be resident when this one ends (s11: the next layer's in_proj, PDL-launched,
  // otherwise starts only after this grid completes).
  pdl_launch_dependents();
  pdl_wait();
  const int t = blockIdx.x;
  if (threadIdx.x < k) {
    sp[threadIdx.x] = pos[size_t(t) * k + threadIdx.x];
    sw[threadIdx.x] = w[size_t(t) * k + threadIdx.x];
  }
  __syncthreads();
  const float gate = 1.f / (1.f + expf(-logits[size_t(t) * size_t(stride) + E]));
  const float4* sh = reinterpret_cast<const float4*>(shared + size_t(t) * size_t(H));
  float4* ht = reinterpret_cast<float4*>(h + size_t(t) * size_t(H));
  if constexpr (KT > 0) {
    const int H4 = H / 4;
    float4 v[PER][KT], sv[PER], hv[PER];
#pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int c = threadIdx.x + p * 256;
      if (c < H4) {
#pragma unroll
        for (int j = 0; j < KT; ++j) v[p][j] = y4(y, size_t(sp[j]), size_t(H), c);
        sv[p] = sh[c];
        hv[p] = ht[c];
      }
    }
#pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int c = threadIdx.x + p * 256;
      if (c >= H4) continue;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < KT; ++j) add_scaled(acc, sw[j], v[p][j]);
      ht[c] = combined(acc, gate, sv[p], hv[p]);
    }
  } else {
    for (int c = threadIdx.x; c < H / 4; c += blockDim.x) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < k; ++j) add_scaled(acc, sw[j], y4(y, size_t(sp[j]), size_t(H), c));
      const float4 sv = sh[c];
      ht[c] = combined(acc, gate, sv, ht[c]);
    }
  }
  if (norm_scale) {   // the next norm of the new row, by rms_norm's own function (bit for bit)
    __syncthreads();  // the block's h stores are visible to its threads
    rms_norm_row(h + size_t(t) * size_t(H), norm_scale, H, eps,
                 reinterpret_cast<uint4*>(norm_out + size_t(t) * size_t(H)), scratch);
  }
}

// ---- host
// ----------------------------------------------------------------------------------------

bool device_is_sm90() {
  return device_compute_capability() / 10 == 9;
}

// Raises the kernel's dynamic shared-memory limit (once) and checks the grid size.
template <class Kernel>
void prepare_launch(Kernel kernel, std::once_flag& once, int smem, int64_t blocks,
                    const char* what) {
  std::call_once(once, [&] {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  if (blocks < 1 || blocks > 0x7fffffff) fail("{}: {} blocks", what, blocks);
}

void check_routing(const MoeRouting& r, const char* what) {
  if (!r.topk_idx || r.T < 1) fail("{}: routing workspace not laid out", what);
}

}  // namespace
namespace {

template <class Cfg, bool GROUPED, bool WG>
void launch_gate_up(const bf16* x, int H, const bf16* gate_up, int I, const GroupArgs& g, int tiles,
                    bf16* act, cudaStream_t stream) {
  auto kernel = [] {
    if constexpr (WG)
      return moe_gate_up_wgmma_kernel<Cfg, GROUPED>;
    else
      return moe_gate_up_mma_kernel<Cfg, GROUPED>;
  }();
  static std::once_flag once;
  const int64_t blocks = int64_t(tiles) * ceil_div(I, Cfg::BN / 2);
  prepare_launch(kernel, once, Cfg::SMEM_BYTES, blocks, "moe gate_up");
  launch_kernel(moe_pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(Cfg::THREADS),
                Cfg::SMEM_BYTES, stream, x, H, gate_up, I, g, act);
}

template <class Cfg, bool WG>
void launch_down(const bf16* act, int I, const bf16* down, int H, const GroupArgs& g, int tiles,
                 float* y, cudaStream_t stream) {
  auto kernel = [] {
    if constexpr (WG)
      return moe_down_wgmma_kernel<Cfg>;
    else
      return moe_down_mma_kernel<Cfg>;
  }();
  static std::once_flag once;
  const int64_t blocks = int64_t(tiles) * ceil_div(H, Cfg::BN);
  prepare_launch(kernel, once, Cfg::SMEM_BYTES, blocks, "moe down");
  launch_kernel(moe_pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(Cfg::THREADS),
                Cfg::SMEM_BYTES, stream, act, I, down, H, g, y);
}

std::atomic<bool> g_moe_pdl{true};

void check_dims(int H, int I, const char* what) {
  if (H < 8 || I < 8 || H % 8 != 0 || I % 8 != 0)
    fail("{}: H {} and I {} must be positive multiples of 8", what, H, I);
}

// The routed tiles of r, after the shared expert's tiles when `shared` is given (its gate_up
// weights and act for gate_up, its down weights, act and output for down).
GroupArgs group_args(const MoeRouting& r, const MoeSharedPart* shared, bool down) {
  GroupArgs g{r.sorted_token, r.expert_offsets, r.tile_expert, r.tile_row0, r.num_tiles, 0, 0,
              nullptr,        nullptr,          nullptr};
  if (shared) {
    g.dense_rows = r.T;
    g.shared_tiles = ceil_div(r.T, kMoeTileRows);
    g.shared_w = down ? shared->down : shared->gate_up;
    g.shared_in = down ? shared->act : nullptr;  // gate_up: the launch's x
    g.shared_out = down ? static_cast<void*>(shared->out) : static_cast<void*>(shared->act);
  }
  return g;
}

void check_shared(const MoeSharedPart* shared, const char* what) {
  if (shared && (!shared->gate_up || !shared->down || !shared->act || !shared->out))
    fail("{}: the shared expert's part has a null pointer", what);
}

}  // namespace

void set_moe_pdl_enabled(bool on) {
  g_moe_pdl = on;
}
bool moe_pdl_enabled() {
  return g_moe_pdl;
}

void moe_grouped_gate_up(const bf16* x, int H, const bf16* gate_up, int I, const MoeRouting& r,
                         bf16* act, cudaStream_t stream, bool use_wgmma,
                         const MoeSharedPart* shared) {
  check_routing(r, "moe_grouped_gate_up");
  check_dims(H, I, "moe_grouped_gate_up");
  check_shared(shared, "moe_grouped_gate_up");
  GroupArgs g = group_args(r, shared, false);
  g.shared_in = x;
  const int tiles = g.shared_tiles + r.max_tiles;
  if (use_wgmma && device_is_sm90())
    launch_gate_up<GateUpWg, true, true>(x, H, gate_up, I, g, tiles, act, stream);
  else
    launch_gate_up<GateUpMma, true, false>(x, H, gate_up, I, g, tiles, act, stream);
}

void moe_shared_gate_up(const bf16* x, int T, int H, const bf16* shared_gate_up, int Is, bf16* act,
                        cudaStream_t stream, bool use_wgmma) {
  check_dims(H, Is, "moe_shared_gate_up");
  if (T < 1) fail("moe_shared_gate_up: T {}", T);
  const GroupArgs g{nullptr, nullptr, nullptr, nullptr, nullptr, T, 0, nullptr, nullptr, nullptr};
  const int tiles = ceil_div(T, kMoeTileRows);
  if (use_wgmma && device_is_sm90())
    launch_gate_up<GateUpWg, false, true>(x, H, shared_gate_up, Is, g, tiles, act, stream);
  else
    launch_gate_up<GateUpMma, false, false>(x, H, shared_gate_up, Is, g, tiles, act, stream);
}

void moe_grouped_down(const bf16* act, int I, const bf16* down, int H, const MoeRouting& r,
                      float* y, cudaStream_t stream, bool use_wgmma, const MoeSharedPart* shared) {
  check_routing(r, "moe_grouped_down");
  check_dims(H, I, "moe_grouped_down");
  check_shared(shared, "moe_grouped_down");
  const GroupArgs g = group_args(r, shared, true);
  const int tiles = g.shared_tiles + r.max_tiles;
  if (use_wgmma && device_is_sm90())
    launch_down<DownWg, true>(act, I, down, H, g, tiles, y, stream);
  else
    launch_down<DownMma, false>(act, I, down, H, g, tiles, y, stream);
}

__global__ void __launch_bounds__(256)
    moe_shared_swiglu_kernel(const float* __restrict__ gu, int T, int Is, bf16* __restrict__ act) {
  const int64_t n = int64_t(T) * Is;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / Is, i = e % Is;
    const float g = gu[t * 2 * Is + i], u = gu[t * 2 * Is + Is + i];
    act[e] = __float2bfloat16_rn(silu(g) * u);
  }
}

void moe_shared_swiglu(const float* gu, int T, int Is, bf16* act, cudaStream_t stream) {
  if (!gu || !act || T < 1 || Is < 1) fail("moe_shared_swiglu: bad arguments (T {}, Is {})", T, Is);
  const int64_t n = int64_t(T) * Is;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, int64_t(256)), 1024));
  moe_shared_swiglu_kernel<<<blocks, 256, 0, stream>>>(gu, T, Is, act);
  LILAC_CUDA_LAUNCHED();
}

void moe_combine(const float* y, const MoeRouting& r, const float* logits, int stride,
                 const float* shared, int H, float* h, cudaStream_t stream, const float* norm_scale,
                 bf16* norm_out, float eps, bool y_bf16) {
  check_routing(r, "moe_combine");
  if (H % 4 != 0 || stride <= r.E)
    fail("moe_combine: H {} (multiple of 4), stride {} (> E {})", H, stride, r.E);
  if (y_bf16 && (H % 8 != 0 || !is_aligned(y, 16)))
    fail("moe_combine: bf16 expert rows need H % 8 == 0 and a 16-byte aligned y (H {})", H);
  if (norm_scale && !moe_combine_norm_supported(H, h, norm_scale, norm_out))
    fail("moe_combine: the fused norm needs H % 8 == 0 and 16-byte aligned rows (H {})", H);
  static_assert(kRmsThreads == 256, "the combine's blocks run rms_norm_row");
  // The unrolled form at the model's k = 8 and H <= 2048 (two float4 columns per thread).
  const bool unrolled = r.k == 8 && H <= 2 * 256 * 4;
  auto launch = [&](auto kernel, const auto* yv) {
    launch_kernel(moe_pdl_enabled(), kernel, dim3(unsigned(r.T)), dim3(256), 0, stream, yv,
                  r.topk_weight, r.pair_position, r.k, logits, stride, r.E, shared, H, h,
                  norm_scale, norm_out, eps);
  };
  if (y_bf16) {
    const bf16* y16 = reinterpret_cast<const bf16*>(y);
    if (unrolled) return launch(moe_combine_kernel<8, 2, bf16>, y16);
    return launch(moe_combine_kernel<0, 1, bf16>, y16);
  }
  if (unrolled) return launch(moe_combine_kernel<8, 2, float>, y);
  launch(moe_combine_kernel<0, 1, float>, y);
}

bool moe_combine_norm_supported(int H, const float* h, const float* norm_scale,
                                const bf16* norm_out) {
  return H % 8 == 0 && is_aligned(h, 16) && is_aligned(norm_scale, 16) && is_aligned(norm_out, 16);
}

}  // namespace lilac::cuda
