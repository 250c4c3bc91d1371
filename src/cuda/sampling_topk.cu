// The small top_k path of cuda::sample (SamplerPath::SmallTopK, 1 <= top_k <= kSmallTopK = 32):
// the same token, logprob and top_logprobs as the general path (sampling.cu) and as
// lilac::sample_token, in three launches instead of ten: prep (sampling.cu, unchanged), then
//   2. tile (nb x 256, tiles of 1024 ids): e = unnormalised_prob(y, m) as the exp kernel has it,
//      then the tile's first kk = min(top_k, ids in the tile) elements in the order (e descending,
//      id ascending), sorted, as 64-bit keys (e's bits, then 0xffffffff - id: unsigned key order =
//      the sampler's order) into the workspace; slots kk .. top_k - 1 get 0 (no element).
//      Selection in the block: a count radix select over e's bits (4 digits of 8 bits, a shared
//      256-bin histogram each) gives tau = the kk-th largest e and `above` = #{e > tau}; every
//      e > tau is kept, and of the e == tau the need = kk - above lowest ids (rank in id order by
//      ballots and a 32-entry scan); one warp sorts the kk keys by counting.
//   3. finish (1 x 1024): the global first L_k = min(top_k, n) elements are among the tiles' lists
//      (an element ranked j globally has at most j elements before it in its own tile). The k-th
//      largest tile head lb (one thread per tile counts the larger heads; only when nb > top_k)
//      bounds the global k-th key from below, so the candidates >= lb hold the global first L_k;
//      they are at most k (k - 1) + 1 (k tiles have a head >= lb, the one whose head is lb gives
//      only its head) or nb k <= k^2 when nb <= k: at most 1024, one per thread, ranked by
//      counting. One warp then holds the order's first L_k elements, lane j the j-th, and applies
//      the contract (model/sampling.cpp): Z_k = their mass; L_p = the first j + 1 whose prefix
//      mass >= top_p_target(top_p, Z_k); L_m = #{e >= min_p} among them ({e >= min_p} is a prefix
//      of the order, so this is min(L_m, L_k)); kept = the first max(1, min(L_k, L_p, L_m));
//      r = scaled_draw(u24, Z_kept); the token is the kept id whose interval [below, below + mass)
//      holds r, `below` being the kept mass at lower ids (the CPU's walk in ascending id order);
//      the last kept id if Z_kept = 0 (as the CPU). Greedy, logprob, top_logprobs and `advance`:
//      the general finish kernel's code (sampling_common.cuh).
// Cost at V = 248077 (nb = 243, top_k = 20): the tile kernel reads y (1 MB, in L2) and writes
// 243 x 256 bytes, with 17 block barriers for the select; the finish kernel
// counts 243 x 243 head comparisons (~2k cycles), loads 4860 keys, ranks ~20-60 survivors. About
// 4-5 us per launch including its ramp: ~15 us for the three launches against ~48 us for ten.
#include <cfloat>
#include <climits>

#include "cuda/sampling_common.cuh"

namespace lilac::cuda::sampler {
namespace {

using sampling::mass_of;

constexpr unsigned kAbsent = 0xffffffffu;  // e bits of an id past n (real e bits <= 0x3f800000)
constexpr int kTileWarps = kPassThreads / 32;

__device__ __forceinline__ unsigned long long topk_key(unsigned e_bits, int id) {
  return (static_cast<unsigned long long>(e_bits) << 32) | (0xffffffffu - unsigned(id));
}
__device__ __forceinline__ float key_e(unsigned long long key) {
  return __uint_as_float(unsigned(key >> 32));
}
__device__ __forceinline__ int key_id(unsigned long long key) {
  return int(0xffffffffu - unsigned(key & 0xffffffffull));
}
// The path's top_k (the host guarantees [1, kSmallTopK]; clamped so that no index leaves it).
__device__ __forceinline__ int small_k(const DeviceSamplingParams& P) {
  return min(max(P.top_k, 1), kSmallTopK);
}

// One digit of a count radix select (one warp; every lane returns the same): cnt[256] is the
// histogram of this digit over the elements matching the prefix so far, `above` the number known
// to be larger. Returns the highest bin b with above + #{bins >= b} >= target; above grows by the
// bins over b. target <= above + #{all bins} (so some bin qualifies).
__device__ unsigned resolve_count_digit(const unsigned* cnt, unsigned target, unsigned& above) {
  const int lane = threadIdx.x & 31;
  unsigned c[8], lc = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    c[b] = cnt[8 * lane + b];
    lc += c[b];
  }
  unsigned sc = lc;  // inclusive suffix sum over the lanes: bins 8 lane .. 255
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned u = __shfl_down_sync(kFull, sc, o);
    if (lane + o < 32) sc += u;
  }
  const unsigned ballot = __ballot_sync(kFull, above + sc >= target);
  const int star = 31 - __clz(int(ballot));
  unsigned ac = above + sc - lc;
  int digit = 8 * lane;
  bool found = false;
#pragma unroll
  for (int b = 7; b >= 0; --b) {
    if (!found) {
      if (ac + c[b] >= target) {
        digit = 8 * lane + b;
        found = true;
      } else {
        ac += c[b];
      }
    }
  }
  above = __shfl_sync(kFull, ac, star);
  return unsigned(__shfl_sync(kFull, digit, star));
}

