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

std::string json_text(const ojson& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The JSON text that adds one parameter to an arguments object: '{"key":value' for the first,
// ',"key":value' after it. The fragments and the closing '}' ('{}' without parameters) are the
// arguments text, streamed or not.
std::string param_fragment(bool first, const std::string& key, const ojson& value) {
  return (first ? "{" : ",") + json_text(ojson(key)) + ":" + json_text(value);
}

struct ParsedCall {
  CallStatus status = CallStatus::Malformed;
  std::string name;
  bool json_form = false;
  ojson arguments = ojson::object();                  // the JSON form's arguments
  std::vector<std::pair<std::string, ojson>> params;  // the XML form's, in order (first wins)

  std::vector<std::string> fragments() const {
    if (json_form) return {json_text(arguments)};
    std::vector<std::string> out;
    for (const auto& [k, v] : params) out.push_back(param_fragment(out.empty(), k, v));
    out.push_back(params.empty() ? "{}" : "}");
    return out;
  }
  std::string arguments_text() const {
    std::string s;
    for (const auto& f : fragments()) s += f;
    return s;
  }
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
  bool stream_calls = false;  // release calls as they are written (OutputParser's constructor)
  // The call being streamed (stream_calls): offsets are into the call's block, buf[open...).
  struct StreamedCall {
    bool started = false;
    int index = -1;
    std::string name;
    std::vector<std::string> keys;  // parameters sent, in order
    std::string sent;               // the argument fragments sent, joined
    size_t resume = 0;              // where the next parameter (or </function>) starts
    size_t value_scan = 0;  // where the search for the open parameter's </parameter> resumes
  } streamed;
  bool tools_declared = false;  // a tool list was given: calls to other names are text
  std::map<std::string, std::map<std::string, std::set<std::string>>>
      schemas;  // tool -> param -> types

  Impl(bool in_reasoning, const nlohmann::json& tools, bool stream)
      : mode(in_reasoning ? Mode::Reasoning : Mode::Content), stream_calls(stream) {
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

  // Text of the current mode (reasoning or content) into both of out's views.
  void put_text(ParsedDelta& out, std::string_view text) {
    if (text.empty()) return;
    const bool reasoning = mode == Mode::Reasoning;
    (reasoning ? out.reasoning : out.content).append(text);
    const auto kind = reasoning ? ParsedPiece::Kind::Reasoning : ParsedPiece::Kind::Content;
    if (out.pieces.empty() || out.pieces.back().kind != kind) out.pieces.push_back({kind, -1, ""});
    out.pieces.back().text.append(text);
  }

  void emit(ParsedDelta& out, std::string_view text) {
    if (text.empty()) return;
    put_text(out, rejoin_ws);
    rejoin_ws.clear();
    put_text(out, text);
    segment_start = false;
  }

  bool declared(const std::string& name) const {
    return !tools_declared || schemas.count(name) > 0;
  }

  // Tool-call text that is not a call: text of the mode the call interrupted, verbatim.
  // A call already streamed (CallStart sent) that turns out not to be one is closed with the
  // parameters sent, so the client's arguments stay a JSON object; its text follows as text.
  void emit_raw(ParsedDelta& out, std::string_view text) {
    if (streamed.started) finish_streamed(out, {streamed.keys.empty() ? "{}" : "}"});
    mode = call_from;
    put_text(out, rejoin_ws);
    rejoin_ws.clear();
    if (!segment_start) put_text(out, ws_before_call);
    put_text(out, text);
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
    if (!final) {
      if (stream_calls) advance_stream(out, open);
      return false;
    }
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
    std::vector<std::string> fragments = c.fragments();
    if (streamed.started) {
      // The fragments sent are the first ones of the whole call's (the same parse, see
      // advance_stream); the rest follow, one per parameter, then the '}'.
      const size_t k = streamed.keys.size();
      std::string sent;
      for (size_t f = 0; f < k && f < fragments.size(); ++f) sent += fragments[f];
      if (c.json_form || k >= fragments.size() || sent != streamed.sent)
        fragments = {k == 0 ? "{}" : "}"};  // not expected; keeps the streamed JSON an object
      else
        fragments.erase(fragments.begin(), fragments.begin() + long(k));
      finish_streamed(out, fragments);
    } else {
      const int index = next_index++;
      const std::string args = c.arguments_text();
      out.pieces.push_back({ParsedPiece::Kind::CallStart, index, c.name});
      out.pieces.push_back({ParsedPiece::Kind::CallArguments, index, args});
      out.pieces.push_back({ParsedPiece::Kind::CallEnd, index, args});
      out.tool_calls.emplace_back(index, ToolCall{c.name, args});
    }
    mode = call_from;  // a call inside the thinking: the thinking goes on until </think>
    segment_start = true;
  }

  // The streamed call's last fragments, its CallEnd and its whole form in tool_calls.
  void finish_streamed(ParsedDelta& out, const std::vector<std::string>& rest) {
    for (const auto& f : rest) {
      streamed.sent += f;
      out.pieces.push_back({ParsedPiece::Kind::CallArguments, streamed.index, f});
    }
    out.pieces.push_back({ParsedPiece::Kind::CallEnd, streamed.index, streamed.sent});
    out.tool_calls.emplace_back(streamed.index, ToolCall{streamed.name, streamed.sent});
    streamed = StreamedCall{};
  }

  // Whether the text after a </parameter> makes it the end of its value (parse_call's rule:
  // another parameter, </function>, or the end of the block, which is </tool_call> here), and
  // whether the text so far may still become such text.
  bool ends_value(std::string_view after) const {
    return starts_with(after, kParamOpen) || starts_with(after, kFunctionClose) ||
           (!implicit_open && starts_with(after, kCallClose));
  }
  bool may_end_value(std::string_view after) const {
    return starts_with(kParamOpen, after) || starts_with(kFunctionClose, after) ||
           (!implicit_open && starts_with(kCallClose, after));
  }

  // stream_calls: sends what the call's text so far decides, and nothing that the rest of it
  // could change: CallStart once <function=NAME> is complete (may_be_call has accepted it: the
  // name is declared), then each parameter whose end is certain. The rules are parse_call's, so
  // the fragments are the first of the ones the whole call gives; whatever does not follow
  // them (a malformed call) is left to the whole call, at its end. Resumes where it stopped.
  void advance_stream(ParsedDelta& out, size_t open) {
    const std::string_view block = std::string_view(buf).substr(open);
    StreamedCall& s = streamed;
    if (!s.started) {
      const size_t i = skip_ws(block, 0);
      if (!starts_with(block.substr(i), kFunctionOpen)) return;  // the JSON form, or too early
      const size_t name_at = i + kFunctionOpen.size();
      const size_t gt = block.find('>', name_at);
      if (gt == std::string_view::npos) return;
      s.started = true;
      s.index = next_index++;
      s.name = std::string(block.substr(name_at, gt - name_at));
      s.resume = gt + 1;
      out.pieces.push_back({ParsedPiece::Kind::CallStart, s.index, s.name});
    }
    while (true) {
      const size_t i = skip_ws(block, s.resume);
      if (!starts_with(block.substr(i), kParamOpen)) return;
      const size_t key_at = i + kParamOpen.size();
      const size_t gt = block.find('>', key_at);
      if (gt == std::string_view::npos) return;
      std::string key(trim(block.substr(key_at, gt - key_at)));
      if (key.empty() || key.find_first_of("<\n") != std::string::npos) return;
      const size_t value_at = gt + 1;
      size_t end = std::string_view::npos;
      for (size_t q = block.find(kParamClose, std::max(value_at, s.value_scan));
           q != std::string_view::npos; q = block.find(kParamClose, q + 1)) {
        std::string_view after = block.substr(skip_ws(block, q + kParamClose.size()));
        if (ends_value(after)) {
          end = q;
          break;
        }
        if (may_end_value(after)) {  // undecided until more text comes
          s.value_scan = q;
          return;
        }
      }
      if (end == std::string_view::npos) {
        s.value_scan =
            std::max(value_at, block.size() - std::min(block.size(), kParamClose.size() - 1));
        return;
      }
      if (std::find(s.keys.begin(), s.keys.end(), key) == s.keys.end()) {
        std::string f = param_fragment(
            s.keys.empty(), key, param_value(s.name, key, block.substr(value_at, end - value_at)));
        s.keys.push_back(key);
        s.sent += f;
        out.pieces.push_back({ParsedPiece::Kind::CallArguments, s.index, std::move(f)});
      }
      s.resume = end + kParamClose.size();
      s.value_scan = 0;
    }
  }

  // A parameter's value text (between <parameter=KEY> and its </parameter>, one newline each
  // side dropped) as JSON typed by the tool's schema.
  ojson param_value(const std::string& tool, const std::string& key, std::string_view value) const {
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    std::set<std::string> types;
    if (auto t = schemas.find(tool); t != schemas.end())
      if (auto p = t->second.find(key); p != t->second.end()) types = p->second;
    return typed_value(std::string(value), types);
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
      const bool repeated = std::any_of(c.params.begin(), c.params.end(),
                                        [&](const auto& p) { return p.first == key; });
      if (!repeated) c.params.emplace_back(key, param_value(c.name, key, block.substr(i, end - i)));
      i = end + kParamClose.size();
    }
  }

  static ParsedCall parse_json_call(std::string_view t, bool closed) {
    ParsedCall c;
    c.json_form = true;
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

OutputParser::OutputParser(bool in_reasoning, const nlohmann::json& tools, bool stream_calls)
    : impl_(std::make_shared<Impl>(in_reasoning, tools, stream_calls)) {}

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
