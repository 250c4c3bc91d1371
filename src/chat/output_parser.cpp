#include "chat/output_parser.h"

#include <algorithm>
#include <map>
#include <set>

namespace lilac {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  return rtrim(s.substr(std::min(s.size(), skip_ws(s, 0))));
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// The longest suffix of s that is a proper prefix of tag: text that may become the tag.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// Bytes at the end of s that start a UTF-8 sequence not yet complete.
size_t utf8_incomplete_tail(std::string_view s) {
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

// The JSON types a parameter schema allows ("string", "integer", ...); empty when unknown.
std::set<std::string> schema_types(const nlohmann::json& schema, int depth = 0) {
  std::set<std::string> out;
  if (!schema.is_object() || depth > 4) return out;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) out.insert(t->get<std::string>());
    if (t->is_array())
      for (const auto& x : *t)
        if (x.is_string()) out.insert(x.get<std::string>());
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto alts = schema.find(k); alts != schema.end() && alts->is_array())
      for (const auto& alt : *alts) {
        auto sub = schema_types(alt, depth + 1);
        if (sub.empty()) return {};  // an untyped alternative: anything goes
        out.insert(sub.begin(), sub.end());
      }
  return out;
}

bool json_kind_allowed(const ojson& v, const std::set<std::string>& types) {
  if (v.is_null()) return types.count("null");
  if (v.is_boolean()) return types.count("boolean");
  if (v.is_number_integer()) return types.count("integer") || types.count("number");
  if (v.is_number()) return types.count("number");
  if (v.is_object()) return types.count("object");
  if (v.is_array()) return types.count("array");
  return types.count("string");
}

// A parameter's text as the JSON value the schema asks for: strings raw; other types parsed as
// JSON (Python spellings True/False/None accepted, as the Qwen3.5 template renders them), falling
// back to the raw string when it does not parse or its type is not one the schema allows;
// without a schema, JSON when it parses, else the string.
ojson typed_value(const std::string& text, const std::set<std::string>& types) {
  bool only_string = types.count("string") &&
                     std::all_of(types.begin(), types.end(),
                                 [](const std::string& t) { return t == "string" || t == "null"; });
  if (only_string && !(types.count("null") && trim(text) == "null")) return text;
  std::string_view t = trim(text);
  ojson v = ojson::parse(t.begin(), t.end(), nullptr, false);
  if (v.is_discarded()) {
    if (t == "True" || t == "False")
      v = (t == "True");
    else if (t == "None")
      v = nullptr;
    else
      return text;
  }
  if (types.empty() || json_kind_allowed(v, types)) return v;
  return text;  // does not fit the schema (e.g. "3.5" for an integer): the raw string
}

// Characters of a function name as models write them (get_weather, mcp__fs__read, a.b-c).
bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':';
}

enum class CallStatus { Complete, InsideValue, Malformed };

struct ParsedCall {
  CallStatus status = CallStatus::Malformed;
  std::string name;
  ojson arguments = ojson::object();
};

}  // namespace

struct OutputParser::Impl {
  enum class Mode { Reasoning, Content, ToolCall };
  Mode mode;
  bool response_start = true;  // nothing but whitespace seen: a <think> here opens reasoning
  bool segment_start = true;   // at the start of a reasoning/content segment: whitespace is dropped
  std::string buf;             // text not released yet
  size_t call_scan = 0;        // ToolCall: where the search for the next </tool_call> resumes
  std::string ws_before_call;  // whitespace trimmed before <tool_call>: restored if it is no call
  Mode call_from = Mode::Content;  // ToolCall: the mode the call interrupted (and returns to)
  std::string
      rejoin_ws;  // reasoning split by a call: the whitespace before it, put back if more follows
  bool implicit_open = false;  // ToolCall: the call began at <function= (no <tool_call>)
  int next_index = 0;
  bool tools_declared = false;  // a tool list was given: calls to other names are text
  std::map<std::string, std::map<std::string, std::set<std::string>>>
      schemas;  // tool -> param -> types

