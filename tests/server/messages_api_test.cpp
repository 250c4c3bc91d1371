// POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API) end to end through
// the real engine, output parser and HTTP server, with a scripted backend forcing the tokens:
// content blocks, the SSE event sequence, tool_use / tool_result round trips, the thinking
// budget, errors in Anthropic's shape, x-api-key, and prompt reuse across a Claude-Code-shaped
// session whose system prompt changes on every request.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server_fixture.h"

namespace lilac::test {
namespace {

using nlohmann::json;

json body(const std::string& text, json extra = json::object()) {
  json b = {{"model", "claude-x"},
            {"max_tokens", 200},
            {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

const json kTools = json::parse(R"([{"name": "get_weather", "description": "Weather",
  "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
  "days": {"type": "integer"}}, "required": ["city"]}}])");

const std::string kCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

TEST(MessagesApi, ThinkingTextAndUsage) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string script = "Think a bit.\n</think>\n\nHello — grüß dich!";
  o.script = {script_text(*tok, script)};
  TestServer ts(std::move(o));
  auto r = ts.post("/v1/messages", body("hi"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("msg_"));
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "Think a bit.");
  EXPECT_EQ(j["content"][1], json({{"type", "text"}, {"text", "Hello — grüß dich!"}}));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  EXPECT_EQ(j["usage"]["output_tokens"], tok->encode(script, true).size() + 1);  // + eos
  EXPECT_GT(j["usage"]["input_tokens"].get<int>(), 0);
  // count_tokens counts the same prompt.
  auto c = ts.post("/v1/messages/count_tokens", body("hi"));
  ASSERT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(
      json::parse(c->body)["input_tokens"],
      j["usage"]["input_tokens"].get<int>() + j["usage"]["cache_read_input_tokens"].get<int>());
}

TEST(MessagesApi, StreamingEventSequenceWithToolUse) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "Need weather.\n</think>\n\nChecking.\n" + kCall)};
  TestServer ts(std::move(o));
  auto r = ts.post("/v1/messages", body("weather?", {{"stream", true}, {"tools", kTools}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  auto events = named_events(r->body);
  std::vector<std::string> names;
  std::string thinking, text, partial_json;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name);  // the event line and the data agree
    if (name != "content_block_delta" || names.empty() || names.back() != name)
      names.push_back(name);
    if (name == "content_block_delta") {
      const json& d = data["delta"];
      if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
      if (d["type"] == "text_delta") text += d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") partial_json += d["partial_json"].get<std::string>();
    }
  }
  const std::vector<std::string> expected = {"message_start",       "ping",
                                             "content_block_start", "content_block_delta",
                                             "content_block_stop",  "content_block_start",
                                             "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta",
                                             "content_block_stop",  "message_delta",
                                             "message_stop"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(thinking, "Need weather.");
  EXPECT_EQ(text, "Checking.");
  EXPECT_EQ(json::parse(partial_json), json({{"city", "Paris"}, {"days", 3}}));
  const json& start = events[0].second["message"];
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_TRUE(start["content"].empty());
  EXPECT_GT(start["usage"]["input_tokens"].get<int>(), 0);
  int index = -1;
  for (const auto& [name, data] : events)
    if (name == "content_block_start") {
      EXPECT_EQ(data["index"], ++index);
      if (index == 2) {
        EXPECT_EQ(data["content_block"]["type"], "tool_use");
        EXPECT_EQ(data["content_block"]["name"], "get_weather");
        EXPECT_TRUE(data["content_block"]["id"].get<std::string>().starts_with("toolu_"));
      }
    }
  const json& delta = events[events.size() - 2].second;
  EXPECT_EQ(delta["delta"]["stop_reason"], "tool_use");
  EXPECT_GT(delta["usage"]["output_tokens"].get<int>(), 10);
}

TEST(MessagesApi, StreamedToolUseInputPerParameterAndAMalformedCall) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok,
                          "x\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                          "Rome\n</parameter>\n<parameter=days>\n2\n</parameter>\noops</tool_call>",
                          "broken"),
              script_text(*tok, "x\n</think>\n\n" + kCall)};
  TestServer ts(std::move(o));
  auto stream = [&](const std::string& text) {
    auto r = ts.post("/v1/messages", body(text, {{"stream", true}, {"tools", kTools}}));
    EXPECT_TRUE(r && r->status == 200);
    return r ? named_events(r->body) : decltype(named_events("")){};
  };
  std::vector<std::string> partials;
  for (const auto& [name, data] : stream("weather?"))
    if (name == "content_block_delta" && data["delta"]["type"] == "input_json_delta")
      partials.push_back(data["delta"]["partial_json"]);
  EXPECT_EQ(partials, (std::vector<std::string>{R"({"city":"Paris")", R"(,"days":3)", "}"}));
  // Malformed after its first parameter went out: the tool_use block is closed with what was
  // sent (valid JSON), then the markup is a text block; every block is started and stopped.
  partials.clear();
  std::vector<std::string> blocks;
  int open = -1;
  std::string stop_reason;
  for (const auto& [name, data] : stream("broken weather?")) {
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = data["index"];
      blocks.push_back(data["content_block"]["type"]);
    }
    if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], open);
      if (data["delta"]["type"] == "input_json_delta")
        partials.push_back(data["delta"]["partial_json"]);
    }
    if (name == "content_block_stop") {
      EXPECT_EQ(data["index"], open);
      open = -1;
    }
    if (name == "message_delta") stop_reason = data["delta"]["stop_reason"];
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "tool_use", "text"}));
  EXPECT_EQ(partials, (std::vector<std::string>{R"({"city":"Rome")", "}"}));
  EXPECT_EQ(stop_reason, "tool_use");
}

