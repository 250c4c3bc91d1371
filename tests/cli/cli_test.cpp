// The `lilac` binary end to end: inspect and logits on the fixtures, exit codes, error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

TEST(CliInspect, DescribesAGoodCheckpoint) {
  auto r = run_lilac("inspect --model " + data_path("tiny-a"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("format:   bf16"));
  EXPECT_THAT(r.output, HasSubstr("hub (fused"));
  EXPECT_THAT(r.output, HasSubstr("3 Gated DeltaNet, 1 full attention"));
  EXPECT_THAT(r.output, HasSubstr("status:   OK"));
  auto per = run_lilac("inspect --model " + data_path("tiny-a-per-expert"));
  EXPECT_EQ(per.status, 0) << per.output;
  EXPECT_THAT(per.output, HasSubstr("per-expert"));
}

TEST(CliInspect, ListsEveryProblemAndFails) {
  TempDir t;
  std::string dir = t.str("m");
  std::filesystem::copy(data_path("tiny-a-per-expert"), dir);
  // Two problems at once: a config that disagrees on the expert size, and a bogus extra key.
  std::ifstream in(dir + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), {});
  in.close();
  auto pos = cfg.find("\"moe_intermediate_size\": 64");
  ASSERT_NE(pos, std::string::npos);
  cfg.replace(pos, 27, "\"moe_intermediate_size\": 32");
  std::filesystem::permissions(dir + "/config.json", std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  std::ofstream(dir + "/config.json") << cfg;
  auto r = run_lilac("inspect --model " + dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("experts.0.gate_proj.weight"));
  EXPECT_THAT(r.output, HasSubstr("experts.15.down_proj.weight"));
  EXPECT_THAT(r.output, HasSubstr("UNUSABLE"));
}

TEST(CliInspect, MissingDirectory) {
  auto r = run_lilac("inspect --model /nonexistent/model");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("config.json"));
}

TEST(CliLogits, MatchesTheFixtureAndWritesItsLayout) {
  TempDir t;
  const std::string ref = data_path("tiny-a/reference.safetensors");
  auto r = run_lilac("logits --model " + data_path("tiny-a") + " --prompt-from " + ref +
                     " --decode 16 --rope-freq-bf16 --atol 1e-4 --compare " + ref + " --out " +
                     t.str("out.safetensors"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("decode_ids       16/16 identical"));
  EXPECT_THAT(r.output, HasSubstr("PASS"));
  // The written file compares against the reference the same way (its names and shapes match).
  auto again =
      run_lilac("logits --model " + data_path("tiny-a-per-expert") + " --prompt-from " +
                t.str("out.safetensors") + " --decode 16 --rope-freq-bf16 --atol 1e-6 --compare " +
                t.str("out.safetensors"));
  EXPECT_EQ(again.status, 0) << again.output;
}

TEST(CliLogits, FailsAboveTolerance) {
  // Without the fixture's bf16-rounded RoPE frequencies the logits differ by ~1e-3 (see
  // CpuBackendRope): a 1e-4 comparison must fail with exit code 3.
  const std::string ref = data_path("tiny-a/reference.safetensors");
  auto r = run_lilac("logits --model " + data_path("tiny-a") + " --prompt-from " + ref +
                     " --atol 1e-4 --compare " + ref);
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAIL"));
}

TEST(CliLogits, BadArguments) {
  EXPECT_EQ(run_lilac("logits --model " + data_path("tiny-a") + " --prompt-ids 1,x,3").status, 1);
  EXPECT_EQ(run_lilac("logits --model " + data_path("tiny-a") + " --prompt-ids 1,99999").status, 1);
  EXPECT_EQ(run_lilac("logits --model " + data_path("tiny-a")).status, 1);
  auto r =
      run_lilac("logits --model " + data_path("tiny-a") + " --prompt-ids 1,2 --device warp-drive");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("unknown device"));
  auto ok = run_lilac("logits --model " + data_path("tiny-a") + " --prompt-ids 1,2,3 --decode 2");
  EXPECT_EQ(ok.status, 0) << ok.output;
}

}  // namespace
}  // namespace lilac::test
