// The parts the two realisations of cuda::sample share (sampling.cu: the general path of ten
// launches; sampling_topk.cu: the small top_k path of three): block reductions, the workspace
// layout, the tiles' partials, and the two ends of the finish kernel (greedy token and raw
// log-sum-exp from the partials; top_logprobs, result and the `advance` update). Included by those
// two .cu files only.
#pragma once

#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "cuda/sampling.h"
#include "cuda/vec_util.cuh"
#include "model/sampling_core.h"

namespace lilac::cuda::sampler {

constexpr unsigned kFull = 0xffffffffu;

// ---- block reductions
// ----------------------------------------------------------------------------

// The order of logits and candidates: value descending, then id ascending. No NaN reaches here.
__device__ __forceinline__ bool better(float v, int id, float bv, int bid) {
  return v > bv || (v == bv && id < bid);
}

__device__ __forceinline__ void warp_argmax(float& v, int& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oid = __shfl_xor_sync(kFull, id, o);
    if (better(ov, oid, v, id)) v = ov, id = oid;
  }
}

// Every thread gets the block's best (v, id). sv, sid: 32 entries of shared memory.
__device__ inline void block_argmax(float& v, int& id, float* sv, int* sid) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_argmax(v, id);
  __syncthreads();
  if (lane == 0) sv[warp] = v, sid[warp] = id;
  __syncthreads();
  v = lane < nw ? sv[lane] : -INFINITY;
  id = lane < nw ? sid[lane] : INT_MAX;
  warp_argmax(v, id);
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < nw ? scratch[lane] : -INFINITY);
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ inline unsigned long long block_sum_u64(unsigned long long v,
                                                   unsigned long long* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum_u64(lane < nw ? scratch[lane] : 0ull);
}

// Inclusive prefix sum over the block in thread order.
__device__ inline unsigned long long block_scan_u64(unsigned long long v,
                                                    unsigned long long* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    unsigned long long s = lane < nw ? scratch[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_up_sync(kFull, s, o);
      if (lane >= o) s += t;
    }
    if (lane < nw) scratch[lane] = s;
  }
  __syncthreads();
  return warp > 0 ? v + scratch[warp - 1] : v;
}

// ---- sampler workspace -------------------------------------------------------------------------

constexpr int kTile = 1024;        // ids per block of the passes
constexpr int kPassThreads = 256;  // 4 ids per thread, strided by 256 (coalesced)
constexpr int kPer = kTile / kPassThreads;
constexpr int kFinishThreads = 1024;
constexpr int kBins = 256;
constexpr int kSlots =
    7;  // histogram slots: 0 = digit 0 (both searches), 1-3 = k digits 1-3, 4-6 = p digits 1-3
constexpr int kMaxN = kTile * kFinishThreads;

struct Part {
  float ymax;   // max of x' / T
  float xbest;  // max of x' and its lowest id (greedy)
  int32_t xarg;
  float raw_max;  // max raw logit and sum exp(raw - raw_max) (log-sum-exp)
  float raw_sum;
};

struct Cand {
  float v;
  int32_t id;  // INT_MAX: none
};

// A radix search after d digits: the prefix (d digits of 8 bits), count and mass of the elements
// above it, the target (count or mass) and whether the search runs.
struct SearchState {
  unsigned long long ma;
  unsigned long long target;
  unsigned int prefix;
  unsigned int ca;
  int active;
  int reserved;
};

struct Ws {
  float* e;                   // [nb * kTile]: y, then e
  Part* part;                 // [nb]
  Cand* cand;                 // [nb * kMaxTopLogprobs]
  unsigned int* hcnt;         // [kSlots * kBins]
  unsigned long long* hmass;  // [kSlots * kBins]
  unsigned long long* minp_mass;
  unsigned int* minp_count;
  SearchState* st;                // [2 searches][4 digits]
  unsigned long long* walk_mass;  // [nb]
  unsigned int* walk_ties;        // [nb]
  unsigned long long* topk;       // [nb * kSmallTopK] the small top_k path's tile lists (topk_key)
  int n;
  int nb;
};

inline size_t align256(size_t x) {
  return (x + 255) & ~size_t(255);
}

