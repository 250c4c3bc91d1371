// `lilac tokenize`, run as a process: plain and JSON modes both ways, --model, bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer_fixtures.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

struct CliRun {
  int code;
  std::string out, err;
};

CliRun tokenize(const std::string& args, const std::string& input) {
  TempDir dir;
  std::ofstream(dir.str("in"), std::ios::binary) << input;
  std::string cmd = std::string(LILAC_BINARY) + " tokenize " + args + " < " + dir.str("in") +
                    " > " + dir.str("out") + " 2> " + dir.str("err");
  int status = std::system(cmd.c_str());
  auto slurp = [&](const char* name) {
    std::ifstream f(dir.str(name), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp("out"), slurp("err")};
}

std::string tok_arg() {
  return "--tokenizer " + qwen3_tokenizer_path();
}

std::string joined(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

TEST(TokenizerCli, PlainBothWays) {
  const std::string text = "<|im_start|>user\nHello, world!<|im_end|>\n";
  std::vector<int32_t> ids = qwen3_tokenizer().encode(text);
  CliRun r = tokenize(tok_arg(), text);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, joined(ids) + "\n");
  CliRun plain = tokenize(tok_arg() + " --no-special", text);
  EXPECT_EQ(plain.out, joined(qwen3_tokenizer().encode(text, false)) + "\n");
  CliRun d = tokenize(tok_arg() + " --decode", joined(ids) + "\n");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, text);
  CliRun skip = tokenize(tok_arg() + " --decode --skip-special", joined(ids));
  EXPECT_EQ(skip.out, "user\nHello, world!\n");
}

TEST(TokenizerCli, JsonBothWays) {
  const nlohmann::json& g = tokenizer_golden();
  nlohmann::json strings = g["strings"];
  CliRun r = tokenize(tok_arg() + " --json", strings.dump());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), g["variants"]["qwen3_regex"]["ids"]);
  CliRun d = tokenize(tok_arg() + " --json --decode", g["variants"]["qwen3_regex"]["ids"].dump());
  ASSERT_EQ(d.code, 0) << d.err;
  nlohmann::json back = nlohmann::json::parse(d.out);
  ASSERT_EQ(back.size(), strings.size());
  EXPECT_EQ(back[10], strings[10]);
}

TEST(TokenizerCli, ModelDirUsesItsRules) {
  const nlohmann::json& g = tokenizer_golden();
  TempDir dir;
  std::filesystem::copy_file(qwen3_tokenizer_path(), dir.str("tokenizer.json"));
  std::ofstream(dir.str("config.json")) << R"({"model_type": "qwen3_5_moe"})";
  CliRun r = tokenize("--model " + dir.str() + " --json",
                      nlohmann::json::array({g["strings"][53]}).dump());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)[0], g["variants"]["qwen35_regex"]["ids"][53]);
}

TEST(TokenizerCli, BadInputIsAnError) {
  struct Case {
    std::string args, input, message;
  };
  const std::vector<Case> cases = {
      {tok_arg(), "ok \xFF", "byte offset 3"},
      {tok_arg() + " --json", "[\"a\", 3]", "item 1"},
      {tok_arg() + " --json", "{\"a\": 1}", "JSON array"},
      {tok_arg() + " --json", "[\"a\"", "not valid JSON"},
      {tok_arg() + " --decode", "12 x3 4", "\"x3\" at byte 3"},
      {tok_arg() + " --decode", "99999999", "out of range"},
      {tok_arg() + " --decode --json", "[[1, \"2\"]]", "item 0"},
      {"--tokenizer /nonexistent.json", "x", "/nonexistent.json"},
      {"", "x", "exactly one of"},
  };
  for (const Case& c : cases) {
    CliRun r = tokenize(c.args, c.input);
    EXPECT_EQ(r.code, 1) << c.args << " <<< " << c.input;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
}  // namespace lilac::test