  Impl(bool in_reasoning, const nlohmann::json& tools)
      : mode(in_reasoning ? Mode::Reasoning : Mode::Content) {
    if (!tools.is_array()) return;
    tools_declared = true;
    for (const auto& tool : tools) {
      if (!tool.is_object()) continue;
      const nlohmann::json& fn = tool.contains("function") ? tool["function"] : tool;
      if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
      auto& params = schemas[fn["name"].get<std::string>()];
      if (fn.contains("parameters") && fn["parameters"].is_object() &&
          fn["parameters"].contains("properties") && fn["parameters"]["properties"].is_object())
        for (const auto& [k, v] : fn["parameters"]["properties"].items())
          params[k] = schema_types(v);
    }
  }

  void emit(ParsedDelta& out, std::string_view text) {
    if (text.empty()) return;
    std::string& dst = mode == Mode::Reasoning ? out.reasoning : out.content;
    dst.append(rejoin_ws);
    rejoin_ws.clear();
    dst.append(text);
    segment_start = false;
  }

  bool declared(const std::string& name) const {
    return !tools_declared || schemas.count(name) > 0;
  }

  // Tool-call text that is not a call: text of the mode the call interrupted, verbatim.
  void emit_raw(ParsedDelta& out, std::string_view text) {
    mode = call_from;
    std::string& dst = mode == Mode::Reasoning ? out.reasoning : out.content;
    dst.append(rejoin_ws);
    rejoin_ws.clear();
    if (!segment_start) dst.append(ws_before_call);
    dst.append(text);
    ws_before_call.clear();
    segment_start = false;
  }

  void run(ParsedDelta& out, bool final) {
    while (mode == Mode::ToolCall ? step_call(out, final) : step_text(out, final)) {
    }
  }

  // One step in reasoning or content; false when it needs more text.
  bool step_text(ParsedDelta& out, bool final) {
    if (segment_start) buf.erase(0, skip_ws(buf, 0));
    if (buf.empty()) return false;
    if (response_start) {
      if (starts_with(buf, kThinkOpen)) {
        buf.erase(0, kThinkOpen.size());
        mode = Mode::Reasoning;
        response_start = false;
        segment_start = true;
        return true;
      }
      if (!final && starts_with(kThinkOpen, buf)) return false;
      response_start = false;
    }
    size_t call = std::min(buf.find(kCallOpen), buf.find(kFunctionOpen));
    size_t think = mode == Mode::Reasoning ? buf.find(kThinkClose) : std::string::npos;
    if (call != std::string::npos || think != std::string::npos) {
      size_t at = std::min(call, think);
      std::string_view before = std::string_view(buf).substr(0, at);
      emit(out, rtrim(before));
      ws_before_call = before.substr(rtrim(before).size());
      if (at == think) {
        buf.erase(0, at + kThinkClose.size());
        rejoin_ws.clear();
        mode = Mode::Content;
        segment_start = true;
      } else {
        buf.erase(0, at);
        call_from = mode;
        mode = Mode::ToolCall;
        implicit_open = !starts_with(buf, kCallOpen);
        call_scan = implicit_open ? 0 : kCallOpen.size();
      }
      return true;
    }
    if (final) {
      emit(out, rtrim(buf));
      buf.clear();
      return false;
    }
    // Release all but what may still become a tag, the whitespace before it (trimmed if a tag
    // follows) and an incomplete UTF-8 character.
    size_t hold = std::max(partial_suffix(buf, kCallOpen), partial_suffix(buf, kFunctionOpen));
    if (mode == Mode::Reasoning) hold = std::max(hold, partial_suffix(buf, kThinkClose));
    size_t cut = buf.size() - hold;
    while (cut > 0 && is_ws(buf[cut - 1])) --cut;
    cut -= utf8_incomplete_tail(std::string_view(buf).substr(0, cut));
    emit(out, std::string_view(buf).substr(0, cut));
    buf.erase(0, cut);
    return false;
  }

