// When do a PDL-launched kernel's blocks become resident, and can they stream their weights while
// the previous kernel runs? (docs/kernels.md, "Tenth session": the question behind q_gemv_staged
// and the persistent decode plan.) Two kernels on one stream, the second launched with PDL:
//   A ("busy"): a_blocks x 256 threads, each block streams its slice of a buffer (DRAM-bound) and
//      holds a_smem bytes of dynamic shared memory (to take room on the SM); it calls
//      griddepcontrol.launch_dependents first.
//   B ("staged"): b_blocks x 256 threads; thread 0 bulk-copies the block's b_bytes of weights into
//      shared memory at entry, then the block waits (griddepcontrol.wait), then for its copy.
// Device timestamps (%globaltimer, ns) relative to A's first block start: A's last block end, B's
// first and last block entry, B's last wait return, B's last copy landing. B entering before A
// ends means its blocks were resident alongside A's; B's copies landing before its wait returns
// means the weights streamed under A.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/bulk_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/vec_util.cuh"

using lilac::cuda::DeviceBuffer;
using lilac::cuda::launch_kernel;
using lilac::cuda::pdl_launch_dependents;
using lilac::cuda::pdl_wait;
namespace bulk = lilac::cuda::bulk;

namespace {

using u64 = unsigned long long;

struct Times {
  u64 a_start, a_end, b_entry_first, b_entry_last, b_wait, b_landed, b_end;
};

__device__ __forceinline__ u64 now() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(256)
    busy_kernel(const uint4* __restrict__ src, size_t words_per_block, uint4* sink, Times* t) {
  extern __shared__ uint4 pad[];  // only takes room on the SM
  __shared__ uint4 red[256];
  (void)pad;
  pdl_launch_dependents();
  pdl_wait();
  if (threadIdx.x == 0) atomicMin(&t->a_start, now());
  uint4 acc = make_uint4(0, 0, 0, 0);
  const uint4* p = src + size_t(blockIdx.x) * words_per_block;
  for (size_t i = threadIdx.x; i < words_per_block; i += 256) {
    const uint4 v = __ldcs(p + i);
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint4 v = red[255];
    if (v.x == 0x9e3779b9u && v.y == 1u) sink[0] = v;  // never: keeps the loads
    __threadfence();
    atomicMax(&t->a_end, now());
  }
}

__global__ void __launch_bounds__(256)
    staged_kernel(const uint4* __restrict__ w, unsigned bytes, uint4* sink, Times* t) {
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ uint64_t bar;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    const u64 t0 = now();
    atomicMin(&t->b_entry_first, t0);
    atomicMax(&t->b_entry_last, t0);
    bulk::init(&bar, 1);
    bulk::fence_init();
    bulk::arrive_expect_tx(&bar, bytes);
    bulk::copy(buf, w + size_t(blockIdx.x) * (bytes / 16), bytes, &bar);
  }
  __syncthreads();
  pdl_wait();
  if (threadIdx.x == 0) atomicMax(&t->b_wait, now());
  bulk::wait(&bar, 0);
  if (threadIdx.x == 0) atomicMax(&t->b_landed, now());
  uint4 v = buf[threadIdx.x];
  if (v.x == 0x9e3779b9u && v.y == 1u) sink[1] = v;
  if (threadIdx.x == 0) atomicMax(&t->b_end, now());
}

struct Case {
  const char* name;
  int a_blocks;
  size_t a_bytes;     // A's total bytes streamed
  int a_smem;         // A's dynamic shared memory per block
  bool a_max_shared;  // A prefers the largest shared-memory carveout
  int b_blocks;
  unsigned b_bytes;  // B's weights per block
};

