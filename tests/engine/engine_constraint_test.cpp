// The engine's side of structured output (GenerationRequest::constraint): on the demo model, every
// sampled token is one the constraint allows, and accept() sees every token in order.
#include <gtest/gtest.h>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace lilac::test {
namespace {

// Allows exactly one token per step, cycling through `plan`; records what it is told was taken.
class PlannedTokens : public TokenConstraint {
 public:
  explicit PlannedTokens(std::vector<int32_t> plan) : plan_(std::move(plan)) {}
  void allowed_tokens(std::span<uint32_t> allowed) override {
    std::fill(allowed.begin(), allowed.end(), 0u);
    const int32_t t = plan_[accepted.size() % plan_.size()];
    allowed[size_t(t) / 32] |= 1u << (t % 32);
    ++masks;
  }
  void accept(int32_t token) override { accepted.push_back(token); }
  std::vector<int32_t> accepted;
  int masks = 0;

 private:
  std::vector<int32_t> plan_;
};

TEST(EngineConstraint, EverySampledTokenIsAllowedAndAccepted) {
  const std::string dir = data_root() + "/../../models/demo";
  auto model = load_model(dir);
  auto tok = Tokenizer::from_model_dir(dir);
  cpu::CpuBackend cpu{model->config, model->weights};
  cpu.set_sampling_vocab(tok->size());
  Engine engine(cpu, *tok);
  const std::vector<int32_t> plan = {tok->encode("a", false)[0], tok->encode("b", false)[0],
                                     tok->encode("c", false)[0]};
  for (bool greedy : {true, false}) {
    auto c = std::make_shared<PlannedTokens>(plan);
    GenerationRequest rq;
    rq.prompt = tok->encode("Hello there", false);
    rq.sampling.temperature = greedy ? 0.f : 1.f;
    rq.sampling.seed = 7;
    rq.max_tokens = 7;
    rq.constraint = c;
    GenerationResult r = engine.submit(std::move(rq)).get();
    ASSERT_EQ(r.finish, FinishReason::Length) << r.error;
    ASSERT_EQ(r.tokens.size(), 7u);
    for (size_t i = 0; i < r.tokens.size(); ++i) EXPECT_EQ(r.tokens[i], plan[i % 3]) << i;
    EXPECT_EQ(c->accepted, r.tokens);
    EXPECT_EQ(c->masks, 7);
  }
}

}  // namespace
}  // namespace lilac::test
