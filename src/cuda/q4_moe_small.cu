// Small-M MoE over 4/8-bit experts: batched decode (B = 2..64 rows) and short prompts, where each
// touched expert sees a few tokens (B k / E: 0.5 at 16 rows, 2 at 64, 8 at a 256-token chunk).
//
// Why (docs/kernels.md, version 5): the decode MoE kernels read the experts per token (at 16 rows,
// 128 expert reads for ~100 distinct experts), and the prefill kernels read each expert once but
// in 128-token tiles, one 256-thread block per 256 rows, dequantising and streaming 128 token
// rows for ~8 real ones. Here the unit of work is a warp on one 16-row weight tile of one expert,
// and the tokens of that expert take the MMA's n dimension in chunks of 8 (q4_tile.cuh's
// q_set_dot_tokens): the weights are read once per step at the rate of many independent warps,
// and the MMAs grow with ceil(m_e / 8).
//
// Bytes per touched expert: (2I x H + H x I) x 4.5 / 8 = 1.77 MB at I = 512, H = 2048; per layer
// ~100 / 221 / 256 touched experts at 16 / 64 rows / 256 prompt tokens (uniform router).
//
// Grid: x = expert (E routed + 1: the shared expert as expert E, every token, dense rows),
// y = 4 output tiles per block (one per warp), z = pass of 32 tokens (kChunks chunks of 8; the
// grid is sized for T tokens per expert, the bound, and blocks past an expert's tokens exit at
// once, so the host needs no counts). gate_up: the warp holds the gate tile p and the up tile
// P + p of its expert (x loaded once for both) and writes act = bf16(silu(g) u) directly; down:
// one 16-row tile of down_e per warp against the expert's act rows (contiguous sorted rows).
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/q4_moe.h"
#include "cuda/q4_tile.cuh"
#include "util/error.h"

namespace lilac::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = 4;                // token chunks of 8 per pass
constexpr int kPassTokens = 8 * kChunks;  // 32
// Groups per set: the registers a set holds (its codes, scales and a chunk's x) bound the warps
// an SM keeps in flight. Run 3 (docs/kernels.md): the down kernel with sets of 8 (~150
// registers, 3 blocks per SM) moved 1.3 TB/s.
constexpr int kGateUpSet = 4;  // two tiles per warp
constexpr int kDownSet = 4;
constexpr int kMinBlocks = 4;  // per SM: at most 128 registers per thread

struct Segment {
  int row0, count;  // the pass's first sorted row (or token) and its tokens (<= kPassTokens)
};

// The pass's tokens of block (blockIdx.x, blockIdx.z): routed expert e's sorted rows, or the
// shared expert's tokens (e == E). False when the pass is past the expert's tokens.
__device__ __forceinline__ bool segment(const int32_t* __restrict__ offsets, int E, int T,
                                        Segment& s) {
  const int e = blockIdx.x;
  int row0 = 0, m = T;
  if (e < E) {
    row0 = offsets[e];
    m = offsets[e + 1] - row0;
  }
  const int base = blockIdx.z * kPassTokens;
  if (base >= m) return false;
  s.row0 = row0 + base;
  s.count = min(kPassTokens, m - base);
  return true;
}

template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    q_moe_small_gate_up_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I,
                               QMatrix shared_gate_up, int Is, const int32_t* __restrict__ offsets,
                               const int32_t* __restrict__ sorted_token, int E, int T,
                               bf16* __restrict__ act, bf16* __restrict__ shared_act) {
  Segment seg;
  if (!segment(offsets, E, T, seg)) return;
  const bool shared = int(blockIdx.x) == E;
  const QMatrix& W = shared ? shared_gate_up : gate_up;
  const int n = shared ? Is : I;  // outputs per token
  const int P = n / kQTileRows;   // output tiles
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int p = blockIdx.y * kWarps + warp;
  if (p >= P) return;  // warp-uniform; no block synchronisation below
  const int G = H / kQGroup;
  constexpr int PL = BITS / 4;
  const int gate_tile = (shared ? 0 : int(blockIdx.x) * 2 * P) + p;
  const uint32_t* const codes[2] = {W.codes + size_t(gate_tile) * G * PL * kQBlockWords,
                                    W.codes + size_t(gate_tile + P) * G * PL * kQBlockWords};
  const uint32_t* const sb[2] = {W.sb + size_t(gate_tile) * G * kQSbWords,
                                 W.sb + size_t(gate_tile + P) * G * kQSbWords};
  const qtile::TokenRows rows{shared ? nullptr : sorted_token, seg.row0, seg.count};
  float y[2][kChunks][4] = {};
  for (int set = 0; set * kGateUpSet < G; ++set)
    qtile::q_set_dot_tokens<BITS, 2, kChunks, kGateUpSet>(codes, sb, G, set, x, H, rows, y);
  bf16* out = shared ? shared_act : act;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = ch * 8 + 2 * t + (q & 1);
      if (tok >= seg.count) continue;
      const int i = p * kQTileRows + g + (q < 2 ? 0 : 8);
      out[size_t(seg.row0 + tok) * size_t(n) + i] =
          __float2bfloat16_rn(silu(y[0][ch][q]) * y[1][ch][q]);
    }
}

