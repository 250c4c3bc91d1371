#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "engine/stop_matcher.h"
#include "util/device_fault.h"
#include "util/error.h"

namespace lilac {

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
  }
  return "?";
}

Engine::Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options)
    : backend_(backend),
      tokenizer_(tokenizer),
      options_(options),
      cache_(backend, options.snapshot_budget, options.context_size) {
  backend_.set_sampling_vocab(std::min<int32_t>(tokenizer.size(), int32_t(backend.config().vocab)));
  thread_ = std::thread([this] { worker(); });
}

Engine::~Engine() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

void Engine::shutdown() {
  std::deque<std::unique_ptr<Job>> dropped;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    if (running_cancel_) *running_cancel_ = true;
  }
  wake_.notify_all();
  for (auto& job : dropped) {
    GenerationResult r;
    r.finish = FinishReason::Cancelled;
    r.prompt_tokens = int64_t(job->request.prompt.size());
    job->promise.set_value(std::move(r));
  }
}

size_t Engine::queue_length() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

bool Engine::busy() const {
  std::lock_guard lock(mutex_);
  return running_cancel_ != nullptr;
}

std::future<GenerationResult> Engine::submit(GenerationRequest request) {
  const int64_t n = int64_t(request.prompt.size());
  if (n == 0) fail("the prompt is empty");
  if (n >= options_.context_size)
    fail("the prompt has {} tokens; the context size is {} (prompt + answer)", n,
         options_.context_size);
  for (int32_t id : request.prompt)
    if (id < 0 || id >= backend_.config().vocab) fail("token id {} is out of range", id);
  if (request.max_tokens < 1) fail("max_tokens must be at least 1");
  request.max_tokens = std::min(request.max_tokens, options_.context_size - n);
  auto job = std::make_unique<Job>();
  job->request = std::move(request);
  job->queued_at = Clock::now();
  auto future = job->promise.get_future();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) fail("the server is shutting down");
    if (!fault_.empty()) fail("the device failed ({}); restart the server", fault_);
    if (int(queue_.size()) >= options_.queue_capacity) {
      metrics_.requests_rejected++;
      throw QueueFull();
    }
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return future;
}

std::string Engine::fault() const {
  std::lock_guard lock(mutex_);
  return fault_;
}

void Engine::warm_up() {
  auto seq = backend_.new_sequence(4);
  SamplingParams greedy;
  greedy.temperature = 0;
  int32_t ids[2] = {0, 0};
  backend_.begin_sampling(*seq, std::span<const int32_t>(ids, 2), greedy);
  StepResult r = backend_.step(*seq, std::span<const int32_t>(ids, 2), 0);
  backend_.step(*seq, std::span<const int32_t>(&r.token, 1), 1);
  ready_ = true;
}

void Engine::worker() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      job = std::move(queue_.front());
      queue_.pop_front();
      running_cancel_ = job->request.cancelled;
      if (stopping_) *running_cancel_ = true;
    }
    GenerationResult result;
    const std::string fault = this->fault();
    try {
      if (!fault.empty()) fail("the device failed earlier ({}); restart the server", fault);
      result = run(*job);
    } catch (const DeviceFault& e) {
      live_.reset();
      live_tokens_.clear();
      cache_.clear();  // snapshots may live on the failed device
      result.finish = FinishReason::Error;
      result.error = std::string("device fault: ") + e.what();
      result.prompt_tokens = int64_t(job->request.prompt.size());
      std::lock_guard lock(mutex_);
      fault_ = e.what();
    } catch (const std::exception& e) {
      // A failed step leaves the sequence in an unknown state: drop it.
      live_.reset();
      live_tokens_.clear();
      result.finish = FinishReason::Error;
      result.error = e.what();
      result.prompt_tokens = int64_t(job->request.prompt.size());
    }
    metrics_.requests_total++;
    if (result.finish == FinishReason::Error) metrics_.requests_failed++;
    if (result.finish == FinishReason::Cancelled) metrics_.requests_cancelled++;
    {
      std::lock_guard lock(mutex_);
      running_cancel_.reset();
    }
    job->promise.set_value(std::move(result));
  }
}