__global__ void __launch_bounds__(kPassThreads)
    sample_topk_tile_kernel(const DeviceSamplingParams* params, Ws ws) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ unsigned s_hist[kBins];
  __shared__ unsigned s_ties[kPer * kTileWarps];  // ties per (q, warp), then their exclusive scan
  __shared__ unsigned long long s_sel[kSmallTopK];
  __shared__ float sf[32];
  __shared__ unsigned s_prefix, s_above, s_nsel;
  static_assert(kPassThreads == kBins && kPer * kTileWarps == 32, "one bin per thread, one lane");
  const DeviceSamplingParams P = *params;
  if (is_greedy(P)) return;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  if (t == 0) s_nsel = 0;
  float m = -INFINITY;
  for (int b = t; b < ws.nb; b += kPassThreads) m = fmaxf(m, ws.part[b].ymax);
  m = block_max(m, sf);  // (its barriers also order s_nsel's reset)
  const int base = blockIdx.x * kTile;
  const int k = small_k(P);
  const unsigned kk = unsigned(min(k, min(kTile, ws.n - base)));  // >= 1: the tile has an id
  unsigned bits[kPer];  // e's bits, id base + q * kPassThreads + t (id order: q, warp, lane)
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + t;
    bits[q] = i < ws.n ? __float_as_uint(sampling::unnormalised_prob(ws.e[i], m)) : kAbsent;
  }

  // tau = the kk-th largest e bits of the tile, above = #{e > tau}.
  unsigned prefix = 0, above = 0;
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    const int shift = 24 - 8 * d;
    s_hist[t] = 0;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kPer; ++q)
      if (bits[q] != kAbsent && (d == 0 || (bits[q] >> (shift + 8)) == prefix))
        atomicAdd(&s_hist[(bits[q] >> shift) & 0xffu], 1u);
    __syncthreads();
    if (warp == 0) {
      unsigned a = above;
      const unsigned digit = resolve_count_digit(s_hist, kk, a);
      if (lane == 0) s_prefix = (prefix << 8) | digit, s_above = a;
    }
    __syncthreads();
    prefix = s_prefix;
    above = s_above;
  }
  const unsigned tau = prefix, need = kk - above;  // above < kk: need >= 1

  // The ties' ranks in id order: a ballot per (q, warp), an exclusive scan of the 32 counts.
  unsigned tie_rank[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const unsigned bal = __ballot_sync(kFull, bits[q] == tau);
    tie_rank[q] = __popc(bal & ((1u << lane) - 1u));
    if (lane == 0) s_ties[q * kTileWarps + warp] = __popc(bal);
  }
  __syncthreads();
  if (warp == 0) {
    const unsigned c = s_ties[lane];
    unsigned incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned u = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += u;
    }
    s_ties[lane] = incl - c;
  }
  __syncthreads();
  // The selection: e > tau in slots [0, above) (any order), the first `need` ties after them.
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = base + q * kPassThreads + t;
    if (bits[q] != kAbsent && bits[q] > tau) {
      s_sel[atomicAdd(&s_nsel, 1u)] = topk_key(bits[q], i);
    } else if (bits[q] == tau) {
      const unsigned r = s_ties[q * kTileWarps + warp] + tie_rank[q];
      if (r < need) s_sel[above + r] = topk_key(bits[q], i);
    }
  }
  __syncthreads();
  if (warp == 0) {  // sort the kk keys (distinct) by counting; 0 in the list's unused slots
    const unsigned long long key = unsigned(lane) < kk ? s_sel[lane] : 0ull;
    int rank = 0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const unsigned long long other = __shfl_sync(kFull, key, j);
      rank += other > key ? 1 : 0;
    }
    unsigned long long* list = ws.topk + size_t(blockIdx.x) * kSmallTopK;
    if (unsigned(lane) < kk)
      list[rank] = key;
    else if (lane < k)
      list[lane] = 0ull;
  }
}