void run(cudaStream_t s, const Case& c, const uint4* a_src, const uint4* b_src, uint4* sink,
         Times* d_t, bool pdl) {
  const size_t words = c.a_bytes / 16 / size_t(c.a_blocks);
  LILAC_CUDA_CHECK(cudaFuncSetAttribute(
      busy_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
      c.a_max_shared ? int(cudaSharedmemCarveoutMaxShared) : int(cudaSharedmemCarveoutDefault)));
  Times init{~0ull, 0, ~0ull, 0, 0, 0, 0};
  double sums[6] = {0, 0, 0, 0, 0, 0};
  const int reps = 20;
  for (int r = 0; r < reps + 2; ++r) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(d_t, &init, sizeof init, cudaMemcpyHostToDevice, s));
    launch_kernel(false, busy_kernel, dim3(c.a_blocks), dim3(256), size_t(c.a_smem), s, a_src,
                  words, sink, d_t);
    launch_kernel(pdl, staged_kernel, dim3(c.b_blocks), dim3(256), size_t(c.b_bytes), s, b_src,
                  c.b_bytes, sink, d_t);
    Times t{};
    LILAC_CUDA_CHECK(cudaMemcpyAsync(&t, d_t, sizeof t, cudaMemcpyDeviceToHost, s));
    LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
    if (r < 2) continue;  // warm-up
    const double a0 = double(t.a_start);
    sums[0] += (double(t.a_end) - a0) / 1e3;
    sums[1] += (double(t.b_entry_first) - a0) / 1e3;
    sums[2] += (double(t.b_entry_last) - a0) / 1e3;
    sums[3] += (double(t.b_wait) - a0) / 1e3;
    sums[4] += (double(t.b_landed) - a0) / 1e3;
    sums[5] += (double(t.b_end) - a0) / 1e3;
  }
  std::printf("%-44s %-4s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", c.name, pdl ? "PDL" : "no",
              sums[0] / reps, sums[1] / reps, sums[2] / reps, sums[3] / reps, sums[4] / reps,
              sums[5] / reps);
  std::fflush(stdout);
}

}  // namespace

int main() {
  int sms = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int cc = lilac::cuda::device_compute_capability();
  if (cc < 90) {
    std::printf("needs compute capability 9.0 (bulk copies, PDL); this GPU is %d\n", cc);
    return 1;
  }
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(busy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  LILAC_CUDA_CHECK(
      cudaFuncSetAttribute(staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  const size_t a_bytes = 64ull << 20;  // ~16 us of DRAM at 4.3 TB/s
  DeviceBuffer<uint4> a_src(a_bytes / 16), b_src((64ull << 20) / 16), sink(4);
  LILAC_CUDA_CHECK(cudaMemset(a_src.get(), 1, a_src.bytes()));
  LILAC_CUDA_CHECK(cudaMemset(b_src.get(), 2, b_src.bytes()));
  DeviceBuffer<Times> d_t(1);
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Case cases[] = {
      {"A 4/SM no smem; B 1/SM 64 KB", 4 * sms, a_bytes, 0, false, sms, 64 << 10},
      {"A 4/SM no smem, max carveout; B 1/SM 64 KB", 4 * sms, a_bytes, 0, true, sms, 64 << 10},
      {"A 4/SM no smem; B 3/SM 36 KB", 4 * sms, a_bytes, 0, false, 3 * sms, 36 << 10},
      {"A 4/SM no smem, max carveout; B 3/SM 36 KB", 4 * sms, a_bytes, 0, true, 3 * sms, 36 << 10},
      {"A 8/SM (2048 threads); B 1/SM 64 KB", 8 * sms, a_bytes, 0, true, sms, 64 << 10},
      {"A 1/SM 160 KB smem; B 1/SM 64 KB", sms, a_bytes, 160 << 10, false, sms, 64 << 10},
      {"A 1/SM 100 KB smem; B 1/SM 100 KB", sms, a_bytes, 100 << 10, false, sms, 100 << 10},
      {"A 4/SM no smem; B 2/SM 108 KB (too many)", 4 * sms, a_bytes, 0, true, 2 * sms, 108 << 10},
  };
  std::printf(
      "us from A's first block start (mean of 20): A end, B first entry, B last entry, B last "
      "wait return, B last copy landed, B end\n%-44s %-4s %8s %8s %8s %8s %8s %8s\n",
      "case", "PDL", "A end", "B in 1st", "B in last", "B wait", "B landed", "B end");
  for (const Case& c : cases)
    for (bool pdl : {true, false}) run(s, c, a_src.get(), b_src.get(), sink.get(), d_t.get(), pdl);
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
