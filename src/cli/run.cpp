// `lilac run [PROMPT...]`: one prompt (the arguments, or stdin when there are none or "-") in,
// the answer streamed to stdout. Reasoning goes to stderr (dim on a terminal; --hide-reasoning
// drops it). Ctrl-C stops the answer (exit 130).
#include <csignal>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <random>

#include "cli/command.h"
#include "cli/console.h"
#include "cli/terminal.h"
#include "runtime/backends.h"
#include "runtime/model_setup.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) {
  g_interrupted = 1;
}

}  // namespace

void add_gen_options(CLI::App& app, GenOptions& o) {
  app.add_option("--model", o.model,
                 "Model directory (else $LILAC_MODEL, the Hugging Face cache, the demo model)");
  app.add_option("--device", o.device, "cuda, cpu or auto")->capture_default_str();
  app.add_option("--weights", o.weights,
                 "auto, bf16, fp8 or q4 (the checkpoint's format; q4 on a BF16 or FP8 checkpoint "
                 "quantizes at load)")
      ->capture_default_str();
  app.add_option("--ctx-size", o.ctx_size, "Context size in tokens");
  app.add_option("--gdn-state", o.gdn_state,
                 "How the Gated DeltaNet recurrent state is kept between steps: f32 (the "
                 "default; as the references) or bf16 (rounded each time it is stored)");
  app.add_option("--max-tokens", o.max_tokens,
                 "Most tokens to generate (default: up to the context)");
  app.add_option("--temperature", o.temperature,
                 "Sampling temperature (default: generation_config.json)");
  app.add_option("--top-p", o.top_p, "Nucleus sampling mass");
  app.add_option("--top-k", o.top_k, "Top-k (0: off)");
  app.add_option("--seed", o.seed, "Sampling seed (default: random)");
  app.add_option("--system", o.system, "A system prompt");
  app.add_flag("--no-think", o.no_think, "Turn thinking off (enable_thinking=false)");
  app.add_flag("--hide-reasoning", o.hide_reasoning, "Do not print the reasoning");
  app.add_flag("-q,--quiet", o.quiet, "No loading messages");
}

std::unique_ptr<runtime::LoadedModel> load_for_terminal(const GenOptions& o) {
  using namespace lilac::runtime;
  const std::optional<GdnStateFormat> gdn_state = parse_gdn_state_flag(o.gdn_state);
  ModelChoice choice = choose_model(o.model);
  if (choice.demo) std::fprintf(stderr, "warning: %s\n", demo_warning().c_str());
  LoadOptions lo;
  lo.device = o.device;
  lo.weights = o.weights;
  lo.context_size = o.ctx_size;
  lo.gdn_state = gdn_state;
  lo.queue_capacity = 1;
  lo.parallel = 1;  // one conversation at a time: one slot
  Progress progress("lilac: ");
  if (!o.quiet) lo.progress = [&progress](const std::string& line) { progress(line); };
  return load_for_serving(choice, lo);
}

TurnOptions turn_options(const GenOptions& o, const runtime::LoadedModel& m) {
  TurnOptions t;
  t.sampling = m.defaults;
  if (o.temperature) t.sampling.temperature = *o.temperature;
  if (o.top_p) t.sampling.top_p = *o.top_p;
  if (o.top_k) t.sampling.top_k = *o.top_k;
  t.sampling.seed = o.seed ? *o.seed : uint64_t(std::random_device{}()) << 16;
  if (o.no_think) t.chat.enable_thinking = false;
  t.max_tokens = o.max_tokens;
  t.raw = o.raw;
  return t;
}

namespace {

int run_run(const GenOptions& o, const std::vector<std::string>& words) {
  std::string prompt;
  if (words.empty() || (words.size() == 1 && words[0] == "-")) {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), {});
    while (!prompt.empty() && (prompt.back() == '\n' || prompt.back() == '\r')) prompt.pop_back();
  } else {
    for (const auto& w : words) prompt += (prompt.empty() ? "" : " ") + w;
  }
  if (prompt.find_first_not_of(" \t\r\n") == std::string::npos)
    fail("the prompt is empty (give it as arguments or on stdin)");
  auto m = load_for_terminal(o);
  TurnOptions t = turn_options(o, *m);
  nlohmann::json messages = nlohmann::json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  const bool err_tty = is_tty(2);
  bool in_reasoning = false;
  TurnCallbacks cb;
  cb.reasoning = [&](const std::string& s) {
    if (o.hide_reasoning) return;
    if (!in_reasoning) std::fputs(err_tty ? "\033[2m" : "[reasoning]\n", stderr);
    in_reasoning = true;
    std::fputs(s.c_str(), stderr);
    std::fflush(stderr);
  };
  auto end_reasoning = [&] {
    if (!in_reasoning) return;
    std::fputs(err_tty ? "\033[0m\n" : "\n[/reasoning]\n", stderr);
    std::fflush(stderr);
    in_reasoning = false;
  };
  cb.content = [&](const std::string& s) {
    end_reasoning();
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  };
  cb.tool_call = [&](const ToolCall& c) {
    end_reasoning();
    std::printf("\n[tool call] %s %s\n", c.name.c_str(), c.arguments.c_str());
  };
  TurnResult r = run_turn(*m, messages, prompt, t, cb, &g_interrupted);
  end_reasoning();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (r.interrupted) {
    std::fprintf(stderr, "lilac: interrupted\n");
    return 130;
  }
  if (r.result.finish == FinishReason::Length)
    std::fprintf(stderr, "lilac: stopped at the token limit\n");
  return 0;
}

const Command kRun{"run", "Answer one prompt (arguments or stdin), streamed to stdout",
                   [](CLI::App& app) {
                     auto o = std::make_shared<GenOptions>();
                     auto words = std::make_shared<std::vector<std::string>>();
                     add_gen_options(app, *o);
                     app.add_flag("--raw", o->raw, "Send the prompt as it is (no chat template)");
                     app.add_option("prompt", *words, "The prompt (default: read stdin)");
                     return Runner([o, words] { return run_run(*o, *words); });
                   }};

}  // namespace
}  // namespace lilac::cli
