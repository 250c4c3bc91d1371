// POST /v1/responses: the OpenAI Responses API (what Codex speaks), stateless. The request's
// instructions and input items are converted into a chat-completions body and validated by
// parse_chat_request; the answer is a list of output items (reasoning, message, function_call),
// whole or as the Responses SSE event sequence. See docs/api.md.
#include <ctime>
#include <optional>

#include "server/agent_api.h"
#include "server/log.h"

namespace lilac::server {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);

bool present(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// j[key] when j is an object and it is a string, else `otherwise` (never throws).
std::string string_or(const json& j, const char* key, const std::string& otherwise) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return otherwise;
  return j[key].get<std::string>();
}

// Text of a message's content: a string, or parts input_text / output_text / text / refusal.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_field(where, "'{}' must be a string or an array of content parts", where);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const json& p = content[i];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad_field(w, "'{}' must be an object with a 'type'", w);
    const std::string type = p["type"].get<std::string>();
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      bad_field(w, "content part type '{}' is not supported: this server's model takes text only",
                type);
    if (!p.contains(key) || !p[key].is_string())
      bad_field(w + "." + key, "'{}.{}' must be a string", w, key);
    if (!out.empty()) out += "\n";
    out += p[key].get<std::string>();
  }
  return out;
}

struct Converted {
  json chat_body = json::object();
  std::optional<int64_t> thinking_budget;  // set by the request (else the kwargs decide)
  json echo = json::object();              // request fields the response object repeats
};

// The input items -> chat-completions messages. System / developer messages before the first
// other item join the system message (with `instructions` first); later ones become user
// messages (the chat template takes a system message only at the start). Reasoning items attach
// to the next assistant message; consecutive function calls form one assistant message.
json convert_input(const json& b) {
  std::string system;
  if (present(b, "instructions")) {
    if (!b["instructions"].is_string())
      bad_field("instructions", "'instructions' must be a string");
    system = b["instructions"].get<std::string>();
  }
  json msgs = json::array();
  std::string reasoning;  // from reasoning items, for the next assistant message
  auto assistant = [&]() -> json& {
    if (msgs.empty() || msgs.back()["role"] != "assistant" || !reasoning.empty()) {
      json m = {{"role", "assistant"}, {"content", ""}};
      if (!reasoning.empty()) m["reasoning_content"] = reasoning;
      reasoning.clear();
      msgs.push_back(m);
    }
    return msgs.back();
  };
  if (!b.contains("input")) bad_field("input", "'input' is required");
  const json& input = b["input"];
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const std::string w = fmt::format("input[{}]", i);
      const json& it = input[i];
      if (!it.is_object()) bad_field(w, "'{}' must be an object", w);
      std::string type = it.contains("type") && it["type"].is_string() ? it["type"] : "message";
      if (type == "message") {
        if (!it.contains("role") || !it["role"].is_string())
          bad_field(w + ".role", "'{}.role' must be a string", w);
        std::string role = it["role"].get<std::string>();
        if (!it.contains("content")) bad_field(w + ".content", "'{}.content' is required", w);
        const std::string text = content_text(it["content"], w + ".content");
        if (role == "system" || role == "developer") {
          if (msgs.empty()) {
            system += (system.empty() ? "" : "\n\n") + text;
            continue;
          }
          role = "user";
        }
        if (role == "assistant") {
          json m = {{"role", "assistant"}, {"content", text}};
          if (!reasoning.empty()) m["reasoning_content"] = reasoning;
          reasoning.clear();
          msgs.push_back(m);
        } else if (role == "user") {
          msgs.push_back({{"role", "user"}, {"content", text}});
        } else {
          bad_field(w + ".role", "'{}.role' must be user, assistant, system or developer", w);
        }
      } else if (type == "function_call") {
        for (const char* k : {"name", "arguments"})
          if (!it.contains(k) || !it[k].is_string())
            bad_field(w + "." + k, "'{}.{}' must be a string", w, k);
        json call = {{"type", "function"},
                     {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
        if (present(it, "call_id")) call["id"] = it["call_id"];
        json& a = assistant();
        if (!a.contains("tool_calls")) a["tool_calls"] = json::array();
        a["tool_calls"].push_back(call);
      } else if (type == "function_call_output") {
        if (!it.contains("output")) bad_field(w + ".output", "'{}.output' is required", w);
        json m = {{"role", "tool"}, {"content", content_text(it["output"], w + ".output")}};
        if (present(it, "call_id")) m["tool_call_id"] = it["call_id"];
        msgs.push_back(m);
      } else if (type == "reasoning") {
        // The reasoning text when given, else its summary; encrypted_content is opaque here.
        for (const char* k : {"content", "summary"}) {
          if (!present(it, k) || !it[k].is_array() || it[k].empty()) continue;
          for (const auto& part : it[k])
            if (part.is_object() && part.contains("text") && part["text"].is_string())
              reasoning += (reasoning.empty() ? "" : "\n") + part["text"].get<std::string>();
          break;
        }
      } else if (type == "item_reference") {
        bad_field(w,
                  "'item_reference' needs stored responses: this server is stateless; send "
                  "the items themselves");
      } else {
        bad_field(w + ".type",
                  "input item type '{}' is not supported (message, function_call, "
                  "function_call_output and reasoning are)",
                  type);
      }
    }
  } else {
    bad_field("input", "'input' must be a string or an array of items");
  }
  if (!system.empty()) msgs.insert(msgs.begin(), json{{"role", "system"}, {"content", system}});
  return msgs;
}

