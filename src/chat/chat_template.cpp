// ChatTemplate: OpenAI-style requests -> the variables transformers' apply_chat_template passes
// (messages, tools, add_generation_prompt, chat_template_kwargs, special tokens) -> the Jinja
// engine. Request validation lives here so that a bad request fails with a message naming the
// field, before the template sees it.
#include "chat/chat_template.h"

#include <filesystem>

#include "chat/jinja.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace lilac {

extern const std::string_view kBuiltinQwen36Template;  // generated from the .jinja at build time

namespace {

using ojson = nlohmann::ordered_json;

// A regular file only: a FIFO or /dev/zero as a template file is an error, not a hang.
std::string read_file(const std::filesystem::path& p) {
  return read_small_file(p.string());
}

// nlohmann's copy and conversion recurse, so a request nested absurdly deep would overflow the
// stack before the engine's own bound (jinja::kMaxNesting) is reached: measure it first, without
// recursion.
template <typename Json>
void check_depth(const Json& j, const char* what) {
  std::vector<std::pair<const Json*, int>> todo{{&j, 1}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (depth > jinja::kMaxNesting)
      fail("{} nested more than {} levels deep", what, jinja::kMaxNesting);
    if (v->is_structured())
      for (const auto& child : *v) todo.emplace_back(&child, depth + 1);
  }
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

void normalise_tool_call(ojson& call, size_t i, size_t k) {
  if (!call.is_object()) fail("messages[{}].tool_calls[{}] must be an object", i, k);
  bool wrapped = call.contains("function");
  ojson& fn = wrapped ? call["function"] : call;
  std::string where =
      fmt::format("messages[{}].tool_calls[{}]{}", i, k, wrapped ? ".function" : "");
  if (!fn.is_object()) fail("{} must be an object", where);
  if (!fn.contains("name") || !fn["name"].is_string()) fail("{}.name must be a string", where);
  if (!fn.contains("arguments") || !fn["arguments"].is_string()) {
    if (fn.contains("arguments") && !fn["arguments"].is_object() && !fn["arguments"].is_null())
      fail("{}.arguments must be a JSON object or a string holding one", where);
    return;
  }
  const std::string& text = fn["arguments"].get_ref<const std::string&>();
  // Clients send "" for a call without arguments.
  if (blank(text)) {
    fn["arguments"] = ojson::object();
    return;
  }
  ojson parsed;
  try {
    parsed = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}.arguments is not valid JSON: {}", where, e.what());
  }
  if (!parsed.is_object())
    fail("{}.arguments must be a JSON object, got {}", where, parsed.type_name());
  fn["arguments"] = std::move(parsed);
}

ojson normalise_messages(const ojson& messages) {
  if (!messages.is_array()) fail("messages must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson msg = messages[i];
    if (!msg.is_object()) fail("messages[{}] must be an object", i);
    if (!msg.contains("role") || !msg["role"].is_string())
      fail("messages[{}].role must be a string", i);
    if (msg["role"] == "developer") msg["role"] = "system";
    if (msg.contains("content")) {
      const ojson& c = msg["content"];
      if (c.is_array()) {
        for (size_t k = 0; k < c.size(); ++k) {
          const ojson& part = c[k];
          if (!part.is_object()) fail("messages[{}].content[{}] must be an object", i, k);
          std::string type = part.contains("type") && part["type"].is_string()
                                 ? part["type"].get<std::string>()
                                 : "";
          if (type != "text")
            fail(
                "messages[{}].content[{}]: unsupported content part type '{}' (only text is "
                "supported)",
                i, k, type);
          if (!part.contains("text") || !part["text"].is_string())
            fail("messages[{}].content[{}]: a text part needs a string 'text'", i, k);
        }
      } else if (!c.is_string() && !c.is_null()) {
        fail("messages[{}].content must be a string, an array of content parts or null", i);
      }
    }
    if (!msg.contains("reasoning_content") && msg.contains("reasoning") &&
        msg["reasoning"].is_string())
      msg["reasoning_content"] = msg["reasoning"];
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      ojson& calls = msg["tool_calls"];
      if (!calls.is_array()) fail("messages[{}].tool_calls must be an array", i);
      for (size_t k = 0; k < calls.size(); ++k) normalise_tool_call(calls[k], i, k);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// A special token in tokenizer_config.json: a string, or an AddedToken {"content": ...}.
std::optional<std::string> token_text(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

class JinjaChatTemplate final : public ChatTemplate {
 public:
  JinjaChatTemplate(const std::string& text, std::string source, jinja::Dict special)
      : source_(std::move(source)), tmpl_(text, source_), special_(std::move(special)) {}

  std::string render(const ojson& messages, const ojson& tools,
                     const ChatOptions& options) const override {
    check_depth(messages, "messages");
    check_depth(tools, "tools");
    check_depth(options.extra, "chat_template_kwargs");
    if (!tools.is_null() && !tools.is_array()) fail("tools must be an array");
    if (tools.is_array())
      for (size_t k = 0; k < tools.size(); ++k)
        if (!tools[k].is_object()) fail("tools[{}] must be an object", k);
    if (!options.extra.is_null() && !options.extra.is_object())
      fail("chat_template_kwargs must be an object");

    // Later entries win, as in transformers: special tokens, then kwargs, then the fixed names.
    jinja::Dict ctx = special_;
    if (options.extra.is_object())
      for (auto it = options.extra.begin(); it != options.extra.end(); ++it)
        ctx.set(jinja::Value(it.key()), jinja::Value::from_json(it.value()));
    ctx.set(jinja::Value("messages"), jinja::Value::from_json(normalise_messages(messages)));
    ctx.set(jinja::Value("tools"), jinja::Value::from_json(tools));
    ctx.set(jinja::Value("add_generation_prompt"), jinja::Value(options.add_generation_prompt));
    if (options.enable_thinking)
      ctx.set(jinja::Value("enable_thinking"), jinja::Value(*options.enable_thinking));
    if (options.preserve_thinking) ctx.set(jinja::Value("preserve_thinking"), jinja::Value(true));
    return tmpl_.render(jinja::Value::dict(std::move(ctx)));
  }

  const std::string& source() const override { return source_; }

 private:
  std::string source_;
  jinja::Template tmpl_;
  jinja::Dict special_;
};

jinja::Dict qwen36_special_tokens() {
  jinja::Dict d;
  d.set(jinja::Value("eos_token"), jinja::Value("<|im_end|>"));
  d.set(jinja::Value("pad_token"), jinja::Value("<|endoftext|>"));
  return d;
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 const ChatOptions& options) const {
  check_depth(messages, "messages");
  check_depth(tools, "tools");
  return render(ojson(messages), ojson(tools), options);
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_string(const std::string& source_text,
                                                        const std::string& source) {
  return std::make_unique<JinjaChatTemplate>(source_text, source, jinja::Dict{});
}

std::unique_ptr<ChatTemplate> ChatTemplate::builtin_qwen36() {
  return std::make_unique<JinjaChatTemplate>(std::string(kBuiltinQwen36Template),
                                             "builtin Qwen3.6 chat template",
                                             qwen36_special_tokens());
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  ojson config;
  jinja::Dict special;
  if (fs::exists(config_path)) {
    try {
      config = ojson::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", config_path.string(), e.what());
    }
    if (!config.is_object()) fail("{}: expected a JSON object", config_path.string());
    for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                             "cls_token", "mask_token"})
      if (config.contains(name))
        if (auto t = token_text(config[name])) special.set(jinja::Value(name), jinja::Value(*t));
  }
  fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_path))
    return std::make_unique<JinjaChatTemplate>(read_file(jinja_path), jinja_path.string(),
                                               std::move(special));
  if (config.is_object() && config.contains("chat_template")) {
    const ojson& ct = config["chat_template"];
    std::string where = config_path.string() + " chat_template";
    if (ct.is_string())
      return std::make_unique<JinjaChatTemplate>(ct.get<std::string>(), where, std::move(special));
    if (ct.is_array()) {
      for (const ojson& entry : ct)
        if (entry.is_object() && entry.value("name", "") == "default" &&
            entry.contains("template") && entry["template"].is_string())
          return std::make_unique<JinjaChatTemplate>(entry["template"].get<std::string>(),
                                                     where + " (default)", std::move(special));
      fail("{}: a list of templates without one named \"default\"", where);
    }
    fail("{}: expected a string or a list of {{name, template}}", where);
  }
  return builtin_qwen36();
}

}  // namespace lilac
