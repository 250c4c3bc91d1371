// Greedy argmax and the exact sampler on the GPU.
//
// argmax over V = 248077 real logits (the lm_head output is resident in L2): 1 MB read; the floor
// is ~0.25 us of bandwidth, so the kernel is latency: one launch of ceil(n / 2048) = 122 blocks x
// 256 threads; a thread loads two float4 (8 logits, ascending ids), keeps the best under (value
// desc, id asc), a block reduction gives the block's winner, which joins a running maximum in the
// workspace as one 64-bit key (order-preserving value bits, then the inverted id) by atomicMax;
// the last block to finish (a counter, threadfence-reduction pattern) takes the key with an
// atomicExch (leaving 0) and writes the id. v1 (the last block re-reduced the 122 winners from
// memory) measured 3.5 us in a graph; v2 drops that pass (~0.5-0.7 us) and is launched with PDL,
// so its launch overlaps the lm_head GEMV's tail: predicted ~2 us in the decode graph.
//
// sample: the semantics of lilac::sample_token in the integer/IEEE arithmetic of
// model/sampling_core.h (see model/sampling.cpp for the realisation of each step), so the token
// equals the CPU's exactly, ties included. Tiles of 1024 ids, nb = ceil(n / 1024) blocks (243).
//   1. prep (nb x 256): penalties, y = x'/T into the workspace; per block: max y, argmax x' (the
//      greedy token), raw max and sum exp(raw - max) (logprobs), and the block's top-N raw logits
//      (N = top_logprobs rounds of a block argmax over "the next after the previous pick").
//   2. exp (nb x 256): m = max y from the block partials; e = unnormalised_prob(y, m) in place;
//      the 256-bin histogram (count and 40-bit fixed-point mass) of e's top byte; count and mass
//      of e >= min_p. Integer atomics: exact and order-independent.
//   3. radix (6 launches, nb x 256): the thresholds as radix selects over e's bit patterns (e >= 0,
//      so the bits order like the values), 8 bits per pass, 4 passes per search, each pass a
//      histogram of the elements whose higher digits match the prefix found so far:
//        k-search: tau_k = the largest value v with #{e >= v} >= top_k (only if 1 < top_k < n);
//        p-search: tau_p = the largest v with mass{e >= v} >= trunc(top_p * Z_k) (only if
//                  top_p < 1), Z_k = mass of the top_k set, known once the k-search is done.
//      Digit d of a search is resolved by one warp from pass d-1's histogram (a suffix scan over
//      the bins) at the start of the kernel of pass d; block 0 records the state for the next.
//   4. walk (nb x 256): every block decides the kept set as (tau, n_ties): {e > tau} plus the
//      n_ties lowest ids with e == tau (the first L of the (e desc, id asc) order, L = min(L_k,
//      L_p, L_m), or {e >= min_p}); per block: mass of e > tau and the count of e == tau.
//   5. finish (1 x 1024): greedy token and log-sum-exp from the prep partials; otherwise
//      r = floor(u24 * Z_kept / 2^24), a block scan over the nb blocks' kept masses (tie ranks
//      from a scan of the tie counts) finds the block where the ascending-id running mass passes
//      r, a scan inside that tile finds the id. Then the logprob, the top_logprobs merge of the
//      blocks' lists, and (advance) the penalty-state and step update.
// Cost: ~9 passes over 1 MB (in L2) and 10 launches: measured 48 us at T 1, top_k 20, top_p 0.95
// (the greedy benchmark path uses argmax instead). This is SamplerPath::General; requests with
// 1 <= top_k <= kSmallTopK take SamplerPath::SmallTopK (sampling_topk.cu: this file's prep, then
// per-tile candidates and a merging finish, three launches) with the same result. The helpers
// both share (reductions, workspace, the finish kernel's two ends) are in sampling_common.cuh.
#include "cuda/sampling.h"

#include <atomic>
#include <cfloat>
#include <climits>

#include "cuda/sampling_common.cuh"
#include "model/sampling_core.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

using namespace sampler;  // NOLINT: the helpers shared with sampling_topk.cu

