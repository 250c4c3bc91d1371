// sampling in the kernel lab: cuda::sample's two paths on the same inputs, each checked against
// the CPU sampler (lilac::sample_token: the token must be equal, logprobs to f32 rounding) at the
// model's vocabulary, then timed as lilac_cuda_bench_kernels times the sampler (a graph of
// launches rotating over 4 logits rows, the step moving on the device). Both versions are
// production: v1 (ten launches) serves every request, v2 (three launches) only those with
// 1 <= top_k <= cuda::kSmallTopK, and is timed only with such a top_k.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../lab.h"
#include "cuda/sampling.h"
#include "model/sampling.h"

namespace lilac::lab {
namespace {

using cuda::DeviceBuffer;
using test::random_floats;

constexpr int kReal = 248077;  // the model's real vocabulary

cuda::SamplerPath path_of(int version) {
  return version == 1 ? cuda::SamplerPath::General : cuda::SamplerPath::SmallTopK;
}

// Random logits in [-3, 3) with exact ties: every 97th logit is rounded to a multiple of 1/8, so
// dozens of ids share each of the largest values and top_k / top_p cuts can fall inside a group.
std::vector<float> make_logits(uint32_t seed) {
  std::vector<float> x = random_floats(size_t(kReal), 3.f, seed);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = std::round(x[i] * 8.f) / 8.f;
  return x;
}

struct Case {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p, presence;
};
constexpr Case kCases[] = {{"T1 k20 p0.95 presence 1.5", 1.f, 20, 0.95f, 0.f, 1.5f},
                           {"T0.7 k20 p0.8", 0.7f, 20, 0.8f, 0.f, 0.f},
                           {"T1.7 k32 p0.5 min_p 0.05", 1.7f, 32, 0.5f, 0.05f, 0.f},
                           {"T0.6 k2", 0.6f, 2, 1.f, 0.f, 0.f}};

bool check(int version) {
  const std::vector<float> x = make_logits(17);
  auto dx = upload(x);
  PenaltyState pen;
  pen.reset(kReal);
  for (int i = 0; i < 4000; ++i) {
    pen.add_prompt(std::vector<int32_t>{(i * 7919) % kReal});
    if (i % 3 == 0) pen.add_output((i * 104729) % kReal);
  }
  auto counts = upload(pen.output_counts);
  auto seen = upload(pen.seen);
  DeviceBuffer<char> ws(cuda::sample_workspace_bytes(kReal));
  DeviceBuffer<cuda::DeviceSamplingParams> dp(1);
  DeviceBuffer<cuda::DeviceSampleResult> res(1);
  bool ok = true;
  for (const Case& c : kCases) {
    int equal = 0, draws = 0;
    std::vector<float> got_lp, want_lp;
    for (uint64_t j = 0; j < 12; ++j) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.presence_penalty = c.presence;
      p.top_logprobs = 5;
      p.seed = 1000 + j;
      const bool use_pen = c.presence != 0.f;
      const SampleResult want = sample_token(x.data(), kReal, p, use_pen ? &pen : nullptr, j * 31);
      const cuda::DeviceSamplingParams d = cuda::device_sampling_params(p, j * 31, 0);
      LILAC_CUDA_CHECK(cudaMemcpy(dp.get(), &d, sizeof(d), cudaMemcpyHostToDevice));
      cuda::sample(dx.get(), kReal, dp.get(), use_pen ? counts.get() : nullptr,
                   use_pen ? seen.get() : nullptr, ws.get(), res.get(), nullptr, path_of(version));
      const cuda::DeviceSampleResult got = download(res)[0];
      ++draws;
      bool same = got.token == want.token && size_t(got.n_top) == want.top.size();
      got_lp.push_back(got.logprob);
      want_lp.push_back(want.logprob);
      for (size_t t = 0; same && t < want.top.size(); ++t) {
        same = got.top_ids[t] == want.top[t].first;
        got_lp.push_back(got.top_logprobs[t]);
        want_lp.push_back(want.top[t].second);
      }
      equal += same ? 1 : 0;
    }
    const bool tokens_ok = equal == draws;
    std::printf("  check %s: token and top ids equal in %d of %d draws %s\n", c.name, equal, draws,
                tokens_ok ? "ok" : "FAIL");
    ok = tokens_ok && ok;
    // A log-sum-exp over 2.5e5 terms in f32 against the CPU's double: 5e-4 absolute.
    ok = report_check(std::string(c.name) + ": logprobs", compare(got_lp, want_lp, 5e-4, 0)) && ok;
  }
  return ok;
}

void time_cases(const Options& opt, int version) {
  std::vector<DeviceBuffer<float>> logits;
  for (uint32_t r = 0; r < 4; ++r) logits.push_back(upload(make_logits(50 + r)));
  DeviceBuffer<char> ws(cuda::sample_workspace_bytes(kReal));
  DeviceBuffer<cuda::DeviceSamplingParams> dp(1);
  DeviceBuffer<cuda::DeviceSampleResult> res(1);
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (const Case& c : kCases) {
    if (c.presence != 0.f) continue;  // no penalty arrays in the timing (as the kernel bench)
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 7;
    const cuda::DeviceSamplingParams d =
        cuda::device_sampling_params(p, 0, 1);  // the step moves between replays
    LILAC_CUDA_CHECK(cudaMemcpy(dp.get(), &d, sizeof(d), cudaMemcpyHostToDevice));
    const double us = graph_us(s, opt.runs, 20, [&](int i) {
      cuda::sample(logits[size_t(i % 4)].get(), kReal, dp.get(), nullptr, nullptr, ws.get(),
                   res.get(), s, path_of(version));
    });
    std::printf("  time %s: %.2f us per sample (graph of 20, %s)\n", c.name, us,
                version == 1 ? "10 launches" : "3 launches");
  }
  std::fflush(stdout);
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
}

bool run(const Options& opt, const Version& v) {
  const bool ok = check(v.number);
  time_cases(opt, v.number);
  return ok;
}

}  // namespace

Op sampling_op() {
  return Op{
      "sampling",
      "one token from V = 248077 logits, top_k <= 32 (kSmallTopK), with and without top_p, "
      "min_p, presence penalty",
      {{1, "radix", "ten launches: prep, exp, six radix-select passes, walk, finish", true},
       {2, "small_k", "three launches: prep, per-tile top_k candidates, merge + finish", true}},
      run};
}

}  // namespace lilac::lab
