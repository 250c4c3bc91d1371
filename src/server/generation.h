// One request running through the engine, consumed from another thread (an HTTP handler, the
// terminal chat): the engine's token events are queued, and next() hands them out with the text
// split by the output parser (reasoning / content / tool calls) when the request is a chat.
// Cancelling (client gone, Ctrl-C) stops the engine within a step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "engine/engine.h"

namespace lilac::server {

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// What one next() call released.
struct GenerationChunk {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<int, ToolCall>> tool_calls;
  // The same output in the order it was written, tool calls piece by piece when
  // ParseOptions::stream_calls (call indexes as in tool_calls). Streaming writers use these.
  std::vector<ParsedPiece> pieces;
  std::vector<TokenLogprob> logprobs;  // one per token sampled since the last chunk
  bool finished = false;               // the request is over; result() is valid
  bool empty() const {
    return reasoning.empty() && content.empty() && tool_calls.empty() && pieces.empty() &&
           logprobs.empty();
  }
};

struct ParseOptions {
  bool chat = true;           // split with the output parser (else: raw text as content)
  bool in_reasoning = false;  // the prompt ended inside <think>
  nlohmann::json tools = nlohmann::json::array();
  int max_tool_calls = -1;    // parallel_tool_calls false: 1 (later calls are dropped)
  bool stream_calls = false;  // the parser releases calls as they are written (a stream)
};

class Generation {
 public:
  // Submits `request` (its on_token is replaced). Throws what Engine::submit throws.
  Generation(Engine& engine, GenerationRequest request, ParseOptions parse);
  ~Generation();  // cancels a request still running
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits up to `timeout` for output and returns it (possibly empty, finished false). Once the
  // request is over, returns the rest with finished = true (and then only finished chunks).
  GenerationChunk next(std::chrono::milliseconds timeout);
  void cancel() { *cancelled_ = true; }
  bool cancelled() const { return *cancelled_; }
  // Valid once a chunk with finished = true was returned.
  const GenerationResult& result() const { return result_; }
  int tool_calls_seen() const { return calls_seen_; }

 private:
  struct Channel {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<TokenEvent> events;
    bool done = false;  // the engine completed the request (every event is in `events`)
  };
  void absorb(const ParsedDelta& d, GenerationChunk& out);

  std::shared_ptr<Channel> channel_ = std::make_shared<Channel>();
  std::shared_ptr<std::atomic<bool>> cancelled_;
  std::future<GenerationResult> future_;
  ParseOptions parse_;
  std::optional<OutputParser> parser_;
  GenerationResult result_;
  bool done_ = false;
  int calls_seen_ = 0;
  std::map<int, int> call_index_;  // the parser's call index -> ours (-1: dropped)
};

// True when the prompt ends inside an open <think> block (thinking on): the model's output
// starts as reasoning.
bool prompt_opens_reasoning(const std::string& prompt);

// Where the prompt's last message starts (the index of the last <|im_start|> id), the point at
// which a later turn of the same conversation still agrees with this one: the engine keeps a
// snapshot there. 0 when there is none.
size_t last_turn_start(const std::vector<int32_t>& prompt, const Tokenizer& tokenizer);

}  // namespace lilac::server
