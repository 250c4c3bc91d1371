// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API (what Claude Code
// speaks). The request is converted into a chat-completions body and validated by
// parse_chat_request; the answer is written as Anthropic content blocks (thinking, text,
// tool_use) or as its SSE event sequence. Errors use Anthropic's shape. See docs/api.md.
#include <ctime>
#include <optional>

#include "server/agent_api.h"
#include "server/log.h"

namespace lilac::server {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr std::string_view kBillingHeader = "x-anthropic-billing-header:";

bool present(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

std::string type_of(const json& block, const std::string& where) {
  if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
    bad_field(where, "'{}' must be an object with a 'type'", where);
  return block["type"].get<std::string>();
}

std::string text_field(const json& block, const char* key, const std::string& where) {
  if (!block.contains(key) || !block[key].is_string())
    bad_field(where + "." + key, "'{}.{}' must be a string", where, key);
  return block[key].get<std::string>();
}

[[noreturn]] void no_images(const std::string& where, const std::string& type) {
  bad_field(where,
            "content blocks of type '{}' are not supported: this server's model takes text only",
            type);
}

// Volatile system text: Claude Code starts its system prompt with a billing / attribution line
// ("x-anthropic-billing-header: cc_version=...; cch=<changes every request>;"). It means nothing
// to the model and, at the very start of the prompt, would defeat prompt reuse for everything
// after it, so such lines are dropped before rendering.
std::string without_volatile_lines(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view line = std::string_view(text).substr(pos, end - pos);
    if (line.substr(0, kBillingHeader.size()) != kBillingHeader) out.append(line);
    pos = end;
  }
  return out;
}

std::string system_text(const json& system) {
  if (system.is_string()) return without_volatile_lines(system.get<std::string>());
  if (!system.is_array())
    bad_field("system", "'system' must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < system.size(); ++i) {
    const std::string w = fmt::format("system[{}]", i);
    const std::string type = type_of(system[i], w);
    if (type != "text") bad_field(w, "'{}' must be a text block, not '{}'", w, type);
    std::string t = without_volatile_lines(text_field(system[i], "text", w));
    if (t.empty()) continue;
    if (!out.empty()) out += "\n\n";
    out += t;
  }
  return out;
}

// tool_result content: a string or text blocks (joined with newlines).
std::string tool_result_text(const json& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(where, "'{}' must be a string or an array of blocks", where);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const std::string type = type_of(content[i], w);
    if (type == "image" || type == "document") no_images(w, type);
    if (type != "text") bad_field(w, "'{}': block type '{}' is not supported here", w, type);
    if (!out.empty()) out += "\n";
    out += text_field(content[i], "text", w);
  }
  return out;
}

