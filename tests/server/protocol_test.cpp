// The OpenAI protocol end to end through the real engine, output parser and HTTP server, with a
// scripted backend forcing the exact tokens: SSE deltas, tool-call fragments, finish reasons,
// usage, stop strings across token boundaries, multibyte characters split across tokens.
#include <gtest/gtest.h>

#include <map>

#include "server_fixture.h"

namespace lilac::test {
namespace {

using nlohmann::json;

const std::string kReasoning = "Let me think: naïve café, 你好, ü ✓.";
const std::string kAnswer = "The answer is 42 — größer als 日本語 🙂.";

json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

struct Split {
  std::string reasoning, content;
  std::vector<json> tool_deltas;
  std::vector<std::string> order;  // "r", "c", "t" per delta, in order
  json finish_chunk, usage_chunk;
};

Split split_stream(const std::vector<json>& events) {
  Split s;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    if (e["choices"].empty()) {
      s.usage_chunk = e;
      continue;
    }
    const json& ch = e["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("reasoning_content"))
      s.reasoning += d["reasoning_content"].get<std::string>(), s.order.push_back("r");
    if (d.contains("content") && !d["content"].get<std::string>().empty())
      s.content += d["content"].get<std::string>(), s.order.push_back("c");
    if (d.contains("tool_calls"))
      for (const auto& t : d["tool_calls"]) s.tool_deltas.push_back(t), s.order.push_back("t");
    if (!ch["finish_reason"].is_null()) s.finish_chunk = e;
  }
  return s;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \n"), b = s.find_last_not_of(" \n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Some token of `ids` alone is not valid UTF-8 (a character split across tokens).
bool splits_a_character(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (!valid_utf8(tok.token_bytes(id))) return true;
  return false;
}

TEST(Protocol, StreamsReasoningThenContentWithUsage) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string text = kReasoning + "\n</think>\n\n" + kAnswer;
  const auto script_ids = tok->encode(text, true);
  ASSERT_TRUE(splits_a_character(*tok, script_ids));
  o.script = {script_text(*tok, text)};
  TestServer ts(std::move(o));

  auto r = ts.post(
      "/v1/chat/completions",
      {{"messages", user("hi")}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 5u);
  EXPECT_EQ(events.back(), "[DONE]");
  // One id / created for the whole stream; the first delta carries the role.
  const json first = events[0];
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["id"], first["id"]);
    EXPECT_EQ(events[i]["created"], first["created"]);
  }
  Split s = split_stream(events);
  EXPECT_EQ(trim(s.reasoning), trim(kReasoning));
  EXPECT_EQ(trim(s.content), trim(kAnswer));
  // Reasoning deltas come first, no delta splits a character or leaks a tag.
  bool seen_content = false;
  for (const auto& k : s.order) {
    if (k == "c") seen_content = true;
    if (k == "r") {
      EXPECT_FALSE(seen_content) << "reasoning after content";
    }
  }
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    if (events[i]["choices"].empty()) continue;
    const json& d = events[i]["choices"][0]["delta"];
    for (const char* key : {"reasoning_content", "content"}) {
      if (!d.contains(key)) continue;
      const std::string piece = d[key].get<std::string>();
      EXPECT_TRUE(valid_utf8(piece));
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos)
          << "a replacement character: a split character";
      EXPECT_EQ(piece.find("think>"), std::string::npos) << piece;
    }
  }
  EXPECT_EQ(s.finish_chunk["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(s.finish_chunk["choices"][0]["delta"].empty());
  // Usage: the prompt as the template renders it, every sampled token (the eos too).
  ASSERT_TRUE(s.usage_chunk.is_object());
  EXPECT_TRUE(s.usage_chunk["choices"].empty());
  const auto prompt_ids =
      tok->encode(ts.chat_template->render(user("hi"), json::array(), {}), true);
  const json& u = s.usage_chunk["usage"];
  EXPECT_EQ(u["prompt_tokens"], prompt_ids.size());
  EXPECT_EQ(u["completion_tokens"], script_ids.size() + 1);
  EXPECT_EQ(u["total_tokens"],
            u["prompt_tokens"].get<int64_t>() + u["completion_tokens"].get<int64_t>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST(Protocol, NonStreamingMessageAndUsage) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, kReasoning + "\n</think>\n\n" + kAnswer)};
  TestServer ts(std::move(o));
  auto r = ts.post("/v1/chat/completions",
                   {{"messages", user("hi")}, {"model", "whatever"}, {"unknown_field", 1}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "test-model");
  const json& m = j["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(trim(m["reasoning_content"]), trim(kReasoning));
  EXPECT_EQ(trim(m["content"]), trim(kAnswer));
  EXPECT_FALSE(m.contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
}

const json kWeatherTools = json::parse(R"([{"type":"function","function":{"name":"get_weather",
  "description":"Weather for a city","parameters":{"type":"object","properties":{
  "city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}])");

std::string weather_call(const std::string& city, int days) {
  return "<tool_call>\n<function=get_weather>\n<parameter=city>\n" + city +
         "\n</parameter>\n<parameter=days>\n" + std::to_string(days) +
         "\n</parameter>\n</function>\n</tool_call>";
}

TEST(Protocol, StreamsToolCallFragments) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "The user wants the weather.\n</think>\n\n" +
                                    weather_call("Paris", 3) + "\n" + weather_call("Zürich", 5))};
  TestServer ts(std::move(o));
  auto r = ts.post(
      "/v1/chat/completions",
      {{"messages", user("weather in Paris?")}, {"tools", kWeatherTools}, {"stream", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  Split s = split_stream(sse_events(r->body));
  EXPECT_EQ(trim(s.reasoning), "The user wants the weather.");
  EXPECT_EQ(s.content.find("<tool_call>"), std::string::npos) << s.content;
  // Per call: a first fragment (index, id, type, name, arguments "") then argument text.
  std::map<int, std::string> args;
  std::map<int, json> heads;
  for (const auto& t : s.tool_deltas) {
    const int index = t["index"];
    if (!heads.count(index)) {
      heads[index] = t;
      EXPECT_TRUE(t["id"].is_string());
      EXPECT_EQ(t["id"].get<std::string>().rfind("call_", 0), 0u);
      EXPECT_EQ(t["type"], "function");
      EXPECT_EQ(t["function"]["name"], "get_weather");
      EXPECT_EQ(t["function"]["arguments"], "");
    } else {
      EXPECT_FALSE(t.contains("id"));
      EXPECT_FALSE(t["function"].contains("name"));
      args[index] += t["function"]["arguments"].get<std::string>();
    }
  }
  ASSERT_EQ(heads.size(), 2u);
  EXPECT_EQ(json::parse(args[0]), json::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(json::parse(args[1]), json::parse(R"({"city":"Zürich","days":5})"));
  EXPECT_NE(heads[0]["id"], heads[1]["id"]);
  EXPECT_EQ(s.finish_chunk["choices"][0]["finish_reason"], "tool_calls");
}

TEST(Protocol, NonStreamingToolCallsAndParallelOff) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(
      *tok, "ok\n</think>\n\n" + weather_call("Paris", 3) + "\n" + weather_call("Oslo", 1))};
  TestServer ts(std::move(o));
  json body = {
      {"messages", user("weather?")}, {"tools", kWeatherTools}, {"tool_choice", "required"}};
  auto r = ts.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  const json& calls = j["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0]["function"]["arguments"].is_string());
  EXPECT_EQ(json::parse(calls[1]["function"]["arguments"].get<std::string>())["city"], "Oslo");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  body["parallel_tool_calls"] = false;
  r = ts.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  // The prompt carries the instruction lilac adds for required / parallel_tool_calls false.
  auto p = ts.post("/apply-template", body);
  ASSERT_TRUE(p);
  const std::string prompt = json::parse(p->body)["prompt"];
  EXPECT_NE(prompt.find("You must call at least one of the tools"), std::string::npos);
  EXPECT_NE(prompt.find("Call at most one function."), std::string::npos);
  EXPECT_NE(prompt.find("get_weather"), std::string::npos);
  // tool_choice none: the prompt lists no tools.
  body["tool_choice"] = "none";
  p = ts.post("/apply-template", body);
  EXPECT_EQ(json::parse(p->body)["prompt"].get<std::string>().find("get_weather"),
            std::string::npos);
}

// The arguments deltas of each call in a chat stream (the head's "" first), by index.
std::map<int, std::vector<std::string>> argument_deltas(const Split& s) {
  std::map<int, std::vector<std::string>> out;
  for (const auto& t : s.tool_deltas)
    out[t["index"].get<int>()].push_back(t["function"]["arguments"].get<std::string>());
  return out;
}

TEST(Protocol, StreamedCallsParallelOffAndAMalformedCall) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok,
                          "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                          "Rome\n</parameter>\n<parameter=days>\n2\n</parameter>\noops</tool_call>",
                          "broken"),
              script_text(*tok, "ok\n</think>\n\n" + weather_call("Paris", 3) + "\n" +
                                    weather_call("Oslo", 1))};
  TestServer ts(std::move(o));
  // parallel_tool_calls false: the second call is dropped whole, from its first fragment on.
  json body = {{"messages", user("weather?")},
               {"tools", kWeatherTools},
               {"stream", true},
               {"parallel_tool_calls", false}};
  auto r = ts.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Split s = split_stream(sse_events(r->body));
  auto deltas = argument_deltas(s);
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0], (std::vector<std::string>{"", R"({"city":"Paris")", R"(,"days":3)", "}"}));
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(s.finish_chunk["choices"][0]["finish_reason"], "tool_calls");
  // Garbage after the second parameter: the call already started is closed with the parameter
  // sent (valid JSON), and its markup follows as content, as the non-streaming answer has it.
  body = {{"messages", user("broken weather?")}, {"tools", kWeatherTools}, {"stream", true}};
  r = ts.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  s = split_stream(sse_events(r->body));
  deltas = argument_deltas(s);
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0], (std::vector<std::string>{"", R"({"city":"Rome")", "}"}));
  EXPECT_NE(s.content.find("<parameter=days>"), std::string::npos) << s.content;
  body["stream"] = false;
  r = ts.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  json plain = json::parse(r->body)["choices"][0]["message"];
  EXPECT_FALSE(plain.contains("tool_calls"));
  EXPECT_EQ(plain["content"], s.content);
}