template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    q_moe_small_down_kernel(const bf16* __restrict__ act, int I,
                            const bf16* __restrict__ shared_act, int Is, QMatrix down,
                            QMatrix shared_down, int H, const int32_t* __restrict__ offsets, int E,
                            int T, float* __restrict__ y, float* __restrict__ shared_out) {
  Segment seg;
  if (!segment(offsets, E, T, seg)) return;
  const bool shared = int(blockIdx.x) == E;
  const QMatrix& W = shared ? shared_down : down;
  const int K = shared ? Is : I;
  const int TH = H / kQTileRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int th = blockIdx.y * kWarps + warp;
  if (th >= TH) return;
  const int G = K / kQGroup;
  constexpr int PL = BITS / 4;
  const int tile = (shared ? 0 : int(blockIdx.x) * TH) + th;
  const uint32_t* const codes[1] = {W.codes + size_t(tile) * G * PL * kQBlockWords};
  const uint32_t* const sb[1] = {W.sb + size_t(tile) * G * kQSbWords};
  const qtile::TokenRows rows{nullptr, seg.row0, seg.count};
  float acc[1][kChunks][4] = {};
  for (int set = 0; set * kDownSet < G; ++set)
    qtile::q_set_dot_tokens<BITS, 1, kChunks, kDownSet>(codes, sb, G, set,
                                                        shared ? shared_act : act, K, rows, acc);
  float* out = shared ? shared_out : y;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = ch * 8 + 2 * t + (q & 1);
      if (tok >= seg.count) continue;
      const int c = th * kQTileRows + g + (q < 2 ? 0 : 8);
      out[size_t(seg.row0 + tok) * size_t(H) + c] = acc[0][ch][q];
    }
}

void check_sizes(const char* what, const MoeRouting& r, int H, int I, int Is) {
  if (!r.expert_offsets || !r.sorted_token || r.T < 1 || r.E < 1)
    fail("cuda::{}: routing workspace not laid out", what);
  if (H < 64 || H % 64 || I < 64 || I % 64 || Is < 64 || Is % 64)
    fail("cuda::{}: H {}, I {} and Is {} must be positive multiples of 64", what, H, I, Is);
  if (int64_t(r.T) > 65535LL * kPassTokens) fail("cuda::{}: {} tokens", what, r.T);
}

void check_matrix(const char* what, const QMatrix& m, int64_t rows, int cols, int bits) {
  if (!m || !m.sb) fail("cuda::{}: null weights", what);
  if (m.rows != rows || m.cols != cols || m.bits != bits)
    fail("cuda::{}: weights [{}, {}] at {} bits, expected [{}, {}] at {}", what, m.rows, m.cols,
         m.bits, rows, cols, bits);
}

}  // namespace

bool q_moe_small_supported(const QMatrix& gate_up, const QMatrix& down,
                           const QMatrix& shared_gate_up, const QMatrix& shared_down) {
  const int b = gate_up.bits;
  return gate_up && down && shared_gate_up && shared_down && (b == 4 || b == 8) && down.bits == b &&
         shared_gate_up.bits == b && shared_down.bits == b;
}

void q_moe_small_gate_up(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
                         const QMatrix& shared_gate_up, int Is, const MoeRouting& r, bf16* act,
                         bf16* shared_act, cudaStream_t stream) {
  check_sizes("q_moe_small_gate_up", r, H, I, Is);
  if (T != r.T) fail("cuda::q_moe_small_gate_up: {} tokens, routing laid out for {}", T, r.T);
  const int bits = gate_up.bits;
  check_matrix("q_moe_small_gate_up", gate_up, int64_t(r.E) * 2 * I, H, bits);
  check_matrix("q_moe_small_gate_up (shared)", shared_gate_up, 2 * Is, H, bits);
  if (!x || !act || !shared_act) fail("cuda::q_moe_small_gate_up: null pointer");
  const dim3 grid(unsigned(r.E + 1), unsigned(ceil_div(std::max(I, Is) / kQTileRows, kWarps)),
                  unsigned(ceil_div(T, kPassTokens)));
  if (bits == 4)
    q_moe_small_gate_up_kernel<4>
        <<<grid, kThreads, 0, stream>>>(x, H, gate_up, I, shared_gate_up, Is, r.expert_offsets,
                                        r.sorted_token, r.E, T, act, shared_act);
  else if (bits == 8)
    q_moe_small_gate_up_kernel<8>
        <<<grid, kThreads, 0, stream>>>(x, H, gate_up, I, shared_gate_up, Is, r.expert_offsets,
                                        r.sorted_token, r.E, T, act, shared_act);
  else
    fail("cuda::q_moe_small_gate_up: {} bits", bits);
  LILAC_CUDA_LAUNCHED();
}

void q_moe_small_down(const bf16* act, int I, const bf16* shared_act, int Is, const QMatrix& down,
                      const QMatrix& shared_down, int H, const MoeRouting& r, float* y,
                      float* shared_out, cudaStream_t stream) {
  check_sizes("q_moe_small_down", r, H, I, Is);
  const int bits = down.bits;
  check_matrix("q_moe_small_down", down, int64_t(r.E) * H, I, bits);
  check_matrix("q_moe_small_down (shared)", shared_down, H, Is, bits);
  if (!act || !shared_act || !y || !shared_out) fail("cuda::q_moe_small_down: null pointer");
  const dim3 grid(unsigned(r.E + 1), unsigned(ceil_div(H / kQTileRows, kWarps)),
                  unsigned(ceil_div(r.T, kPassTokens)));
  if (bits == 4)
    q_moe_small_down_kernel<4><<<grid, kThreads, 0, stream>>>(
        act, I, shared_act, Is, down, shared_down, H, r.expert_offsets, r.E, r.T, y, shared_out);
  else if (bits == 8)
    q_moe_small_down_kernel<8><<<grid, kThreads, 0, stream>>>(
        act, I, shared_act, Is, down, shared_down, H, r.expert_offsets, r.E, r.T, y, shared_out);
  else
    fail("cuda::q_moe_small_down: {} bits", bits);
  LILAC_CUDA_LAUNCHED();
}

}  // namespace lilac::cuda