using sampling::bits_float;
using sampling::mass_of;

constexpr uint64_t kUnlimited = 1ull << 62;  // "all ties" for n_ties

// ---- argmax ----------------------------------------------------------------------------------

constexpr int kArgThreads = 256;
constexpr int kArgPerThread = 8;  // two float4
constexpr int kArgTile = kArgThreads * kArgPerThread;

int argmax_blocks(int n) {
  return ceil_div(n, kArgTile);
}

// (value, id) as one 64-bit key whose unsigned order is the argmax order (value descending, then
// id ascending): the value's bits mapped to an order-preserving unsigned integer in the high word
// (negative floats: all bits flipped; others: the sign bit set), 0xffffffff - id in the low word.
// Every non-NaN value maps to a high word >= 0x007fffff (-inf), so key 0 means "no candidate";
// -0 is keyed as +0 (equal values: the lower id wins across blocks as within one).
__device__ __forceinline__ unsigned long long argmax_key(float v, int id) {
  const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);  // -0 == +0, as better() has it
  const unsigned hi = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(hi) << 32) | (0xffffffffu - unsigned(id));
}

// Workspace: [0] the block counter (u32), [8] the running key (u64); both zero between launches.
// Batched: one such slice of kArgmaxRowBytes per row.
constexpr size_t kArgmaxRowBytes = 256;
template <bool kVec>
__global__ void __launch_bounds__(kArgThreads)
    argmax_kernel(const float* __restrict__ x, int n, unsigned int* counter,
                  unsigned long long* key, int32_t* out, size_t x_stride) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  // Batched (argmax_batch): row blockIdx.y has its own logits, workspace slice and output.
  x += blockIdx.y * x_stride;
  counter = reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(counter) +
                                            blockIdx.y * kArgmaxRowBytes);
  key = reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(key) +
                                              blockIdx.y * kArgmaxRowBytes);
  out += blockIdx.y;
  __shared__ float sv[32];
  __shared__ int sid[32];
  __shared__ bool s_last;
  float bv = -INFINITY;
  int bi = INT_MAX;
  const int tile = blockIdx.x * kArgTile;
#pragma unroll
  for (int q = 0; q < kArgPerThread / 4; ++q) {
    const int i = tile + 4 * (q * kArgThreads + threadIdx.x);
    if (kVec && i + 3 < n) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
      if (better(v.x, i, bv, bi)) bv = v.x, bi = i;
      if (better(v.y, i + 1, bv, bi)) bv = v.y, bi = i + 1;
      if (better(v.z, i + 2, bv, bi)) bv = v.z, bi = i + 2;
      if (better(v.w, i + 3, bv, bi)) bv = v.w, bi = i + 3;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (i + j < n) {
          const float v = __ldcg(x + i + j);
          if (better(v, i + j, bv, bi)) bv = v, bi = i + j;
        }
    }
  }
  block_argmax(bv, bi, sv, sid);
  if (threadIdx.x == 0) {
    // The block's winner joins the running maximum at L2 (no second pass over per-block winners);
    // a block of NaNs only has no candidate.
    if (bi != INT_MAX) atomicMax(key, argmax_key(bv, bi));
    __threadfence();  // the key is updated before the counter says so
    s_last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last || threadIdx.x != 0) return;
  __threadfence();
  const unsigned long long k = atomicExch(key, 0ull);  // read and reset for the next launch
  *out = k ? int32_t(0xffffffffu - unsigned(k & 0xffffffffull)) : 0;
  *counter = 0u;
}

__device__ __forceinline__ int hist_slot(int search, int digit) {
  return digit == 0 ? 0 : 3 * search + digit;
}

// ---- radix-select steps (one warp; every lane returns the same) ---------------------------------

