// POST /v1/responses (the OpenAI Responses API, stateless) end to end through the real engine,
// output parser and HTTP server, with a scripted backend: output items, the SSE event sequence,
// function calls and their outputs in the input, reasoning effort, and the clear 400s.
#include <gtest/gtest.h>

#include <functional>

#include "server/agent_api.h"
#include "server_fixture.h"

namespace lilac::test {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "name": "get_weather",
  "description": "Weather", "parameters": {"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}},
  {"type": "web_search"}, {"type": "local_shell"}])");

const std::string kCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

TEST(ResponsesApi, PlainInputGivesReasoningAndMessageItems) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const std::string script = "Short thought.\n</think>\n\nBonjour à tous.";
  o.script = {script_text(*tok, script)};
  TestServer ts(std::move(o));
  auto r =
      ts.post("/v1/responses", {{"model", "x"}, {"input", "hi"}, {"instructions", "Be kind."}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(j["instructions"], "Be kind.");
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0],
            json({{"type", "reasoning_text"}, {"text", "Short thought."}}));
  EXPECT_EQ(j["output"][1]["type"], "message");
  EXPECT_EQ(j["output"][1]["role"], "assistant");
  EXPECT_EQ(j["output"][1]["status"], "completed");
  EXPECT_EQ(j["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(j["output"][1]["content"][0]["text"], "Bonjour à tous.");
  const json& u = j["usage"];
  EXPECT_EQ(u["output_tokens"], tok->encode(script, true).size() + 1);
  EXPECT_EQ(u["total_tokens"], u["input_tokens"].get<int>() + u["output_tokens"].get<int>());
  EXPECT_GT(u["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], 0);
  // The same request again: the prompt comes from the snapshot.
  json again =
      json::parse(ts.post("/v1/responses", {{"input", "hi"}, {"instructions", "Be kind."}})->body);
  EXPECT_GT(again["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST(ResponsesApi, StreamingEventSequenceWithFunctionCall) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "Need it.\n</think>\n\nOne moment.\n" + kCall)};
  TestServer ts(std::move(o));
  auto r = ts.post("/v1/responses", {{"input", "weather?"}, {"stream", true}, {"tools", kTools}});
  ASSERT_EQ(r->status, 200) << r->body;
  auto events = named_events(r->body);
  std::vector<std::string> names;
  int seq = 0;
  std::string args;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name);
    EXPECT_EQ(data["sequence_number"], seq++);
    if (names.empty() || names.back() != name) names.push_back(name);
    if (name == "response.function_call_arguments.delta") args += data["delta"].get<std::string>();
  }
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}, {"days", 3}}));
  const json& done = events.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][2]["type"], "function_call");
  EXPECT_EQ(done["output"][2]["name"], "get_weather");
  EXPECT_TRUE(done["output"][2]["call_id"].get<std::string>().starts_with("call_"));
  EXPECT_GT(done["usage"]["output_tokens"].get<int>(), 0);
  // The reasoning text and the output_item.done items agree with the final response.
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Need it.");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "One moment.");
}

TEST(ResponsesApi, StreamedArgumentsPerParameterAndAMalformedCall) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok,
                          "x\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                          "Rome\n</parameter>\n<parameter=days>\n2\n</parameter>\noops</tool_call>",
                          "broken"),
              script_text(*tok, "x\n</think>\n\n" + kCall)};
  TestServer ts(std::move(o));
  struct Seen {
    std::vector<std::string> deltas;
    std::string done_arguments;
    json completed;
  };
  auto stream = [&](const std::string& input) {
    Seen seen;
    auto r = ts.post("/v1/responses", {{"input", input}, {"stream", true}, {"tools", kTools}});
    EXPECT_TRUE(r && r->status == 200);
    if (!r) return seen;
    for (const auto& [name, data] : named_events(r->body)) {
      if (name == "response.function_call_arguments.delta") seen.deltas.push_back(data["delta"]);
      if (name == "response.function_call_arguments.done") seen.done_arguments = data["arguments"];
      if (name == "response.completed") seen.completed = data["response"];
    }
    return seen;
  };
  Seen ok = stream("weather?");
  EXPECT_EQ(ok.deltas, (std::vector<std::string>{R"({"city":"Paris")", R"(,"days":3)", "}"}));
  EXPECT_EQ(ok.done_arguments, R"({"city":"Paris","days":3})");
  // Malformed after its first parameter went out: the item is done with what was sent, and the
  // markup follows as a message item.
  Seen bad = stream("broken weather?");
  EXPECT_EQ(bad.deltas, (std::vector<std::string>{R"({"city":"Rome")", "}"}));
  EXPECT_EQ(bad.done_arguments, R"({"city":"Rome"})");
  const json& out = bad.completed["output"];
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[1]["type"], "function_call");
  EXPECT_EQ(out[1]["arguments"], R"({"city":"Rome"})");
  EXPECT_EQ(out[2]["type"], "message");
}

