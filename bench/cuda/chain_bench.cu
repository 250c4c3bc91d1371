// What one dependency costs: at a kernel boundary (today's decode step: a kernel per op, PDL,
// graph-replayed) and inside one resident kernel through a device counter (the persistent step's
// plan, docs/persistent-decode.md). These are the timing model's `sync_us` and `task_us`
// (model/decode_schedule_model.h), measured instead of assumed.
//
// A chain of `ops` GEMVs, each op i: y = W_i x_i (W_i bf16 [M, K], a different matrix per op so
// the weights stream from DRAM), x_{i+1} = bf16(y). `blocks` blocks of 256 threads; block b owns
// rows [b R, (b + 1) R) of every op (R = M / blocks), its weights R K bf16 staged in shared
// memory by one bulk copy. Each variant computes the same sums in the same order, so their final
// x are identical bit for bit (checked: a variant that differs is reported and the run fails).
//   kernel, wait first:   a kernel per op, PDL; the weights are copied after griddepcontrol.wait
//                          (today's kernels that load after their wait)
//   kernel, staged:        a kernel per op, PDL; the weights are copied before the wait (a staged
//                          kernel, q_gemv_rms_staged)
//   persistent, wait first: one kernel; each op waits for the previous op's counter (every
//                          block's rows stored: a release add by each block, an acquire poll by
//                          each block's thread 0), then copies its weights
//   persistent:            the same, with op i + 1's weights copied into the block's second
//                          buffer before it waits for op i's counter
// and four variants of the persistent form's dependency (s26: the counter cost 0.4 us more
// per link than the staged kernel's boundary): its signal without the __threadfence before the
// release add; its wait polling without the back-off sleep; both; one flag per producer block (a
// release store each, the waiter's first warp reading them all) instead of one atomic counter.
// Each chain is graph-captured and replayed (warm); per link = time / ops. The bytes' time at
// 4.3 TB/s and the case with K = 64 (almost no bytes: the dependency alone) are printed beside.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/bulk_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/common.h"
#include "cuda/persistent.cuh"
#include "cuda/vec_util.cuh"
#include "util/error.h"

using lilac::cuda::DeviceBuffer;
using lilac::cuda::launch_kernel;
using lilac::cuda::pdl_launch_dependents;
using lilac::cuda::pdl_wait;
namespace bulk = lilac::cuda::bulk;
namespace persistent = lilac::cuda::persistent;

namespace {

constexpr int kThreads = 256;
constexpr int kMaxOps = 64, kMaxBlocks = 128;
// counters[0 .. ops): the counters; [0 .. ops x blocks): the flags (one form at a time);
// counters[kErrorSlot]: set by a wait that gave up.
constexpr int kErrorSlot = kMaxOps * kMaxBlocks;
constexpr int kWarps = kThreads / 32;

// Rows [row0, row0 + R) of y = W x for one block: w the block's R x K weights in shared memory,
// xs x in shared memory (K bf16). Warp w takes rows w, w + 8, ...; lane l the bf16 pairs l, l + 32,
// ... of a row, then a warp sum (fixed order: the same bits in every variant).
__device__ __forceinline__ void block_rows(const __nv_bfloat162* w, const __nv_bfloat162* xs, int R,
                                           int K, int row0, __nv_bfloat16* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < R; r += kWarps) {
    const __nv_bfloat162* wr = w + size_t(r) * (K / 2);
    float acc = 0.f;
    for (int j = lane; j < K / 2; j += 32) {
      const float2 a = __bfloat1622float2(wr[j]), b = __bfloat1622float2(xs[j]);
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[row0 + r] = __float2bfloat16_rn(acc);
  }
}

// x (K bf16, written by other blocks) into shared memory through L2 (ld.global.cg).
__device__ __forceinline__ void load_x(const __nv_bfloat16* x, int K, __nv_bfloat162* xs) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(x);
  uint32_t* dst = reinterpret_cast<uint32_t*>(xs);
  for (int j = threadIdx.x; j < K / 2; j += kThreads) dst[j] = __ldcg(src + j);
}