TEST(Protocol, StopStringAcrossTokenBoundaries) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string text = "hello world, stop here please";
  o.script = {script_text(*tok, text)};
  // The stop string must span a token boundary for this test to mean anything.
  const std::string stop = "ld, st";
  const auto ids = tok->encode(text);
  size_t at = 0;
  bool boundary_inside = false;
  const size_t begin = text.find(stop), end = begin + stop.size();
  for (int32_t id : ids) {
    at += tok->token_bytes(id).size();
    if (at > begin && at < end) boundary_inside = true;
  }
  ASSERT_TRUE(boundary_inside);
  TestServer ts(std::move(o));
  for (bool stream : {false, true}) {
    json body = {{"messages", user("x")},
                 {"stop", json::array({"nomatch", stop})},
                 {"stream", stream},
                 {"chat_template_kwargs", {{"enable_thinking", false}}}};
    auto r = ts.post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string content, finish;
    if (stream) {
      Split s = split_stream(sse_events(r->body));
      content = s.content;
      finish = s.finish_chunk["choices"][0]["finish_reason"];
    } else {
      json j = json::parse(r->body);
      content = j["choices"][0]["message"]["content"];
      finish = j["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(trim(content), "hello wor") << "stream=" << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST(Protocol, LengthLogprobsAndCompletions) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "abcdefghijklmnopqrstuvwxyz")};
  TestServer ts(std::move(o));
  auto r = ts.post(
      "/v1/chat/completions",
      {{"messages", user("x")}, {"max_tokens", 3}, {"logprobs", true}, {"top_logprobs", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 3u);
  for (const auto& e : lp) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_TRUE(e["logprob"].is_number());
    EXPECT_TRUE(e["bytes"].is_array());
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
  }
  // Raw completions: the text as it is, streamed.
  r = ts.post("/v1/completions", {{"prompt", "the alphabet:"},
                                  {"stream", true},
                                  {"max_tokens", 100},
                                  {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  auto events = sse_events(r->body);
  std::string text;
  json usage;
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    if (e["choices"].empty())
      usage = e["usage"];
    else
      text += e["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(e["object"], "text_completion");
  }
  EXPECT_EQ(text, "abcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(usage["prompt_tokens"], tok->encode("the alphabet:").size());
  // Non-streaming with echo.
  r = ts.post("/v1/completions", {{"prompt", "abc:"}, {"echo", true}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().rfind("abc:", 0), 0u);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST(Protocol, TokenizeDetokenizeApplyTemplateModelsMetrics) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "x")};
  TestServer ts(std::move(o));
  auto r = ts.post("/tokenize", {{"content", "héllo <|im_end|>"}});
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), tok->encode("héllo <|im_end|>", true));
  EXPECT_EQ(j["count"], j["tokens"].size());
  r = ts.post("/detokenize", {{"tokens", j["tokens"]}});
  EXPECT_EQ(json::parse(r->body)["text"], "héllo <|im_end|>");
  r = ts.post("/apply-template", {{"messages", user("hi")}});
  EXPECT_EQ(json::parse(r->body)["prompt"],
            ts.chat_template->render(user("hi"), json::array(), {}));
  r = ts.post("/apply-template",
              {{"messages", user("hi")}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ChatOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(json::parse(r->body)["prompt"],
            ts.chat_template->render(user("hi"), json::array(), off));
  auto c = ts.client();
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(c.Get("/v1/models/test-model")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/other")->status, 404);
  ts.post("/v1/chat/completions", {{"messages", user("hi")}});
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_NE(met->body.find("lilac_requests_total 1"), std::string::npos) << met->body;
  EXPECT_NE(met->body.find("lilac_time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_NE(met->body.find("lilac_time_per_output_token_seconds_count"), std::string::npos);
  EXPECT_NE(met->body.find("lilac_queue_length 0"), std::string::npos);
}

}  // namespace
}  // namespace lilac::test
