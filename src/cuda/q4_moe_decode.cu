// MoE for one decode token over 4/8-bit experts. Real shapes: H = 2048, E = 256, k = 8,
// I = Is = 512, 4 bits (0.5625 bytes per weight).
//
// q_moe_gate_up_gemv: (k * 2I + 2Is) x H = 9216 x 2048 weights = 10.6 MB: 2.47 us at 4.3 TB/s.
//   Work unit = (expert slot j, output tile p of 16 outputs, slice of the H column sets): a warp
//   computes the gate tile p and the up tile I/16 + p of the slot's expert (q_set_dot with two
//   tiles: 16 x 16-byte code loads per lane in flight, 8 KB per warp). Units: k * I/16 + Is/16 =
//   288 tile pairs x S = 4 slices (H = 2048 is 4 sets of 512 columns) = 1152 warps in 144 blocks:
//   the whole 10.6 MB is requested at once. The slices of a pair are warps of one block; their
//   sums meet in shared memory (slice order), then 16 lanes write bf16(silu(g) * u).
//   Expert ids are read on the device (graph-safe); the grid depends on k, I, Is only.
// q_moe_down_gemv: (k + 1) x H x I = 9 x 2048 x 512 = 9.4 M weights = 5.3 MB: 1.23 us.
//   Block = one 16-row tile of h (H / 16 = 128 blocks) x (k + 1) warps: warp j computes the tile
//   of expert idx[j] (the shared expert for j = k) against act_j (I = 512: one set, 8 code loads
//   per lane); lane partials are quad-reduced, the k + 1 tile results meet in shared memory and
//   16 lanes add sum_j w_j y_j + sigmoid(logit) y_k (j ascending, shared last) into h.
// Both rely on every warp's loads being in flight together (no persistent loop): ~1150 warps x
// 4-8 KB. Deterministic: no atomics, fixed orders.
#include <algorithm>