  // Whether `rest` (text after <tool_call> and whitespace, or at <function=) can still be the
  // start of a call: <function=NAME> with a declared NAME, then <parameter= or </function>; or
  // (after <tool_call> only) JSON. False as soon as it cannot, so prose that mentions a tag is
  // released at once instead of at the end of the output.
  bool may_be_call(std::string_view rest) const {
    if (!starts_with(rest, kFunctionOpen)) {
      if (starts_with(kFunctionOpen, rest)) return true;
      return !implicit_open && rest[0] == '{';
    }
    size_t i = kFunctionOpen.size();
    while (i < rest.size() && name_char(rest[i])) ++i;
    if (i == rest.size()) return true;
    if (rest[i] != '>' || i == kFunctionOpen.size()) return false;
    if (!declared(std::string(rest.substr(kFunctionOpen.size(), i - kFunctionOpen.size()))))
      return false;
    std::string_view body = rest.substr(skip_ws(rest, i + 1));
    for (std::string_view tag : {kParamOpen, kFunctionClose})
      if (starts_with(body, tag) || starts_with(tag, body)) return true;
    return false;
  }

  // One step inside a call; buf starts with <tool_call> (or with <function= when the model left
  // out the opening tag: the call then ends at </function>, and a </tool_call> right after it
  // belongs to it). False when it needs more text.
  bool step_call(ParsedDelta& out, bool final) {
    const size_t open = implicit_open ? 0 : kCallOpen.size();
    const std::string_view tag = implicit_open ? kFunctionOpen : kCallOpen;
    size_t b = skip_ws(buf, open);
    if (b < buf.size() && !may_be_call(std::string_view(buf).substr(b))) {
      emit_raw(out, tag);
      buf.erase(0, tag.size());
      return true;
    }
    const std::string_view close = implicit_open ? kFunctionClose : kCallClose;
    for (size_t e = buf.find(close, call_scan); e != std::string::npos;
         e = buf.find(close, e + 1)) {
      const size_t block_end = implicit_open ? e + close.size() : e;
      ParsedCall c = parse_call(std::string_view(buf).substr(open, block_end - open), true);
      if (c.status == CallStatus::InsideValue) continue;  // this closing tag is part of a value
      size_t end = e + close.size();
      if (implicit_open) {
        const size_t k = skip_ws(buf, end);
        std::string_view after = std::string_view(buf).substr(k);
        if (!final && after.size() < kCallClose.size() && starts_with(kCallClose, after)) {
          call_scan = e;  // a </tool_call> may follow: wait for it
          return false;
        }
        if (starts_with(after, kCallClose)) end = k + kCallClose.size();
      }
      if (c.status == CallStatus::Complete && declared(c.name)) {
        release(out, c);
      } else {
        emit_raw(out, std::string_view(buf).substr(0, end));
      }
      buf.erase(0, end);
      return true;
    }
    call_scan = std::max(open, buf.size() - std::min(buf.size(), close.size() - 1));
    if (!final) return false;
    ParsedCall c = parse_call(std::string_view(buf).substr(open), false);
    if (c.status == CallStatus::Complete && declared(c.name))
      release(out, c);
    else
      emit_raw(out, rtrim(buf));  // the end of the output: trimmed like any content
    buf.clear();
    return false;
  }

