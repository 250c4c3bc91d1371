// The generation engine: one model, one sequence at a time. Requests (prompt ids, sampling,
// stops, max tokens) wait in a bounded FIFO queue and run on the engine's worker thread: prompt
// prefill in chunks (reusing snapshots of earlier conversations, prefix_cache.h), then decode
// token by token, streaming each token's text (complete UTF-8, stop strings held back) through
// the request's callback. A request is cancellable at any step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cpu/sampling.h"
#include "engine/metrics.h"
#include "engine/prefix_cache.h"
#include "model/backend.h"
#include "tokenizer/tokenizer.h"

namespace lilac {

struct EngineOptions {
  int64_t context_size = 32768;         // tokens per sequence (prompt + answer)
  int queue_capacity = 64;              // waiting requests beyond the running one
  int64_t prefill_chunk = 2048;         // prompt tokens per forward call (cancellation granularity)
  size_t snapshot_budget = 1ull << 30;  // bytes of prompt-reuse snapshots (0: off)
};

// One generated token as the callback sees it.
struct TokenEvent {
  int32_t id = -1;
  std::string text;  // newly releasable text (may be empty: held back or incomplete UTF-8)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

enum class FinishReason { Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop_ids;          // e.g. the tokenizer's eos ids
  std::vector<std::string> stop_strings;  // matched on the decoded text
  bool skip_special_tokens = false;       // text of special tokens left out of the stream
  // Prompt lengths after which to keep a snapshot (besides the whole prompt and the answer),
  // e.g. where the last message starts: a later turn of the same conversation re-renders the
  // answer differently (reasoning dropped) but still agrees with the prompt up to there.
  std::vector<size_t> snapshot_at;
  // Called on the engine thread for every token; return false to cancel.
  std::function<bool(const TokenEvent&)> on_token;
  // Set from any thread (client gone, server stopping): the request stops within a step.
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
};

struct GenerationResult {
  FinishReason finish = FinishReason::Stop;
  std::string error;  // when finish == Error
  std::vector<int32_t> tokens;
  std::string text;  // the streamed text, concatenated
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens reused from a snapshot
  double queue_s = 0, prefill_s = 0, decode_s = 0;
};

class QueueFull : public std::runtime_error {
 public:
  QueueFull() : std::runtime_error("the request queue is full") {}
};

class Engine {
 public:
  Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options = {});
  ~Engine();  // cancels queued and running requests, joins the worker

  // Queues a request; throws QueueFull (nothing queued) when the queue is at capacity, and
  // lilac::Error for a request that can never run (empty prompt, longer than the context).
  std::future<GenerationResult> submit(GenerationRequest request);

  // One tiny prefill + decode step, so the first real request does not pay for lazy setup
  // (graph capture, allocations). /health reports ready after it.
  void warm_up();
  bool ready() const { return ready_; }
  // Why the device failed (a step threw DeviceFault), empty while healthy. Once set, every
  // queued and later request fails with it.
  std::string fault() const;

  // Stops taking requests; cancels everything queued or running.
  void shutdown();

  const EngineOptions& options() const { return options_; }
  Metrics& metrics() { return metrics_; }
  size_t queue_length() const;
  // A request is running (prefill or decode).
  bool busy() const;
  Backend& backend() { return backend_; }

 private:
  struct Job {
    GenerationRequest request;
    std::promise<GenerationResult> promise;
    std::chrono::steady_clock::time_point queued_at;
  };
  void worker();
  GenerationResult run(Job& job);

  Backend& backend_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  PrefixCache cache_;
  Metrics metrics_;
  // The live sequence of the last request and the ids it has consumed: a next prompt that
  // extends them continues it without a copy.
  std::unique_ptr<SequenceState> live_;
  std::vector<int32_t> live_tokens_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::shared_ptr<std::atomic<bool>> running_cancel_;
  bool stopping_ = false;
  std::string fault_;  // see fault()
  std::atomic<bool> ready_{false};
  std::thread thread_;
};

}  // namespace lilac
