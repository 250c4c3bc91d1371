// --gdn-state through the runtime (runtime/backends.h, model_setup.h): the flag's parsing, the
// CPU backend opened with and without it (also when quantizing at load), and load_for_serving
// passing LoadOptions::gdn_state to the backend it opens and saying so at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_data.h"
#include "io/checkpoint.h"
#include "runtime/backends.h"
#include "runtime/model_setup.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

TEST(GdnStateSetup, FlagParsing) {
  EXPECT_EQ(runtime::parse_gdn_state_flag(std::nullopt), std::nullopt) << "not given";
  EXPECT_EQ(runtime::parse_gdn_state_flag("f32"), GdnStateFormat::f32);
  EXPECT_EQ(runtime::parse_gdn_state_flag("bf16"), GdnStateFormat::bf16);
  for (const char* bad : {"fp8", ""}) {
    try {
      runtime::parse_gdn_state_flag(std::string(bad));
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("--gdn-state"));
      EXPECT_THAT(e.what(), HasSubstr(std::string("'") + bad + "' (expected f32 or bf16)"));
    }
  }
}

TEST(GdnStateSetup, OpenBackendSetsTheCpuFormat) {
  auto model = load_model(demo_model_dir());
  EXPECT_EQ(runtime::gdn_state_format(*runtime::open_backend(*model, "cpu")), GdnStateFormat::f32);
  EXPECT_EQ(runtime::gdn_state_format(*runtime::open_backend(*model, "cpu", GdnStateFormat::bf16)),
            GdnStateFormat::bf16);
  EXPECT_EQ(runtime::gdn_state_format(*runtime::open_backend(*model, "cpu", GdnStateFormat::f32)),
            GdnStateFormat::f32);
  // Quantizing at load (in memory on the cpu) keeps the choice.
  auto q = runtime::open_backend(*model, "cpu", /*quantize_at_load=*/true, GdnStateFormat::bf16);
  EXPECT_EQ(runtime::gdn_state_format(*q), GdnStateFormat::bf16);
}

TEST(GdnStateSetup, LoadForServingPassesItOn) {
  runtime::LoadOptions lo;
  lo.device = "cpu";
  lo.context_size = 256;
  lo.parallel = 1;
  std::vector<std::string> log;
  lo.progress = [&log](const std::string& line) { log.push_back(line); };
  auto said = [&log] {
    for (const auto& line : log)
      if (line.find("Gated DeltaNet recurrent state kept in bf16") != std::string::npos)
        return true;
    return false;
  };
  const auto choice = runtime::choose_model(demo_model_dir());
  auto dflt = runtime::load_for_serving(choice, lo);
  EXPECT_EQ(runtime::gdn_state_format(*dflt->backend), GdnStateFormat::f32);
  EXPECT_FALSE(said());
  lo.gdn_state = GdnStateFormat::bf16;
  auto bf16 = runtime::load_for_serving(choice, lo);
  EXPECT_EQ(runtime::gdn_state_format(*bf16->backend), GdnStateFormat::bf16);
  EXPECT_TRUE(said()) << "the start-up log names the format";
}

}  // namespace
}  // namespace lilac::test
