// Structured output on the CUDA backend (label gpu): CudaBackend::step_constrained (the mask
// computed on the host while the device runs the step, applied on the device, the device
// sampler) against the reference Backend::step_constrained (forward(), the mask on the host, the
// host sampler) on the tiny-a fixture: the same tokens, greedy and sampled, prompt and decode
// steps, and never a token the constraint forbids.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../test_data.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "grammar/constraint.h"
#include "io/checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace lilac::test {
namespace {

// Allows about 2 tokens in 7, a different set at every step (advanced by accept()).
class StrideConstraint : public TokenConstraint {
 public:
  explicit StrideConstraint(int32_t n) : n_(n) {}
  bool allows(int32_t t) const {
    return (uint64_t(t) * 2654435761u + uint64_t(step_) * 40503u) % 7 < 2;
  }
  void allowed_tokens(std::span<uint32_t> allowed) override {
    ++calls;
    for (int32_t t = 0; t < n_; ++t)
      if (allows(t)) allowed[size_t(t) / 32] |= 1u << (t % 32);
  }
  void accept(int32_t) override { ++step_; }
  int calls = 0;

 private:
  int32_t n_;
  int step_ = 0;
};

void expect_device_matches_reference(const SamplingParams& p, const char* what) {
  auto model = load_model(data_path("tiny-a"));
  auto backend = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  const int32_t V = backend->sampling_vocab();
  auto dev_seq = backend->new_sequence(64);
  auto ref_seq = backend->new_sequence(64);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  backend->begin_sampling(*dev_seq, prompt, p);
  backend->begin_sampling(*ref_seq, prompt, p);
  StrideConstraint dev_c(V), ref_c(V);
  std::vector<int32_t> dev_in = prompt, ref_in = prompt;
  for (uint64_t i = 0; i < 24; ++i) {
    const StepResult d = backend->step_constrained(*dev_seq, dev_in, i, dev_c);
    const StepResult r = backend->Backend::step_constrained(*ref_seq, ref_in, i, ref_c);
    ASSERT_TRUE(dev_c.allows(d.token))
        << what << ": step " << i << " sampled forbidden " << d.token;
    ASSERT_EQ(d.token, r.token) << what << ": step " << i;
    if (p.temperature > 0) EXPECT_NEAR(d.logprob, r.logprob, 1e-4) << what << ": step " << i;
    dev_c.accept(d.token);
    ref_c.accept(r.token);
    dev_in = {d.token};
    ref_in = {r.token};
  }
  EXPECT_EQ(dev_c.calls, 24) << "one mask per sampled token";
}

TEST(ConstrainedStep, GreedyMatchesTheHostReference) {
  LILAC_REQUIRE_GPU();
  SamplingParams p;
  p.temperature = 0;
  expect_device_matches_reference(p, "greedy");
}

TEST(ConstrainedStep, SampledMatchesTheHostReference) {
  LILAC_REQUIRE_GPU();
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.seed = 7;
  p.top_logprobs = 3;
  expect_device_matches_reference(p, "sampled");
}

TEST(ConstrainedStep, PenaltiesMatchTheHostReference) {
  LILAC_REQUIRE_GPU();
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 3;
  p.presence_penalty = 0.5f;
  p.repetition_penalty = 1.2f;
  expect_device_matches_reference(p, "penalties");
}

// The cost of structured output at batch 1 (run explicitly: --gtest_also_run_disabled_tests):
// the full-size synthetic model in 4-bit, greedy, 256 decode steps each way: step() against
// step_constrained() with a JSON-shaped grammar over the Qwen3 tokenizer's vocabulary (a list of
// records that never closes, so every step is constrained). Reports ms per token both ways and
// the host time of the masks (computed while the device runs the step).
TEST(ConstrainedStep, DISABLED_DecodeCostQ4) {
  LILAC_REQUIRE_GPU();
  TokenizerOptions opt;
  opt.force_qwen35_regex = true;
  auto tok = Tokenizer::from_file(data_path("tokenizer/qwen3-tokenizer.json.gz"), opt);
  std::vector<std::string> bytes(size_t(tok->size()));
  for (int32_t id = 0; id < tok->size(); ++id)
    if (!tok->is_special(id)) bytes[size_t(id)] = tok->token_bytes(id);
  auto vocab = std::make_shared<const grammar::Vocabulary>(std::move(bytes), tok->eos_ids());
  auto index = std::make_shared<grammar::GrammarIndex>(
      std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(
          R"(root ::= "[" ws record ("," ws record)*
record ::= "{\"id\": " [0-9]+ ", \"name\": \"" [a-zA-Z ]* "\", \"ok\": " ("true" | "false") "}"
ws ::= [ \n]*)")),
      vocab);
  auto backend = cuda::make_synthetic_backend("q4", 1);
  backend->set_sampling_vocab(tok->size());
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  constexpr int kSteps = 256;
  auto run = [&](bool constrained, std::vector<double>& mask_ms) {
    auto seq = backend->new_sequence(kSteps + 64);
    backend->begin_sampling(*seq, prompt, greedy);
    grammar::GrammarConstraint c(index);
    struct Timed : TokenConstraint {
      grammar::GrammarConstraint* inner;
      std::vector<double>* ms;
      void allowed_tokens(std::span<uint32_t> a) override {
        const auto t0 = std::chrono::steady_clock::now();
        inner->allowed_tokens(a);
        ms->push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      void accept(int32_t t) override { inner->accept(t); }
    } timed;
    timed.inner = &c;
    timed.ms = &mask_ms;
    std::vector<int32_t> in = prompt;
    std::chrono::steady_clock::time_point t0;
    for (int i = 0; i < kSteps + 8; ++i) {
      if (i == 8) t0 = std::chrono::steady_clock::now();  // 8 warm-up steps (graphs, caches)
      const StepResult r = constrained ? backend->step_constrained(*seq, in, uint64_t(i), timed)
                                       : backend->step(*seq, in, uint64_t(i));
      if (constrained) {
        EXPECT_EQ(c.rejected(), 0);
        timed.accept(r.token);
      }
      in = {r.token};
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           kSteps;
  };
  std::vector<double> none, mask_ms;
  const double plain = run(false, none);
  const double constrained = run(true, mask_ms);
  std::sort(mask_ms.begin(), mask_ms.end());
  auto pct = [&](double q) { return mask_ms[size_t(q * double(mask_ms.size() - 1))]; };
  std::printf(
      "q4 batch 1, greedy, %d steps: step() %.3f ms/token (%.1f tok/s), step_constrained %.3f "
      "ms/token (%.1f tok/s): %.1f%% slower; host mask p50 %.3f ms, p99 %.3f ms, max %.3f ms "
      "(%zu masks, %zu cached grammar contexts)\n",
      kSteps, plain, 1e3 / plain, constrained, 1e3 / constrained,
      100.0 * (constrained / plain - 1.0), pct(0.5), pct(0.99), mask_ms.back(), mask_ms.size(),
      index->cached_entries());
}

}  // namespace
}  // namespace lilac::test