// One op as its own kernel. kStaged: the weights' copy is issued before griddepcontrol.wait.
template <bool kStaged>
__global__ void __launch_bounds__(kThreads)
    op_kernel(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* x, __nv_bfloat16* y, int K,
              int R) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bar;
  auto* w = reinterpret_cast<__nv_bfloat162*>(smem);
  auto* xs = reinterpret_cast<__nv_bfloat162*>(smem + size_t(R) * K * 2);
  const unsigned bytes = unsigned(R) * unsigned(K) * 2u;
  const __nv_bfloat16* src = W + size_t(blockIdx.x) * R * K;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    bulk::init(&bar, 1);
    bulk::fence_init();
    if (kStaged) {
      bulk::arrive_expect_tx(&bar, bytes);
      bulk::copy(w, src, bytes, &bar);
    }
  }
  pdl_wait();
  if (!kStaged && threadIdx.x == 0) {
    bulk::arrive_expect_tx(&bar, bytes);
    bulk::copy(w, src, bytes, &bar);
  }
  load_x(x, K, xs);
  __syncthreads();  // xs complete; the barrier's init visible
  bulk::wait(&bar, 0);
  block_rows(w, xs, R, K, int(blockIdx.x) * R, y);
}

// The whole chain in one kernel: op i's rows, then this block's release add on counter i; op
// i + 1 waits until counter i counts every block. Buffers: two weight buffers (op i in i % 2),
// x. kPrefetch: op i + 1's copy is issued before op i's wait (else after op i + 1's own wait:
// the counter alone against the kernel boundary). Counters must be zero at launch; the waits are
// cuda/persistent.cuh's (a wait that gives up sets *error and the kernel returns).
// The dependency's form (persistent.cuh): counter with fence, counter without, counter polled
// without the back-off, both (lean), a flag per producer (flags: ops x gridDim.x).
enum SyncForm { kCounterFence, kCounterNoFence, kCounterNoSleep, kCounterLean, kFlags };

template <bool kPrefetch, SyncForm kSync = kCounterFence>
__global__ void __launch_bounds__(kThreads)
    persistent_kernel(const __nv_bfloat16* __restrict__ W, __nv_bfloat16* xs_all, int K, int R,
                      int ops, unsigned* counters, unsigned* error) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bar[2];
  const size_t wbytes = size_t(R) * K * 2;
  auto* w0 = reinterpret_cast<__nv_bfloat162*>(smem);
  auto* w1 = reinterpret_cast<__nv_bfloat162*>(smem + wbytes);
  auto* xs = reinterpret_cast<__nv_bfloat162*>(smem + 2 * wbytes);
  const size_t M = size_t(R) * gridDim.x;
  auto weights = [&](int i) { return W + (size_t(i) * M + size_t(blockIdx.x) * R) * K; };
  if (threadIdx.x == 0) {
    bulk::init(&bar[0], 1);
    bulk::init(&bar[1], 1);
    bulk::fence_init();
    bulk::arrive_expect_tx(&bar[0], unsigned(wbytes));
    bulk::copy(w0, weights(0), unsigned(wbytes), &bar[0]);
  }
  __syncthreads();
  for (int i = 0; i < ops; ++i) {
    const int buf = i & 1;
    __nv_bfloat162* const w = buf ? w1 : w0;
    if (threadIdx.x == 0) {
      if (kPrefetch && i + 1 < ops) {  // the next op's weights, before this op's wait
        bulk::arrive_expect_tx(&bar[buf ^ 1], unsigned(wbytes));
        bulk::copy(buf ? w0 : w1, weights(i + 1), unsigned(wbytes), &bar[buf ^ 1]);
      }
    }
    if (i > 0) {
      const bool ok =
          kSync == kFlags
              ? persistent::wait_flags(counters + size_t(i - 1) * gridDim.x, int(gridDim.x), 1u,
                                       error)
              : persistent::wait(
                    counters + i - 1, gridDim.x, error, 1u << 26,
                    kSync == kCounterNoSleep || kSync == kCounterLean ? 0xffffffffu : 64u);
      if (!ok) return;
    }
    if (!kPrefetch && i > 0 && threadIdx.x == 0) {  // this op's weights, after its wait
      bulk::arrive_expect_tx(&bar[buf], unsigned(wbytes));
      bulk::copy(w, weights(i), unsigned(wbytes), &bar[buf]);
    }
    load_x(xs_all + size_t(i) * K, K, xs);
    __syncthreads();
    bulk::wait(&bar[buf], unsigned(i >> 1) & 1u);
    block_rows(w, xs, R, K, int(blockIdx.x) * R, xs_all + size_t(i + 1) * K);
    // every row of this block stored (and w, xs free again)
    if (kSync == kFlags)
      persistent::signal_flag(counters + size_t(i) * gridDim.x, 1u);
    else if (kSync == kCounterNoFence || kSync == kCounterLean)
      persistent::signal<false>(counters + i);
    else
      persistent::signal(counters + i);
  }
}

