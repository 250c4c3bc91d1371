// What the terminal commands (`run`, `chat`) share: progress lines while loading, and one chat
// turn streamed through the engine with reasoning and answer delivered apart.
#pragma once

#include <atomic>
#include <csignal>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/output_parser.h"
#include "engine/engine.h"
#include "runtime/model_setup.h"

namespace lilac::cli {

bool is_tty(int fd);

// Progress for long work on stderr: a line rewritten in place on a terminal, plain lines else.
class Progress {
 public:
  explicit Progress(std::string prefix);
  ~Progress();  // ends an in-place line
  void operator()(const std::string& line);

 private:
  std::string prefix_;
  bool tty_;
  bool open_ = false;
};

// The start-up warning for the demo model.
std::string demo_warning();

struct TurnCallbacks {
  std::function<void(const std::string&)> reasoning;  // reasoning text as it streams
  std::function<void(const std::string&)> content;    // answer text as it streams
  std::function<void(const ToolCall&)> tool_call;
};

struct TurnResult {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  GenerationResult result;
  bool interrupted = false;  // *interrupt became true
};

struct TurnOptions {
  ChatOptions chat;
  SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: up to the context
  std::vector<std::string> stop;
  bool raw = false;  // `prompt` is sent as it is (no chat template, no parser)
};

// Renders `messages` (or takes `raw_prompt` when options.raw), runs it, streams the pieces to
// the callbacks, and stops early when *interrupt becomes non-zero (a SIGINT handler's flag).
TurnResult run_turn(runtime::LoadedModel& m, const nlohmann::json& messages,
                    const std::string& raw_prompt, const TurnOptions& options,
                    const TurnCallbacks& cb, const volatile std::sig_atomic_t* interrupt);

}  // namespace lilac::cli
