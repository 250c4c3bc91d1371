// Chat templates: the Jinja template a checkpoint ships (chat_template.jinja, or chat_template in
// tokenizer_config.json), rendered as HF transformers' apply_chat_template does, byte for byte.
//
// INTERFACE CONTRACT (the engine and server code against this; implementations may add to it).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace lilac {

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: the template's default (thinking on)
  bool preserve_thinking = false;
  // Other chat_template_kwargs, passed through as template variables (ordered: tojson keeps order).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  // Parses a template; throws lilac::Error naming `source` and the line on a syntax error.
  static std::unique_ptr<ChatTemplate> from_string(const std::string& source_text,
                                                   const std::string& source);
  // The model directory's own template, else the built-in copy of the Qwen3.6 template:
  // DIR/chat_template.jinja, else `chat_template` in DIR/tokenizer_config.json (a string, or
  // HF's list of {name, template}: the one named "default"). Special tokens (bos_token,
  // eos_token, ...) in tokenizer_config.json become template variables, as in transformers.
  static std::unique_ptr<ChatTemplate> from_model_dir(const std::string& dir);
  static std::unique_ptr<ChatTemplate> builtin_qwen36();

  // Renders OpenAI-style messages (and optional tool JSON schemas). Assistant tool_calls whose
  // arguments is a JSON string are parsed first; reasoning_content / reasoning are accepted.
  // Errors the template raises (raise_exception) and bad input come out as lilac::Error.
  // nlohmann::json sorts object keys, so `tojson` in the template (the tool list) prints them
  // sorted; prefer the ordered_json overload, which keeps the client's order as transformers does.
  virtual std::string render(const nlohmann::json& messages, const nlohmann::json& tools,
                             const ChatOptions& options) const;

  // The same, keeping the key order of the request: parse request bodies as ordered_json.
  // messages: [{role: system|developer|user|assistant|tool, content: string | [{type: "text",
  // text}] | null, reasoning_content?, reasoning?, tool_calls?: [{id, type, function: {name,
  // arguments: object | JSON string}}], tool_call_id?}]; developer is rendered as system.
  // tools: null or an array of {type: "function", function: {name, description, parameters}}.
  virtual std::string render(const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools,
                             const ChatOptions& options) const = 0;

  // Where the template came from (a file path, "tokenizer_config.json", or "builtin").
  virtual const std::string& source() const = 0;
};

}  // namespace lilac
