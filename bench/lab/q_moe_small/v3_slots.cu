// Kernel lab q_moe_small version 3 (s22): production's register gate_up kernel
// (src/cuda/q4_moe_small.cu, q_moe_small_gate_up_kernel; lab version 1) with the weights of a
// warp's next set copied by cp.async into a private shared-memory slot while the warp computes the
// current set from its slot.
//
// Why (s22 run 10, ncu of the 16-row pass): version 1 loads a set (4 groups of its gate and up
// tiles: 4 KB of codes + 512 B of scales per warp) into registers, waits, computes, then loads the
// next: 31% of the stall samples sit on the first read of a set's codes, with ~13 warps per SM
// and at most one set per warp in flight, only while the warp waits (DRAM at 51%). Here each warp
// keeps SLOTS - 1 sets in flight all the time, in shared memory rather than registers. Shared
// memory per block: the pass's staged x (8 x (H + 8) bf16: 32.9 KB at H = 2048) + 4 warps x SLOTS
// x 4,608 B: SLOTS 2 -> 69.8 KB (3 blocks per SM), 3 -> 88.3 KB (2 blocks per SM).
// Arithmetic: the same QSet values and q_group_dot calls as version 1 (bit-identical act).
//
// Slot layout (bytes): codes [tile nt < 2][group m < 4][512] (lane l's 16 bytes at 16 l: what
// load_qset gives lane l), then scale/bias [nt][m][64] (lane (g, t) reads 8 bytes at 8 g).
#include <algorithm>

#include "cuda/q4_moe_small.cuh"
#include "cuda/q4_tile.cuh"
#include "q_moe_small_lab.h"
#include "util/error.h"

namespace lilac::lab {
namespace {

using namespace cuda::qmoe_small;
using cuda::bf16;
using cuda::QMatrix;

constexpr int kSetGroups = kGateUpSet;                        // 4 groups per set
constexpr int kCodeBytes = 2 * kSetGroups * 512;              // 4,096
constexpr int kSlotBytes = kCodeBytes + 2 * kSetGroups * 64;  // + 512 of scale/bias

__device__ __forceinline__ void cp16(unsigned char* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// This lane's copies of set `set` (groups 4 set .. + ng - 1 of both tiles) into `slot`: one
// 16-byte piece of codes per (tile, group), and piece (lane & 3) of (tile, group) = lane >> 2's
// 64 bytes of scale/bias.
__device__ __forceinline__ void issue_set(unsigned char* slot, const uint32_t* const (&codes)[2],
                                          const uint32_t* const (&sb)[2], int G, int set) {
  const int lane = threadIdx.x & 31, grp0 = set * kSetGroups, ng = min(kSetGroups, G - grp0);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int m = 0; m < kSetGroups; ++m)
      if (m < ng)
        cp16(slot + (nt * kSetGroups + m) * 512 + lane * 16,
             codes[nt] + size_t(grp0 + m) * cuda::kQBlockWords + lane * 4);
  const int nt = lane >> 4, m = (lane >> 2) & 3, piece = lane & 3;
  if (m < ng)
    cp16(slot + kCodeBytes + (nt * kSetGroups + m) * 64 + piece * 16,
         sb[nt] + size_t(grp0 + m) * cuda::kQSbWords + piece * 4);
}

// The dot products of one slot (NT tiles x GS groups: codes [nt GS + m][512], then scale/bias
// [nt GS + m][64]; groups grp0 + m, m < ng) against the staged x row of this lane's token g (xr:
// 32-bit words; zeros when !has): the QSet version 1 loads into registers, read from the slot, and
// the same q_group_dot calls.
template <int NT, int GS>
__device__ __forceinline__ void slot_dot(const unsigned char* slot, int grp0, int ng,
                                         const uint32_t* xr, bool has, float (&y)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  cuda::qtile::QSet<4, NT, GS> w;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < GS; ++m) {
      const int i = nt * GS + m;
      w.cw[nt][m][0] = m < ng ? *reinterpret_cast<const uint4*>(slot + i * 512 + lane * 16)
                              : make_uint4(0, 0, 0, 0);
      w.sbv[nt][m] = m < ng ? *reinterpret_cast<const uint2*>(slot + kCodeBytes + i * 64 + g * 8)
                            : make_uint2(0, 0);
    }
  // The dots as set_dot_staged (q4_moe_small.cu) does them after its load_qset; a copy, so that
  // production's compiled code stays what the GPU tests ran (a shared helper moved its address
  // arithmetic in the PTX).
  const int t = lane & 3;
#pragma unroll
  for (int m = 0; m < GS; ++m) {
    if (m >= ng) continue;  // warp-uniform
    uint32_t X[4][2];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      X[kb][0] = has ? xr[(grp0 + m) * 32 + 8 * kb + t] : 0u;
      X[kb][1] = has ? xr[(grp0 + m) * 32 + 8 * kb + t + 4] : 0u;
    }
    cuda::qtile::q_group_dot(w, m, X, y);
  }
}