TEST(MessagesApi, ToolRoundTripHistoryRendersLikeChat) {
  // tool_use / tool_result / thinking history becomes the chat messages the template expects:
  // the same prompt as the equivalent chat-completions request.
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "ok")};
  TestServer ts(std::move(o));
  json anthropic = {
      {"model", "m"},
      {"max_tokens", 50},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief."}}})},
      {"tools", kTools},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"},
             {"content",
              json::array(
                  {{{"type", "thinking"}, {"thinking", "Call it."}, {"signature", "sig-ignored"}},
                   {{"type", "tool_use"},
                    {"id", "toolu_1"},
                    {"name", "get_weather"},
                    {"input", {{"city", "Paris"}}}}})}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "tool_result"},
                            {"tool_use_id", "toolu_1"},
                            {"content", json::array({{{"type", "text"}, {"text", "Sunny"}}})}},
                           {{"type", "text"}, {"text", "Thanks"}}})}}})}};
  json chat = {
      {"tools", json::array({{{"type", "function"},
                              {"function",
                               {{"name", "get_weather"},
                                {"description", "Weather"},
                                {"parameters", kTools[0]["input_schema"]}}}}})},
      {"messages",
       json::array({{{"role", "system"}, {"content", "Be brief."}},
                    {{"role", "user"}, {"content", "Weather in Paris?"}},
                    {{"role", "assistant"},
                     {"content", ""},
                     {"reasoning_content", "Call it."},
                     {"tool_calls", json::array({{{"id", "toolu_1"},
                                                  {"type", "function"},
                                                  {"function",
                                                   {{"name", "get_weather"},
                                                    {"arguments", "{\"city\":\"Paris\"}"}}}}})}},
                    {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "Sunny"}},
                    {{"role", "user"}, {"content", "Thanks"}}})}};
  auto a = ts.post("/v1/messages/count_tokens", anthropic);
  auto c = ts.post("/tokenize", chat);
  ASSERT_EQ(a->status, 200) << a->body;
  ASSERT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(json::parse(a->body)["input_tokens"], json::parse(c->body)["count"]);
  auto m = ts.post("/v1/messages", anthropic);
  ASSERT_EQ(m->status, 200) << m->body;
}