// A deterministic fill: W ~ uniform(-1, 1) / sqrt(K), x_0 ~ uniform(-1, 1).
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, float scale, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b9u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn((float(h & 0xffffff) / float(1 << 23) - 1.f) * scale);
  }
}

struct Case {
  int M, K, ops;
};

enum Variant {
  kWaitFirst,
  kStagedKernel,
  kPersistentWaitFirst,
  kPersistent,
  kPersistentNoFence,
  kPersistentNoSleep,
  kPersistentLean,
  kPersistentFlags
};
const char* const kVariantName[] = {
    "kernel, wait first",   "kernel, staged",       "persistent, wait first", "persistent",
    "persistent, no fence", "persistent, no sleep", "persistent, neither",    "persistent, flags"};
constexpr int kVariants = 8;

// The persistent kernel of a variant (>= kPersistentWaitFirst).
using PersistentFn = void (*)(const __nv_bfloat16*, __nv_bfloat16*, int, int, int, unsigned*,
                              unsigned*);
PersistentFn persistent_fn(Variant v) {
  switch (v) {
    case kPersistentWaitFirst:
      return persistent_kernel<false>;
    case kPersistentNoFence:
      return persistent_kernel<true, kCounterNoFence>;
    case kPersistentNoSleep:
      return persistent_kernel<true, kCounterNoSleep>;
    case kPersistentLean:
      return persistent_kernel<true, kCounterLean>;
    case kPersistentFlags:
      return persistent_kernel<true, kFlags>;
    default:
      return persistent_kernel<true>;
  }
}

// Captures one chain of the variant into a graph, replays it (2 warm-up, `reps` timed), returns
// us per link and leaves the final x in `final_x`.
double time_chain(Variant v, const Case& c, int blocks, const __nv_bfloat16* W,
                  __nv_bfloat16* xs_all, unsigned* counters, cudaStream_t s,
                  std::vector<uint16_t>& final_x) {
  const int R = c.M / blocks;
  const size_t wbytes = size_t(R) * c.K * 2, xbytes = size_t(c.K) * 2;
  cudaGraph_t graph;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  if (v >= kPersistentWaitFirst) {
    // Every block must be resident at once, or a block spins on a counter that a block waiting
    // for its SM would add to: check before launching.
    int per_sm = 0, sms = 0;
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<true>,
                                                                   kThreads, 2 * wbytes + xbytes));
    if (per_sm * sms < blocks) lilac::fail("chain_bench: {} blocks do not fit at once", blocks);
    LILAC_CUDA_CHECK(
        cudaMemsetAsync(counters, 0, size_t(c.ops) * size_t(blocks) * sizeof(unsigned), s));
    launch_kernel(false, persistent_fn(v), dim3(unsigned(blocks)), dim3(kThreads),
                  2 * wbytes + xbytes, s, W, xs_all, c.K, R, c.ops, counters,
                  counters + kErrorSlot);
  } else {
    for (int i = 0; i < c.ops; ++i) {
      const __nv_bfloat16* Wi = W + size_t(i) * c.M * c.K;
      if (v == kStagedKernel)
        launch_kernel(true, op_kernel<true>, dim3(unsigned(blocks)), dim3(kThreads),
                      wbytes + xbytes, s, Wi, xs_all + size_t(i) * c.K,
                      xs_all + size_t(i + 1) * c.K, c.K, R);
      else
        launch_kernel(true, op_kernel<false>, dim3(unsigned(blocks)), dim3(kThreads),
                      wbytes + xbytes, s, Wi, xs_all + size_t(i) * c.K,
                      xs_all + size_t(i + 1) * c.K, c.K, R);
    }
  }
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  LILAC_CUDA_CHECK(cudaEventCreate(&e0));
  LILAC_CUDA_CHECK(cudaEventCreate(&e1));
  const int reps = 20;
  for (int r = 0; r < 2; ++r) LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s));
  LILAC_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int r = 0; r < reps; ++r) LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s));
  LILAC_CUDA_CHECK(cudaEventRecord(e1, s));
  LILAC_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  unsigned gave_up = 0;
  LILAC_CUDA_CHECK(cudaMemcpy(&gave_up, counters + kErrorSlot, 4, cudaMemcpyDeviceToHost));
  if (gave_up) lilac::fail("chain_bench: {}: a counter wait gave up", kVariantName[v]);
  final_x.resize(size_t(c.K));
  LILAC_CUDA_CHECK(
      cudaMemcpy(final_x.data(), xs_all + size_t(c.ops) * c.K, xbytes, cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(cudaEventDestroy(e0));
  LILAC_CUDA_CHECK(cudaEventDestroy(e1));
  LILAC_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LILAC_CUDA_CHECK(cudaGraphDestroy(graph));
  return double(ms) * 1e3 / reps / c.ops;
}

}  // namespace