// Places the workspace's arrays at `base` (null: sizes only); returns the total size.
inline size_t layout(int n, char* base, Ws* ws) {
  const int nb = ceil_div(n, kTile);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* at = base ? base + off : nullptr;
    off = align256(off + bytes);
    return at;
  };
  Ws w;
  w.e = reinterpret_cast<float*>(take(size_t(nb) * kTile * 4));
  w.part = reinterpret_cast<Part*>(take(size_t(nb) * sizeof(Part)));
  w.cand = reinterpret_cast<Cand*>(take(size_t(nb) * kMaxTopLogprobs * sizeof(Cand)));
  w.hcnt = reinterpret_cast<unsigned int*>(take(kSlots * kBins * 4));
  w.hmass = reinterpret_cast<unsigned long long*>(take(kSlots * kBins * 8));
  w.minp_mass = reinterpret_cast<unsigned long long*>(take(8));
  w.minp_count = reinterpret_cast<unsigned int*>(take(4));
  w.st = reinterpret_cast<SearchState*>(take(2 * 4 * sizeof(SearchState)));
  w.walk_mass = reinterpret_cast<unsigned long long*>(take(size_t(nb) * 8));
  w.walk_ties = reinterpret_cast<unsigned int*>(take(size_t(nb) * 4));
  w.topk = reinterpret_cast<unsigned long long*>(take(size_t(nb) * kSmallTopK * 8));
  w.n = n;
  w.nb = nb;
  if (ws) *ws = w;
  return off;
}

__device__ __forceinline__ bool is_greedy(const DeviceSamplingParams& P) {
  return P.temperature <= 0.f || P.top_k == 1;
}

// ---- the finish kernels' two ends (one block of kFinishThreads; nb <= kFinishThreads) ----------

// The greedy token (argmax of x', lowest id on ties; 0 if every x' is NaN) into *greedy_token and
// the raw log-sum-exp as the result, from the tiles' partials; every thread gets both.
__device__ inline float finish_partials(const Ws& ws, float* sv, int* sid, int* greedy_token) {
  const int t = threadIdx.x;
  const Part pt = t < ws.nb ? ws.part[t] : Part{-INFINITY, -INFINITY, INT_MAX, -INFINITY, 0.f};
  float gv = pt.xbest;
  int gi = pt.xarg;
  block_argmax(gv, gi, sv, sid);
  const float M = block_max(pt.raw_max, sv);
  float s = pt.raw_max > -INFINITY ? pt.raw_sum * expf(pt.raw_max - M) : 0.f;
  s = block_sum(s, sv);
  *greedy_token = gi == INT_MAX ? 0 : gi;
  return M + logf(s);
}

// Once every thread knows the token: top_logprobs (merge the tiles' lists, N rounds of "the best
// after the previous pick"), the result, and (P.advance) the step and penalty-state update.
__device__ inline void finish_write(const float* __restrict__ logits, DeviceSamplingParams* params,
                                    const DeviceSamplingParams& P, int32_t* counts, uint8_t* seen,
                                    const Ws& ws, DeviceSampleResult* result, int token, float lse,
                                    float* sv, int* sid) {
  const int t = threadIdx.x;
  const int N = min(min(max(P.top_logprobs, 0), kMaxTopLogprobs), ws.n);
  float pv = INFINITY;
  int pid = -1;
  for (int q = 0; q < N; ++q) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = t; j < ws.nb * N; j += kFinishThreads) {
      const Cand c = ws.cand[(j / N) * kMaxTopLogprobs + j % N];
      const bool after = c.v < pv || (c.v == pv && c.id > pid);
      if (c.id != INT_MAX && after && better(c.v, c.id, bv, bi)) bv = c.v, bi = c.id;
    }
    block_argmax(bv, bi, sv, sid);
    if (t == 0) {
      result->top_ids[q] = bi;
      result->top_logprobs[q] = bv - lse;
    }
    pv = bv;
    pid = bi;
  }
  if (t == 0) {
    result->token = token;
    result->logprob = logits[token] - lse;
    result->n_top = N;
    if (P.advance) {
      params->step = P.step + 1;
      if (counts) counts[token] += 1;
      if (seen) seen[token] = 1;
    }
  }
}

// The small top_k path after the prep kernel (sampling_topk.cu): the tile-candidates and the
// finish kernel, both launched with PDL.
void launch_small_top_k(const float* logits, DeviceSamplingParams* params, int32_t* counts,
                        uint8_t* seen, const Ws& ws, DeviceSampleResult* result,
                        cudaStream_t stream);

}  // namespace lilac::cuda::sampler