__global__ void __launch_bounds__(kFinishThreads)
    sample_topk_finish_kernel(const float* __restrict__ logits, DeviceSamplingParams* params,
                              int32_t* counts, uint8_t* seen, Ws ws, DeviceSampleResult* result) {
  pdl_launch_dependents();  // PDL (launch.h): nothing is read before the wait
  pdl_wait();
  __shared__ float sv[32];
  __shared__ int sid[32];
  __shared__ unsigned long long s_head[kFinishThreads];
  __shared__ unsigned long long s_surv[kFinishThreads];
  __shared__ unsigned long long s_top[kSmallTopK];
  __shared__ unsigned long long s_lb;
  __shared__ unsigned s_nsurv;
  __shared__ int s_token;
  const DeviceSamplingParams P = *params;
  const int t = threadIdx.x;
  int greedy_token;
  const float lse = finish_partials(ws, sv, sid, &greedy_token);
  if (t == 0) s_token = greedy_token, s_lb = 0ull, s_nsurv = 0u;

  if (!is_greedy(P)) {
    const int k = small_k(P), nb = ws.nb;
    const int kn = min(k, ws.n);  // L_k: top_k, or n when top_k >= n
    // Every tile has at least one id, so every head is an element (key > 0).
    const unsigned long long head = t < nb ? ws.topk[size_t(t) * kSmallTopK] : 0ull;
    s_head[t] = head;
    __syncthreads();
    if (nb > k && t < nb) {  // lb = the k-th largest head (keys are distinct: exactly one)
      int larger = 0;
#pragma unroll 4
      for (int u = 0; u < nb; ++u) larger += s_head[u] > head ? 1 : 0;
      if (larger == k - 1) s_lb = head;
    }
    __syncthreads();
    const unsigned long long lb = s_lb;
    for (int c = t; c < nb * k; c += kFinishThreads) {
      const unsigned long long key = ws.topk[size_t(c / k) * kSmallTopK + c % k];
      if (key != 0ull && key >= lb) {
        const unsigned slot = atomicAdd(&s_nsurv, 1u);
        if (slot < kFinishThreads) s_surv[slot] = key;  // always: <= max(k (k - 1) + 1, nb k)
      }
    }
    __syncthreads();
    const int ns = min(int(s_nsurv), kFinishThreads);
    if (t < ns) {  // the survivors' ranks; the first kn are the order's first kn elements
      const unsigned long long key = s_surv[t];
      int larger = 0;
      for (int u = 0; u < ns; ++u) larger += s_surv[u] > key ? 1 : 0;
      if (larger < kn) s_top[larger] = key;
    }
    __syncthreads();
    if (t < 32) {  // lane j: the j-th element of the order
      const int lane = t;
      const bool in = lane < kn;
      const unsigned long long key = in ? s_top[lane] : 0ull;
      const float e = in ? key_e(key) : 0.f;
      const int id = in ? key_id(key) : INT_MAX;
      const unsigned long long m = in ? mass_of(e) : 0ull;
      const unsigned long long zk = warp_sum_u64(m);
      unsigned long long cum = m;  // inclusive prefix mass in the order
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long u = __shfl_up_sync(kFull, cum, o);
        if (lane >= o) cum += u;
      }
      int L = kn;
      if (P.top_p < 1.f) {  // the lane kn - 1 (cum = Z_k >= target) always qualifies
        const unsigned long long target = sampling::top_p_target(P.top_p, zk);
        L = min(L, __ffs(int(__ballot_sync(kFull, in && cum >= target))));
      }
      if (P.min_p > 0.f) L = min(L, __popc(__ballot_sync(kFull, in && e >= P.min_p)));
      L = max(L, 1);
      const bool kept = lane < L;
      const unsigned long long km = kept ? m : 0ull;
      const unsigned long long r =
          sampling::scaled_draw(sampling::philox_u24(P.seed, P.step), warp_sum_u64(km));
      // The walk in ascending id order: the kept mass at lower ids.
      unsigned long long below = 0;
      int last = kept ? id : -1;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int oid = __shfl_sync(kFull, id, j);
        const unsigned long long om = __shfl_sync(kFull, km, j);
        if (oid < id) below += om;
        const int olast = __shfl_sync(kFull, last, j);
        last = max(last, olast);
      }
      const unsigned hit = __ballot_sync(kFull, km > 0 && below <= r && r < below + km);
      // No hit only when Z_kept = 0 (then the CPU returns the last kept id).
      const int token = hit ? __shfl_sync(kFull, id, __ffs(int(hit)) - 1) : last;
      if (lane == 0) s_token = token;
    }
  }
  __syncthreads();
  finish_write(logits, params, P, counts, seen, ws, result, s_token, lse, sv, sid);
}

}  // namespace

void launch_small_top_k(const float* logits, DeviceSamplingParams* params, int32_t* counts,
                        uint8_t* seen, const Ws& ws, DeviceSampleResult* result,
                        cudaStream_t stream) {
  launch_kernel(true, sample_topk_tile_kernel, dim3(ws.nb), dim3(kPassThreads), 0, stream, params,
                ws);
  launch_kernel(true, sample_topk_finish_kernel, dim3(1), dim3(kFinishThreads), 0, stream, logits,
                params, counts, seen, ws, result);
}

}  // namespace lilac::cuda::sampler
