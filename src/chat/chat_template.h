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
  nlohmann::json extra = nlohmann::json::object();  // other chat_template_kwargs, passed through
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  // Parses a template; throws lilac::Error naming `source` and the line on a syntax error.
  static std::unique_ptr<ChatTemplate> from_string(const std::string& source_text, const std::string& source);
  // The model directory's own template, else the built-in copy of the Qwen3.6 template.
  static std::unique_ptr<ChatTemplate> from_model_dir(const std::string& dir);
  static std::unique_ptr<ChatTemplate> builtin_qwen36();

  // Renders OpenAI-style messages (and optional tool JSON schemas). Assistant tool_calls whose
  // arguments is a JSON string are parsed first; reasoning_content / reasoning are accepted.
  // Errors the template raises (raise_exception) and bad input come out as lilac::Error.
  virtual std::string render(const nlohmann::json& messages, const nlohmann::json& tools,
                             const ChatOptions& options) const = 0;
};

}  // namespace lilac