TEST(MessagesApi, ErrorsInAnthropicShapeAndApiKeys) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "ok")};
  o.http.api_key = "sekret";
  TestServer ts(std::move(o));
  const httplib::Headers key = {{"x-api-key", "sekret"}};
  auto expect_error = [](const httplib::Result& r, int status, const std::string& type,
                         const std::string& words) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], type) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(words), std::string::npos) << r->body;
  };
  expect_error(ts.post("/v1/messages", body("hi")), 401, "authentication_error", "API key");
  expect_error(ts.post("/v1/messages", body("hi"), {{"x-api-key", "wrong"}}), 401,
               "authentication_error", "incorrect");
  // The OpenAI routes keep the OpenAI shape, and take x-api-key too.
  auto chat = ts.post("/v1/chat/completions",
                      {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  EXPECT_EQ(chat->status, 401);
  EXPECT_TRUE(json::parse(chat->body)["error"].contains("code"));
  EXPECT_EQ(ts.post("/v1/chat/completions",
                    {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}, key)
                ->status,
            200);
  EXPECT_EQ(ts.post("/v1/messages", body("hi"), {{"Authorization", "Bearer sekret"}})->status, 200);
  // Bad requests.
  json image = body("x");
  image["messages"][0]["content"] = json::array(
      {{{"type", "image"},
        {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}}});
  expect_error(ts.post("/v1/messages", image, key), 400, "invalid_request_error", "text only");
  json no_max = body("x");
  no_max.erase("max_tokens");
  expect_error(ts.post("/v1/messages", no_max, key), 400, "invalid_request_error", "max_tokens");
  expect_error(ts.post("/v1/messages", body("x", {{"thinking", {{"type", "enabled"}}}}), key), 400,
               "invalid_request_error", "budget_tokens");
  expect_error(ts.client().Post("/v1/messages", key, "{not json", "application/json"), 400,
               "invalid_request_error", "JSON");
  expect_error(ts.post("/v1/messages", body("x", {{"messages", json::array()}}), key), 400,
               "invalid_request_error", "messages");
  expect_error(
      ts.post("/v1/messages",
              body("x", {{"tool_choice", {{"type", "tool"}, {"name", "nope"}}}, {"tools", kTools}}),
              key),
      400, "invalid_request_error", "nope");
  expect_error(ts.client().Post("/v1/messages/nothing", key, "{}", "application/json"), 404,
               "not_found_error", "no route");
  // The server still serves; once draining, 503 in Anthropic's shape.
  EXPECT_EQ(ts.post("/v1/messages", body("hi"), key)->status, 200);
  ts.srv->drain();
  expect_error(ts.post("/v1/messages", body("hi"), key), 503, "overloaded_error", "shutting down");
}

TEST(MessagesApi, ThinkingBudgetStopSequencesAndUndeclaredCalls) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string long_thought = "one two three four five six seven eight nine ten";
  o.script = {
      script_text(*tok, long_thought + "\n</think>\n\nDone.", "budget"),
      script_text(*tok, "Hm.\n</think>\n\nfirst STOP second", "stopper"),
      script_text(*tok, "Hm.\n</think>\n\n<tool_call>\n<function=rm>\n</function>\n</tool_call>",
                  "undeclared")};
  TestServer ts(std::move(o));
  auto r = ts.post("/v1/messages",
                   body("budget", {{"thinking", {{"type", "enabled"}, {"budget_tokens", 3}}}}));
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ASSERT_GE(j["content"].size(), 2u) << j.dump();
  const auto ids = tok->encode(long_thought, true);
  EXPECT_EQ(j["content"][0]["thinking"],
            tok->decode(std::vector<int32_t>(ids.begin(), ids.begin() + 3)));
  EXPECT_EQ(j["content"][1]["type"], "text");
  // Without a budget the whole thought comes back.
  json full = json::parse(ts.post("/v1/messages", body("budget"))->body);
  EXPECT_EQ(full["content"][0]["thinking"], long_thought);
  // Thinking disabled: the prompt closes the thinking (two more tokens than enabled).
  auto count = [&](const json& thinking) {
    json b = body("budget");
    if (!thinking.is_null()) b["thinking"] = thinking;
    return json::parse(ts.post("/v1/messages/count_tokens", b)->body)["input_tokens"].get<int>();
  };
  EXPECT_GT(count({{"type", "disabled"}}), count({{"type", "enabled"}, {"budget_tokens", 10}}));
  // stop_sequences: the stop string and its reason.
  json s = json::parse(
      ts.post("/v1/messages", body("stopper", {{"stop_sequences", {"STOP", "never"}}}))->body);
  EXPECT_EQ(s["stop_reason"], "stop_sequence");
  EXPECT_EQ(s["stop_sequence"], "STOP");
  EXPECT_EQ(s["content"].back()["text"], "first");
  // A call to a function the request did not declare is text, and the turn ends normally.
  json u = json::parse(ts.post("/v1/messages", body("undeclared", {{"tools", kTools}}))->body);
  EXPECT_EQ(u["stop_reason"], "end_turn");
  EXPECT_EQ(u["content"].back()["type"], "text");
  EXPECT_NE(u["content"].back()["text"].get<std::string>().find("<function=rm>"),
            std::string::npos);
}

