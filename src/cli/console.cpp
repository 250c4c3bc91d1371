#include "cli/console.h"

#include <unistd.h>

#include <cstdio>

#include "server/generation.h"
#include "util/error.h"

namespace lilac::cli {

using server::Generation;
using server::GenerationChunk;
using server::last_turn_start;
using server::ParseOptions;
using server::prompt_opens_reasoning;

bool is_tty(int fd) {
  return isatty(fd) == 1;
}

Progress::Progress(std::string prefix) : prefix_(std::move(prefix)), tty_(is_tty(2)) {}

Progress::~Progress() {
  if (open_) std::fprintf(stderr, "\n");
}

void Progress::operator()(const std::string& line) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", prefix_.c_str(), line.c_str());
    open_ = true;
  } else {
    std::fprintf(stderr, "%s%s\n", prefix_.c_str(), line.c_str());
  }
  std::fflush(stderr);
}

std::string demo_warning() {
  return "this is the bundled DEMO model (models/demo): a tiny model with RANDOM weights, so its "
         "text is "
         "meaningless. It exists to try lilac without a download; give --model DIR (or "
         "LILAC_MODEL) for a real "
         "Qwen3.6-35B-A3B checkpoint.";
}

TurnResult run_turn(runtime::LoadedModel& m, const nlohmann::json& messages,
                    const std::string& raw_prompt, const TurnOptions& o, const TurnCallbacks& cb,
                    const volatile std::sig_atomic_t* interrupt) {
  std::string prompt =
      o.raw ? raw_prompt : m.chat_template->render(messages, nlohmann::json::array(), o.chat);
  std::vector<int32_t> ids = m.tokenizer->encode(prompt, true);
  const int64_t ctx = m.engine->options().context_size;
  if (int64_t(ids.size()) >= ctx)
    fail("the conversation has {} tokens, and the context is {} (--ctx-size); /reset to start over",
         ids.size(), ctx);
  GenerationRequest rq;
  rq.prompt = ids;
  rq.sampling = o.sampling;
  rq.max_tokens = o.max_tokens > 0 ? o.max_tokens : ctx;
  rq.stop_ids = m.tokenizer->eos_ids();
  rq.stop_strings = o.stop;
  if (size_t at = last_turn_start(ids, *m.tokenizer); at > 0) rq.snapshot_at.push_back(at);
  ParseOptions parse;
  parse.chat = !o.raw;
  parse.in_reasoning = !o.raw && prompt_opens_reasoning(prompt);
  Generation g(*m.engine, std::move(rq), parse);
  TurnResult out;
  for (;;) {
    GenerationChunk c = g.next(std::chrono::milliseconds(50));
    if (!c.reasoning.empty()) {
      out.reasoning += c.reasoning;
      if (cb.reasoning) cb.reasoning(c.reasoning);
    }
    if (!c.content.empty()) {
      out.content += c.content;
      if (cb.content) cb.content(c.content);
    }
    for (auto& [i, call] : c.tool_calls) {
      out.tool_calls.push_back(call);
      if (cb.tool_call) cb.tool_call(call);
    }
    if (c.finished) break;
    if (interrupt && *interrupt && !g.cancelled()) {
      out.interrupted = true;
      g.cancel();
    }
  }
  out.result = g.result();
  if (out.result.finish == FinishReason::Error) fail("generation failed: {}", out.result.error);
  return out;
}

}  // namespace lilac::cli
