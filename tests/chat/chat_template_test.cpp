#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../test_data.h"
#include "chat/chat_template.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using ojson = nlohmann::ordered_json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatOptions options_of(const ojson& c) {
  ChatOptions o;
  o.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("enable_thinking")) o.enable_thinking = c["enable_thinking"].get<bool>();
  o.preserve_thinking = c.value("preserve_thinking", false);
  return o;
}

void check_golden(const std::string& variant) {
  std::string dir = data_path("tokenizer/");
  auto tmpl =
      ChatTemplate::from_string(slurp(dir + "chat_template_" + variant + ".jinja"), variant);
  ojson golden = ojson::parse(slurp(dir + "chat-golden-" + variant + ".json"));
  ASSERT_EQ(golden["cases"].size(), 15u);
  for (const ojson& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ojson tools = c.contains("tools") ? c["tools"] : ojson();
    EXPECT_EQ(tmpl->render(c["messages"], tools, options_of(c)), c["rendered"].get<std::string>());
  }
}

TEST(ChatTemplate, GoldenQwen36) {
  check_golden("qwen36");
}
TEST(ChatTemplate, GoldenQwen35) {
  check_golden("qwen35");
}

}  // namespace
}  // namespace lilac::test