#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int BITS>
__global__ void __launch_bounds__(kThreads)
    q_moe_gate_up_kernel(QMatrix gate_up, QMatrix shared_gate_up, const int32_t* __restrict__ idx,
                         int k, const bf16* __restrict__ x, int I, int Is, bf16* __restrict__ act,
                         int S, int sets_per_slice, const int32_t* __restrict__ order, int B) {
  __shared__ float part[kWarps][2][kQTileRows];
  // Batched: token blockIdx.y (its experts, x and act row).
  idx += blockIdx.y * k;
  x += size_t(blockIdx.y) * gate_up.cols;
  act += size_t(blockIdx.y) * (size_t(k) * I + Is);
  pdl_launch_dependents();  // PDL (launch.h): idx and x come from the previous kernels
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int P = I / kQTileRows, Ps = Is / kQTileRows;
  const int unit = blockIdx.x * (kWarps / S) + warp / S;
  const int slice = warp % S;
  // Sorted mode (order != null, B tokens in one grid row): routed slot j is the pair order[j] of
  // the B * k (token, slot) pairs sorted by expert, so the pairs of one expert are neighbours in
  // the grid and its weights come from L2 after the first; then the B tokens' shared experts.
  const int nr = order ? B * k : k, ns = order ? B : 1;
  const bool active = unit < nr * P + ns * Ps;  // warp-uniform
  const bool routed = unit < nr * P;
  const size_t A = size_t(k) * I + Is;
  // Fields selected by value (a reference to either parameter would copy both to local memory).
  const uint32_t* m_codes = routed ? gate_up.codes : shared_gate_up.codes;
  const uint32_t* m_sb = routed ? gate_up.sb : shared_gate_up.sb;
  const int G = gate_up.cols / kQGroup, sets = (G + 7) / 8;  // both have H columns
  int gate_tile = 0, up_tile = 0;
  bf16* out = act;
  if (routed) {
    const int j = unit / P, p = unit - j * P;
    const int pair = order ? order[j] : j;
    const int t = order ? pair / k : 0, slot = order ? pair - t * k : j;
    const int e = idx[pair];
    gate_tile = e * (2 * P) + p;
    up_tile = gate_tile + P;
    out = act + size_t(t) * A + size_t(slot) * I + p * kQTileRows;
    x += size_t(t) * gate_up.cols;
  } else if (active) {
    const int u = unit - nr * P, t = u / Ps, p = u - t * Ps;
    gate_tile = p;
    up_tile = p + Ps;
    out = act + size_t(t) * A + size_t(k) * I + p * kQTileRows;
    x += size_t(t) * gate_up.cols;
  }
  constexpr int PL = BITS / 4;
  float y[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  if (active) {
    const uint32_t* const codes[2] = {m_codes + size_t(gate_tile) * G * PL * kQBlockWords,
                                      m_codes + size_t(up_tile) * G * PL * kQBlockWords};
    const uint32_t* const sb[2] = {m_sb + size_t(gate_tile) * G * kQSbWords,
                                   m_sb + size_t(up_tile) * G * kQSbWords};
    const int s1 = min(sets, (slice + 1) * sets_per_slice);
    for (int set = slice * sets_per_slice; set < s1; ++set)
      qtile::q_set_dot<BITS, 2>(codes, sb, G, set, x, y);
  }
  const float g0 = qtile::quad_sum(y[0][0]), g1 = qtile::quad_sum(y[0][1]);
  const float u0 = qtile::quad_sum(y[1][0]), u1 = qtile::quad_sum(y[1][1]);
  if ((lane & 3) == 0) {
    const int r = lane >> 2;
    part[warp][0][r] = g0;
    part[warp][0][r + 8] = g1;
    part[warp][1][r] = u0;
    part[warp][1][r + 8] = u1;
  }
  __syncthreads();
  if (!active || slice != 0 || lane >= kQTileRows) return;
  float g = 0.f, u = 0.f;
  for (int s = 0; s < S; ++s) {
    g += part[warp + s][0][lane];
    u += part[warp + s][1][lane];
  }
  out[lane] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

constexpr int kDownMaxWarps = 16;

// Block = one 16-row tile of h; warp w computes the slots w, w + warps, ... (k + 1 <= 16: one
// slot per warp).
template <int BITS>
__global__ void __launch_bounds__(kDownMaxWarps * 32)
    q_moe_down_kernel(QMatrix down, QMatrix shared_down, const int32_t* __restrict__ idx,
                      const float* __restrict__ w, const float* __restrict__ shared_logit,
                      const bf16* __restrict__ act, int k, int H, int I, float* __restrict__ h,
                      int Is, int logit_stride, int token_major) {
  __shared__ float part[32][kQTileRows];
  // Batched: token blockIdx.y (its experts, weights, shared logit, act and residual rows).
  // token_major: grid (B, tiles), so the B tokens of one output tile are neighbours and share
  // the tile's shared-expert rows and common experts' rows through L2.
  const int tok = token_major ? blockIdx.x : blockIdx.y;
  const int tile = token_major ? blockIdx.y : blockIdx.x;
  idx += tok * k;
  w += tok * k;
  shared_logit += size_t(tok) * logit_stride;
  act += size_t(tok) * (size_t(k) * I + Is);
  h += size_t(tok) * H;
  pdl_launch_dependents();  // PDL (launch.h): idx, w and act come from the previous kernels
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  constexpr int PL = BITS / 4;
  for (int j = warp; j <= k; j += warps) {  // slot j (j == k: the shared expert)
    const bool routed = j < k;
    const uint32_t* m_codes = routed ? down.codes : shared_down.codes;
    const uint32_t* m_sb = routed ? down.sb : shared_down.sb;
    const int G = (routed ? down.cols : shared_down.cols) / kQGroup, sets = (G + 7) / 8;
    const int mt = routed ? idx[j] * (H / kQTileRows) + tile : tile;
    const uint32_t* const codes[1] = {m_codes + size_t(mt) * G * PL * kQBlockWords};
    const uint32_t* const sb[1] = {m_sb + size_t(mt) * G * kQSbWords};
    const bf16* x = act + size_t(j) * I;
    float y[1][2] = {{0.f, 0.f}};
    for (int set = 0; set < sets; ++set) qtile::q_set_dot<BITS, 1>(codes, sb, G, set, x, y);
    const float r0 = qtile::quad_sum(y[0][0]), r1 = qtile::quad_sum(y[0][1]);
    if ((lane & 3) == 0) {
      part[j][lane >> 2] = r0;
      part[j][(lane >> 2) + 8] = r1;
    }
  }
  __syncthreads();
  if (warp != 0 || lane >= kQTileRows) return;
  const int c = tile * kQTileRows + lane;
  if (c >= H) return;
  float acc = 0.f;
  for (int s = 0; s < k; ++s) acc = fmaf(w[s], part[s][lane], acc);
  acc = fmaf(1.f / (1.f + expf(-*shared_logit)), part[k][lane], acc);
  h[c] += acc;
}

void check_matrix(const char* what, const QMatrix& m, int rows, int cols) {
  if (!m || !m.sb) fail("cuda::{}: null weights", what);
  if (m.rows != rows || m.cols != cols || (m.bits != 4 && m.bits != 8))
    fail("cuda::{}: weights [{}, {}] at {} bits, expected [{}, {}] at 4 or 8 bits", what, m.rows,
         m.cols, m.bits, rows, cols);
}

void check_dims(const char* what, int k, int H, int I, int Is) {
  if (k < 1 || k > 31 || H < 64 || H % 64 || I < 64 || I % 64 || Is < 64 || Is % 64)
    fail("cuda::{}: unsupported k={} H={} I={} Is={} (k <= 31; H, I, Is multiples of 64)", what, k,
         H, I, Is);
}

}  // namespace

void q_moe_gate_up_gemv(const QMatrix& gate_up, const QMatrix& shared_gate_up, const int32_t* idx,
                        int k, const bf16* x, int H, int I, int Is, bf16* act, cudaStream_t stream,
                        int B, const int32_t* order) {
  if (!idx || !x || !act) fail("cuda::q_moe_gate_up_gemv: null pointer");
  if (B < 1 || B > 65535) fail("cuda::q_moe_gate_up_gemv: B = {}", B);
  check_dims("q_moe_gate_up_gemv", k, H, I, Is);
  if (gate_up.rows % (2 * I) != 0) fail("cuda::q_moe_gate_up_gemv: gate_up rows {}", gate_up.rows);
  check_matrix("q_moe_gate_up_gemv", gate_up, gate_up.rows, H);
  check_matrix("q_moe_gate_up_gemv", shared_gate_up, 2 * Is, H);
  if (gate_up.bits != shared_gate_up.bits)
    fail("cuda::q_moe_gate_up_gemv: experts at {} bits, shared expert at {}", gate_up.bits,
         shared_gate_up.bits);
  const int units =
      order ? B * (k * (I / kQTileRows) + Is / kQTileRows) : k * (I / kQTileRows) + Is / kQTileRows;
  const int grid_y = order ? 1 : B;
  const int sets = (H / kQGroup + 7) / 8;
  int S = 1;
  while (S < kWarps && S < sets && (long long)units * grid_y * S < 8LL * sm_count()) S *= 2;
  const int sps = (sets + S - 1) / S;
  const int grid = ceil_div(units, kWarps / S);
  launch_kernel(true, gate_up.bits == 4 ? q_moe_gate_up_kernel<4> : q_moe_gate_up_kernel<8>,
                dim3(grid, grid_y), dim3(kThreads), 0, stream, gate_up, shared_gate_up, idx, k, x,
                I, Is, act, S, sps, order, B);
}

void q_moe_down_gemv(const QMatrix& down, const QMatrix& shared_down, const int32_t* idx,
                     const float* w, const float* shared_logit, const bf16* act, int k, int H,
                     int I, int Is, float* h, cudaStream_t stream, int B, int logit_stride) {
  if (!idx || !w || !shared_logit || !act || !h) fail("cuda::q_moe_down_gemv: null pointer");
  if (B < 1 || B > 65535) fail("cuda::q_moe_down_gemv: B = {}", B);
  check_dims("q_moe_down_gemv", k, H, I, Is);
  if (down.rows % H != 0) fail("cuda::q_moe_down_gemv: down rows {}", down.rows);
  check_matrix("q_moe_down_gemv", down, down.rows, I);
  check_matrix("q_moe_down_gemv", shared_down, H, Is);
  if (down.bits != shared_down.bits)
    fail("cuda::q_moe_down_gemv: experts at {} bits, shared expert at {}", down.bits,
         shared_down.bits);
  const int grid = H / kQTileRows, threads = 32 * std::min(k + 1, kDownMaxWarps);
  // From 32 tokens on (at 2-16 the two grids measured the same: runs 7 and 8).
  const bool token_major = B >= 32;
  launch_kernel(true, down.bits == 4 ? q_moe_down_kernel<4> : q_moe_down_kernel<8>,
                token_major ? dim3(B, grid) : dim3(grid, B), dim3(threads), 0, stream, down,
                shared_down, idx, w, shared_logit, act, k, H, I, h, Is, logit_stride,
                token_major ? 1 : 0);
}

}  // namespace lilac::cuda