GenerationResult Engine::run(Job& job) {
  GenerationRequest& rq = job.request;
  GenerationResult res;
  const std::vector<int32_t>& prompt = rq.prompt;
  res.prompt_tokens = int64_t(prompt.size());
  res.queue_s = seconds_since(job.queued_at);
  metrics_.queue_time.observe(res.queue_s);
  const auto start = Clock::now();
  auto is_cancelled = [&] { return rq.cancelled->load(); };

  // Where to start: the live sequence when the prompt extends what it consumed, else the longest
  // snapshot that is a prefix of the prompt, else a fresh sequence.
  std::unique_ptr<SequenceState> st;
  size_t reused = 0;
  auto [snap, snap_len] = cache_.lookup(prompt);
  if (live_ && live_tokens_.size() < prompt.size() && live_tokens_.size() >= snap_len &&
      std::equal(live_tokens_.begin(), live_tokens_.end(), prompt.begin())) {
    st = std::move(live_);
    reused = live_tokens_.size();
  } else if (snap) {
    st = std::move(snap);
    reused = snap_len;
  } else {
    st = backend_.new_sequence(options_.context_size);
  }
  live_.reset();
  live_tokens_.clear();
  res.cached_tokens = int64_t(reused);
  metrics_.prompt_tokens_total += prompt.size();
  metrics_.cached_prompt_tokens_total += reused;

  backend_.begin_sampling(*st, prompt, rq.sampling);
  // Prefill the rest of the prompt in chunks (checking for cancellation between them); the last
  // chunk goes through step(), which samples the first token.
  size_t pos = reused;
  const size_t chunk = size_t(std::max<int64_t>(1, options_.prefill_chunk));
  std::vector<size_t> marks;  // snapshot points still ahead, ascending
  for (size_t m : rq.snapshot_at)
    if (m > pos && m < prompt.size()) marks.push_back(m);
  std::sort(marks.begin(), marks.end());
  marks.erase(std::unique(marks.begin(), marks.end()), marks.end());
  size_t mark = 0;
  while (prompt.size() - pos > chunk || mark < marks.size()) {
    if (is_cancelled()) {
      res.finish = FinishReason::Cancelled;
      return res;
    }
    size_t n = std::min(chunk, prompt.size() - pos);
    if (mark < marks.size()) n = std::min(n, marks[mark] - pos);
    if (pos + n >= prompt.size()) break;  // the last piece goes through step()
    backend_.forward(*st, std::span(prompt).subspan(pos, n), {}, false);
    pos += n;
    if (mark < marks.size() && pos == marks[mark]) {
      cache_.store(*st, std::span(prompt).first(pos));
      ++mark;
    }
  }
  if (is_cancelled()) {
    res.finish = FinishReason::Cancelled;
    return res;
  }
  StepResult next = backend_.step(*st, std::span(prompt).subspan(pos), 0);
  res.prefill_s = seconds_since(start);
  metrics_.time_to_first_token.observe(res.prefill_s);
  cache_.store(*st, prompt);  // the snapshot "after the prompt"

  StreamDecoder decoder(tokenizer_, rq.skip_special_tokens);
  StopMatcher stops(rq.stop_strings);
  const auto decode_start = Clock::now();
  auto last_token_at = decode_start;
  res.finish = FinishReason::Length;
  for (int64_t n = 1;; ++n) {
    const int32_t token = next.token;
    res.tokens.push_back(token);
    metrics_.generated_tokens_total++;
    const bool stop_id =
        std::find(rq.stop_ids.begin(), rq.stop_ids.end(), token) != rq.stop_ids.end();
    TokenEvent ev;
    ev.id = token;
    ev.logprob = next.logprob;
    ev.top_logprobs = std::move(next.top);
    if (!stop_id) ev.text = stops.push(decoder.push(token));
    res.text += ev.text;
    if (rq.on_token && !rq.on_token(ev)) *rq.cancelled = true;
    if (stop_id || stops.stopped()) {
      res.finish = FinishReason::Stop;
      break;
    }
    if (is_cancelled()) {
      res.finish = FinishReason::Cancelled;
      break;
    }
    if (n >= rq.max_tokens || st->position() + 1 >= options_.context_size) break;
    next = backend_.step(*st, std::span<const int32_t>(&token, 1), uint64_t(n));
    const auto now = Clock::now();
    metrics_.time_per_output_token.observe(
        std::chrono::duration<double>(now - last_token_at).count());
    last_token_at = now;
  }
  res.decode_s = seconds_since(decode_start);
  // Text still held back (incomplete UTF-8 at a length cut, a partial stop string).
  if (res.finish != FinishReason::Cancelled) {
    TokenEvent tail;
    tail.text = stops.stopped() ? "" : stops.push(decoder.flush()) + stops.flush();
    if (!tail.text.empty()) {
      res.text += tail.text;
      if (rq.on_token) rq.on_token(tail);
    }
  }
  // Keep the sequence: it has consumed the prompt and every generated token but the last.
  live_tokens_ = prompt;
  live_tokens_.insert(live_tokens_.end(), res.tokens.begin(), res.tokens.end() - 1);
  live_ = std::move(st);
  if (res.finish != FinishReason::Cancelled)
    cache_.store(*live_, live_tokens_);  // "after the answer"
  return res;
}

}  // namespace lilac