int main() {
  if (lilac::cuda::device_compute_capability() < 90) {
    std::printf("needs compute capability 9.0 (bulk copies, PDL)\n");
    return 1;
  }
  int sms = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = kMaxBlocks;  // one per SM, all resident (the persistent kernel relies on it)
  if (sms < blocks) {
    std::printf("needs %d SMs, this GPU has %d\n", blocks, sms);
    return 1;
  }
  const Case cases[] = {
      {2048, 2048, 64},  // 8 MB per op (an out_proj-sized GEMV in bf16): 1.95 us of bytes
      {2048, 512, 64},   // 2 MB per op
      {256, 2048, 64},   // 1 MB per op (the router's size), 2 rows per block
      {2048, 64, 64},    // 0.25 MB per op: the dependency alone
  };
  static_assert(sizeof(cases) / sizeof(cases[0]) > 0);
  for (const Case& c : cases)
    if (c.ops > kMaxOps) lilac::fail("chain_bench: {} ops (at most {})", c.ops, kMaxOps);
  size_t max_w = 0, max_x = 0;
  int max_smem = 0;
  for (const Case& c : cases) {
    max_w = std::max(max_w, size_t(c.ops) * c.M * c.K);
    max_x = std::max(max_x, size_t(c.ops + 1) * c.K);
    max_smem = std::max(max_smem, int(2 * size_t(c.M / blocks) * c.K * 2 + size_t(c.K) * 2));
  }
  std::vector<const void*> kernels = {reinterpret_cast<const void*>(op_kernel<false>),
                                      reinterpret_cast<const void*>(op_kernel<true>)};
  for (int v = kPersistentWaitFirst; v < kVariants; ++v)
    kernels.push_back(reinterpret_cast<const void*>(persistent_fn(Variant(v))));
  for (const void* k : kernels)
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  DeviceBuffer<__nv_bfloat16> W(max_w), xs(max_x);
  DeviceBuffer<unsigned> counters(size_t(kErrorSlot) + 1);
  LILAC_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("%d blocks x %d threads, graph replays (warm), us per link (mean of 20 chains)\n",
              blocks, kThreads);
  std::printf(
      "kernel: a kernel per op (PDL), weights after / before the wait; persistent: one\n"
      "kernel, a counter per op (fenced release add), weights after the wait / the next\n"
      "op's ahead; then the ahead form with the add unfenced, the poll without back-off,\n"
      "both, a flag per producer block instead of the counter\n");
  std::printf("%-20s %6s %6s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n", "case (M x K, ops)", "MB/op",
              "bytes", "k.wait", "k.staged", "p.wait", "p.ahead", "p.nofnc", "p.nosl", "p.lean",
              "p.flags", "final x");
  bool all_same = true;
  for (const Case& c : cases) {
    fill_kernel<<<256, 256, 0, s>>>(W.get(), size_t(c.ops) * c.M * c.K, 1.f / std::sqrt(float(c.K)),
                                    12345u);
    LILAC_CUDA_LAUNCHED();
    fill_kernel<<<8, 256, 0, s>>>(xs.get(), size_t(c.K), 1.f, 777u);
    LILAC_CUDA_LAUNCHED();
    LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
    double us[kVariants];
    std::vector<uint16_t> ref, got;
    for (int v = 0; v < kVariants; ++v) {
      us[v] = time_chain(Variant(v), c, blocks, W.get(), xs.get(), counters.get(), s,
                         v == 0 ? ref : got);
      if (v > 0 && std::memcmp(ref.data(), got.data(), ref.size() * 2) != 0) {
        std::printf("%s: final x differs from the per-op kernels'\n", kVariantName[v]);
        all_same = false;
      }
    }
    const double mb = double(c.M) * c.K * 2 / 1e6;
    char name[64];
    std::snprintf(name, sizeof name, "%d x %d, %d", c.M, c.K, c.ops);
    std::printf("%-20s %6.2f %6.2f", name, mb, mb / 4.3);
    for (int v = 0; v < kVariants; ++v) std::printf(" %7.2f", us[v]);
    std::printf(" %7s\n", all_same ? "same" : "DIFFER");
    std::fflush(stdout);
  }
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
  return all_same ? 0 : 1;
}
