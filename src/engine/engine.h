// The generation engine: one model, continuous batching (docs/batching.md). Requests (prompt ids,
// sampling, stops, max tokens) wait in a bounded FIFO queue; the engine's worker thread admits
// them into up to `parallel` sequence slots and advances every running sequence with one
// Backend::step_batch call per step: each decoding sequence by one token, and prompts still being
// read by chunks under a per-step token budget (reusing snapshots of earlier conversations,
// prefix_cache.h). Each token's text (complete UTF-8, stop strings held back) streams through
// the request's callback. A request joins at the next step, leaves as soon as it is done, and is
// cancellable at any step.
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

#include "engine/metrics.h"
#include "engine/prefix_cache.h"
#include "model/backend.h"
#include "model/sampling.h"
#include "tokenizer/tokenizer.h"

namespace lilac {

struct EngineOptions {
  int64_t context_size = 32768;         // tokens per sequence (prompt + answer)
  int queue_capacity = 64;              // waiting requests beyond the running ones
  int parallel = 1;                     // sequence slots: requests in flight at once
  int64_t prefill_chunk = 2048;         // most prompt tokens of one sequence in one step
  int64_t step_token_budget = 2048;     // most tokens (decode + prompt pieces) in one step
  size_t snapshot_budget = 1ull << 30;  // bytes of prompt-reuse snapshots (0: off)
};

// What the slots occupy (allocated at start-up): per slot, the attention layers' KV cache for
// context_size tokens plus the fixed recurrent (GDN conv + state) part.
struct SlotMemory {
  size_t per_slot = 0;      // bytes of one slot
  size_t kv_per_token = 0;  // bytes of KV cache per token of context
  size_t fixed = 0;         // bytes independent of the context (recurrent state, buffers)
  size_t total = 0;         // all slots
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
  // Structured output: the tokens each sampled step may take (null: any). The engine accepts
  // every token the sequence takes into it, sampled or forced.
  std::shared_ptr<TokenConstraint> constraint;
  // Thinking budget: when >= 0 and the request starts inside reasoning, once that many tokens
  // were generated without think_end_id, the engine stops sampling and takes think_close one id
  // per step as if sampled (streamed, counted in max_tokens, accepted by the constraint), then
  // samples the answer.
  bool starts_in_reasoning = false;
  int64_t thinking_budget = -1;
  int32_t think_end_id = -1;
  std::vector<int32_t> think_close;
  // Called on the engine thread for every token; return false to cancel.
  std::function<bool(const TokenEvent&)> on_token;
  // Called once the request's future is ready (after its last on_token), on whichever thread
  // completed it: a consumer waiting for tokens learns at once that none will come.
  std::function<void()> on_done;
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

// One engine step as a step observer sees it (Engine::set_step_observer).
struct StepRecord {
  int decode_rows = 0;        // sequences advanced by one token
  int prompt_pieces = 0;      // sequences reading a piece of their prompt
  int64_t prompt_tokens = 0;  // tokens of those pieces
  int takers = 0;             // sequences that took a token (decoding or ending their prompt)
  double seconds = 0;         // Backend::step_batch
  double gap_seconds = -1;    // engine time since the previous step (-1: the engine was idle)
};

class QueueFull : public std::runtime_error {
 public:
  QueueFull() : std::runtime_error("the request queue is full") {}
};

class Engine {
 public:
  // Allocates the `parallel` slots (one sequence state of context_size tokens each); throws
  // lilac::Error naming the bytes when they do not fit.
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

  // Called on the engine thread after every step that ran (e.g. a debug log of each step). Set
  // it before the first request is submitted.
  void set_step_observer(std::function<void(const StepRecord&)> fn) {
    step_observer_ = std::move(fn);
  }

  const EngineOptions& options() const { return options_; }
  Metrics& metrics() { return metrics_; }
  size_t queue_length() const;
  // Requests running (admitted into a slot, prefill or decode).
  size_t running() const { return size_t(running_.load()); }
  bool busy() const { return running() > 0; }
  const SlotMemory& slot_memory() const { return slot_memory_; }
  Backend& backend() { return backend_; }

 private:
  struct Job {
    GenerationRequest request;
    std::promise<GenerationResult> promise;
    std::chrono::steady_clock::time_point queued_at;
  };
  struct Slot;  // engine.cpp
  struct Planned;

  void allocate_slots();
  void worker();
  void admit(std::unique_ptr<Job> job);
  Slot& choose_slot(const std::vector<int32_t>& prompt, size_t& reused);
  std::vector<Planned>& plan_step();  // into plan_
  void apply(Slot& slot, const Planned& p, StepResult& r);
  void take(Slot& slot, int32_t token, float logprob, std::vector<std::pair<int32_t, float>> top);
  void finish(Slot& slot, FinishReason reason, const std::string& error = {});
  void complete(std::unique_ptr<Job> job, GenerationResult result);
  // cache_.store, timed into metrics_.snapshot_seconds.
  void store_snapshot(const SequenceState& state, const std::vector<int32_t>& tokens);

  Backend& backend_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  PrefixCache cache_;
  Metrics metrics_;
  SlotMemory slot_memory_;
  // The slots, touched only by the worker after construction. A free slot keeps the state of its
  // last request and the ids that state consumed (the "live" sequence): a next prompt that
  // extends them continues it without a copy.
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t admissions_ = 0;  // admission order (FIFO prefill) and slot recency
  // The worker's per-step scratch, kept to avoid allocations every step.
  std::vector<Planned> plan_;
  std::vector<Slot*> reading_;
  std::vector<BatchItem> items_;
  // The end of the last step while sequences ran (for metrics_.step_gap_seconds); cleared when
  // the worker goes idle, so that idle time is not counted as overhead.
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
  std::function<void(const StepRecord&)> step_observer_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::atomic<int> running_{0};
  bool stopping_ = false;
  std::string fault_;                 // see fault()
  std::atomic<bool> faulted_{false};  // fault_ is set (checked every step without the mutex)
  std::atomic<bool> ready_{false};
  std::thread thread_;
};

}  // namespace lilac
