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
// back to the raw string; without a schema, JSON when it parses, else the string.
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
  if (types.empty() || !types.count("string") || json_kind_allowed(v, types)) return v;
  return text;
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
  int next_index = 0;
  std::map<std::string, std::map<std::string, std::set<std::string>>>
      schemas;  // tool -> param -> types

  Impl(bool in_reasoning, const nlohmann::json& tools)
      : mode(in_reasoning ? Mode::Reasoning : Mode::Content) {
    if (!tools.is_array()) return;
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
    (mode == Mode::Reasoning ? out.reasoning : out.content).append(text);
    segment_start = false;
  }

  // Tool-call text that is not a call: content, verbatim.
  void emit_raw(ParsedDelta& out, std::string_view text) {
    mode = Mode::Content;
    if (!segment_start) out.content.append(ws_before_call);
    out.content.append(text);
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
    size_t call = buf.find(kCallOpen);
    size_t think = mode == Mode::Reasoning ? buf.find(kThinkClose) : std::string::npos;
    if (call != std::string::npos || think != std::string::npos) {
      size_t at = std::min(call, think);
      std::string_view before = std::string_view(buf).substr(0, at);
      emit(out, rtrim(before));
      ws_before_call = before.substr(rtrim(before).size());
      if (at == think) {
        buf.erase(0, at + kThinkClose.size());
        mode = Mode::Content;
        segment_start = true;
      } else {
        buf.erase(0, at);
        mode = Mode::ToolCall;
        call_scan = kCallOpen.size();
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
    size_t hold = partial_suffix(buf, kCallOpen);
    if (mode == Mode::Reasoning) hold = std::max(hold, partial_suffix(buf, kThinkClose));
    size_t cut = buf.size() - hold;
    while (cut > 0 && is_ws(buf[cut - 1])) --cut;
    cut -= utf8_incomplete_tail(std::string_view(buf).substr(0, cut));
    emit(out, std::string_view(buf).substr(0, cut));
    buf.erase(0, cut);
    return false;
  }

  // One step inside <tool_call>; buf starts with the tag. False when it needs more text.
  bool step_call(ParsedDelta& out, bool final) {
    // Not a call at all (prose that mentions the tag): degrade now rather than at the end.
    size_t b = skip_ws(buf, kCallOpen.size());
    if (b < buf.size()) {
      std::string_view rest = std::string_view(buf).substr(b);
      bool xml = starts_with(rest, kFunctionOpen) || starts_with(kFunctionOpen, rest);
      if (!xml && rest[0] != '{') {
        emit_raw(out, kCallOpen);
        buf.erase(0, kCallOpen.size());
        return true;
      }
    }
    for (size_t e = buf.find(kCallClose, call_scan); e != std::string::npos;
         e = buf.find(kCallClose, e + 1)) {
      ParsedCall c =
          parse_call(std::string_view(buf).substr(kCallOpen.size(), e - kCallOpen.size()), true);
      if (c.status == CallStatus::InsideValue) continue;  // this </tool_call> is part of a value
      size_t end = e + kCallClose.size();
      if (c.status == CallStatus::Complete) {
        release(out, c);
      } else {
        emit_raw(out, std::string_view(buf).substr(0, end));
      }
      buf.erase(0, end);
      return true;
    }
    call_scan =
        std::max(kCallOpen.size(), buf.size() - std::min(buf.size(), kCallClose.size() - 1));
    if (!final) return false;
    ParsedCall c = parse_call(std::string_view(buf).substr(kCallOpen.size()), false);
    if (c.status == CallStatus::Complete)
      release(out, c);
    else
      emit_raw(out, rtrim(buf));  // the end of the output: trimmed like any content
    buf.clear();
    return false;
  }

  void release(ParsedDelta& out, const ParsedCall& c) {
    ws_before_call.clear();
    out.tool_calls.emplace_back(
        next_index++, ToolCall{c.name, c.arguments.dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace)});
    mode = Mode::Content;
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
