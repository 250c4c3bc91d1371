// What coding agents need from /v1/chat/completions, end to end with scripted outputs: a tool
// call written inside the thinking or without its opening tag comes back as a call with nothing
// leaked into content (streaming and not), the thinking budget (chat_template_kwargs and
// reasoning_effort), and the server-wide chat_template_kwargs defaults.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace lilac::test {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"},
  "days": {"type": "integer"}}}}}])");

const std::string kFunction =
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>";

json chat(const std::string& text, json extra = json::object()) {
  json b = {{"messages", json::array({{{"role", "user"}, {"content", text}}})}, {"tools", kTools}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

TEST(AgentChat, CallsInsideThinkingOrWithoutOpeningTagAreCalls) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {
      script_text(*tok, "Let me check.\n<tool_call>\n" + kFunction + "\n</tool_call>\n</think>\n\n",
                  "inside"),
      script_text(*tok, "Check.\n</think>\n\n" + kFunction + "\n</tool_call>", "bare")};
  TestServer ts(std::move(o));
  for (const char* which : {"inside", "bare"}) {
    json j = json::parse(ts.post("/v1/chat/completions", chat(which))->body);
    const json& msg = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << which << j.dump();
    EXPECT_TRUE(msg["content"].is_null()) << which << j.dump();
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << which;
    EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris","days":3})");
    // Streaming: no content delta at all.
    auto r = ts.post("/v1/chat/completions", chat(which, {{"stream", true}}));
    int calls = 0;
    for (const auto& e : sse_events(r->body)) {
      if (e == "[DONE]") continue;
      const json& d = e["choices"][0]["delta"];
      if (d.contains("content")) {
        EXPECT_EQ(d["content"], "") << which << e.dump();
      }
      if (d.contains("tool_calls") && d["tool_calls"][0].contains("id")) ++calls;
    }
    EXPECT_EQ(calls, 1) << which;
  }
}

TEST(AgentChat, ThinkingBudgetFromKwargsAndEffortAndServerDefaults) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string thought = "alpha beta gamma delta epsilon zeta eta theta";
  o.script = {script_text(*tok, thought + "\n</think>\n\nAnswer.")};
  o.chat_template_kwargs = {{"thinking_budget", 4}, {"preserve_thinking", true}};
  TestServer ts(std::move(o));
  const auto ids = tok->encode(thought, true);
  auto first = [&](size_t n) {
    return tok->decode(std::vector<int32_t>(ids.begin(), ids.begin() + long(n)));
  };
  auto reasoning = [&](json extra) {
    json j = json::parse(ts.post("/v1/chat/completions", chat("x", extra))->body);
    return j["choices"][0]["message"].value("reasoning_content", std::string());
  };
  // The server default budget (4) applies; a request's own budget wins; -1: none.
  EXPECT_EQ(reasoning({}), first(4));
  EXPECT_EQ(reasoning({{"chat_template_kwargs", {{"thinking_budget", 2}}}}), first(2));
  EXPECT_EQ(reasoning({{"chat_template_kwargs", {{"thinking_budget", -1}}}}), thought);
  // thinking_budget (here the server's default) wins over reasoning_effort.
  EXPECT_EQ(reasoning({{"reasoning_effort", "low"}}), first(4));
  auto bad = ts.post("/v1/chat/completions",
                     chat("x", {{"chat_template_kwargs", {{"thinking_budget", "lots"}}}}));
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(ts.post("/v1/chat/completions", chat("x", {{"reasoning_effort", "huge"}}))->status,
            400);
  // The budget's closing tokens are part of the answer's token count; the answer follows.
  json j = json::parse(ts.post("/v1/chat/completions", chat("x"))->body);
  EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
  // The defaults reach the template: /apply-template shows preserve_thinking's effect on a
  // history with reasoning in an earlier turn.
  json hist = {{"messages", json::array({{{"role", "user"}, {"content", "a"}},
                                         {{"role", "assistant"},
                                          {"content", "b"},
                                          {"reasoning_content", "SECRET-THOUGHT"}},
                                         {{"role", "user"}, {"content", "c"}}})}};
  std::string with_default = json::parse(ts.post("/apply-template", hist)->body)["prompt"];
  EXPECT_NE(with_default.find("SECRET-THOUGHT"), std::string::npos);
  hist["chat_template_kwargs"] = {{"preserve_thinking", false}};
  std::string overridden = json::parse(ts.post("/apply-template", hist)->body)["prompt"];
  EXPECT_EQ(overridden.find("SECRET-THOUGHT"), std::string::npos);
}

}  // namespace
}  // namespace lilac::test