// Resolves the next digit of a search from that digit's histogram (elements matching s.prefix):
// the highest bin b with (above + weight of bins >= b) >= target; above grows by the bins over b.
__device__ SearchState resolve_digit(SearchState s, const unsigned int* cnt,
                                     const unsigned long long* mass, bool by_mass) {
  const int lane = threadIdx.x & 31;
  unsigned int c[8];
  unsigned long long m[8];
  unsigned long long lc = 0, lm = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    c[b] = cnt[8 * lane + b];
    m[b] = mass[8 * lane + b];
    lc += c[b];
    lm += m[b];
  }
  // Inclusive suffix sums over lanes (bins 8 lane .. 255).
  unsigned long long sc = lc, sm = lm;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long tc = __shfl_down_sync(kFull, sc, o),
                             tm = __shfl_down_sync(kFull, sm, o);
    if (lane + o < 32) sc += tc, sm += tm;
  }
  const unsigned long long reach = by_mass ? s.ma + sm : s.ca + sc;
  const unsigned ballot = __ballot_sync(kFull, reach >= s.target);
  const int star =
      ballot ? 31 - __clz(int(ballot)) : 0;  // ballot == 0 is unreachable (target <= total)
  unsigned long long ac = s.ca + sc - lc, am = s.ma + sm - lm;
  int digit = 8 * lane;
  bool found = false;
#pragma unroll
  for (int b = 7; b >= 0; --b) {
    if (!found) {
      const unsigned long long w = by_mass ? am + m[b] : ac + c[b];
      if (w >= s.target) {
        digit = 8 * lane + b;
        found = true;
      } else {
        ac += c[b];
        am += m[b];
      }
    }
  }
  s.prefix = (s.prefix << 8) | unsigned(__shfl_sync(kFull, digit, star));
  s.ca = unsigned(__shfl_sync(kFull, ac, star));
  s.ma = __shfl_sync(kFull, am, star);
  return s;
}

__device__ unsigned long long total_mass(const Ws& ws) {
  const int lane = threadIdx.x & 31;
  unsigned long long m = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) m += ws.hmass[8 * lane + b];
  return warp_sum_u64(m);
}

__device__ __forceinline__ bool k_search_on(const DeviceSamplingParams& P, int n) {
  return P.top_k > 0 && P.top_k < n;
}

// The finished k-search (after the kernel of its digit 3 ran): tau_k's bits, count and mass above.
__device__ SearchState k_final(const Ws& ws) {
  return resolve_digit(ws.st[0 * 4 + 3], ws.hcnt + 3 * kBins, ws.hmass + 3 * kBins, false);
}

// The p-search's start: active iff top_p < 1 and its target trunc(top_p * Z_k) > 0.
__device__ SearchState p_start(const DeviceSamplingParams& P, const Ws& ws) {
  SearchState s{};
  if (!(P.top_p < 1.f)) return s;
  unsigned long long zk;
  if (k_search_on(P, ws.n)) {
    const SearchState k = k_final(ws);
    zk = k.ma + (unsigned long long)(P.top_k - int(k.ca)) * mass_of(bits_float(k.prefix));
  } else {
    zk = total_mass(ws);
  }
  s.target = sampling::top_p_target(P.top_p, zk);
  s.active = s.target > 0;
  return s;
}

struct Kept {
  float tau;                  // keep e > tau, and e == tau for the first n_ties ids
  unsigned long long n_ties;  // kUnlimited: all of them
  unsigned long long Z;       // mass of the kept set
};

