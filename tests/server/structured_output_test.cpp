#include "server/structured_output.h"

#include <gtest/gtest.h>

#include "../grammar/grammar_test.h"
#include "chat/output_parser.h"
#include "grammar/json_schema.h"
#include "server/api_error.h"
#include "server_fixture.h"

namespace lilac::server {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer",
      "minimum": 1, "maximum": 14}, "opts": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
    "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "ping"}}])");

TEST(StructuredOutput, ToolCallGrammarIsTheTemplateFormatAndTheParserReadsIt) {
  const std::string g = tool_call_grammar(kTools, false);
  // As the chat template renders an assistant's tool call.
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis 2\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"x\": true}\n</parameter>\n"
      "</function>\n</tool_call>";
  EXPECT_TRUE(grammar::test::matches(g, call));
  EXPECT_TRUE(grammar::test::matches(g, "<tool_call>\n<function=ping>\n</function>\n</tool_call>"));
  // Required parameter missing, out-of-range integer, a newline in a raw string, two calls.
  EXPECT_FALSE(grammar::test::matches(g,
                                      "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</"
                                      "parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(grammar::test::matches(g,
                                      "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</"
                                      "parameter>\n<parameter=days>\n15\n"
                                      "</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(grammar::test::matches(g,
                                      "<tool_call>\n<function=get_weather>\n<parameter=city>"
                                      "\nA\nB\n</parameter>\n<parameter=days>\n1\n"
                                      "</parameter>\n</function>\n</tool_call>"));
  const std::string ping = "<tool_call>\n<function=ping>\n</function>\n</tool_call>";
  EXPECT_FALSE(grammar::test::matches(g, ping + "\n" + ping));
  EXPECT_TRUE(grammar::test::matches(tool_call_grammar(kTools, true), ping + "\n" + ping));

  OutputParser parser(false, nlohmann::json(kTools));
  ParsedDelta d = parser.push(call);
  ParsedDelta end = parser.finish();
  d.tool_calls.insert(d.tool_calls.end(), end.tool_calls.begin(), end.tool_calls.end());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(d.tool_calls[0].second.arguments),
            json::parse(R"({"city": "Paris 2", "days": 3, "opts": {"x": true}})"));
  // Streamed (a forced call in a stream), token by token: a fragment per parameter and the brace,
  // joined the same arguments.
  OutputParser streaming(false, nlohmann::json(kTools), true);
  std::vector<std::string> fragments;
  auto collect = [&](const ParsedDelta& delta) {
    for (const auto& p : delta.pieces)
      if (p.kind == ParsedPiece::Kind::CallArguments) fragments.push_back(p.text);
  };
  for (char c : call) collect(streaming.push(std::string(1, c)));
  collect(streaming.finish());
  ASSERT_EQ(fragments.size(), 4u);
  std::string joined;
  for (const auto& f : fragments) joined += f;
  EXPECT_EQ(joined, d.tool_calls[0].second.arguments);
}

TEST(StructuredOutput, ResponseFormatFieldsAndErrors) {
  EXPECT_FALSE(response_format_grammar(json::object()));
  EXPECT_FALSE(response_format_grammar({{"response_format", {{"type", "text"}}}}));
  EXPECT_TRUE(response_format_grammar({{"response_format", {{"type", "json_object"}}}}));
  auto status_and_message = [](const json& body) -> std::pair<int, std::string> {
    try {
      response_format_grammar(body);
    } catch (const ApiError& e) {
      return {e.status, e.what()};
    }
    return {200, ""};
  };
  auto [s1, m1] = status_and_message({{"response_format", {{"type", "yaml"}}}});
  EXPECT_EQ(s1, 400);
  auto [s2, m2] = status_and_message(
      {{"response_format",
        {{"type", "json_schema"},
         {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"format", "ipv6"}}}}}}}});
  EXPECT_EQ(s2, 400);
  EXPECT_NE(m2.find("ipv6"), std::string::npos);
  auto [s3, m3] = status_and_message({{"response_format", {{"type", "json_schema"}}}});
  EXPECT_EQ(s3, 400);
  auto [s4, m4] = status_and_message(
      {{"response_format",
        {{"type", "json_schema"},
         {"json_schema", {{"schema", {{"type", "object"}, {"required", "a"}}}}}}}});
  EXPECT_EQ(s4, 400);  // a keyword of the wrong JSON type
}

// With thinking on, anything goes until </think>; then a blank line may precede the answer, which
// must follow the grammar, and only the end of turn may follow a complete answer.
TEST(StructuredOutput, ThinkingConstraintOpensAfterThinkAndAllowsTheBlankLine) {
  auto tok = Tokenizer::from_model_dir(test::demo_dir());
  auto c = grammar_constraint(grammar::json_object_grammar(), *tok, true);
  const int32_t n = tok->size();
  std::vector<uint32_t> bits((size_t(n) + 31) / 32);
  auto allowed = [&](int32_t id) {
    c->allowed_tokens(bits);
    return bool(bits[size_t(id) / 32] >> (id % 32) & 1u);
  };
  const auto x = tok->encode("x", false);
  ASSERT_FALSE(x.empty());
  EXPECT_TRUE(allowed(x[0]));  // reasoning: free
  for (int32_t id : tok->encode("some reasoning</think>", true)) c->accept(id);
  EXPECT_FALSE(allowed(x[0]));
  for (int32_t id : tok->encode("\n\n{\"a\": 1}", false)) {
    ASSERT_TRUE(allowed(id)) << id;
    c->accept(id);
  }
  const int32_t eos = tok->eos_ids().front();
  EXPECT_TRUE(allowed(eos));
  EXPECT_FALSE(allowed(x[0]));
}

}  // namespace
}  // namespace lilac::server