TEST(MessagesApi, WhatClaudeCodeSendsBesides) {
  // Seen from Claude Code 2.1.197: a system message inside `messages` (its mid-conversation-system
  // beta), output_config.effort, thinking {type: adaptive}, context_management.
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "ok")};
  TestServer ts(std::move(o));
  json b = {
      {"model", "m"},
      {"max_tokens", 20},
      {"thinking", {{"type", "adaptive"}}},
      {"output_config", {{"effort", "high"}}},
      {"context_management", {{"edits", json::array({{{"type", "clear_thinking_20251015"}}})}}},
      {"messages", json::array({{{"role", "user"}, {"content", "Hi"}},
                                {{"role", "system"}, {"content", "Agents: claude, Explore"}}})}};
  auto r = ts.post("/v1/messages", b);
  ASSERT_EQ(r->status, 200) << r->body;
  json chat = {
      {"messages", json::array({{{"role", "user"}, {"content", "Hi"}},
                                {{"role", "user"}, {"content", "Agents: claude, Explore"}}})}};
  b.erase("max_tokens");
  EXPECT_EQ(json::parse(ts.post("/v1/messages/count_tokens", b)->body)["input_tokens"],
            json::parse(ts.post("/tokenize", chat)->body)["count"]);
  b["max_tokens"] = 20;
  b["output_config"]["effort"] = "enormous";
  EXPECT_EQ(ts.post("/v1/messages", b)->status, 400);
}

json load_session() {
  std::ifstream in(data_root() + "/agents/claude_code_session.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

TEST(MessagesApi, PromptReuseSurvivesClaudeCodesVolatileSystemBlock) {
  // A recorded-shape Claude Code session: every request's first system block carries a billing
  // header whose cch= changes. Dropped before rendering, it cannot defeat prompt reuse: each
  // later turn reads most of its prompt from the engine's snapshots.
  const json session = load_session();
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  for (const auto& s : session["script"])
    o.script.push_back(script_text(*tok, s["text"], s.value("match", "")));
  TestServer ts(std::move(o));
  std::vector<json> usages;
  for (const auto& rq : session["requests"]) {
    auto r = ts.post("/v1/messages", rq);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json usage;
    for (const auto& [name, data] : named_events(r->body))
      if (name == "message_delta") usage = data["usage"];
    ASSERT_FALSE(usage.is_null()) << r->body;
    usages.push_back(usage);
    std::printf("turn %zu: input %d, cache_read %d, output %d\n", usages.size(),
                usage["input_tokens"].get<int>(), usage["cache_read_input_tokens"].get<int>(),
                usage["output_tokens"].get<int>());
  }
  ASSERT_EQ(usages.size(), 3u);
  EXPECT_EQ(usages[0]["cache_read_input_tokens"], 0);
  for (size_t t = 1; t < 3; ++t) {
    const int cached = usages[t]["cache_read_input_tokens"];
    const int total = cached + usages[t]["input_tokens"].get<int>();
    const int before = usages[t - 1]["cache_read_input_tokens"].get<int>() +
                       usages[t - 1]["input_tokens"].get<int>();
    EXPECT_GE(cached, before * 9 / 10) << "turn " << t + 1;  // the previous prompt, nearly all
    EXPECT_LT(total - cached, 200) << "turn " << t + 1;      // only the new messages computed
  }
  // The header never reaches the prompt; the same request with another cch counts the same.
  json a = session["requests"][0], b = a;
  b["system"][0]["text"] = "x-anthropic-billing-header: cc_version=9; cch=zzzzz;";
  a.erase("stream");
  b.erase("stream");
  EXPECT_EQ(ts.post("/v1/messages/count_tokens", a)->body,
            ts.post("/v1/messages/count_tokens", b)->body);
  // Control: the same system text with the header, sent through chat completions (which keeps
  // it), reuses almost nothing of a prompt that differs from the previous one only in cch=.
  auto chat = [&](const std::string& cch) {
    std::string sys = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cch=" + cch + ";\n";
    for (size_t k = 1; k < a["system"].size(); ++k)
      sys += a["system"][k]["text"].get<std::string>();
    json req = {
        {"max_tokens", 5},
        {"messages", json::array({{{"role", "system"}, {"content", sys}},
                                  {{"role", "user"}, {"content", "What does it print?"}}})}};
    return json::parse(ts.post("/v1/chat/completions", req)->body)["usage"];
  };
  chat("aaaaa");
  json control = chat("bbbbb");
  EXPECT_LT(control["prompt_tokens_details"]["cached_tokens"].get<int>(), 40);
}

}  // namespace
}  // namespace lilac::test
