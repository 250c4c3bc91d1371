// `lilac run`, `chat` and `serve` as a user runs them (the demo model, errors, exit codes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLilac = LILAC_BINARY;
std::string demo() {
  return data_root() + "/../../models/demo";
}

TEST(CliRun, AnswersOnePromptOnTheDemoModel) {
  const std::string flags =
      " --model " + demo() + " --device cpu --max-tokens 6 --seed 5 --no-think";
  auto r = run_shell(kLilac + " run" + flags + " 'Hello there'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("RANDOM weights"));
  // The answer alone (stdout): the same seed and prompt, from the arguments or from stdin, give
  // the same text.
  auto a = run_shell(kLilac + " run -q" + flags + " 'Hello there'", false);
  auto b = run_shell("echo 'Hello there' | " + kLilac + " run -q" + flags, false);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(b.status, 0);
  EXPECT_FALSE(a.output.empty());
  EXPECT_EQ(a.output, b.output);
}

// --weights q4 on the BF16 demo checkpoint: quantized at load (on the CPU here, in memory), and
// it answers.
TEST(CliRun, QuantizesABf16CheckpointAtLoad) {
  auto r = run_shell(kLilac + " run --model " + demo() +
                     " --device cpu --weights q4 --max-tokens 6 --seed 5 --no-think 'Hello there'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("quantizing the bf16 weights to 4-bit at load"));
}

TEST(CliRun, Errors) {
  auto empty = run_shell("printf '' | " + kLilac + " run --model " + demo());
  EXPECT_EQ(empty.status, 1);
  EXPECT_THAT(empty.output, HasSubstr("the prompt is empty"));
  auto missing = run_shell(kLilac + " run --model /nonexistent/model hi");
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.output, HasSubstr("/nonexistent/model"));
}

TEST(CliChat, HistoryResetAndExit) {
  auto r =
      run_shell("printf 'hi\\n/help\\n/reset\\nagain\\n/bogus\\n/exit\\nnever\\n' | " + kLilac +
                " chat -q --model " + demo() + " --device cpu --max-tokens 4 --seed 1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(new conversation)"));
  EXPECT_THAT(r.output, HasSubstr("unknown command /bogus"));
  EXPECT_THAT(r.output, HasSubstr("commands: /reset"));
}

// The scripted backend is test scaffolding: only the test build of the server
// (lilac_test_server, tests/support) has `--scripted`; the production binary neither lists nor
// accepts it.
TEST(CliServe, ScriptedIsOnlyInTheTestServer) {
  auto help = run_shell(kLilac + " serve --help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_THAT(help.output, HasSubstr("--weights"));
  EXPECT_THAT(help.output, Not(HasSubstr("--scripted")));
  auto refused = run_shell(kLilac + " serve --model " + demo() + " --port 0 --scripted x.json");
  EXPECT_NE(refused.status, 0);
  EXPECT_THAT(refused.output, HasSubstr("--scripted"));
  const std::string test_server = LILAC_TEST_SERVER;
  auto test_help = run_shell(test_server + " serve --help");
  EXPECT_EQ(test_help.status, 0) << test_help.output;
  EXPECT_THAT(test_help.output, HasSubstr("--scripted"));
  auto conflict = run_shell(test_server + " serve --synthetic --scripted x.json --port 0");
  EXPECT_EQ(conflict.status, 1);
  EXPECT_THAT(conflict.output, HasSubstr("no --model or --scripted with it"));
}

TEST(CliServe, RefusesBadFlagsBeforeServing) {
  auto w = run_shell(kLilac + " serve --model " + demo() + " --port 0 --weights fp8");
  EXPECT_EQ(w.status, 1);
  EXPECT_THAT(w.output, HasSubstr("--weights fp8: the checkpoint"));
  auto d = run_shell(kLilac + " serve --model " + demo() + " --port 0 --device tpu");
  EXPECT_EQ(d.status, 1);
  EXPECT_THAT(d.output, HasSubstr("--device tpu"));
  auto l = run_shell(kLilac + " serve --model " + demo() + " --port 0 --log-level loud");
  EXPECT_EQ(l.status, 1);
  EXPECT_THAT(l.output, HasSubstr("unknown log level"));
  auto p = run_shell(kLilac + " serve --model " + demo() + " --port 70000");
  EXPECT_EQ(p.status, 1);
}

}  // namespace
}  // namespace lilac::test