// Anthropic messages -> chat-completions messages (OpenAI shape, as parse_chat_request takes).
void convert_message(const json& m, size_t index, json& out) {
  const std::string w = fmt::format("messages[{}]", index);
  if (!m.is_object()) bad_field(w, "'{}' must be an object", w);
  if (!m.contains("role") || !m["role"].is_string())
    bad_field(w + ".role", "'{}.role' must be user or assistant", w);
  std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant" && role != "system")
    bad_field(w + ".role", "'{}.role' must be user, assistant or system; got '{}'", w, role);
  if (!m.contains("content")) bad_field(w + ".content", "'{}.content' is required", w);
  const json& content = m["content"];
  if (role == "system") {
    // A system message in the conversation (Claude Code's mid-conversation-system beta): the
    // chat template takes a system message only at the start, so it becomes a user turn.
    std::string text = content.is_string() ? content.get<std::string>() : system_text(content);
    if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    return;
  }
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array())
    bad_field(w + ".content", "'{}.content' must be a string or an array of content blocks", w);
  std::string text, thinking;
  json calls = json::array();
  auto flush_user_text = [&] {
    if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    text.clear();
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bw = fmt::format("{}.content[{}]", w, i);
    const json& b = content[i];
    const std::string type = type_of(b, bw);
    if (type == "text") {
      if (!text.empty()) text += "\n";
      text += text_field(b, "text", bw);
    } else if (type == "image" || type == "document") {
      no_images(bw, type);
    } else if (role == "user" && type == "tool_result") {
      flush_user_text();  // keeps the order: text before a result stays before it
      json msg = {{"role", "tool"},
                  {"content", tool_result_text(b.value("content", json()), bw + ".content")}};
      if (present(b, "tool_use_id") && b["tool_use_id"].is_string())
        msg["tool_call_id"] = b["tool_use_id"];
      out.push_back(msg);
    } else if (role == "assistant" && type == "tool_use") {
      if (!b.contains("name") || !b["name"].is_string())
        bad_field(bw + ".name", "'{}.name' must be a string", bw);
      json input = b.value("input", json::object());
      if (!input.is_object()) bad_field(bw + ".input", "'{}.input' must be an object", bw);
      json call = {{"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}};
      if (present(b, "id") && b["id"].is_string()) call["id"] = b["id"];
      calls.push_back(call);
    } else if (role == "assistant" && type == "thinking") {
      // Accepted in history; the signature means nothing here and is ignored.
      if (!thinking.empty()) thinking += "\n";
      thinking += text_field(b, "thinking", bw);
    } else if (role == "assistant" && type == "redacted_thinking") {
      continue;  // opaque to us
    } else {
      bad_field(bw, "content block type '{}' is not supported in a {} message", type, role);
    }
  }
  if (role == "user") {
    flush_user_text();
    return;
  }
  json msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(msg);
}

json convert_tools(const json& tools) {
  if (!tools.is_array()) bad_field("tools", "'tools' must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = fmt::format("tools[{}]", i);
    const json& t = tools[i];
    if (!t.is_object()) bad_field(w, "'{}' must be an object", w);
    const std::string type = t.contains("type") && t["type"].is_string() ? t["type"] : "custom";
    if (type != "custom") {
      Log::warn("/v1/messages: tool type '" + type + "' is not supported; ignored",
                {{"tool", t.value("name", json())}});
      continue;
    }
    if (!t.contains("name") || !t["name"].is_string())
      bad_field(w + ".name", "'{}.name' must be a string", w);
    json fn = {{"name", t["name"]}};
    if (present(t, "description")) fn["description"] = t["description"];
    if (present(t, "input_schema")) {
      if (!t["input_schema"].is_object())
        bad_field(w + ".input_schema", "'{}.input_schema' must be a JSON schema object", w);
      fn["parameters"] = t["input_schema"];
    }
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

struct MessagesRequest {
  json chat_body = json::object();
  std::vector<std::string> stop;
  std::optional<int64_t> thinking_budget;  // set by the request (else the kwargs decide)
};

// The Anthropic body -> a chat-completions body (validated afterwards by parse_chat_request).
MessagesRequest convert(const json& b, bool need_max_tokens) {
  MessagesRequest r;
  json& c = r.chat_body;
  json messages = json::array();
  if (present(b, "system")) {
    std::string sys = system_text(b["system"]);
    if (!sys.empty()) messages.push_back({{"role", "system"}, {"content", sys}});
  }
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    bad_field("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < b["messages"].size(); ++i) convert_message(b["messages"][i], i, messages);
  c["messages"] = messages;
  if (present(b, "tools")) c["tools"] = convert_tools(b["tools"]);
  if (need_max_tokens && !present(b, "max_tokens"))
    bad_field("max_tokens", "'max_tokens' is required");
  for (const char* key : {"max_tokens", "temperature", "top_p", "top_k", "model", "stream"})
    if (present(b, key)) c[key] = b[key];
  if (present(b, "stop_sequences")) {
    const json& s = b["stop_sequences"];
    if (!s.is_array()) bad_field("stop_sequences", "'stop_sequences' must be an array of strings");
    for (const auto& x : s) {
      if (!x.is_string()) bad_field("stop_sequences", "'stop_sequences' must hold strings");
      if (!x.get<std::string>().empty()) r.stop.push_back(x.get<std::string>());
    }
  }
  if (present(b, "tool_choice")) {
    const json& tc = b["tool_choice"];
    const std::string type = type_of(tc, "tool_choice");
    if (type == "auto") {
      c["tool_choice"] = "auto";
    } else if (type == "any") {
      c["tool_choice"] = "required";
    } else if (type == "none") {
      c["tool_choice"] = "none";
    } else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string())
        bad_field("tool_choice.name", "'tool_choice.name' must be a string");
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      bad_field("tool_choice", "'tool_choice.type' must be auto, any, tool or none; got '{}'",
                type);
    }
    if (present(tc, "disable_parallel_tool_use") && tc["disable_parallel_tool_use"].is_boolean())
      c["parallel_tool_calls"] = !tc["disable_parallel_tool_use"].get<bool>();
  }
  // output_config.effort (Anthropic's effort parameter): a thinking budget, as reasoning efforts
  // map; an explicit thinking.budget_tokens wins.
  if (present(b, "output_config") && b["output_config"].is_object() &&
      present(b["output_config"], "effort")) {
    const json& e = b["output_config"]["effort"];
    if (!e.is_string())
      bad_field("output_config.effort", "'output_config.effort' must be a string");
    r.thinking_budget = effort_budget(e.get<std::string>(), "output_config.effort");
  }
  if (present(b, "thinking")) {
    const json& t = b["thinking"];
    const std::string type = type_of(t, "thinking");
    if (type == "enabled") {
      c["chat_template_kwargs"]["enable_thinking"] = true;
      if (!present(t, "budget_tokens") || !t["budget_tokens"].is_number_integer() ||
          t["budget_tokens"].get<int64_t>() < 0)
        bad_field("thinking.budget_tokens", "'thinking.budget_tokens' must be an integer >= 0");
      r.thinking_budget = t["budget_tokens"].get<int64_t>();
    } else if (type == "disabled") {
      c["chat_template_kwargs"]["enable_thinking"] = false;
    } else if (type == "adaptive") {
      c["chat_template_kwargs"]["enable_thinking"] = true;
    } else {
      bad_field("thinking", "'thinking.type' must be enabled, disabled or adaptive; got '{}'",
                type);
    }
  }
  return r;
}

// Converts and validates; job.chat is ready to render.
MessagesRequest prepare(AgentJob& job, const json& body, bool need_max_tokens) {
  MessagesRequest mr = convert(body, need_max_tokens);
  job.chat = parse_chat_request(with_default_kwargs(mr.chat_body, job.model.chat_template_kwargs),
                                job.model.defaults);
  job.chat.common.stop = mr.stop;
  job.stream = job.chat.common.stream;
  return mr;
}

json usage_of(const GenerationResult& r) {
  return {{"input_tokens", r.prompt_tokens - r.cached_tokens},
          {"output_tokens", int64_t(r.tokens.size())},
          {"cache_read_input_tokens", r.cached_tokens},
          {"cache_creation_input_tokens", 0}};
}

std::string stop_reason(const AgentJob& job, const GenerationResult& r, bool tool_use,
                        std::optional<std::string>& stop_sequence) {
  if (r.finish == FinishReason::Length) return "max_tokens";
  if (tool_use) return "tool_use";
  stop_sequence = matched_stop(job, r);
  return stop_sequence ? "stop_sequence" : "end_turn";
}

std::optional<std::string> failure(const GenerationResult& r) {
  if (r.finish == FinishReason::Error) return "generation failed: " + r.error;
  if (r.finish == FinishReason::Cancelled)
    return "the generation was cancelled (the server is shutting down)";
  return std::nullopt;
}

json tool_use_block(const ToolCall& call) {
  json input = json::parse(call.arguments, nullptr, false);
  if (!input.is_object()) input = json::object();
  return {{"type", "tool_use"},
          {"id", "toolu_" + random_id(24)},
          {"name", call.name},
          {"input", input}};
}

std::string message_id() {
  return "msg_" + random_id(24);
}

bool complete_messages(AgentJob& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  json content = json::array();
  auto append_text = [&](const char* type, const char* key, const std::string& s) {
    if (s.empty()) return;
    if (content.empty() || content.back()["type"] != type) {
      json block = {{"type", type}, {key, ""}};
      if (std::string(type) == "thinking") block["signature"] = "";
      content.push_back(block);
    }
    content.back()[key] = content.back()[key].get<std::string>() + s;
  };
  bool tool_use = false;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    append_text("thinking", "thinking", c.reasoning);
    append_text("text", "text", c.content);
    for (const auto& [index, call] : c.tool_calls) {
      (void)index;
      content.push_back(tool_use_block(call));
      tool_use = true;
    }
    if (c.finished) break;
    if (!agent_heartbeat(job, sink)) return false;
  }
  const GenerationResult& r = g.result();
  json body;
  if (auto err = failure(r)) {
    body = anthropic_error_body(500, *err);
  } else {
    std::optional<std::string> seq;
    const std::string reason = stop_reason(job, r, tool_use, seq);
    body = {{"id", message_id()},
            {"type", "message"},
            {"role", "assistant"},
            {"model", job.model.model_id},
            {"content", content},
            {"stop_reason", reason},
            {"stop_sequence", seq ? json(*seq) : json(nullptr)},
            {"usage", usage_of(r)}};
  }
  if (!agent_emit(job, sink, dump(body))) return false;
  sink.done();
  return true;
}

bool stream_messages(AgentJob& job, httplib::DataSink& sink) {
  Generation& g = *job.gen;
  auto ev = [&](const std::string& name, json data) {
    data["type"] = name;
    return agent_event(job, sink, name, data);
  };
  json start = {{"id", message_id()},
                {"type", "message"},
                {"role", "assistant"},
                {"model", job.model.model_id},
                {"content", json::array()},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage",
                 {{"input_tokens", job.prompt_tokens},
                  {"output_tokens", 0},
                  {"cache_read_input_tokens", 0},
                  {"cache_creation_input_tokens", 0}}}};
  if (!ev("message_start", {{"message", start}})) return false;
  if (!ev("ping", json::object())) return false;
  int index = -1;
  std::string open;  // the open block's type ("" when none)
  auto close_block = [&] {
    if (open.empty()) return true;
    if (open == "thinking" &&
        !ev("content_block_delta",
            {{"index", index}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}))
      return false;
    open.clear();
    return ev("content_block_stop", {{"index", index}});
  };
  auto text_delta = [&](const std::string& type, const std::string& s) {
    if (s.empty()) return true;
    const bool thinking = type == "thinking";
    if (open != type) {
      if (!close_block()) return false;
      open = type;
      json block = thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                            : json{{"type", "text"}, {"text", ""}};
      if (!ev("content_block_start", {{"index", ++index}, {"content_block", block}})) return false;
    }
    json delta = thinking ? json{{"type", "thinking_delta"}, {"thinking", s}}
                          : json{{"type", "text_delta"}, {"text", s}};
    return ev("content_block_delta", {{"index", index}, {"delta", delta}});
  };
  bool tool_use = false;
  for (;;) {
    GenerationChunk c = g.next(kPoll);
    bool wrote = !c.pieces.empty();
    // In the order written; a call as a tool_use block whose input streams as input_json_delta
    // fragments (one per parameter, then the '}'), stopped at the call's end.
    for (const ParsedPiece& p : c.pieces) {
      bool ok = true;
      switch (p.kind) {
        case ParsedPiece::Kind::Reasoning:
          ok = text_delta("thinking", p.text);
          break;
        case ParsedPiece::Kind::Content:
          ok = text_delta("text", p.text);
          break;
        case ParsedPiece::Kind::CallStart: {
          tool_use = true;
          json block = tool_use_block(ToolCall{p.text, "{}"});
          ok = close_block() &&
               ev("content_block_start", {{"index", ++index}, {"content_block", block}});
          open = "tool_use";
          break;
        }
        case ParsedPiece::Kind::CallArguments:
          ok = ev("content_block_delta",
                  {{"index", index},
                   {"delta", {{"type", "input_json_delta"}, {"partial_json", p.text}}}});
          break;
        case ParsedPiece::Kind::CallEnd:
          ok = close_block();
          break;
      }
      if (!ok) return false;
    }
    if (c.finished) break;
    if (!wrote && !agent_heartbeat(job, sink)) return false;
  }
  if (!close_block()) return false;
  const GenerationResult& r = g.result();
  if (auto err = failure(r)) {
    agent_event(job, sink, "error", anthropic_error_body(500, *err));
  } else {
    std::optional<std::string> seq;
    const std::string reason = stop_reason(job, r, tool_use, seq);
    if (!ev("message_delta",
            {{"delta", {{"stop_reason", reason}, {"stop_sequence", seq ? json(*seq) : json()}}},
             {"usage", usage_of(r)}}) ||
        !ev("message_stop", json::object()))
      return false;
  }
  sink.done();
  return true;
}

