// The serving set-up's batching parts: load_for_serving sizes the slots (--parallel, its default
// per backend) and the step token budget (--step-tokens, its default per backend) and refuses bad
// values; load_synthetic_for_serving (serve --synthetic) puts any backend behind the Qwen3
// tokenizer file and the built-in template (here the demo model's CPU backend stands in for the
// GPU's synthetic one, so CI runs it).
#include <gtest/gtest.h>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "runtime/model_setup.h"
#include "util/error.h"

namespace lilac::test {
namespace {

std::string demo_dir() {
  return data_root() + "/../../models/demo";
}

std::unique_ptr<runtime::LoadedModel> load_demo(const runtime::LoadOptions& lo) {
  return runtime::load_for_serving(runtime::choose_model(demo_dir()), lo,
                                   [](Model& m, const std::string&, bool) {
                                     return std::make_unique<cpu::CpuBackend>(m.config, m.weights);
                                   });
}

TEST(ServingSetup, ParallelSizesTheSlots) {
  runtime::LoadOptions lo;
  lo.device = "cpu";
  lo.context_size = 2048;
  std::vector<std::string> log;
  lo.progress = [&log](const std::string& line) { log.push_back(line); };
  auto dflt = load_demo(lo);
  EXPECT_EQ(dflt->engine->options().parallel, 4) << "the cpu default";
  EXPECT_EQ(dflt->engine->metrics().slots, 4);
  // The step token budget: the engine's 2048 on the cpu (4096 on cuda, where several prompts'
  // pieces run as one prefill chunk).
  EXPECT_EQ(runtime::default_step_tokens(*dflt->backend), 2048);
  EXPECT_EQ(dflt->engine->options().step_token_budget, 2048) << "the cpu default";
  bool said = false;
  for (const auto& line : log) said = said || line.find("slots: 4 x") != std::string::npos;
  EXPECT_TRUE(said) << "the slot memory is logged at start-up";
  lo.parallel = 7;
  lo.step_tokens = 64;
  auto seven = load_demo(lo);
  EXPECT_EQ(seven->engine->options().parallel, 7);
  EXPECT_EQ(seven->engine->options().step_token_budget, 64);
  EXPECT_EQ(seven->engine->slot_memory().total, 7 * seven->engine->slot_memory().per_slot);
  lo.parallel = -1;
  EXPECT_THROW(load_demo(lo), Error);
}

TEST(ServingSetup, SyntheticServesAnyBackendBehindTheTokenizerFile) {
  auto model = load_model(demo_dir());
  runtime::LoadOptions lo;
  lo.context_size = 512;
  lo.parallel = 2;
  lo.weights = "bf16";
  auto lm = runtime::load_synthetic_for_serving(
      lo, data_path("tokenizer/qwen3-tokenizer.json.gz"),
      [&] { return std::make_unique<cpu::CpuBackend>(model->config, model->weights); });
  EXPECT_GT(lm->tokenizer->size(), 150000) << "the Qwen3 tokenizer";
  EXPECT_NE(lm->description.find("synthetic"), std::string::npos) << lm->description;
  ASSERT_TRUE(lm->chat_template);
  EXPECT_EQ(lm->defaults.temperature, 0.f);
  GenerationRequest rq;
  rq.prompt = {1, 2, 3, 4, 5};
  rq.max_tokens = 5;
  rq.sampling = lm->defaults;
  GenerationResult r = lm->engine->submit(std::move(rq)).get();
  EXPECT_EQ(r.finish, FinishReason::Length) << r.error;
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_THROW(
      runtime::load_synthetic_for_serving(
          lo, data_path("no/such/tokenizer.json"),
          [&] { return std::make_unique<cpu::CpuBackend>(model->config, model->weights); }),
      Error);
}

}  // namespace
}  // namespace lilac::test