// The kept set (one warp; the radix kernels have run).
__device__ Kept decide(const DeviceSamplingParams& P, const Ws& ws) {
  const long long n = ws.n;
  const unsigned long long ztot = total_mass(ws);
  long long Lk = n, Lp = n, Lm = n;
  Kept k{0.f, 0, ztot}, p{0.f, 0, 0};
  if (k_search_on(P, ws.n)) {
    const SearchState s = k_final(ws);
    k.tau = bits_float(s.prefix);
    k.n_ties = (unsigned long long)(P.top_k - int(s.ca));
    k.Z = s.ma + k.n_ties * mass_of(k.tau);
    Lk = P.top_k;
  }
  if (P.top_p < 1.f) {
    const unsigned long long target = sampling::top_p_target(P.top_p, k.Z);
    if (target == 0) {  // the shortest prefix with mass >= 0: the first element (e = 1)
      p = Kept{1.f, 1, mass_of(1.f)};
      Lp = 1;
    } else {
      const SearchState s =
          resolve_digit(ws.st[1 * 4 + 3], ws.hcnt + 6 * kBins, ws.hmass + 6 * kBins, true);
      p.tau = bits_float(s.prefix);
      const unsigned long long mt = mass_of(p.tau);
      p.n_ties = target > s.ma && mt > 0 ? (target - s.ma + mt - 1) / mt : 1;
      p.Z = s.ma + p.n_ties * mt;
      Lp = (long long)s.ca + (long long)p.n_ties;
    }
  }
  if (P.min_p > 0.f) Lm = *ws.minp_count;
  const long long L = min(Lk, min(Lp, Lm));
  if (L >= n) return Kept{0.f, kUnlimited, ztot};  // everything (e >= 0)
  if (L <= 0) return Kept{1.f, 1, mass_of(1.f)};   // min_p > 1: the first element only
  if (L == Lk) return k;
  if (L == Lp) return p;
  return Kept{P.min_p, kUnlimited, *ws.minp_mass};
}

// ---- sampler kernels ---------------------------------------------------------------------------

__global__ void __launch_bounds__(kPassThreads)
    sample_prep_kernel(const float* __restrict__ logits, const DeviceSamplingParams* params,
                       const int32_t* counts, const uint8_t* seen, Ws ws) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ float sv[32];
  __shared__ int sid[32];
  const DeviceSamplingParams P = *params;
  if (blockIdx.x == 0) {  // fresh accumulators for this draw (the exp kernel adds to them)
    for (int i = threadIdx.x; i < kSlots * kBins; i += kPassThreads)
      ws.hcnt[i] = 0, ws.hmass[i] = 0;
    if (threadIdx.x == 0) *ws.minp_mass = 0, *ws.minp_count = 0;
  }
  const bool greedy = is_greedy(P);
  const bool penalties = counts || seen;
  const int base = blockIdx.x * kTile;
  float raw[kPer];
  float ymax = -INFINITY, xb = -INFINITY, rmax = -INFINITY;
  int xi = INT_MAX;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + threadIdx.x;
    raw[q] = NAN;  // outside [0, n): skipped by every comparison below
    if (i < ws.n) {
      const float r = logits[i];
      raw[q] = r;
      const float xp =
          penalties
              ? sampling::penalize(r, counts ? counts[i] : 0, seen ? seen[i] != 0 : false,
                                   P.repetition_penalty, P.presence_penalty, P.frequency_penalty)
              : r;
      if (better(xp, i, xb, xi)) xb = xp, xi = i;
      rmax = fmaxf(rmax, r);
      if (!greedy) {
        const float y = sampling::f_div(xp, P.temperature);
        ws.e[i] = y;
        ymax = fmaxf(ymax, y);
      }
    }
  }
  ymax = block_max(ymax, sv);
  rmax = block_max(rmax, sv);
  block_argmax(xb, xi, sv, sid);
  float rs = 0.f;
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (raw[q] > -INFINITY) rs += expf(raw[q] - rmax);
  rs = block_sum(rs, sv);
  if (threadIdx.x == 0) ws.part[blockIdx.x] = Part{ymax, xb, xi, rmax, rs};

  // This tile's top-N raw logits: N rounds, each the best strictly after the previous pick.
  const int N = min(max(P.top_logprobs, 0), kMaxTopLogprobs);
  float pv = INFINITY;
  int pid = -1;
  for (int r = 0; r < N; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int i = base + q * kPassThreads + threadIdx.x;
      const float v = raw[q];
      const bool after = v < pv || (v == pv && i > pid);
      if (after && better(v, i, bv, bi)) bv = v, bi = i;
    }
    block_argmax(bv, bi, sv, sid);
    if (threadIdx.x == 0) ws.cand[blockIdx.x * kMaxTopLogprobs + r] = Cand{bv, bi};
    pv = bv;
    pid = bi;
  }
}