Converted convert(const json& b) {
  Converted r;
  json& c = r.chat_body;
  if (present(b, "previous_response_id"))
    bad_field("previous_response_id",
              "'previous_response_id' is not supported: this server is stateless and stores no "
              "responses; send the whole conversation in 'input'");
  if (present(b, "store") && b["store"] == true)
    bad_field("store",
              "'store': true is not supported: this server is stateless; send 'store': false");
  if (present(b, "background") && b["background"] == true)
    bad_field("background", "'background': true is not supported");
  c["messages"] = convert_input(b);
  json tools = json::array();
  if (present(b, "tools")) {
    if (!b["tools"].is_array()) bad_field("tools", "'tools' must be an array");
    for (size_t i = 0; i < b["tools"].size(); ++i) {
      const json& t = b["tools"][i];
      const std::string w = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad_field(w, "'{}' must be an object", w);
      if (t.contains("type") && !t["type"].is_string())
        bad_field(w + ".type", "'{}.type' must be a string", w);
      const std::string type = string_or(t, "type", "function");
      if (type != "function") {
        Log::warn("/v1/responses: tool type '" + type + "' is not supported; ignored",
                  {{"tool", t.value("name", json())}});
        continue;
      }
      json fn = {{"name", t.value("name", json())}};
      if (present(t, "description")) fn["description"] = t["description"];
      if (present(t, "parameters")) fn["parameters"] = t["parameters"];
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    c["tools"] = tools;
  }
  r.echo["tools"] = present(b, "tools") ? b["tools"] : json::array();
  r.echo["tool_choice"] = "auto";
  if (present(b, "tool_choice")) {
    const json& tc = b["tool_choice"];
    r.echo["tool_choice"] = tc;
    if (tc.is_string()) {
      c["tool_choice"] = tc;
    } else if (string_or(tc, "type", "") == "function" && tc.contains("name")) {
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      Log::warn("/v1/responses: tool_choice " + tc.dump() + " is not supported; using auto");
    }
  }
  if (present(b, "max_output_tokens")) c["max_tokens"] = b["max_output_tokens"];
  for (const char* key : {"temperature", "top_p", "parallel_tool_calls", "stream", "model"})
    if (present(b, key)) c[key] = b[key];
  if (present(b, "reasoning")) {
    const json& rs = b["reasoning"];
    if (!rs.is_object()) bad_field("reasoning", "'reasoning' must be an object");
    if (present(rs, "effort")) {
      if (!rs["effort"].is_string()) bad_field("reasoning.effort", "must be a string");
      const std::string effort = rs["effort"].get<std::string>();
      r.thinking_budget = effort_budget(effort, "reasoning.effort");
      if (effort == "none") c["chat_template_kwargs"]["enable_thinking"] = false;
    }
    r.echo["reasoning"] = rs;
  }
  if (present(b, "text") && b["text"].is_object() && present(b["text"], "format") &&
      string_or(b["text"]["format"], "type", "text") != "text")
    Log::warn("/v1/responses: text.format " + string_or(b["text"]["format"], "type", "?") +
              " is not enforced; the answer is free text");
  for (const char* key : {"instructions", "metadata", "max_output_tokens"})
    r.echo[key] = present(b, key) ? b[key] : json(nullptr);
  return r;
}

// The output items of one response, built from the generation's chunks; with `send` set, every
// step is also an SSE event (response.output_item.added, ..., response.output_item.done).
class OutputItems {
 public:
  using Send = std::function<bool(const std::string&, json)>;
  explicit OutputItems(Send send) : send_(std::move(send)) {}
  json items = json::array();
  std::string reasoning_all;  // every reasoning text (usage.reasoning_tokens)

  bool text(const std::string& kind, const std::string& s) {
    if (s.empty()) return true;
    if (kind == "reasoning") reasoning_all += s;
    if (open_ != kind) {
      if (!close()) return false;
      open_ = kind;
      text_.clear();
      id_ = (kind == "reasoning" ? "rs_" : "msg_") + random_id(24);
      if (!ev("response.output_item.added", {{"output_index", items.size()}, {"item", item({})}}))
        return false;
      if (!ev("response.content_part.added", {{"item_id", id_},
                                              {"output_index", items.size()},
                                              {"content_index", 0},
                                              {"part", part("")}}))
        return false;
    }
    text_ += s;
    return ev(
        kind == "reasoning" ? "response.reasoning_text.delta" : "response.output_text.delta",
        {{"item_id", id_}, {"output_index", items.size()}, {"content_index", 0}, {"delta", s}});
  }

  // A function_call item, streamed: added (arguments ""), a delta per fragment, then done.
  bool call_start(const std::string& name) {
    if (!close()) return false;
    call_ = {{"type", "function_call"},
             {"id", "fc_" + random_id(24)},
             {"call_id", "call_" + random_id(24)},
             {"name", name},
             {"arguments", ""},
             {"status", "in_progress"}};
    return ev("response.output_item.added", {{"output_index", items.size()}, {"item", call_}});
  }
  bool call_arguments(const std::string& fragment) {
    if (call_.is_null()) return true;
    call_["arguments"] = call_["arguments"].get<std::string>() + fragment;
    return ev("response.function_call_arguments.delta",
              {{"item_id", call_["id"]}, {"output_index", items.size()}, {"delta", fragment}});
  }
  bool call_end() {
    if (call_.is_null()) return true;
    json it = std::move(call_);
    call_ = nullptr;
    const size_t at = items.size();
    if (!ev("response.function_call_arguments.done", {{"item_id", it["id"]},
                                                      {"output_index", at},
                                                      {"name", it["name"]},
                                                      {"arguments", it["arguments"]}}))
      return false;
    it["status"] = "completed";
    items.push_back(it);
    return ev("response.output_item.done", {{"output_index", at}, {"item", it}});
  }

  bool close() {
    if (!call_end()) return false;
    if (open_.empty()) return true;
    const bool reasoning = open_ == "reasoning";
    const size_t at = items.size();
    json done = {{"item_id", id_}, {"output_index", at}, {"content_index", 0}, {"text", text_}};
    if (!ev(reasoning ? "response.reasoning_text.done" : "response.output_text.done", done))
      return false;
    if (!ev("response.content_part.done",
            {{"item_id", id_}, {"output_index", at}, {"content_index", 0}, {"part", part(text_)}}))
      return false;
    json it = item(json::array({part(text_)}));
    if (!reasoning) it["status"] = "completed";
    items.push_back(it);
    open_.clear();
    return ev("response.output_item.done", {{"output_index", at}, {"item", it}});
  }

  int sequence = 0;
  bool ev(const std::string& name, json data) {
    if (!send_) return true;
    data["type"] = name;
    data["sequence_number"] = sequence++;
    return send_(name, std::move(data));
  }

 private:
  json part(const std::string& text) const {
    if (open_ == "reasoning") return {{"type", "reasoning_text"}, {"text", text}};
    return {{"type", "output_text"},
            {"text", text},
            {"annotations", json::array()},
            {"logprobs", json::array()}};
  }
  json item(json content) const {
    if (open_ == "reasoning")
      return {{"type", "reasoning"},
              {"id", id_},
              {"summary", json::array()},
              {"content", content.is_array() ? content : json::array()}};
    return {{"type", "message"},
            {"id", id_},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", content.is_array() ? content : json::array()}};
  }
  Send send_;
  std::string open_, text_, id_;
  json call_;  // the function_call item being streamed (null when none)
};

struct ResponsesJob : AgentJob {
  std::string id = "resp_" + random_id(24);
  int64_t created = int64_t(std::time(nullptr));
  json echo;
};

json response_object(const ResponsesJob& job, const std::string& status, const json& output) {
  const CommonParams& c = job.chat.common;
  json r = {{"id", job.id},
            {"object", "response"},
            {"created_at", job.created},
            {"status", status},
            {"model", job.model.model_id},
            {"output", output},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"parallel_tool_calls", job.chat.parallel_tool_calls},
            {"temperature", c.sampling.temperature},
            {"top_p", c.sampling.top_p},
            {"previous_response_id", nullptr},
            {"store", false},
            {"text", {{"format", {{"type", "text"}}}}},
            {"usage", nullptr}};
  for (const auto& [k, v] : job.echo.items()) r[k] = v;
  return r;
}

void finish_object(json& r, const GenerationResult& g, const OutputItems& out,
                   const ServingModel& m) {
  const int64_t completion = int64_t(g.tokens.size());
  r["usage"] = {{"input_tokens", g.prompt_tokens},
                {"input_tokens_details", {{"cached_tokens", g.cached_tokens}}},
                {"output_tokens", completion},
                {"output_tokens_details",
                 {{"reasoning_tokens", std::min(completion, count_tokens(m, out.reasoning_all))}}},
                {"total_tokens", g.prompt_tokens + completion}};
  if (g.finish == FinishReason::Length) {
    r["status"] = "incomplete";
    r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  }
  if (g.finish == FinishReason::Error || g.finish == FinishReason::Cancelled) {
    r["status"] = "failed";
    r["error"] = {
        {"code", "server_error"},
        {"message", g.finish == FinishReason::Error ? "generation failed: " + g.error
                                                    : std::string("the generation was cancelled")}};
  }
}

// Runs the generation through `out`; false when the client went away.
bool drive(AgentJob& job, httplib::DataSink& sink, OutputItems& out) {
  Generation& g = *job.gen;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    bool wrote = !c.pieces.empty();
    for (const ParsedPiece& p : c.pieces) {
      bool ok = true;
      switch (p.kind) {
        case ParsedPiece::Kind::Reasoning:
          ok = out.text("reasoning", p.text);
          break;
        case ParsedPiece::Kind::Content:
          ok = out.text("message", p.text);
          break;
        case ParsedPiece::Kind::CallStart:
          ok = out.call_start(p.text);
          break;
        case ParsedPiece::Kind::CallArguments:
          ok = out.call_arguments(p.text);
          break;
        case ParsedPiece::Kind::CallEnd:
          ok = out.call_end();
          break;
      }
      if (!ok) return false;
    }
    if (c.finished) break;
    if (!wrote && !agent_heartbeat(job, sink)) return false;
  }
  return out.close();
}

