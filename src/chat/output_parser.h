// Splits the model's streamed output (docs/model.md section 7) into reasoning, content and tool
// calls, one token's text at a time. Holds back text that may be the start of a tag; malformed or
// truncated XML degrades to content, never a crash.
//
// Output grammar (Qwen3.5/3.6):
//   [<think>] reasoning </think> content (<tool_call> call </tool_call> content)*
//   call := <function=NAME> (<parameter=KEY>\nVALUE\n</parameter>)* </function>
//         | {"name": NAME, "arguments": {...}}          (the JSON form older Qwen models use)
// What models really write is accepted too (docs/api.md, "Tool calls as the model really writes
// them"): a call inside the reasoning is a call, and the reasoning goes on after it until
// </think>; a call without its opening <tool_call> (<function=NAME>...</function>, optionally
// followed by </tool_call>) is a call. Without in_reasoning the output may still open with
// <think>. A tool call whose text is not a call degrades to text, raw, where it was written
// (reasoning or content); so does one left unclosed at finish() unless its </function> was seen,
// and so does a call to a function the tool list does not declare (when a list is given). A
// parameter given twice keeps its first value.
//
// Whitespace: reasoning and content are trimmed at both ends of each segment (the newlines the
// template puts around </think> and <tool_call> are not text), so trailing whitespace is held
// until more text follows. The parser also never splits a UTF-8 character across deltas.
//
// INTERFACE CONTRACT (the engine and server code against this; implementations may add to it).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace lilac {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialised
};

// One step of the output, in the order the model wrote it. Streaming consumers use these; the
// fields of ParsedDelta below hold the same text (and whole calls) for those that do not.
struct ParsedPiece {
  enum class Kind {
    Reasoning,      // text: reasoning text
    Content,        // text: content text
    CallStart,      // index, text: the function's name; the call's arguments follow
    CallArguments,  // index, text: JSON text that extends the arguments object
    CallEnd,        // index, text: the call's whole arguments (its fragments, joined)
  };
  Kind kind;
  int index = -1;
  std::string text;
};

// What one push() released. A tool call is released whole into tool_calls, once its
// </tool_call> (or </function> at the end) has been seen; index counts calls from 0 in this
// response. pieces holds everything in order; with stream_calls, a call's pieces come as it is
// written (see OutputParser), else all at once when it is complete.
struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<int, ToolCall>> tool_calls;
  std::vector<ParsedPiece> pieces;
  bool empty() const {
    return reasoning.empty() && content.empty() && tool_calls.empty() && pieces.empty();
  }
};

class OutputParser {
 public:
  // in_reasoning: the prompt ended inside <think> (thinking on), so output starts as reasoning.
  // tools: the request's tool list (JSON schemas type the parameter values; a value that does
  // not fit its schema keeps the raw string). An array, even empty, declares the callable names:
  // a call to any other is text. null: any name is a call (no list to check against).
  // stream_calls: release a call as it is written (docs/api.md, "Streamed tool calls"):
  // CallStart once <function=NAME> is complete and NAME is callable, one CallArguments per
  // parameter once its </parameter> is certainly its end ('{"city":"Paris"', then ',"days":3'),
  // the closing '}' (or '{}') and CallEnd once the call is complete. The fragments join to the
  // arguments a parser without stream_calls gives for the same output. A call that turns out not
  // to be one after its CallStart (malformed, or cut off by the end of the output) is closed with
  // '}' (its arguments: the parameters already sent) and also put into tool_calls; its markup
  // then follows as text, as without stream_calls. The JSON call form is released whole.
  OutputParser(bool in_reasoning, const nlohmann::json& tools, bool stream_calls = false);
  ParsedDelta push(std::string_view text);
  ParsedDelta finish();  // end of generation: release everything held back

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace lilac