__global__ void __launch_bounds__(kPassThreads)
    sample_exp_kernel(const DeviceSamplingParams* params, Ws ws) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ unsigned int scnt[kBins];
  __shared__ unsigned long long smass[kBins];
  __shared__ float sf[32];
  __shared__ unsigned long long s64[32];
  const DeviceSamplingParams P = *params;
  if (is_greedy(P)) return;
  scnt[threadIdx.x] = 0;
  smass[threadIdx.x] = 0;
  float m = -INFINITY;
  for (int b = threadIdx.x; b < ws.nb; b += kPassThreads) m = fmaxf(m, ws.part[b].ymax);
  m = block_max(m, sf);  // (its barriers also order the histogram's zeroing)
  unsigned long long mc = 0, mm = 0;
  const int base = blockIdx.x * kTile;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + threadIdx.x;
    if (i < ws.n) {
      const float e = sampling::unnormalised_prob(ws.e[i], m);
      ws.e[i] = e;
      const unsigned long long me = mass_of(e);
      const unsigned bin = __float_as_uint(e) >> 24;
      atomicAdd(&scnt[bin], 1u);
      atomicAdd(&smass[bin], me);
      if (P.min_p > 0.f && e >= P.min_p) mc += 1, mm += me;
    }
  }
  mc = block_sum_u64(mc, s64);
  mm = block_sum_u64(mm, s64);
  if (threadIdx.x == 0 && mc) {
    atomicAdd(ws.minp_count, unsigned(mc));
    atomicAdd(ws.minp_mass, mm);
  }
  if (scnt[threadIdx.x]) {  // (block_sum_u64's barriers ordered the histogram's atomics)
    atomicAdd(&ws.hcnt[threadIdx.x], scnt[threadIdx.x]);
    atomicAdd(&ws.hmass[threadIdx.x], smass[threadIdx.x]);
  }
}

// Histogram of digit `digit` (1..3) of search `search` (0: top_k, 1: top_p).
__global__ void __launch_bounds__(kPassThreads)
    sample_radix_kernel(const DeviceSamplingParams* params, Ws ws, int search, int digit) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ unsigned int scnt[kBins];
  __shared__ unsigned long long smass[kBins];
  __shared__ SearchState s_state;
  const DeviceSamplingParams P = *params;
  if (is_greedy(P)) return;
  scnt[threadIdx.x] = 0;
  smass[threadIdx.x] = 0;
  if (threadIdx.x < 32) {
    SearchState s;
    if (digit == 1) {
      if (search == 0) {
        s = SearchState{};
        s.active = k_search_on(P, ws.n);
        s.target = (unsigned long long)max(P.top_k, 0);
      } else {
        s = p_start(P, ws);
      }
    } else {
      s = ws.st[search * 4 + digit - 1];
    }
    if (s.active) {
      const int slot = hist_slot(search, digit - 1);
      s = resolve_digit(s, ws.hcnt + slot * kBins, ws.hmass + slot * kBins, search == 1);
    }
    if (threadIdx.x == 0) {
      s_state = s;
      if (blockIdx.x == 0) ws.st[search * 4 + digit] = s;  // read by the next digit's kernel
    }
  }
  __syncthreads();
  const SearchState s = s_state;
  if (!s.active) return;
  const int shift = 32 - 8 * digit;
  const int base = blockIdx.x * kTile;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + threadIdx.x;
    if (i < ws.n) {
      const float e = ws.e[i];
      const unsigned bits = __float_as_uint(e);
      if ((bits >> shift) == s.prefix) {
        const unsigned bin = (bits >> (shift - 8)) & 0xffu;
        atomicAdd(&scnt[bin], 1u);
        atomicAdd(&smass[bin], mass_of(e));
      }
    }
  }
  __syncthreads();
  if (scnt[threadIdx.x]) {
    const int slot = hist_slot(search, digit);
    atomicAdd(&ws.hcnt[slot * kBins + threadIdx.x], scnt[threadIdx.x]);
    atomicAdd(&ws.hmass[slot * kBins + threadIdx.x], smass[threadIdx.x]);
  }
}