bool complete_response(ResponsesJob& job, httplib::DataSink& sink) {
  OutputItems out(nullptr);
  if (!drive(job, sink, out)) return false;
  json r = response_object(job, "completed", out.items);
  finish_object(r, job.gen->result(), out, job.model);
  if (!agent_emit(job, sink, dump(r))) return false;
  sink.done();
  return true;
}

bool stream_response(ResponsesJob& job, httplib::DataSink& sink) {
  OutputItems out(
      [&](const std::string& name, json data) { return agent_event(job, sink, name, data); });
  json r = response_object(job, "in_progress", json::array());
  if (!out.ev("response.created", {{"response", r}}) ||
      !out.ev("response.in_progress", {{"response", r}}))
    return false;
  if (!drive(job, sink, out)) return false;
  r = response_object(job, "completed", out.items);
  finish_object(r, job.gen->result(), out, job.model);
  const std::string status = r["status"];
  const std::string name = status == "completed"    ? "response.completed"
                           : status == "incomplete" ? "response.incomplete"
                                                    : "response.failed";
  if (!out.ev(name, {{"response", r}})) return false;
  sink.done();
  return true;
}

}  // namespace

void handle_responses(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  auto job = std::make_shared<ResponsesJob>();
  job->model = s.serving();
  Converted cv = convert(parse_body(req.body));
  job->chat = parse_chat_request(with_default_kwargs(cv.chat_body, job->model.chat_template_kwargs),
                                 job->model.defaults);
  job->stream = job->chat.common.stream;
  job->echo = cv.echo;
  launch_agent_job(s, *job, render_and_encode(*job),
                   cv.thinking_budget.value_or(chat_thinking_budget(job->chat)));
  auto body = [job](AgentJob&, httplib::DataSink& sink) {
    return job->stream ? stream_response(*job, sink) : complete_response(*job, sink);
  };
  respond_agent(res, job, body);
}

}  // namespace lilac::server
