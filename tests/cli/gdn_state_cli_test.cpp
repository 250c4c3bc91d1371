// --gdn-state on the commands that open a backend: `bench` records the format in its JSON and
// header line, `run` passes it to the backend, and a bad value is refused with the flag and the
// value named (by serve before it binds, by bench before --synthetic looks for a GPU).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

TEST(CliGdnState, BenchRecordsTheFormat) {
  TempDir dir;
  const std::string out = dir.str("bench.json");
  const std::string base =
      "bench --model " + demo_model_dir() +
      " --device cpu --lengths 16 --rounds 1 --decode 3 --sampling off --json " + out;
  for (const char* f : {"", "f32", "bf16"}) {
    const std::string want = *f ? f : "f32";
    auto r = run_lilac(base + (*f ? std::string(" --gdn-state ") + f : ""));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("Gated DeltaNet state " + want)) << "the header line";
    std::ifstream in(out);
    nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["gdn_state"], want) << (*f ? f : "(default)");
  }
}

TEST(CliGdnState, RunUsesIt) {
  auto r = run_lilac("run --model " + demo_model_dir() +
                     " --device cpu --gdn-state bf16 --max-tokens 4 --seed 5 --no-think 'Hello'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Gated DeltaNet recurrent state kept in bf16"));
}

TEST(CliGdnState, BadValuesAreRefused) {
  const std::string want = "--gdn-state fp8: unknown Gated DeltaNet state format 'fp8'";
  for (const std::string& cmd : {"serve --model " + demo_model_dir() + " --device cpu --port 0",
                                 "run --model " + demo_model_dir() + " hi",
                                 "bench --model " + demo_model_dir() + " --device cpu --lengths 16",
                                 std::string("bench --synthetic")}) {
    auto r = run_lilac(cmd + " --gdn-state fp8");
    EXPECT_EQ(r.status, 1) << cmd << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(want)) << cmd;
  }
  auto empty =
      run_lilac("bench --model " + demo_model_dir() + " --device cpu --lengths 16 --gdn-state ''");
  EXPECT_EQ(empty.status, 1) << empty.output;
  EXPECT_THAT(empty.output, HasSubstr("unknown Gated DeltaNet state format ''"));
  for (const char* cmd : {"serve", "run", "chat", "bench"}) {
    auto help = run_lilac(std::string(cmd) + " --help");
    EXPECT_EQ(help.status, 0) << cmd;
    EXPECT_THAT(help.output, HasSubstr("--gdn-state")) << cmd;
  }
}

}  // namespace
}  // namespace lilac::test
