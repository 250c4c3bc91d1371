// Structured output for the OpenAI endpoints: `response_format` (json_object, json_schema) and
// forced tool calls (`tool_choice` required or a named function) become a grammar
// (grammar/json_schema.h) and a TokenConstraint the engine applies while sampling
// (docs/structured-output.md). Unsupported schema features are a 400 naming them.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/backend.h"
#include "tokenizer/tokenizer.h"

namespace lilac::server {

struct ChatRequest;

// The GBNF grammar a request's body asks for through `response_format`, or none ("text", or no
// field). Throws ApiError 400 on a malformed field or an unsupported schema feature.
std::optional<std::string> response_format_grammar(const nlohmann::ordered_json& body);

// The grammar of one tool call (or several, when `parallel`) in the model's XML format, the
// arguments matching each tool's `parameters` schema. `tools`: the normalised request tools
// ({"type": "function", "function": {...}}) the call may use, in the order the request
// declared them (ordered_json: parameters are written in declaration order). Throws ApiError 400.
std::string tool_call_grammar(const nlohmann::ordered_json& tools, bool parallel);

// The constraint for a chat request (response_format, or tool_choice required / named), or null.
// `thinking`: the prompt opens a reasoning block; the grammar starts after </think>.
std::shared_ptr<TokenConstraint> chat_constraint(const std::string& body, const ChatRequest& r,
                                                 const Tokenizer& tokenizer, bool thinking);
// The constraint for a completions request (response_format), or null.
std::shared_ptr<TokenConstraint> completion_constraint(const std::string& body,
                                                       const Tokenizer& tokenizer);

// A constraint for a GBNF grammar over the tokenizer's vocabulary (compiled grammars and their
// mask caches are kept and shared by requests asking for the same grammar). `open_after_think`:
// everything is allowed until </think> is taken.
std::shared_ptr<TokenConstraint> grammar_constraint(const std::string& gbnf,
                                                    const Tokenizer& tokenizer,
                                                    bool open_after_think);

}  // namespace lilac::server