// Sets the kernel's shared memory and launches it on production's grid (x: routed tiles and the
// shared expert's blocks, y: grid_y, z: passes).
template <class Kernel, class... Args>
void launch_on_grid(Kernel fn, size_t smem, unsigned grid_y, const cuda::MoeRouting& r,
                    cudaStream_t stream, Args... args) {
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int Z = grid_passes(r.T, r.E, r.k);
  fn<<<dim3(grid_x(r, Z), grid_y, unsigned(Z)), kThreads, smem, stream>>>(args...);
  LILAC_CUDA_LAUNCHED();
}

template <int SLOTS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    gate_up_slots_kernel(const bf16* __restrict__ x, int H, QMatrix gate_up, int I,
                         QMatrix shared_gate_up, int Is, Tiles tiles,
                         const int32_t* __restrict__ sorted_token, int E, int T,
                         bf16* __restrict__ act, bf16* __restrict__ shared_act) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  unsigned char* slots = smem + staged_x_bytes(H) + size_t(warp) * SLOTS * kSlotBytes;
  const int G = H / cuda::kQGroup, nsets = (G + kSetGroups - 1) / kSetGroups;
  const int stride = (H + kXPad) / 2;  // staged x row in 32-bit words
  Segment seg;
  for (PassIter it(tiles, E, T); it.segment(seg); it.pass += it.step) {
    const bool shared = it.e == E;
    const uint32_t* const wc = shared ? shared_gate_up.codes : gate_up.codes;
    const uint32_t* const ws = shared ? shared_gate_up.sb : gate_up.sb;
    const int n = shared ? Is : I;
    const int P = n / cuda::kQTileRows;
    const int p = int(blockIdx.y) * kWarps + warp;
    const bool active = p < P;  // warp-uniform
    const int gate_tile = (shared ? 0 : it.e * 2 * P) + (active ? p : 0);
    const uint32_t* const codes[2] = {wc + size_t(gate_tile) * G * cuda::kQBlockWords,
                                      wc + size_t(gate_tile + P) * G * cuda::kQBlockWords};
    const uint32_t* const sb[2] = {ws + size_t(gate_tile) * G * cuda::kQSbWords,
                                   ws + size_t(gate_tile + P) * G * cuda::kQSbWords};
    // Groups committed in order: x, then sets 0 .. SLOTS - 2 (one group each, empty when
    // inactive or past the sets), so that waiting for x leaves the sets in flight.
    issue_x(x, H, shared ? nullptr : sorted_token, seg, xs);
    commit();
#pragma unroll
    for (int s = 0; s + 1 < SLOTS; ++s) {
      if (active && s < nsets) issue_set(slots + s * kSlotBytes, codes, sb, G, s);
      commit();
    }
    wait_groups<SLOTS - 1>();
    __syncthreads();  // the staged x visible to every warp
    float y[2][4] = {};
    if (active) {
      const uint32_t* xr = reinterpret_cast<const uint32_t*>(xs) + g * stride;
      const bool has = g < seg.count;
      for (int set = 0; set < nsets; ++set) {
        __syncwarp();  // every lane is done reading the slot refilled next (set - 1's)
        if (set + SLOTS - 1 < nsets)
          issue_set(slots + ((set + SLOTS - 1) % SLOTS) * kSlotBytes, codes, sb, G,
                    set + SLOTS - 1);
        commit();
        wait_groups<SLOTS - 1>();  // this lane's copies of set `set` landed
        __syncwarp();              // ... and every lane's (scale/bias pieces are read across lanes)
        const int grp0 = set * kSetGroups;
        slot_dot<2, kSetGroups>(slots + (set % SLOTS) * kSlotBytes, grp0, min(kSetGroups, G - grp0),
                                xr, has, y);
      }
      bf16* out = shared ? shared_act : act;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int i = p * cuda::kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(n) + i] =
            __float2bfloat16_rn(cuda::silu(y[0][q]) * y[1][q]);
      }
    }
    wait_groups<0>();
    __syncthreads();  // the staged x and the slots are re-used by the next pass
  }
}

template <int SLOTS, int MINB>
void launch(const bf16* x, int T, int H, const QMatrix& gate_up, int I,
            const QMatrix& shared_gate_up, int Is, const cuda::MoeRouting& r, bf16* act,
            bf16* shared_act, cudaStream_t stream) {
  launch_on_grid(
      gate_up_slots_kernel<SLOTS, MINB>, staged_x_bytes(H) + size_t(kWarps) * SLOTS * kSlotBytes,
      unsigned(cuda::ceil_div(std::max(I, Is) / cuda::kQTileRows, kWarps)), r, stream, x, H,
      gate_up, I, shared_gate_up, Is, tiles_of(r), r.sorted_token, r.E, T, act, shared_act);
}

// Version 5's down kernel: production's register down kernel (J output tiles per warp, one
// after another; K = 512: a tile's 8 groups are one set) with tile j + SLOTS - 1's weights copied
// into the warp's slot while tile j is computed. Slot layout: codes [group m < 8][512], then
// scale/bias [m][64].
constexpr int kDownGroups = 8;
static_assert(kDownGroups * (512 + 64) == kSlotBytes, "a down tile fills one slot");

