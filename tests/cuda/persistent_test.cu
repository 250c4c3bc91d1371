// The persistent kernel's device counters (cuda/persistent.cuh) on the GPU: a chain of ops in
// one resident grid, each op reading everything the previous op wrote (every block's slice), gives
// the CPU's exact integers on the first launch and on a second launch that reuses the counters
// without a reset (epoch 2), through a counter (with and without the fence before its release
// add) or a flag per producer; a wait nobody answers gives up, reports it and returns.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common.h"
#include "cuda/persistent.cuh"
#include "cuda_test_util.h"

namespace lilac::test {
namespace {

namespace persistent = cuda::persistent;

// x_{i+1}[j] = sum_k (k + 1) x_i[k] + j (mod 2^32) for j < n: op i + 1 needs every element of
// op i, written by every block. Block b writes x_{i+1}[j] for j = b, b + B, ...; every thread
// sums x_i itself through L2 (__ldcg), after waiting for op i's counter (epoch x B signals), or
// for op i's B flags to reach `epoch`. Forms: the counter with its fence, without it, the flags
// (counters then holds ops x B flags).
enum Form { kCounter, kCounterNoFence, kFlags };

template <Form kForm>
__global__ void chain_kernel(unsigned* xs, int n, int ops, unsigned* counters, unsigned epoch,
                             unsigned* error) {
  for (int i = 0; i < ops; ++i) {
    if (i > 0) {
      const bool ok = kForm == kFlags
                          ? persistent::wait_flags(counters + size_t(i - 1) * gridDim.x,
                                                   int(gridDim.x), epoch, error)
                          : persistent::wait(counters + i - 1, epoch * gridDim.x, error);
      if (!ok) return;
    }
    const unsigned* x = xs + size_t(i) * n;
    unsigned* y = xs + size_t(i + 1) * n;
    for (int j = blockIdx.x + int(gridDim.x) * int(threadIdx.x); j < n;
         j += int(gridDim.x * blockDim.x)) {
      unsigned s = 0;
      for (int k = 0; k < n; ++k) s += unsigned(k + 1) * __ldcg(x + k);
      y[j] = s + unsigned(j);
    }
    if (kForm == kFlags)
      persistent::signal_flag(counters + size_t(i) * gridDim.x, epoch);
    else
      persistent::signal<kForm == kCounter>(counters + i);
  }
}

// flags: a wait on 40 flags of which the last never moves (the others are set).
template <bool kFlagForm>
__global__ void lonely_wait_kernel(const unsigned* counter, unsigned* error, unsigned* returned) {
  const bool ok = kFlagForm ? persistent::wait_flags(counter, 40, 1u, error, 1000u)
                            : persistent::wait(counter, 1u, error, 1000u);
  if (threadIdx.x == 0) *returned = ok ? 2u : 1u;
}

std::vector<unsigned> cpu_chain(std::vector<unsigned> x, int ops) {
  const size_t n = x.size();
  for (int i = 0; i < ops; ++i) {
    std::vector<unsigned> y(n);
    for (size_t j = 0; j < n; ++j) {
      unsigned s = 0;
      for (size_t k = 0; k < n; ++k) s += unsigned(k + 1) * x[k];
      y[j] = s + unsigned(j);
    }
    x = y;
  }
  return x;
}

template <Form kForm>
void chain_twice() {
  const int n = 1000, ops = 24, threads = 128;
  int per_sm = 0, sms = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  LILAC_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel<kForm>, threads, 0));
  const int blocks = std::min(per_sm * sms, 2 * sms);  // all resident at once
  ASSERT_GT(blocks, 1);
  std::vector<unsigned> x0(n);
  for (int j = 0; j < n; ++j) x0[size_t(j)] = unsigned(j) * 2654435761u + 12345u;
  const std::vector<unsigned> want = cpu_chain(x0, ops);
  cuda::DeviceBuffer<unsigned> xs(static_cast<size_t>(ops + 1) * n);
  cuda::DeviceBuffer<unsigned> counters(static_cast<size_t>(ops) * size_t(blocks)), error(1);
  LILAC_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
  LILAC_CUDA_CHECK(cudaMemset(error.get(), 0, error.bytes()));
  for (unsigned epoch : {1u, 2u}) {  // the second launch counts on from the first's counters
    LILAC_CUDA_CHECK(cudaMemcpy(xs.get(), x0.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    LILAC_CUDA_CHECK(cudaMemset(xs.get() + n, 0xff, size_t(ops) * n * 4));
    chain_kernel<kForm><<<blocks, threads>>>(xs.get(), n, ops, counters.get(), epoch, error.get());
    LILAC_CUDA_LAUNCHED();
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    unsigned err = 0;
    std::vector<unsigned> got(n);
    LILAC_CUDA_CHECK(cudaMemcpy(&err, error.get(), 4, cudaMemcpyDeviceToHost));
    LILAC_CUDA_CHECK(
        cudaMemcpy(got.data(), xs.get() + size_t(ops) * n, size_t(n) * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(err, 0u) << "epoch " << epoch << ": a wait gave up";
    int wrong = 0;
    for (int j = 0; j < n; ++j) wrong += got[size_t(j)] != want[size_t(j)];
    EXPECT_EQ(wrong, 0) << "epoch " << epoch << ", " << blocks << " blocks: first element "
                        << got[0] << " against " << want[0];
  }
}

TEST(PersistentCounters, AChainAcrossEveryBlockIsExactTwice) {
  LILAC_REQUIRE_GPU();
  chain_twice<kCounter>();
}

TEST(PersistentCounters, AChainIsExactTwiceWithoutTheFence) {
  LILAC_REQUIRE_GPU();
  chain_twice<kCounterNoFence>();
}

TEST(PersistentCounters, AChainIsExactTwiceThroughAFlagPerProducer) {
  LILAC_REQUIRE_GPU();
  chain_twice<kFlags>();
}

template <bool kFlagForm>
void lonely_wait() {
  cuda::DeviceBuffer<unsigned> counter(40), error(1), returned(1);
  std::vector<unsigned> flags(40, kFlagForm ? 1u : 0u);
  flags[39] = 0;
  LILAC_CUDA_CHECK(cudaMemcpy(counter.get(), flags.data(), 40 * 4, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemset(error.get(), 0, 4));
  LILAC_CUDA_CHECK(cudaMemset(returned.get(), 0, 4));
  lonely_wait_kernel<kFlagForm><<<1, 64>>>(counter.get(), error.get(), returned.get());
  LILAC_CUDA_LAUNCHED();
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned err = 0, ret = 0;
  LILAC_CUDA_CHECK(cudaMemcpy(&err, error.get(), 4, cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(cudaMemcpy(&ret, returned.get(), 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(err, 1u);
  EXPECT_EQ(ret, 1u) << "the wait returned true for a dependency that never came";
}

TEST(PersistentCounters, AWaitNobodyAnswersGivesUpAndSaysSo) {
  LILAC_REQUIRE_GPU();
  lonely_wait<false>();
}

TEST(PersistentCounters, AFlagWaitMissingOneProducerGivesUpAndSaysSo) {
  LILAC_REQUIRE_GPU();
  lonely_wait<true>();
}

}  // namespace
}  // namespace lilac::test
