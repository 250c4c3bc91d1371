// The batched decode step's speed (label gpu; disabled by default, a benchmark rather than a
// test): the full-size synthetic model, BF16 and 4-bit, 64 sequences prefilled with 1024-token
// prompts, then for B = 1, 2, 4, 8, 16, 32, 64 the first B of them decode together:
//   * graph: the GPU time of one batched pass (median of 10 graph replays, CudaEvents);
//   * step_batch: the wall time of one CudaBackend::step_batch call (greedy rows), host upload,
//     replay, token readback and bookkeeping included (median of 10 calls);
//   * step() x B: B sequences advanced one after another through step() (the path before batching).
// Run: lilac_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='BatchBench.*'
#include <cuda_profiler_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/qwen36.h"

namespace lilac::test {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// n sequences with room for ctx + extra tokens, each prefilled with its own ctx-token prompt of
// hashed ids (greedy sampling state begun).
std::vector<std::unique_ptr<SequenceState>> prefilled_sequences(cuda::CudaBackend& b, int n,
                                                                int ctx, int extra) {
  const int32_t nv = b.sampling_vocab();
  std::vector<std::unique_ptr<SequenceState>> seqs;
  SamplingParams greedy;
  greedy.temperature = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(ctx));
    for (int t = 0; t < ctx; ++t)
      prompt[size_t(t)] = int32_t((uint64_t(i * 7919 + t) * 2654435761ull) % uint64_t(nv));
    seqs.push_back(b.new_sequence(ctx + extra));
    b.begin_sampling(*seqs.back(), prompt, greedy);
    b.forward(*seqs.back(), prompt, {}, false);
  }
  return seqs;
}

void bench(const std::string& weights, GdnStateFormat state = GdnStateFormat::f32) {
  cuda::CudaOptions options;
  options.gdn_state = state;
  auto b = cuda::make_synthetic_backend(weights, 1, SyntheticRouter::Uniform, options);
  const int kMax = 64, kCtx = 1024, kReps = 10;
  const int32_t nv = b->sampling_vocab();
  const auto seqs = prefilled_sequences(*b, kMax, kCtx, 400);
  std::printf(
      "%s, context %d: B, graph ms, tok/s (graph), step_batch ms, tok/s, per-stream tok/s, "
      "step() x B ms\n",
      weights.c_str(), kCtx);
  for (int B : {1, 2, 4, 8, 16, 32, 64}) {
    std::vector<SequenceState*> st;
    for (int i = 0; i < B; ++i) st.push_back(seqs[size_t(i)].get());
    cuda::CudaOptions o = b->options();
    o.batch_min_rows = 1;
    o.batch_grouped_moe_min_rows = 1;  // the MoE grouped by expert (prefill kernels)
    b->set_options(o);
    const double grouped_ms = b->time_batched_pass(st, kReps);
    o.batch_grouped_moe_min_rows = 0;  // the decode MoE kernels, a grid row per token
    b->set_options(o);
    const double graph_ms = b->time_batched_pass(st, kReps);
    std::vector<int32_t> ids(static_cast<size_t>(B));  // distinct tokens: realistic routing
    for (int i = 0; i < B; ++i) ids[size_t(i)] = int32_t((17 + int64_t(i) * 7919) % nv);
    std::vector<double> wall;
    uint64_t index = 0;
    for (int r = 0; r < kReps + 1; ++r) {
      std::vector<BatchItem> items(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i)
        items[size_t(i)] = {st[size_t(i)], std::span(&ids[size_t(i)], 1), index};
      const auto t0 = std::chrono::steady_clock::now();
      const auto res = b->step_batch(items);
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < B; ++i) ids[size_t(i)] = res[size_t(i)].token;
      ++index;
      if (r > 0) wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double step_ms = median(wall);
    // The same B sequences advanced one by one through step() (the single-sequence graph).
    std::vector<double> seq_wall;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < B; ++i) {
        const StepResult res = b->step(*st[size_t(i)], std::span(&ids[size_t(i)], 1), index);
        ids[size_t(i)] = res.token;
      }
      ++index;
      seq_wall.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf(
        "  B=%-3d graph %8.3f ms %9.1f tok/s (grouped MoE %8.3f ms %9.1f tok/s) | step_batch %8.3f "
        "ms %9.1f tok/s %7.1f/stream | step() x B %8.3f ms\n",
        B, graph_ms, 1e3 * B / graph_ms, grouped_ms, 1e3 * B / grouped_ms, step_ms,
        1e3 * B / step_ms, 1e3 / step_ms, median(seq_wall));
    std::fflush(stdout);
  }
  // Where the time of a pass goes, at 16 and 64 rows (the default MoE choice).
  cuda::CudaOptions o = b->options();
  o.batch_grouped_moe_min_rows = -1;
  b->set_options(o);
  for (int B : {16, 64}) {
    std::vector<SequenceState*> st;
    for (int i = 0; i < B; ++i) st.push_back(seqs[size_t(i)].get());
    for (const std::string& line : b->batch_kernel_breakdown(st)) std::printf("%s\n", line.c_str());
  }
}

TEST(BatchBench, DISABLED_DecodeStepTimesBf16) {
  LILAC_REQUIRE_GPU();
  bench("bf16");
}

TEST(BatchBench, DISABLED_DecodeStepTimesQ4) {
  LILAC_REQUIRE_GPU();
  bench("q4");
}

// The same with the recurrent state in bf16 (--gdn-state bf16, model/state_format.h).
TEST(BatchBench, DISABLED_DecodeStepTimesQ4Bf16State) {
  LILAC_REQUIRE_GPU();
  bench("q4", GdnStateFormat::bf16);
}

// One graph replay of the 4-bit batched pass (bf16 state) inside cudaProfilerStart / Stop, for
// Nsight Compute's per-kernel durations of the production graph's nodes (the graph is captured and
// warmed up before the profiled range):
//   LILAC_PROFILE_ROWS=16 ncu --profile-from-start off --metrics gpu__time_duration.sum \
//     --cache-control none --clock-control none lilac_cuda_tests \
//     --gtest_also_run_disabled_tests --gtest_filter='BatchBench.DISABLED_PassUnderProfiler'
TEST(BatchBench, DISABLED_PassUnderProfiler) {
  LILAC_REQUIRE_GPU();
  const char* rows = std::getenv("LILAC_PROFILE_ROWS");
  const int B = rows ? std::atoi(rows) : 16;
  ASSERT_GE(B, 1);
  ASSERT_LE(B, 64);
  cuda::CudaOptions options;
  options.gdn_state = GdnStateFormat::bf16;
  auto b = cuda::make_synthetic_backend("q4", 1, SyntheticRouter::Uniform, options);
  const auto seqs = prefilled_sequences(*b, B, 1024, 16);
  std::vector<SequenceState*> st;
  for (const auto& q : seqs) st.push_back(q.get());
  const double warm_ms = b->time_batched_pass(st, 3);  // capture, warm-up, timing
  ASSERT_EQ(cudaProfilerStart(), cudaSuccess);
  const double ms = b->time_batched_pass(st, 1);  // two replays
  ASSERT_EQ(cudaProfilerStop(), cudaSuccess);
  std::printf("B=%d graph replay %.3f ms (%.3f ms under the profiler)\n", B, warm_ms, ms);
}

}  // namespace
}  // namespace lilac::test
