// `lilac render [--chat-template FILE | --model DIR]`: renders one chat on stdin to stdout, as
// transformers' apply_chat_template would. Input: one JSON object shaped like a chat-golden case,
//   {"messages": [...], "tools": [...]?, "enable_thinking": bool?, "preserve_thinking": bool?,
//    "add_generation_prompt": bool? (default false, as in apply_chat_template),
//    "chat_template_kwargs": {...}?}
// (other keys are ignored). Output: exactly the rendered prompt, no trailing newline added.
// Without a template option the built-in Qwen3.6 template renders.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

struct RenderArgs {
  std::string chat_template;
  std::string model;
};

int run_render(const RenderArgs& a) {
  using ojson = nlohmann::ordered_json;
  if (!a.chat_template.empty() && !a.model.empty())
    fail("give --chat-template or --model, not both");
  std::unique_ptr<ChatTemplate> tmpl;
  if (!a.chat_template.empty()) {
    std::ifstream f(a.chat_template, std::ios::binary);
    if (!f) fail("cannot read {}", a.chat_template);
    tmpl = ChatTemplate::from_string(std::string(std::istreambuf_iterator<char>(f), {}),
                                     a.chat_template);
  } else if (!a.model.empty()) {
    tmpl = ChatTemplate::from_model_dir(a.model);
  } else {
    tmpl = ChatTemplate::builtin_qwen36();
  }

  std::string input(std::istreambuf_iterator<char>(std::cin), {});
  ojson req;
  try {
    req = ojson::parse(input);
  } catch (const nlohmann::json::exception& e) {
    fail("stdin is not valid JSON: {}", e.what());
  }
  if (!req.is_object()) fail("stdin must hold one JSON object with \"messages\"");
  if (!req.contains("messages")) fail("the input has no \"messages\"");
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!req.contains(key) || req[key].is_null()) return std::nullopt;
    if (!req[key].is_boolean()) fail("\"{}\" must be true or false", key);
    return req[key].get<bool>();
  };
  ChatOptions opt;
  opt.add_generation_prompt = flag("add_generation_prompt").value_or(false);
  opt.enable_thinking = flag("enable_thinking");
  opt.preserve_thinking = flag("preserve_thinking").value_or(false);
  if (req.contains("chat_template_kwargs")) {
    if (!req["chat_template_kwargs"].is_object())
      fail("\"chat_template_kwargs\" must be an object");
    opt.extra = req["chat_template_kwargs"];
  }
  ojson tools = req.contains("tools") ? req["tools"] : ojson();
  std::string out = tmpl->render(req["messages"], tools, opt);
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) fail("cannot write the output");
  std::fflush(stdout);
  return 0;
}

const Command kRender{
    "render", "Render a chat (JSON on stdin) with a chat template, as apply_chat_template does",
    [](CLI::App& app) {
      auto args = std::make_shared<RenderArgs>();
      app.add_option("--chat-template", args->chat_template, "Jinja chat template file");
      app.add_option("--model", args->model, "Model directory (its own template)");
      return Runner([args] { return run_render(*args); });
    }};

}  // namespace
}  // namespace lilac::cli
