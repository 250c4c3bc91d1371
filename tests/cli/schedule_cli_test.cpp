// `lilac schedule`: the persistent decode schedule's checks and predicted step for the full-size
// config and for a checkpoint's config; bad values are refused naming the flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(CliSchedule, FullSizeIsCheckedAndPredicted) {
  auto r = run_lilac("schedule --rows 1,16 --gdn-state bf16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("hidden 2048, 40 layers"));
  EXPECT_THAT(r.output, HasSubstr("rows   1: "));
  EXPECT_THAT(r.output, HasSubstr("rows  16: "));
  EXPECT_THAT(r.output, HasSubstr("102 active slots"));  // 256 (1 - (1 - 8/256)^16), rounded
  EXPECT_THAT(r.output, Not(HasSubstr("problem")));
}

TEST(CliSchedule, ACheckpointsConfigAndTodaysPath) {
  auto r = run_lilac("schedule --model " + demo_model_dir() + " --rows 3 --kernel-per-op");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("hidden 128"));
  EXPECT_THAT(r.output, HasSubstr("(kernel per op)"));
}

TEST(CliSchedule, AVerifyPass) {
  auto r = run_lilac("schedule --rows 1 --drafts 3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("verify passes   1 x 4 rows"));
  EXPECT_THAT(r.output, Not(HasSubstr("problem")));
}

TEST(CliSchedule, BadValuesAreRefused) {
  // Each refused with a non-zero status and the flag (or the path) named.
  const std::pair<const char*, const char*> cases[] = {
      {"--weights q3", "--weights"}, {"--gdn-state f16", "--gdn-state"},
      {"--blocks 0", "--blocks"},    {"--tbps 0", "--tbps"},
      {"--rows 0", "--rows"},        {"--drafts 17", "--drafts"},
      {"--context -1", "--context"}, {"--model /nonexistent", "/nonexistent"},
  };
  for (const auto& [args, named] : cases) {
    const auto r = run_lilac(std::string("schedule ") + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_THAT(r.output, HasSubstr(named)) << args;
  }
}

}  // namespace
}  // namespace lilac::test
