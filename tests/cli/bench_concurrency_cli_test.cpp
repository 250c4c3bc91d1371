// `lilac bench --concurrency` on the CPU with the demo model (so CI runs the batched bench), and
// the CLI refusals of the serving flags that come with batching (--parallel, --synthetic).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

std::string demo() {
  return data_root() + "/../../models/demo";
}

// `lilac bench` on the demo model on the CPU with `args`, its JSON written to a temporary file:
// the run (status and output) and the document (null when the run failed).
struct BenchRun {
  CommandResult run;
  nlohmann::json json;
};
BenchRun bench_demo(const std::string& args) {
  TempDir dir;
  const std::string out = dir.str("bench.json");
  BenchRun b{run_lilac("bench --model " + demo() + " --device cpu " + args + " --json " + out), {}};
  if (b.run.status == 0) {
    std::ifstream in(out);
    b.json = nlohmann::json::parse(in);
  }
  return b;
}

TEST(CliBench, ConcurrencySweepWritesConcurrencyResults) {
  auto [r, j] = bench_demo("--concurrency 1,2,4 --prompt-tokens 48 --decode 6");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("per stream tok/s"));
  for (const char* key : {"engine", "commit", "gpu", "device", "weights", "model", "decode_steps"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["prompt_tokens"], 48);
  EXPECT_TRUE(j["results"].empty()) << "--concurrency alone runs only the concurrency sweep";
  const auto& rows = j["concurrency_results"];
  ASSERT_EQ(rows.size(), 3u);
  const int levels[] = {1, 2, 4};
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row["concurrency"], levels[i]);
    EXPECT_EQ(row["decode_steps"], 6);
    const double total = row["output_tok_s"], per_stream = row["per_stream_tok_s"];
    EXPECT_GT(per_stream, 0);
    EXPECT_NEAR(total, per_stream * levels[i], 1e-6 * total);
    EXPECT_NEAR(row["step_ms"].get<double>(), 1e3 / per_stream, 1e-6 * 1e3 / per_stream);
    // Stream 0 reads the same prompt at every level: batching gives it the same greedy tokens.
    EXPECT_EQ(row["stream0_digest"], rows[0]["stream0_digest"]);
  }
}

TEST(CliBench, ConcurrencyAndLengthsTogether) {
  const auto [r, j] =
      bench_demo("--lengths 32 --rounds 1 --concurrency 2 --prompt-tokens 16 --decode 4");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["concurrency_results"].size(), 1u);
  auto bad = run_lilac("bench --model " + demo() + " --device cpu --concurrency 2,x");
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.output, HasSubstr("--concurrency: 'x' is not a positive integer"));
}

// Sampled decode beside greedy: the demo's generation_config.json sets no sampling, so the
// defaults (temperature 1) apply; the sampled tokens are seeded, so every round draws the same.
TEST(CliBench, SampledDecodeBesideGreedy) {
  auto [r, j] = bench_demo("--lengths 32,48 --rounds 2 --decode 5");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sampled tok/s"));
  EXPECT_THAT(r.output, HasSubstr("sampled decode: temperature 1.00"));
  ASSERT_TRUE(j.contains("sampling"));
  EXPECT_EQ(j["sampling"]["temperature"], 1.0);
  EXPECT_THAT(j["sampling"]["source"].get<std::string>(), HasSubstr("generation_config.json"));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["sampled_decode_tok_s"].get<double>(), 0);
    EXPECT_EQ(row["sampled_decode_s_rounds"].size(), 2u);
    EXPECT_EQ(row["sampled_digest"].get<std::string>().size(), 16u);
    EXPECT_NE(row["sampled_digest"], row["digest"]) << "sampled tokens differ from greedy ones";
  }
  EXPECT_GT(j["mean_sampled_decode_tok_s"].get<double>(), 0);

  auto [off, k] = bench_demo("--lengths 32 --rounds 1 --decode 3 --sampling off");
  ASSERT_EQ(off.status, 0) << off.output;
  EXPECT_FALSE(k.contains("sampling"));
  EXPECT_FALSE(k["results"][0].contains("sampled_decode_tok_s"));
  auto bad = run_lilac("bench --model " + demo() + " --device cpu --sampling maybe");
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.output, HasSubstr("--sampling maybe: default or off"));
}

// The first decode step of each round kept apart (a fresh sequence's one-off costs, e.g. the CUDA
// backend's graph capture) and the other steps' rate, beside the protocol's decode_tok_s.
TEST(CliBench, FirstDecodeStepApart) {
  auto [r, j] = bench_demo("--lengths 32 --rounds 1 --decode 4 --sampling off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(first step "));
  const auto& row = j["results"].at(0);
  ASSERT_EQ(row["decode_first_step_s_rounds"].size(), 1u);
  const double first = row["decode_first_step_s_rounds"][0].get<double>();
  const double all = row["decode_s_rounds"][0].get<double>();
  EXPECT_GT(first, 0);
  EXPECT_LT(first, all);
  EXPECT_NEAR(row["decode_rest_tok_s"].get<double>(), 3.0 / (all - first),
              1e-9 * 3.0 / (all - first));
  EXPECT_NEAR(row["decode_tok_s"].get<double>(), 4.0 / all, 1e-9 * 4.0 / all);

  auto [one, k] = bench_demo("--lengths 32 --rounds 1 --decode 1 --sampling off");
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_EQ(k["results"][0]["decode_rest_tok_s"].get<double>(), 0.0) << "no other steps";
}

TEST(CliServe, ParallelAndSyntheticRefusals) {
  auto r = run_lilac("serve --model " + demo() + " --device cpu --port 0 --parallel=-2");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--parallel -2 must be at least 1"));
  auto s = run_lilac("serve --synthetic --device cpu --port 0");
  EXPECT_NE(s.status, 0);
  EXPECT_THAT(s.output, HasSubstr("--synthetic needs the cuda device"));
  auto t = run_lilac("serve --synthetic --model " + demo() + " --port 0");
  EXPECT_NE(t.status, 0);
  EXPECT_THAT(t.output, HasSubstr("no --model with it"));
}

// --router picks the synthetic model's router: refused without --synthetic and for an unknown
// name, before any model is made.
TEST(CliBench, RouterGoesWithSyntheticAndNamesItsChoices) {
  for (const char* cmd : {"bench", "serve"}) {
    auto r = run_lilac(std::string(cmd) + " --model " + demo() + " --device cpu --router zipf");
    EXPECT_NE(r.status, 0) << cmd;
    EXPECT_THAT(r.output, HasSubstr("--router goes with --synthetic")) << cmd;
    auto b = run_lilac(std::string(cmd) + " --synthetic --router skewed");
    EXPECT_NE(b.status, 0) << cmd;
    EXPECT_THAT(b.output, HasSubstr("--router skewed: uniform or zipf")) << cmd;
  }
}

}  // namespace
}  // namespace lilac::test
