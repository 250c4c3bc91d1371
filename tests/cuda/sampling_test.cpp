// cuda::sample (both paths) against lilac::sample_token (cuda::argmax is a conformance case:
// conformance/argmax.cpp). Both samplers share
// model/sampling_core.h's exact arithmetic, so tokens must be EQUAL (not close) for every seed,
// step and parameter set, ties at the top_k / top_p cuts included; logprobs agree to f32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cuda/sampling.h"
#include "cuda_test_util.h"
#include "kernel_check.h"
#include "model/sampling.h"
#include "util/error.h"

namespace lilac::test {
namespace {

constexpr int kV = 248320, kReal = 248077;  // the model's padded vocabulary and its real ids

// ---- sampler -----------------------------------------------------------------------------------

// The device side of one sampler: workspace, parameters, result, penalty arrays.
struct DeviceSampler {
  int n;
  cuda::DeviceBuffer<char> ws;
  cuda::DeviceBuffer<cuda::DeviceSamplingParams> params{1};
  cuda::DeviceBuffer<cuda::DeviceSampleResult> result{1};
  cuda::DeviceBuffer<int32_t> counts;
  cuda::DeviceBuffer<uint8_t> seen;

  explicit DeviceSampler(int n_real) : n(n_real), ws(cuda::sample_workspace_bytes(n_real)) {
    poison(ws);
  }
  void set_penalties(const PenaltyState& st) {
    counts = upload(std::vector<int32_t>(st.output_counts.begin(), st.output_counts.begin() + n));
    seen = upload(std::vector<uint8_t>(st.seen.begin(), st.seen.begin() + n));
  }
  cuda::DeviceSampleResult sample(const float* d_logits, const cuda::DeviceSamplingParams& p,
                                  bool penalties,
                                  cuda::SamplerPath path = cuda::SamplerPath::General) {
    LILAC_CUDA_CHECK(cudaMemcpy(params.get(), &p, sizeof(p), cudaMemcpyHostToDevice));
    poison(result);
    cuda::sample(d_logits, n, params.get(), penalties ? counts.get() : nullptr,
                 penalties ? seen.get() : nullptr, ws.get(), result.get(), nullptr, path);
    return download(result)[0];
  }
};

// Token equal; logprobs to f32 rounding of a log-sum-exp over 2.5e5 terms (the twin sums in
// double): 5e-4 absolute.
void expect_same(const cuda::DeviceSampleResult& g, const SampleResult& c,
                 const std::string& what) {
  ASSERT_EQ(g.token, c.token) << what;
  EXPECT_NEAR(g.logprob, c.logprob, 5e-4) << what;
  ASSERT_EQ(size_t(g.n_top), c.top.size()) << what;
  for (size_t j = 0; j < c.top.size(); ++j) {
    EXPECT_EQ(g.top_ids[j], c.top[j].first) << what << " top " << j;
    EXPECT_NEAR(g.top_logprobs[j], c.top[j].second, 5e-4) << what << " top " << j;
  }
}

// Logits with exact ties planted where the semantics are delicate: three ids share the maximum,
// and five share the value ranked 19th (a top_k = 20 or 22 cut falls inside that group).
std::vector<float> tricky_logits(int V, int n_real, uint32_t seed) {
  std::vector<float> x = random_floats(size_t(V), 3.f, seed);
  for (int i = n_real; i < V; ++i) x[size_t(i)] = 50.f;  // padding: must never be sampled
  if (n_real < 40) return x;
  std::vector<int32_t> order(static_cast<size_t>(n_real));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                    [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  const float top = x[size_t(order[0])], v19 = x[size_t(order[18])];
  for (int i : {order[30], order[31]}) x[size_t(i)] = top;
  for (int i : {order[32], order[33], order[34], order[35]}) x[size_t(i)] = v19;
  return x;
}

PenaltyState random_penalties(int V, uint32_t seed, const std::vector<float>& x) {
  PenaltyState st;
  st.reset(V);
  std::vector<float> r = random_floats(20000, 1.f, seed);
  for (size_t i = 0; i < r.size(); ++i) {
    const int32_t id = int32_t(std::fabs(r[i]) * 1e6) % kReal;
    if (i % 3 == 0)
      st.add_output(id);
    else
      st.add_prompt(std::vector<int32_t>{id});
  }
  // A few of the most likely ids are in the history too.
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 10, order.begin() + kReal,
                    [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  for (int j = 0; j < 10; j += 2) st.add_output(order[size_t(j)]);
  st.add_prompt(std::vector<int32_t>{order[1]});
  return st;
}

struct ParamSet {
  SamplingParams p;
  bool penalties;
  const char* name;
};

std::vector<ParamSet> param_sets() {
  auto P = [](float t, int k, float tp, float mp) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = tp;
    p.min_p = mp;
    return p;
  };
  std::vector<ParamSet> s;
  s.push_back({P(1.f, 0, 1.f, 0.f), false, "plain"});
  s.push_back({P(0.7f, 20, 0.8f, 0.f), false, "non-thinking defaults"});
  SamplingParams thinking = P(1.f, 20, 0.95f, 0.f);
  thinking.presence_penalty = 1.5f;
  thinking.top_logprobs = 5;
  s.push_back({thinking, true, "thinking defaults + presence"});
  s.push_back({P(0.6f, 0, 1.f, 0.05f), false, "min_p"});
  s.push_back({P(1.3f, 0, 0.5f, 0.f), false, "top_p over the whole vocabulary"});
  SamplingParams rep = P(0.9f, 1000, 1.f, 0.f);
  rep.repetition_penalty = 1.3f;
  rep.frequency_penalty = 0.4f;
  rep.top_logprobs = 20;
  s.push_back({rep, true, "top_k 1000 + repetition + frequency"});
  SamplingParams greedy = P(0.f, 0, 1.f, 0.f);
  greedy.repetition_penalty = 1.2f;
  greedy.top_logprobs = 3;
  s.push_back({greedy, true, "greedy + repetition"});
  s.push_back({P(0.8f, 1, 1.f, 0.f), false, "top_k 1"});
  s.push_back({P(1.f, 0, 0.f, 0.f), false, "top_p 0"});
  s.push_back({P(1.f, 0, 1.f, 2.f), false, "min_p > 1"});
  s.push_back({P(4.f, 0, 0.9f, 0.001f), false, "flat: T 4, top_p 0.9, min_p 0.001"});
  s.push_back({P(0.05f, 50, 1.f, 0.f), false, "peaked: T 0.05, top_k 50"});
  s.push_back({P(1.f, 22, 1.f, 0.f), false, "top_k 22 cuts a tie group"});
  s.push_back({P(1.f, 20, 0.3f, 0.f), false, "top_k 20 + top_p 0.3"});
  s.push_back({P(1.f, kReal + 5, 0.99f, 0.f), false, "top_k past n (off) + top_p 0.99"});
  return s;
}

TEST(CudaSampling, SampleMatchesCpuExactly) {
  LILAC_REQUIRE_GPU();
  const std::vector<float> x = tricky_logits(kV, kReal, 31);
  const PenaltyState st = random_penalties(kV, 32, x);
  auto dx = upload(x);
  DeviceSampler ds(kReal);
  ds.set_penalties(st);
  int draws = 0;
  const auto sets = param_sets();
  for (size_t si = 0; si < sets.size(); ++si) {
    const ParamSet& ps = sets[si];
    for (int j = 0; j < 16; ++j) {
      SamplingParams p = ps.p;
      p.seed = 1000 * si + uint64_t(j) * 7919u;
      const uint64_t step =
          j == 15 ? (uint64_t(1) << 32) + 5 : uint64_t(j * j + 3);  // the high counter word too
      const SampleResult want =
          sample_token(x.data(), kReal, p, ps.penalties ? &st : nullptr, step);
      const cuda::DeviceSampleResult got =
          ds.sample(dx.get(), cuda::device_sampling_params(p, step, 0), ps.penalties);
      expect_same(
          got, want,
          (testing::Message() << ps.name << ", seed " << p.seed << ", step " << step).GetString());
      ++draws;
    }
  }
  EXPECT_GE(draws, 200);
}

TEST(CudaSampling, SmallVocabularies) {
  LILAC_REQUIRE_GPU();
  for (int n : {1, 7, 1500, 2049}) {
    const std::vector<float> x = tricky_logits(n + 5, n, uint32_t(n));
    auto dx = upload(x);
    DeviceSampler ds(n);
    const auto sets = param_sets();
    for (size_t si = 0; si < sets.size(); ++si) {
      if (sets[si].penalties) continue;
      for (int j = 0; j < 4; ++j) {
        SamplingParams p = sets[si].p;
        p.seed = 77 + uint64_t(j);
        p.top_logprobs = 20;
        const SampleResult want = sample_token(x.data(), n, p, nullptr, uint64_t(j));
        expect_same(ds.sample(dx.get(), cuda::device_sampling_params(p, uint64_t(j), 0), false),
                    want,
                    (testing::Message() << "n " << n << ", " << sets[si].name << ", draw " << j)
                        .GetString());
      }
    }
  }
}

// advance = 1: the kernel moves the step and adds the token to the penalty arrays, so repeated
// launches with no host update follow the CPU's step-by-step sequence.
TEST(CudaSampling, AdvanceRunsTheDecodeLoopOnTheDevice) {
  LILAC_REQUIRE_GPU();
  const int n = 5000;
  std::vector<float> x = random_floats(size_t(n), 1.f, 5);
  auto dx = upload(x);
  PenaltyState st;
  st.reset(n);
  st.add_prompt(std::vector<int32_t>{1, 2, 3});
  DeviceSampler ds(n);
  ds.set_penalties(st);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.presence_penalty = 1.f;
  p.frequency_penalty = 0.3f;
  p.repetition_penalty = 1.1f;
  p.seed = 2024;
  const cuda::DeviceSamplingParams dp = cuda::device_sampling_params(p, 10, 1);
  LILAC_CUDA_CHECK(cudaMemcpy(ds.params.get(), &dp, sizeof(dp), cudaMemcpyHostToDevice));
  for (uint64_t step = 10; step < 40; ++step) {
    const SampleResult want = sample_token(x.data(), n, p, &st, step);
    st.add_output(want.token);
    cuda::sample(dx.get(), n, ds.params.get(), ds.counts.get(), ds.seen.get(), ds.ws.get(),
                 ds.result.get(), nullptr);
    ASSERT_EQ(download(ds.result)[0].token, want.token) << "step " << step;
  }
  EXPECT_EQ(download(ds.params)[0].step, 40u);
  std::vector<int32_t> counts = download(ds.counts);
  std::vector<uint8_t> seen = download(ds.seen);
  EXPECT_EQ(counts, st.output_counts);
  EXPECT_EQ(seen, st.seen);
}

// ---- the small top_k path (SamplerPath::SmallTopK, sampling_topk.cu) ---------------------------

// The same logits on a coarse grid (steps of 0.25: hundreds of ids share each value, so every cut
// of the order falls inside a tie group) and all equal (every e is 1: the order is the id order;
// the merge's worst case, k (k - 1) + 1 survivors).
std::vector<float> grid_logits(std::vector<float> x) {
  for (float& v : x) v = std::round(v * 4.f) / 4.f;
  return x;
}

PenaltyState small_penalties(int n, uint32_t seed) {
  PenaltyState st;
  st.reset(n);
  std::vector<float> r = random_floats(size_t(std::max(n / 8, 4)), 1.f, seed);
  for (size_t i = 0; i < r.size(); ++i) {
    const int32_t id = int32_t(std::fabs(r[i]) * 1e6) % n;
    if (i % 2 == 0)
      st.add_output(id);
    else
      st.add_prompt(std::vector<int32_t>{id});
  }
  return st;
}

// The small top_k path against the CPU (token exact, logprobs to f32 rounding, top ids exact)
// and against the general path on the same inputs (the whole result bit for bit: both finish
// with the same code).
void check_small_path(DeviceSampler& ds, const float* d_logits, const std::vector<float>& x, int n,
                      const SamplingParams& p, const PenaltyState* st, uint64_t step,
                      const std::string& what) {
  const SampleResult want = sample_token(x.data(), n, p, st, step);
  const auto dp = cuda::device_sampling_params(p, step, 0);
  const cuda::DeviceSampleResult fast =
      ds.sample(d_logits, dp, st != nullptr, cuda::SamplerPath::SmallTopK);
  expect_same(fast, want, what + " (small top_k path)");
  if (testing::Test::HasFatalFailure()) return;
  const cuda::DeviceSampleResult general = ds.sample(d_logits, dp, st != nullptr);
  ASSERT_EQ(fast.token, general.token) << what;
  EXPECT_EQ(fast.logprob, general.logprob) << what;
  ASSERT_EQ(fast.n_top, general.n_top) << what;
  for (int j = 0; j < fast.n_top; ++j) EXPECT_EQ(fast.top_ids[j], general.top_ids[j]) << what;
}

struct SmallKGrid {
  std::vector<int> top_k;
  std::vector<float> top_p{1.f, 0.95f, 0.5f, 0.01f};
  std::vector<float> min_p{0.f, 0.05f};
  std::vector<float> temperature{0.6f, 1.f, 1.7f};
};

TEST(CudaSampling, SmallTopKPathMatchesCpuAtTheModelVocabulary) {
  LILAC_REQUIRE_GPU();
  const std::vector<float> tricky = tricky_logits(kV, kReal, 41);
  // "masked": a grammar's mask left 13 ids (the others -inf, as mask_logits writes them), so a
  // top_k > 13 set is padded with zero-mass ids.
  std::vector<float> masked = tricky;
  for (int i = 0; i < kReal; ++i)
    if (i % 20000 != 17) masked[size_t(i)] = -INFINITY;
  const std::vector<std::pair<const char*, std::vector<float>>> inputs = {
      {"tricky", tricky},
      {"grid", grid_logits(tricky)},
      {"flat", std::vector<float>(kV, 0.5f)},
      {"masked", masked}};
  const SmallKGrid g{{1, 2, 19, 20, 21, cuda::kSmallTopK}};
  int draws = 0;
  for (const auto& [name, x] : inputs) {
    auto dx = upload(x);
    DeviceSampler ds(kReal);
    const PenaltyState st = random_penalties(kV, 42, x);
    ds.set_penalties(st);
    uint64_t seed = 1;
    for (int k : g.top_k)
      for (float tp : g.top_p)
        for (float mp : g.min_p)
          for (float T : g.temperature)
            for (bool pen : {false, true}) {
              SamplingParams p;
              p.temperature = T;
              p.top_k = k;
              p.top_p = tp;
              p.min_p = mp;
              p.presence_penalty = pen ? 1.5f : 0.f;
              p.top_logprobs = int(seed % 3) * 4;  // 0, 4, 8
              p.seed = seed++ * 7919u;
              const uint64_t step = seed % 5 == 0 ? (uint64_t(1) << 32) + seed : seed * seed;
              check_small_path(
                  ds, dx.get(), x, kReal, p, pen ? &st : nullptr, step,
                  (testing::Message() << name << " k " << k << " top_p " << tp << " min_p " << mp
                                      << " T " << T << " pen " << pen << " seed " << p.seed)
                      .GetString());
              if (testing::Test::HasFatalFailure()) return;
              ++draws;
            }
  }
  EXPECT_EQ(draws, 4 * 6 * 4 * 2 * 3 * 2);
}

// Vocabularies around the tile (1024 ids) and the merge's cases: one tile, top_k >= n, a last tile
// of one id, nb <= top_k (every candidate survives) and nb > top_k (the head bound filters).
TEST(CudaSampling, SmallTopKPathMatchesCpuAtAwkwardVocabularies) {
  LILAC_REQUIRE_GPU();
  const SmallKGrid g{{1, 2, 19, 20, 21, cuda::kSmallTopK}};
  for (int n : {1, 7, 31, 1023, 1024, 1025, 20000, 40000}) {
    const std::vector<float> tricky = tricky_logits(n + 7, n, uint32_t(n) + 3);
    const PenaltyState st = small_penalties(n, uint32_t(n) + 4);
    for (int variant = 0; variant < 3; ++variant) {
      const std::vector<float> x = variant == 0   ? tricky
                                   : variant == 1 ? grid_logits(tricky)
                                                  : std::vector<float>(size_t(n) + 7, -2.f);
      auto dx = upload(x);
      DeviceSampler ds(n);
      ds.set_penalties(st);
      uint64_t seed = 5;
      for (int k : g.top_k)
        for (float tp : g.top_p)
          for (float mp : g.min_p)
            for (float T : g.temperature) {
              SamplingParams p;
              p.temperature = T;
              p.top_k = k;
              p.top_p = tp;
              p.min_p = mp;
              const bool pen = seed % 2 == 0;
              if (pen) p.presence_penalty = 1.5f, p.repetition_penalty = 1.1f;
              p.top_logprobs = 20;
              p.seed = seed++;
              check_small_path(ds, dx.get(), x, n, p, pen ? &st : nullptr, seed % 7,
                               (testing::Message()
                                << "n " << n << " variant " << variant << " k " << k << " top_p "
                                << tp << " min_p " << mp << " T " << T << " pen " << pen)
                                   .GetString());
              if (testing::Test::HasFatalFailure()) return;
            }
    }
  }
}

// advance = 1 in a captured graph (the decode step's use): replays follow the CPU's step-by-step
// sequence, and the penalty state on the device follows the CPU's.
TEST(CudaSampling, SmallTopKPathInAGraphRunsTheDecodeLoop) {
  LILAC_REQUIRE_GPU();
  const int n = kReal;
  const std::vector<float> x = tricky_logits(n, n, 77);
  auto dx = upload(x);
  PenaltyState st;
  st.reset(n);
  st.add_prompt(std::vector<int32_t>{1, 2, 3});
  DeviceSampler ds(n);
  ds.set_penalties(st);
  SamplingParams p;  // the model's thinking defaults
  p.temperature = 1.f;
  p.top_k = 20;
  p.top_p = 0.95f;
  p.presence_penalty = 1.5f;
  p.top_logprobs = 3;
  p.seed = 99;
  const cuda::DeviceSamplingParams dp = cuda::device_sampling_params(p, 3, 1);
  LILAC_CUDA_CHECK(cudaMemcpy(ds.params.get(), &dp, sizeof(dp), cudaMemcpyHostToDevice));
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cuda::sample(dx.get(), n, ds.params.get(), ds.counts.get(), ds.seen.get(), ds.ws.get(),
               ds.result.get(), s, cuda::SamplerPath::SmallTopK);
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t step = 3; step < 33; ++step) {
    const SampleResult want = sample_token(x.data(), n, p, &st, step);
    st.add_output(want.token);
    LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s));
    LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
    const cuda::DeviceSampleResult got = download(ds.result)[0];
    expect_same(got, want, "graph replay at step " + std::to_string(step));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  EXPECT_EQ(download(ds.params)[0].step, 33u);
  EXPECT_EQ(download(ds.counts), st.output_counts);
  EXPECT_EQ(download(ds.seen), st.seen);
}

TEST(CudaSampling, SamplerPathIsTheSmallPathExactlyForTopKOneToThirtyTwo) {
  EXPECT_EQ(cuda::sampler_path(0), cuda::SamplerPath::General);
  EXPECT_EQ(cuda::sampler_path(-3), cuda::SamplerPath::General);
  EXPECT_EQ(cuda::sampler_path(1), cuda::SamplerPath::SmallTopK);
  EXPECT_EQ(cuda::sampler_path(20), cuda::SamplerPath::SmallTopK);
  EXPECT_EQ(cuda::sampler_path(cuda::kSmallTopK), cuda::SamplerPath::SmallTopK);
  EXPECT_EQ(cuda::sampler_path(cuda::kSmallTopK + 1), cuda::SamplerPath::General);
  EXPECT_EQ(cuda::sampler_path(1000), cuda::SamplerPath::General);
}

TEST(CudaSampling, BadArgumentsThrowBeforeLaunching) {
  auto* f = reinterpret_cast<const float*>(uintptr_t(256));
  auto* p = reinterpret_cast<cuda::DeviceSamplingParams*>(uintptr_t(256));
  auto* r = reinterpret_cast<cuda::DeviceSampleResult*>(uintptr_t(256));
  void* ws = reinterpret_cast<void*>(uintptr_t(256));
  EXPECT_THROW(cuda::sample(f, 0, p, nullptr, nullptr, ws, r, nullptr), Error);
  EXPECT_THROW(cuda::sample(f, 2000000, p, nullptr, nullptr, ws, r, nullptr), Error);
  EXPECT_THROW(cuda::sample(f, 100, p, nullptr, nullptr, reinterpret_cast<void*>(uintptr_t(260)), r,
                            nullptr),
               Error);
  const cuda::SamplerLaunchCounts before = cuda::sampler_launch_counts();
  const auto small = cuda::SamplerPath::SmallTopK;
  EXPECT_THROW(cuda::sample(f, 0, p, nullptr, nullptr, ws, r, nullptr, small), Error);
  EXPECT_THROW(cuda::sample(f, 2000000, p, nullptr, nullptr, ws, r, nullptr, small), Error);
  EXPECT_THROW(cuda::sample(nullptr, 100, p, nullptr, nullptr, ws, r, nullptr, small), Error);
  EXPECT_THROW(cuda::sample(f, 100, p, nullptr, nullptr, reinterpret_cast<void*>(uintptr_t(264)), r,
                            nullptr, small),
               Error);
  EXPECT_THROW(cuda::sample(f, 100, p, nullptr, nullptr, ws, r, nullptr, cuda::SamplerPath(7)),
               Error);
  const cuda::SamplerLaunchCounts after = cuda::sampler_launch_counts();
  EXPECT_EQ(after.general, before.general);  // nothing above was launched
  EXPECT_EQ(after.small_top_k, before.small_top_k);
  EXPECT_THROW(cuda::argmax(f, 0, ws, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace lilac::test