  void release(ParsedDelta& out, const ParsedCall& c) {
    // Reasoning goes on after a call inside it: the text after the call is joined to the text
    // before it with the whitespace that preceded the call (content drops it, as before).
    if (call_from == Mode::Reasoning && !segment_start) rejoin_ws = ws_before_call;
    ws_before_call.clear();
    out.tool_calls.emplace_back(
        next_index++, ToolCall{c.name, c.arguments.dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace)});
    mode = call_from;  // a call inside the thinking: the thinking goes on until </think>
    segment_start = true;
  }

  // The text between <tool_call> and </tool_call> (closed), or up to the end of the output.
  ParsedCall parse_call(std::string_view block, bool closed) const {
    std::string_view t = trim(block);
    if (!t.empty() && t[0] == '{') return parse_json_call(t, closed);
    ParsedCall c;
    size_t i = skip_ws(block, 0);
    if (!starts_with(block.substr(i), kFunctionOpen)) return c;
    i += kFunctionOpen.size();
    size_t gt = block.find('>', i);
    if (gt == std::string_view::npos) return c;
    c.name = std::string(trim(block.substr(i, gt - i)));
    if (c.name.empty() || c.name.find_first_of("<\n") != std::string::npos) return c;
    auto tool = schemas.find(c.name);
    i = gt + 1;
    while (true) {
      i = skip_ws(block, i);
      if (i == block.size()) {
        // No </function>: accepted before a real </tool_call>, not at the end of the output.
        c.status = closed ? CallStatus::Complete : CallStatus::Malformed;
        return c;
      }
      std::string_view rest = block.substr(i);
      if (starts_with(rest, kFunctionClose)) {
        c.status = skip_ws(block, i + kFunctionClose.size()) == block.size()
                       ? CallStatus::Complete
                       : CallStatus::Malformed;
        return c;
      }
      if (!starts_with(rest, kParamOpen)) return c;
      i += kParamOpen.size();
      gt = block.find('>', i);
      if (gt == std::string_view::npos) return c;
      std::string key(trim(block.substr(i, gt - i)));
      if (key.empty() || key.find_first_of("<\n") != std::string::npos) return c;
      i = gt + 1;
      // The value ends at the first </parameter> followed by another parameter, </function> or
      // the end of the block: a </parameter> inside the value (code, docs) is not followed so.
      size_t end = std::string_view::npos;
      for (size_t q = block.find(kParamClose, i); q != std::string_view::npos;
           q = block.find(kParamClose, q + 1)) {
        std::string_view after = block.substr(skip_ws(block, q + kParamClose.size()));
        if (after.empty() || starts_with(after, kParamOpen) || starts_with(after, kFunctionClose)) {
          end = q;
          break;
        }
      }
      if (end == std::string_view::npos) {
        c.status = closed ? CallStatus::InsideValue : CallStatus::Malformed;
        return c;
      }
      std::string_view value = block.substr(i, end - i);
      if (starts_with(value, "\n")) value.remove_prefix(1);
      if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
      std::set<std::string> types;
      if (tool != schemas.end())
        if (auto p = tool->second.find(key); p != tool->second.end()) types = p->second;
      c.arguments[key] = typed_value(std::string(value), types);
      i = end + kParamClose.size();
    }
  }

  static ParsedCall parse_json_call(std::string_view t, bool closed) {
    ParsedCall c;
    ojson j;
    try {
      j = ojson::parse(t.begin(), t.end());
    } catch (const nlohmann::json::parse_error& e) {
      // Cut short inside a string: the </tool_call> belongs to the JSON.
      if (closed && e.byte >= t.size()) c.status = CallStatus::InsideValue;
      return c;
    }
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return c;
    c.name = j["name"].get<std::string>();
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    if (j.contains(key)) {
      ojson args = j[key];
      if (args.is_string()) {
        const std::string& s = args.get_ref<const std::string&>();
        args = ojson::parse(s, nullptr, false);
      }
      if (!args.is_object()) return c;
      c.arguments = std::move(args);
    }
    c.status = CallStatus::Complete;
    return c;
  }
};

OutputParser::OutputParser(bool in_reasoning, const nlohmann::json& tools)
    : impl_(std::make_shared<Impl>(in_reasoning, tools)) {}

ParsedDelta OutputParser::push(std::string_view text) {
  ParsedDelta out;
  impl_->buf.append(text);
  impl_->run(out, false);
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  impl_->run(out, true);
  return out;
}

}  // namespace lilac