// Runs `fn`, answering its ApiError (and any lilac::Error) in Anthropic's shape.
template <typename Fn>
void anthropic_errors(httplib::Response& res, Fn fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    send_json(res, e.status, anthropic_error_body(e.status, e.what()));
  } catch (const Error& e) {
    send_json(res, 400, anthropic_error_body(400, e.what()));
  } catch (const std::exception& e) {
    Log::error("internal error", {{"path", "/v1/messages"}, {"error", e.what()}});
    send_json(res, 500, anthropic_error_body(500, std::string("internal error: ") + e.what()));
  }
}

}  // namespace

bool is_anthropic_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0;
}

json anthropic_error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

void handle_messages(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  anthropic_errors(res, [&] {
    auto job = std::make_shared<AgentJob>();
    job->model = s.serving();
    MessagesRequest mr = prepare(*job, parse_body(req.body), true);
    launch_agent_job(s, *job, render_and_encode(*job),
                     mr.thinking_budget.value_or(chat_thinking_budget(job->chat)));
    respond_agent(res, job, job->stream ? stream_messages : complete_messages);
  });
}

void handle_count_tokens(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
  anthropic_errors(res, [&] {
    AgentJob job;
    job.model = s.serving();
    json body = parse_body(req.body);
    body.erase("stream");
    prepare(job, body, false);
    render_and_encode(job);
    send_json(res, 200, {{"input_tokens", job.prompt_tokens}});
  });
}

}  // namespace lilac::server