// Per tile: mass of the elements above tau and the count of those equal to it.
__global__ void __launch_bounds__(kPassThreads)
    sample_walk_kernel(const DeviceSamplingParams* params, Ws ws) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ Kept s_kept;
  __shared__ unsigned long long s64[32];
  const DeviceSamplingParams P = *params;
  if (is_greedy(P)) return;
  if (threadIdx.x < 32) {
    const Kept k = decide(P, ws);
    if (threadIdx.x == 0) s_kept = k;
  }
  __syncthreads();
  const float tau = s_kept.tau;
  unsigned long long mg = 0, tc = 0;
  const int base = blockIdx.x * kTile;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + threadIdx.x;
    if (i < ws.n) {
      const float e = ws.e[i];
      if (e > tau)
        mg += mass_of(e);
      else if (e == tau)
        tc += 1;
    }
  }
  mg = block_sum_u64(mg, s64);
  tc = block_sum_u64(tc, s64);
  if (threadIdx.x == 0) {
    ws.walk_mass[blockIdx.x] = mg;
    ws.walk_ties[blockIdx.x] = unsigned(tc);
  }
}

__global__ void __launch_bounds__(kFinishThreads)
    sample_finish_kernel(const float* __restrict__ logits, DeviceSamplingParams* params,
                         int32_t* counts, uint8_t* seen, Ws ws, DeviceSampleResult* result) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ float sv[32];
  __shared__ int sid[32];
  __shared__ unsigned long long s64[32];
  __shared__ Kept s_kept;
  __shared__ unsigned long long s_r, s_base, s_ties_before;
  __shared__ int s_block, s_token;
  const DeviceSamplingParams P = *params;
  const int t = threadIdx.x;
  int greedy_token;
  const float lse = finish_partials(ws, sv, sid, &greedy_token);
  if (t == 0) s_token = greedy_token;

  if (!is_greedy(P)) {
    if (t < 32) {
      const Kept k = decide(P, ws);
      if (t == 0) {
        s_kept = k;
        s_r = sampling::scaled_draw(sampling::philox_u24(P.seed, P.step), k.Z);
        s_block = -1;
      }
    }
    __syncthreads();
    const Kept k = s_kept;
    const unsigned long long r = s_r, mt = mass_of(k.tau);
    // Which tile: kept mass per tile in id order (ties kept while the running tie count < n_ties).
    const unsigned long long ties = t < ws.nb ? ws.walk_ties[t] : 0ull;
    const unsigned long long mgt = t < ws.nb ? ws.walk_mass[t] : 0ull;
    const unsigned long long ties_before = block_scan_u64(ties, s64) - ties;
    const unsigned long long kt =
        ties_before >= k.n_ties ? 0ull : min(k.n_ties - ties_before, ties);
    const unsigned long long km = mgt + kt * mt;
    const unsigned long long incl = block_scan_u64(km, s64);
    if (km > 0 && incl - km <= r && r < incl)
      s_block = t, s_base = incl - km, s_ties_before = ties_before;
    __syncthreads();
    if (s_block >= 0) {  // always (r < Z_kept); then which id inside the tile
      const int i = s_block * kTile + t;
      const float e = i < ws.n ? ws.e[i] : -1.f;
      const unsigned long long tie = e == k.tau ? 1ull : 0ull;
      const unsigned long long rank = s_ties_before + block_scan_u64(tie, s64) - tie;
      const unsigned long long m = e > k.tau ? mass_of(e) : (tie && rank < k.n_ties ? mt : 0ull);
      const unsigned long long inc2 = s_base + block_scan_u64(m, s64);
      if (m > 0 && inc2 - m <= r && r < inc2) s_token = i;
    }
  }
  __syncthreads();
  const int token = s_token;

  finish_write(logits, params, P, counts, seen, ws, result, token, lse, sv, sid);
}

}  // namespace

size_t argmax_workspace_bytes(int) {
  return 256;
}