__device__ __forceinline__ void issue_tile(unsigned char* slot, const uint32_t* codes,
                                           const uint32_t* sb, int G) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kDownGroups; ++m)
    if (m < G) cp16(slot + m * 512 + lane * 16, codes + size_t(m) * cuda::kQBlockWords + lane * 4);
  const int m = lane >> 2, piece = lane & 3;
  if (m < G)
    cp16(slot + kCodeBytes + m * 64 + piece * 16, sb + size_t(m) * cuda::kQSbWords + piece * 4);
}

template <int SLOTS, int J, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    down_slots_kernel(const bf16* __restrict__ act, int I, const bf16* __restrict__ shared_act,
                      int Is, QMatrix down, QMatrix shared_down, int H, Tiles tiles, int E, int T,
                      float* __restrict__ y, float* __restrict__ shared_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int TH = H / cuda::kQTileRows;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  unsigned char* slots = smem + staged_x_bytes(max(I, Is)) + size_t(warp) * SLOTS * kSlotBytes;
  Segment seg;
  for (PassIter it(tiles, E, T); it.segment(seg); it.pass += it.step) {
    const bool shared = it.e == E;
    const int K = shared ? Is : I, G = K / cuda::kQGroup;
    const uint32_t* const wc = shared ? shared_down.codes : down.codes;
    const uint32_t* const ws = shared ? shared_down.sb : down.sb;
    const int base = shared ? 0 : it.e * TH;
    auto th_of = [&](int j) { return (int(blockIdx.y) * J + j) * kWarps + warp; };
    auto issue = [&](int j) {
      const int tile = base + th_of(j);
      issue_tile(slots + (j % SLOTS) * kSlotBytes, wc + size_t(tile) * G * cuda::kQBlockWords,
                 ws + size_t(tile) * G * cuda::kQSbWords, G);
    };
    issue_x(shared ? shared_act : act, K, nullptr, seg, xs);
    commit();
#pragma unroll
    for (int s = 0; s + 1 < SLOTS; ++s) {
      if (s < J && th_of(s) < TH) issue(s);
      commit();
    }
    wait_groups<SLOTS - 1>();
    __syncthreads();  // the staged x visible to every warp
    const int stride = (K + kXPad) / 2;
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(xs) + g * stride;
    const bool has = g < seg.count;
#pragma unroll 1
    for (int j = 0; j < J; ++j) {
      const int th = th_of(j);
      if (th >= TH) break;  // warp-uniform
      __syncwarp();         // every lane is done reading the slot refilled next (tile j - 1's)
      if (j + SLOTS - 1 < J && th_of(j + SLOTS - 1) < TH) issue(j + SLOTS - 1);
      commit();
      wait_groups<SLOTS - 1>();  // this lane's copies of tile j landed
      __syncwarp();              // ... and every lane's
      float acc[1][4] = {};
      slot_dot<1, kDownGroups>(slots + (j % SLOTS) * kSlotBytes, 0, G, xr, has, acc);
      float* out = shared ? shared_out : y;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t + (q & 1);
        if (tok >= seg.count) continue;
        const int c = th * cuda::kQTileRows + g + (q < 2 ? 0 : 8);
        out[size_t(seg.row0 + tok) * size_t(H) + c] = acc[0][q];
      }
    }
    wait_groups<0>();
    __syncthreads();  // the staged x and the slots are re-used by the next pass
  }
}

}  // namespace

void q_moe_small_gate_up_slots(int slots, const bf16* x, int T, int H, const QMatrix& gate_up,
                               int I, const QMatrix& shared_gate_up, int Is,
                               const cuda::MoeRouting& r, bf16* act, bf16* shared_act,
                               cudaStream_t stream) {
  if (gate_up.bits != 4 || shared_gate_up.bits != 4 || H % (cuda::kQGroup * kSetGroups) != 0)
    fail("lab q_moe_small v3: 4-bit weights, H a multiple of 256");
  if (slots == 2)
    return launch<2, 3>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
  if (slots == 3)
    return launch<3, 2>(x, T, H, gate_up, I, shared_gate_up, Is, r, act, shared_act, stream);
  fail("lab q_moe_small v3: {} slots (2 or 3)", slots);
}

void q_moe_small_down_slots(const bf16* act, int I, const bf16* shared_act, int Is,
                            const QMatrix& down, const QMatrix& shared_down, int H,
                            const cuda::MoeRouting& r, float* y, float* shared_out,
                            cudaStream_t stream) {
  if (down.bits != 4 || shared_down.bits != 4 || I > 512 || Is > 512 || I % cuda::kQGroup ||
      Is % cuda::kQGroup)
    fail("lab q_moe_small v5: 4-bit weights, I and Is multiples of 64 up to 512");
  constexpr int J = 4;
  launch_on_grid(down_slots_kernel<2, J, 4>,
                 staged_x_bytes(std::max(I, Is)) + size_t(kWarps) * 2 * kSlotBytes,
                 unsigned(cuda::ceil_div(H / cuda::kQTileRows, kWarps * J)), r, stream, act, I,
                 shared_act, Is, down, shared_down, H, tiles_of(r), r.E, r.T, y, shared_out);
}

}  // namespace lilac::lab
