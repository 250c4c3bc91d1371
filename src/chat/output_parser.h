// Splits the model's streamed output into reasoning, content and tool calls (MODEL.md section 6),
// one token's text at a time. Holds back text that may be the start of a tag; malformed or
// truncated XML degrades to content, never a crash.
//
// INTERFACE CONTRACT (the engine and server code against this; implementations may add to it).
#pragma once

#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lilac {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialised
};

// What one push() released. A tool call is released whole, once its </tool_call> (or
// </function> at the end) has been seen; index counts calls from 0 in this response.
struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<int, ToolCall>> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  // in_reasoning: the prompt ended inside <think> (thinking on), so output starts as reasoning.
  // tools: the request's tool list (JSON schemas type the parameter values), may be null/empty.
  OutputParser(bool in_reasoning, const nlohmann::json& tools);
  ParsedDelta push(std::string_view text);
  ParsedDelta finish();  // end of generation: release everything held back

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace lilac