void argmax(const float* logits, int n, void* workspace, int32_t* out, cudaStream_t stream) {
  if (!logits || !workspace || !out) fail("cuda::argmax: null pointer");
  if (n < 1) fail("cuda::argmax: n = {}", n);
  if (!is_aligned(workspace, 8)) fail("cuda::argmax: the workspace must be 8-byte aligned");
  auto* counter = static_cast<unsigned int*>(workspace);
  auto* key = reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace) + 8);
  const int grid = argmax_blocks(n);
  launch_kernel(true, is_aligned(logits, 16) ? argmax_kernel<true> : argmax_kernel<false>,
                dim3(grid), dim3(kArgThreads), 0, stream, logits, n, counter, key, out, size_t(0));
}

void argmax_batch(const float* logits, int n, size_t stride, int B, void* workspace, int32_t* out,
                  cudaStream_t stream) {
  if (!logits || !workspace || !out) fail("cuda::argmax_batch: null pointer");
  if (n < 1 || B < 1 || B > 65535 || stride < size_t(n))
    fail("cuda::argmax_batch: n = {}, B = {}, stride {}", n, B, stride);
  if (!is_aligned(workspace, 8)) fail("cuda::argmax_batch: the workspace must be 8-byte aligned");
  auto* counter = static_cast<unsigned int*>(workspace);
  auto* key = reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace) + 8);
  const bool vec = is_aligned(logits, 16) && stride % 4 == 0;
  launch_kernel(true, vec ? argmax_kernel<true> : argmax_kernel<false>, dim3(argmax_blocks(n), B),
                dim3(kArgThreads), 0, stream, logits, n, counter, key, out, stride);
}

size_t sample_workspace_bytes(int n_real) {
  return layout(n_real > 0 ? n_real : 1, nullptr, nullptr);
}

SamplerPath sampler_path(int top_k) {
  return top_k >= 1 && top_k <= kSmallTopK ? SamplerPath::SmallTopK : SamplerPath::General;
}

namespace {
std::atomic<long long> g_general_launches{0}, g_small_launches{0};
}  // namespace

SamplerLaunchCounts sampler_launch_counts() {
  SamplerLaunchCounts c;
  c.general = g_general_launches.load();
  c.small_top_k = g_small_launches.load();
  return c;
}

void sample(const float* logits, int n_real, DeviceSamplingParams* params, int32_t* output_counts,
            uint8_t* seen, void* workspace, DeviceSampleResult* result, cudaStream_t stream,
            SamplerPath path) {
  if (!logits || !params || !workspace || !result) fail("cuda::sample: null pointer");
  if (n_real < 1 || n_real > kMaxN)
    fail("cuda::sample: n_real = {} outside [1, {}]", n_real, kMaxN);
  if (!is_aligned(workspace, 256)) fail("cuda::sample: the workspace must be 256-byte aligned");
  if (path != SamplerPath::General && path != SamplerPath::SmallTopK)
    fail("cuda::sample: unknown path {}", int(path));
  Ws ws;
  layout(n_real, static_cast<char*>(workspace), &ws);
  const int nb = ws.nb;
  // Every kernel waits (pdl_wait) before its first read: all are launched with PDL.
  launch_kernel(true, sample_prep_kernel, dim3(nb), dim3(kPassThreads), 0, stream, logits, params,
                output_counts, seen, ws);
  if (path == SamplerPath::SmallTopK) {
    launch_small_top_k(logits, params, output_counts, seen, ws, result, stream);
    ++g_small_launches;
    return;
  }
  launch_kernel(true, sample_exp_kernel, dim3(nb), dim3(kPassThreads), 0, stream, params, ws);
  for (int search = 0; search < 2; ++search)
    for (int digit = 1; digit <= 3; ++digit)
      launch_kernel(true, sample_radix_kernel, dim3(nb), dim3(kPassThreads), 0, stream, params, ws,
                    search, digit);
  launch_kernel(true, sample_walk_kernel, dim3(nb), dim3(kPassThreads), 0, stream, params, ws);
  launch_kernel(true, sample_finish_kernel, dim3(1), dim3(kFinishThreads), 0, stream, logits,
                params, output_counts, seen, ws, result);
  ++g_general_launches;
}

}  // namespace lilac::cuda
