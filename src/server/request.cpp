#include "server/request.h"

#include <cmath>

#include "server/api_error.h"
#include "util/json_parse.h"

namespace lilac::server {

using nlohmann::json;

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json ApiError::to_json() const {
  return error_body(what(), type, param, code);
}

json parse_body(const std::string& body) {
  json j;
  try {
    j = parse_json(body);
  } catch (const JsonParseError& e) {
    throw ApiError(400,
                   e.field.empty() ? fmt::format("the request body is not valid JSON: {}", e.what())
                                   : fmt::format("the request body is not valid JSON: {} (in '{}')",
                                                 e.what(), e.field),
                   "invalid_request_error", e.field);
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

bool optional_bool(const json& b, const char* key, bool dflt) {
  if (!b.contains(key) || b[key].is_null()) return dflt;
  if (!b[key].is_boolean())
    bad_field(key, "'{}' must be true or false, not {}", key, b[key].type_name());
  return b[key].get<bool>();
}

namespace {

bool present(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

double number(const json& j, const char* key, double lo, double hi) {
  const json& v = j[key];
  if (!v.is_number()) bad_field(key, "'{}' must be a number, not {}", key, v.type_name());
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_field(key, "'{}' must be between {} and {}; got {}", key, lo, hi, v.dump());
  return x;
}

int64_t integer(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json& v = j[key];
  if (v.is_number_float()) {
    // Range first, in double: converting a double outside int64's range is undefined.
    // (2^63 is exactly representable; every double >= it is out of range.)
    const double d = v.get<double>();
    if (std::floor(d) != d) bad_field(key, "'{}' must be an integer; got {}", key, v.dump());
    if (d < double(lo) || d > double(hi) || d >= 9223372036854775808.0)
      bad_field(key, "'{}' must be between {} and {}; got {}", key, lo, hi, v.dump());
    return int64_t(d);
  }
  if (!v.is_number()) bad_field(key, "'{}' must be an integer, not {}", key, v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    bad_field(key, "'{}' is out of range ({} to {}); got {}", key, lo, hi, v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad_field(key, "'{}' must be between {} and {}; got {}", key, lo, hi, x);
  return x;
}

bool boolean(const json& j, const char* key) {
  if (!j[key].is_boolean())
    bad_field(key, "'{}' must be true or false, not {}", key, j[key].type_name());
  return j[key].get<bool>();
}

void parse_common(const json& b, const SamplingParams& defaults, CommonParams& c, bool chat) {
  c.sampling = defaults;
  c.sampling.top_logprobs = 0;
  if (present(b, "model")) {
    if (!b["model"].is_string()) bad_field("model", "'model' must be a string");
    c.model = b["model"].get<std::string>();
  }
  if (present(b, "temperature")) c.sampling.temperature = float(number(b, "temperature", 0, 100));
  if (present(b, "top_p")) {
    c.sampling.top_p = float(number(b, "top_p", 0, 1));
    if (c.sampling.top_p <= 0) bad_field("top_p", "'top_p' must be greater than 0");
  }
  if (present(b, "top_k")) {
    int64_t k = integer(b, "top_k", -1, INT32_MAX);
    c.sampling.top_k = k < 0 ? 0 : int(k);
  }
  if (present(b, "min_p")) c.sampling.min_p = float(number(b, "min_p", 0, 1));
  if (present(b, "presence_penalty"))
    c.sampling.presence_penalty = float(number(b, "presence_penalty", -2, 2));
  if (present(b, "frequency_penalty"))
    c.sampling.frequency_penalty = float(number(b, "frequency_penalty", -2, 2));
  if (present(b, "repetition_penalty")) {
    c.sampling.repetition_penalty = float(number(b, "repetition_penalty", 0, 10));
    if (c.sampling.repetition_penalty <= 0)
      bad_field("repetition_penalty", "'repetition_penalty' must be greater than 0");
  }
  if (present(b, "seed")) {
    const json& s = b["seed"];
    if (s.is_number_unsigned())
      c.sampling.seed = s.get<uint64_t>();
    else if (s.is_number_integer())
      c.sampling.seed = uint64_t(s.get<int64_t>());
    else
      bad_field("seed", "'seed' must be an integer, not {}", s.type_name());
    c.seed_given = true;
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (present(b, key))
      c.max_tokens = integer(b, key, 1, INT64_MAX);  // max_completion_tokens wins
  if (present(b, "stop")) {
    const json& s = b["stop"];
    if (s.is_string()) {
      c.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) bad_field("stop", "'stop' takes at most 4 strings; got {}", s.size());
      for (const auto& x : s) {
        if (!x.is_string()) bad_field("stop", "'stop' must be a string or an array of strings");
        c.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_field("stop", "'stop' must be a string or an array of strings, not {}", s.type_name());
    }
    std::erase_if(c.stop, [](const std::string& x) { return x.empty(); });
  }
  if (present(b, "n") && integer(b, "n", 1, INT32_MAX) != 1)
    bad_field("n", "only n = 1 is supported");
  if (present(b, "best_of") && integer(b, "best_of", 1, INT32_MAX) != 1)
    bad_field("best_of", "only best_of = 1 is supported");
  if (present(b, "stream")) c.stream = boolean(b, "stream");
  if (present(b, "ignore_eos")) c.ignore_eos = boolean(b, "ignore_eos");  // vLLM's field
  if (present(b, "stream_options")) {
    const json& so = b["stream_options"];
    if (!so.is_object()) bad_field("stream_options", "'stream_options' must be an object");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean())
        bad_field("stream_options.include_usage", "'include_usage' must be true or false");
      c.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (chat) {
    if (present(b, "logprobs")) c.logprobs = boolean(b, "logprobs");
    if (present(b, "top_logprobs")) {
      c.top_logprobs = int(integer(b, "top_logprobs", 0, 20));
      if (c.top_logprobs > 0 && !c.logprobs)
        bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
  } else if (present(b, "logprobs")) {  // the legacy completions field: an integer 0..5 (or a bool)
    if (b["logprobs"].is_boolean()) {
      c.logprobs = b["logprobs"].get<bool>();
    } else {
      c.top_logprobs = int(integer(b, "logprobs", 0, 20));
      c.logprobs = true;
    }
  }
  c.sampling.top_logprobs = c.logprobs ? c.top_logprobs : 0;
  c.sampling.logprobs = c.logprobs;
}

std::string text_of_content(const json& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_field(where, "'{}' must be a string or an array of content parts", where);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string pw = fmt::format("{}[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad_field(pw, "'{}' must be an object with a 'type'", pw);
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      bad_field(pw,
                "content part type '{}' is not supported: this model takes text only (use parts of "
                "type 'text')",
                type);
    if (!part.contains("text") || !part["text"].is_string())
      bad_field(pw, "'{}.text' must be a string", pw);
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

json normalise_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) bad_field(where, "'{}' must be an array", where);
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const json& c = calls[i];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      bad_field(w, "'{}' must be an object with a 'function'", w);
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad_field(w + ".function.name", "'{}.function.name' must be a non-empty string", w);
    json args = json::object();
    if (present(f, "arguments")) {
      const json& a = f["arguments"];
      if (a.is_string()) {
        const std::string s = a.get<std::string>();
        try {
          args = s.empty() ? json::object() : parse_json(s);
        } catch (const JsonParseError&) {
          args = nullptr;
        }
        if (!args.is_object())
          bad_field(w + ".function.arguments",
                    "'{}.function.arguments' must be a JSON object encoded as a string", w);
      } else if (a.is_object()) {
        args = a;
      } else {
        bad_field(w + ".function.arguments", "'{}.function.arguments' must be a string", w);
      }
    }
    json call = {{"type", "function"}, {"function", {{"name", f["name"]}, {"arguments", args}}}};
    if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
    out.push_back(call);
  }
  return out;
}

json normalise_messages(const json& b) {
  if (!b.contains("messages")) bad_field("messages", "'messages' is required");
  const json& ms = b["messages"];
  if (!ms.is_array()) bad_field("messages", "'messages' must be an array");
  if (ms.empty()) bad_field("messages", "'messages' must hold at least one message");
  json out = json::array();
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string w = fmt::format("messages[{}]", i);
    const json& m = ms[i];
    if (!m.is_object()) bad_field(w, "'{}' must be an object", w);
    if (!m.contains("role") || !m["role"].is_string())
      bad_field(w + ".role", "'{}.role' must be a string", w);
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad_field(w + ".role",
                "unknown role '{}' (expected system, developer, user, assistant or tool)", role);
    json n = {{"role", role}};
    if (!m.contains("content") && role != "assistant")
      bad_field(w + ".content", "'{}.content' is required", w);
    n["content"] =
        text_of_content(m.contains("content") ? m["content"] : json(nullptr), w + ".content");
    if (role == "assistant") {
      for (const char* key : {"reasoning_content", "reasoning"})
        if (present(m, key)) {
          if (!m[key].is_string()) bad_field(w + "." + key, "'{}.{}' must be a string", w, key);
          n["reasoning_content"] = m[key];
          break;
        }
      if (present(m, "tool_calls")) {
        json calls = normalise_tool_calls(m["tool_calls"], w + ".tool_calls");
        if (!calls.empty()) n["tool_calls"] = calls;
      }
    }
    if (role == "tool") {
      if (present(m, "tool_call_id") && m["tool_call_id"].is_string())
        n["tool_call_id"] = m["tool_call_id"];
    }
    if (present(m, "name") && m["name"].is_string()) n["name"] = m["name"];
    out.push_back(std::move(n));
  }
  return out;
}

json normalise_tools(const json& b) {
  json out = json::array();
  if (!present(b, "tools")) return out;
  const json& ts = b["tools"];
  if (!ts.is_array()) bad_field("tools", "'tools' must be an array");
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string w = fmt::format("tools[{}]", i);
    const json& t = ts[i];
    if (!t.is_object()) bad_field(w, "'{}' must be an object", w);
    if (t.contains("type") && t["type"] != "function")
      bad_field(w + ".type", "tool type {} is not supported (only 'function')", t["type"].dump());
    if (!t.contains("function") || !t["function"].is_object())
      bad_field(w + ".function", "'{}.function' must be an object", w);
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad_field(w + ".function.name", "'{}.function.name' must be a non-empty string", w);
    json fn = {{"name", f["name"]}};
    if (present(f, "description")) {
      if (!f["description"].is_string())
        bad_field(w + ".function.description", "'{}.function.description' must be a string", w);
      fn["description"] = f["description"];
    }
    if (present(f, "parameters")) {
      if (!f["parameters"].is_object())
        bad_field(w + ".function.parameters",
                  "'{}.function.parameters' must be a JSON schema object", w);
      fn["parameters"] = f["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

}  // namespace

std::string tool_instruction(const ChatRequest& r) {
  std::string s;
  if (r.tool_choice == ToolChoice::Required)
    s = "You must call at least one of the tools above in your answer.";
  if (r.tool_choice == ToolChoice::Named)
    s = "You must call the function `" + r.forced_tool + "` in your answer.";
  if (!r.parallel_tool_calls && !r.tools.empty())
    s += std::string(s.empty() ? "" : " ") + "Call at most one function.";
  return s;
}

ChatRequest parse_chat_request(const json& b, const SamplingParams& defaults) {
  ChatRequest r;
  parse_common(b, defaults, r.common, true);
  r.messages = normalise_messages(b);
  r.request_tools = normalise_tools(b);
  r.tools = r.request_tools;
  if (present(b, "parallel_tool_calls")) r.parallel_tool_calls = boolean(b, "parallel_tool_calls");
  if (present(b, "tool_choice")) {
    const json& tc = b["tool_choice"];
    if (tc.is_string()) {
      const std::string s = tc.get<std::string>();
      if (s == "auto")
        r.tool_choice = ToolChoice::Auto;
      else if (s == "none")
        r.tool_choice = ToolChoice::None;
      else if (s == "required")
        r.tool_choice = ToolChoice::Required;
      else
        bad_field("tool_choice",
                  "'tool_choice' must be none, auto, required or a function; got '{}'", s);
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      r.tool_choice = ToolChoice::Named;
      r.forced_tool = tc["function"]["name"].get<std::string>();
    } else {
      bad_field("tool_choice",
                "'tool_choice' must be none, auto, required or {{\"type\": \"function\", "
                "\"function\": {{\"name\": ...}}}}");
    }
  }
  if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) &&
      r.tools.empty())
    bad_field("tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
  if (r.tool_choice == ToolChoice::None) r.tools = json::array();
  if (r.tool_choice == ToolChoice::Named) {
    json only = json::array();
    for (const auto& t : r.tools)
      if (t["function"]["name"] == r.forced_tool) only.push_back(t);
    if (only.empty())
      bad_field("tool_choice", "'tool_choice' names '{}', which is not in 'tools'", r.forced_tool);
    r.tools = only;
  }
  if (present(b, "reasoning_effort")) {
    if (!b["reasoning_effort"].is_string())
      bad_field("reasoning_effort", "'reasoning_effort' must be a string");
    r.reasoning_effort = b["reasoning_effort"].get<std::string>();
  }
  if (present(b, "chat_template_kwargs")) {
    const json& k = b["chat_template_kwargs"];
    if (!k.is_object())
      bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto& [key, v] : k.items()) {
      if (key == "enable_thinking") {
        if (!v.is_boolean())
          bad_field("chat_template_kwargs.enable_thinking",
                    "'enable_thinking' must be true or false");
        r.chat.enable_thinking = v.get<bool>();
      } else if (key == "preserve_thinking") {
        if (!v.is_boolean())
          bad_field("chat_template_kwargs.preserve_thinking",
                    "'preserve_thinking' must be true or false");
        r.chat.preserve_thinking = v.get<bool>();
      } else if (key != "add_generation_prompt" && key != "tools" && key != "messages") {
        r.chat.extra[key] = v;
      }
    }
  }
  // reasoning_effort "none" turns thinking off unless chat_template_kwargs said otherwise.
  if (r.reasoning_effort == "none" && !r.chat.enable_thinking) r.chat.enable_thinking = false;
  if (std::string ins = tool_instruction(r); !ins.empty()) {
    if (!r.messages.empty() && r.messages[0]["role"] == "system") {
      std::string c = r.messages[0]["content"].get<std::string>();
      r.messages[0]["content"] = c.empty() ? ins : c + "\n\n" + ins;
    } else {
      r.messages.insert(r.messages.begin(), json{{"role", "system"}, {"content", ins}});
    }
  }
  return r;
}

CompletionRequest parse_completion_request(const json& b, const SamplingParams& defaults) {
  CompletionRequest r;
  parse_common(b, defaults, r.common, false);
  if (!b.contains("prompt")) bad_field("prompt", "'prompt' is required");
  json p = b["prompt"];
  // One prompt per request: a string, [string], [ids] or [[ids]].
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
    if (r.prompt.empty()) bad_field("prompt", "'prompt' is empty");
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    for (const auto& id : p) {
      if (!id.is_number_integer()) bad_field("prompt", "'prompt' token ids must be integers");
      const int64_t x = id.get<int64_t>();
      if (x < 0 || x > INT32_MAX)
        bad_field("prompt", "'prompt' holds token id {} (out of range)", x);
      r.prompt_ids.push_back(int32_t(x));
    }
  } else if (p.is_array() && p.size() > 1) {
    bad_field("prompt",
              "several prompts in one request are not supported: send one prompt per request");
  } else {
    bad_field("prompt", "'prompt' must be a non-empty string or an array of token ids");
  }
  if (present(b, "echo")) r.echo = boolean(b, "echo");
  return r;
}

}  // namespace lilac::server