TEST(ResponsesApi, FunctionCallOutputsRenderLikeChat) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "Sunny.\n</think>\n\nIt is sunny.", "Sunny, 21")};
  o.script.push_back(script_text(*tok, "not matched"));
  TestServer ts(std::move(o));
  json input = json::array(
      {{{"type", "message"}, {"role", "developer"}, {"content", "Use tools."}},
       {{"role", "user"}, {"content", json::array({{{"type", "input_text"}, {"text", "Paris?"}}})}},
       {{"type", "reasoning"},
        {"id", "rs_1"},
        {"summary", json::array()},
        {"content", json::array({{{"type", "reasoning_text"}, {"text", "Call it."}}})}},
       {{"type", "function_call"},
        {"call_id", "call_1"},
        {"name", "get_weather"},
        {"arguments", "{\"city\":\"Paris\"}"}},
       {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "Sunny, 21 C"}}});
  json j = json::parse(ts.post("/v1/responses", {{"input", input}, {"tools", kTools}})->body);
  ASSERT_EQ(j["status"], "completed") << j.dump();
  EXPECT_EQ(j["output"].back()["content"][0]["text"], "It is sunny.");
  // The prompt is the one of the equivalent chat request.
  json chat = {
      {"tools", json::array({{{"type", "function"},
                              {"function",
                               {{"name", "get_weather"},
                                {"description", "Weather"},
                                {"parameters", kTools[0]["parameters"]}}}}})},
      {"messages",
       json::array({{{"role", "system"}, {"content", "Use tools."}},
                    {{"role", "user"}, {"content", "Paris?"}},
                    {{"role", "assistant"},
                     {"content", ""},
                     {"reasoning_content", "Call it."},
                     {"tool_calls", json::array({{{"id", "call_1"},
                                                  {"type", "function"},
                                                  {"function",
                                                   {{"name", "get_weather"},
                                                    {"arguments", "{\"city\":\"Paris\"}"}}}}})}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny, 21 C"}}})}};
  json tokens = json::parse(ts.post("/tokenize", chat)->body);
  EXPECT_EQ(j["usage"]["input_tokens"], tokens["count"]);
}

TEST(ResponsesApi, ClearErrorsForWhatAStatelessServerCannotDo) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "ok")};
  TestServer ts(std::move(o));
  auto expect_400 = [&](const json& b, const std::string& param) {
    auto r = ts.post("/v1/responses", b);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << r->body;
  };
  expect_400({{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id");
  expect_400({{"input", "x"}, {"store", true}}, "store");
  expect_400({{"input", json::array({{{"type", "item_reference"}, {"id", "msg_1"}}})}}, "input[0]");
  expect_400({{"input",
               json::array(
                   {{{"role", "user"},
                     {"content", json::array({{{"type", "input_image"}, {"image_url", "x"}}})}}})}},
             "input[0].content[0]");
  expect_400({{"input", "x"}, {"reasoning", {{"effort", "extreme"}}}}, "reasoning.effort");
  expect_400({{"instructions", "x"}}, "input");
  // store: false, other tool types (ignored) and unknown fields are fine.
  auto ok = ts.post("/v1/responses", {{"input", "x"},
                                      {"store", false},
                                      {"tools", kTools},
                                      {"include", {"reasoning.encrypted_content"}}});
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(ResponsesApi, MaxOutputTokensAndReasoningEffort) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "a b c d e f g h\n</think>\n\nanswer")};
  TestServer ts(std::move(o));
  json j = json::parse(ts.post("/v1/responses", {{"input", "x"}, {"max_output_tokens", 3}})->body);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(j["usage"]["output_tokens"], 3);
  // effort none: thinking off (the prompt closes it, so the model's text is all answer).
  json none = json::parse(
      ts.post("/v1/responses", {{"input", "x"}, {"reasoning", {{"effort", "none"}}}})->body);
  EXPECT_EQ(none["output"][0]["type"], "message");
  EXPECT_EQ(none["reasoning"]["effort"], "none");
}

TEST(ResponsesApi, EffortBudgets) {
  using server::effort_budget;
  EXPECT_EQ(effort_budget("minimal", "f"), 512);
  EXPECT_EQ(effort_budget("low", "f"), 2048);
  EXPECT_EQ(effort_budget("medium", "f"), 8192);
  EXPECT_EQ(effort_budget("high", "f"), 24576);
  EXPECT_EQ(effort_budget("xhigh", "f"), -1);
  EXPECT_THROW(effort_budget("huge", "f"), server::ApiError);
}

// Every field of a valid body (and of its nested objects) replaced by values of every JSON
// type: the answer is 200 or a 4xx, never a 5xx, and the server keeps serving.
void replace_everywhere(const json& j, const std::function<void(const json&)>& each) {
  const json odd[] = {nullptr,
                      1,
                      -5,
                      2.5,
                      "x",
                      "",
                      true,
                      json::array(),
                      json::object(),
                      json::array({1, "a", nullptr}),
                      json{{"type", "image"}}};
  std::function<void(const json&, const json::json_pointer&)> walk =
      [&](const json& node, const json::json_pointer& at) {
        if (node.is_object())
          for (auto& [k, v] : node.items()) walk(v, at / k);
        if (node.is_array())
          for (size_t i = 0; i < node.size(); ++i) walk(node[i], at / i);
        if (at.empty()) return;
        for (const auto& o : odd) {
          json copy = j;
          copy[at] = o;
          each(copy);
        }
        json removed = j;
        json& parent = removed[at.parent_pointer()];
        if (parent.is_array())
          parent.erase(std::stoul(at.back()));
        else
          parent.erase(at.back());
        each(removed);
      };
  walk(j, json::json_pointer());
}

TEST(AgentApis, OddBodiesAreNever5xx) {
  ServerFixtureOptions o;
  auto tok = Tokenizer::from_model_dir(demo_dir());
  o.script = {script_text(*tok, "ok")};
  TestServer ts(std::move(o));
  const json messages = json::parse(R"({"model": "m", "max_tokens": 5, "system": [{"type": "text",
    "text": "s"}], "thinking": {"type": "enabled", "budget_tokens": 2}, "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}, "output_config": {"effort": "low"},
    "tools": [{"name": "f", "input_schema": {"type": "object"}}], "stop_sequences": ["z"],
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type":
    "tool_use", "id": "t", "name": "f", "input": {}}]}, {"role": "user", "content": [{"type":
    "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]}]}]})");
  const json responses = json::parse(R"({"model": "m", "max_output_tokens": 5, "instructions": "i",
    "reasoning": {"effort": "low"}, "tool_choice": {"type": "function", "name": "f"}, "text":
    {"format": {"type": "text"}}, "tools": [{"type": "function", "name": "f",
    "parameters": {"type": "object"}}], "input": [{"role": "user", "content": [{"type": "input_text",
    "text": "hi"}]}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c", "output": "r"}]})");
  int sent = 0;
  for (const auto& [path_binding, valid] :
       {std::pair{"/v1/messages", messages}, std::pair{"/v1/messages/count_tokens", messages},
        std::pair{"/v1/responses", responses}}) {
    const std::string path =
        path_binding;  // lambdas cannot capture a structured binding (clang 14)
    auto ok = ts.post(path, valid);
    ASSERT_EQ(ok->status, 200) << path << " " << ok->body;
    replace_everywhere(valid, [&](const json& b) {
      auto r = ts.post(path, b);
      ASSERT_TRUE(r) << b.dump();
      EXPECT_LT(r->status, 500) << path << " " << b.dump() << " -> " << r->body;
      ++sent;
    });
  }
  EXPECT_GT(sent, 500);
  EXPECT_EQ(ts.post("/v1/responses", responses)->status, 200);
}

}  // namespace
}  // namespace lilac::test
