// Parsing and validation of the OpenAI request bodies (chat completions, completions) into what
// the engine and the chat template take. Every defect is an ApiError (400) naming the field;
// unknown fields are ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "model/sampling.h"

namespace lilac::server {

// Fields shared by /v1/chat/completions and /v1/completions.
struct CommonParams {
  std::string model;
  SamplingParams sampling;  // generation_config defaults, overridden by the request
  bool seed_given = false;
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  std::vector<std::string> stop;
  bool stream = false;
  bool ignore_eos = false;  // generate through eos ids (benchmarks: exactly max_tokens)
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
};

enum class ToolChoice { Auto, None, Required, Named };

struct ChatRequest {
  CommonParams common;
  nlohmann::json messages = nlohmann::json::array();  // normalised for the template
  nlohmann::json tools = nlohmann::json::array();     // what the prompt lists (after tool_choice)
  nlohmann::json request_tools = nlohmann::json::array();  // the tools the request declared
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string forced_tool;  // ToolChoice::Named
  bool parallel_tool_calls = true;
  ChatOptions chat;
  std::string reasoning_effort;  // accepted; recorded only
};

struct CompletionRequest {
  CommonParams common;
  std::string prompt;               // a text prompt, or
  std::vector<int32_t> prompt_ids;  // a prompt of token ids
  bool echo = false;
};

// `defaults`: the model's sampling defaults (generation_config.json).
ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults);
CompletionRequest parse_completion_request(const nlohmann::json& body,
                                           const SamplingParams& defaults);

// Parses a request body as JSON: 400 on malformed JSON (invalid UTF-8 included), nesting deeper
// than kMaxJsonDepth, a number outside double's range (the 400 names the field), or a non-object.
nlohmann::json parse_body(const std::string& body);

// body[key] as a bool: `dflt` when absent or null, a 400 naming the field when not a boolean.
bool optional_bool(const nlohmann::json& body, const char* key, bool dflt);

// The system-prompt instruction lilac adds for tool_choice required / named and
// parallel_tool_calls false (the prompt is how a tool call is requested; see docs/api.md).
std::string tool_instruction(const ChatRequest& r);

}  // namespace lilac::server
