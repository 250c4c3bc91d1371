// The continuous-batching scheduler (docs/batching.md). One worker thread owns the slots; each
// iteration admits queued requests into free slots, drops cancelled ones, plans one step (every
// decoding sequence feeds its last token, prompts still being read get pieces under the token
// budget), runs it as one Backend::step_batch call and hands each sequence its result.
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

// One request in flight in a slot.
struct Running {
  Running(const Tokenizer& tok, const GenerationRequest& rq)
      : decoder(tok, rq.skip_special_tokens), stops(rq.stop_strings) {}
  uint64_t order = 0;         // admission number: prompt pieces go first-come first-served
  size_t prompt_pos = 0;      // prompt ids the state has consumed
  std::vector<size_t> marks;  // snapshot points still ahead, ascending
  size_t mark = 0;
  bool decoding = false;  // the prompt is read; `pending` is the last token taken, not yet fed
  int32_t pending = -1;
  bool thinking = false;  // inside reasoning with a thinking budget to enforce
  size_t forced = 0;      // think_close ids taken so far
  StreamDecoder decoder;
  StopMatcher stops;
  GenerationResult res;
  Clock::time_point admitted, decode_start, last_token_at;
};

struct Engine::Slot {
  std::unique_ptr<SequenceState> state;  // null after a failure (allocated again on use)
  std::vector<int32_t> consumed;         // the ids `state` has consumed, in order
  uint64_t last_used = 0;
  std::unique_ptr<Job> job;  // the request in this slot (null: free)
  std::unique_ptr<Running> run;
};

// One sequence's share of the planned step.
struct Engine::Planned {
  Slot* slot = nullptr;
  bool prompt_piece = false;
  size_t n = 1;        // ids fed
  bool sample = true;  // false: a prompt piece before the last, or a forced token follows
};

Engine::Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options)
    : backend_(backend),
      tokenizer_(tokenizer),
      options_(options),
      cache_(backend, options.snapshot_budget, options.context_size) {
  if (options_.parallel < 1)
    fail("parallel (sequence slots) must be at least 1, not {}", options_.parallel);
  if (options_.step_token_budget < 1) fail("the step token budget must be at least 1");
  if (options_.context_size < 2) fail("the context size must be at least 2 tokens");
  backend_.set_sampling_vocab(std::min<int32_t>(tokenizer.size(), int32_t(backend.config().vocab)));
  metrics_.slots = options_.parallel;
  allocate_slots();
  thread_ = std::thread([this] { worker(); });
}

Engine::~Engine() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

// Every slot gets its full-context state now, so a configuration that does not fit fails at
// start-up. The per-slot size is measured from two tiny states (1 and 2 tokens of context): the
// difference is the KV cache per token, the rest is the fixed recurrent state.
void Engine::allocate_slots() {
  {
    auto one = backend_.new_sequence(1), two = backend_.new_sequence(2);
    const size_t b1 = backend_.state_bytes(*one), b2 = backend_.state_bytes(*two);
    slot_memory_.kv_per_token = b2 > b1 ? b2 - b1 : 0;
    slot_memory_.fixed = b1 - std::min(b1, slot_memory_.kv_per_token);
    slot_memory_.per_slot =
        slot_memory_.fixed + slot_memory_.kv_per_token * size_t(options_.context_size);
    slot_memory_.total = slot_memory_.per_slot * size_t(options_.parallel);
  }
  const ModelConfig& c = backend_.config();
  auto mib = [](size_t b) { return fmt::format("{:.1f} MiB", double(b) / (1 << 20)); };
  for (int i = 0; i < options_.parallel; ++i) {
    auto slot = std::make_unique<Slot>();
    try {
      slot->state = backend_.new_sequence(options_.context_size);
    } catch (const std::exception& e) {
      slots_.clear();
      fail(
          "{} sequence slots of {} tokens do not fit on {}: each slot needs {} ({} of KV cache "
          "for the {} attention layers + {} of recurrent state), {} in all; slot {} failed ({}). "
          "Lower --parallel or --ctx-size.",
          options_.parallel, options_.context_size, backend_.device_description(),
          mib(slot_memory_.per_slot),
          mib(slot_memory_.kv_per_token * size_t(options_.context_size)),
          c.count_layers(LayerType::FullAttention), mib(slot_memory_.fixed),
          mib(slot_memory_.total), i, e.what());
    }
    slots_.push_back(std::move(slot));
  }
}

void Engine::shutdown() {
  std::deque<std::unique_ptr<Job>> dropped;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  wake_.notify_all();
  for (auto& job : dropped) {
    GenerationResult r;
    r.finish = FinishReason::Cancelled;
    r.prompt_tokens = int64_t(job->request.prompt.size());
    job->promise.set_value(std::move(r));
    if (job->request.on_done) job->request.on_done();
  }
}

size_t Engine::queue_length() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

std::future<GenerationResult> Engine::submit(GenerationRequest request) {
  const int64_t n = int64_t(request.prompt.size());
  if (n == 0) fail("the prompt is empty");
  if (n >= options_.context_size)
    fail("the prompt has {} tokens; the context size is {} (prompt + answer)", n,
         options_.context_size);
  for (int32_t id : request.prompt)
    if (id < 0 || id >= backend_.config().vocab) fail("token id {} is out of range", id);
  for (int32_t id : request.think_close)
    if (id < 0 || id >= backend_.config().vocab) fail("think_close id {} is out of range", id);
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
  BatchItem item;
  item.state = seq.get();
  item.ids = std::span<const int32_t>(ids, 2);
  StepResult r = backend_.step_batch(std::span<const BatchItem>(&item, 1)).at(0);
  item.ids = std::span<const int32_t>(&r.token, 1);
  item.sample_index = 1;
  backend_.step_batch(std::span<const BatchItem>(&item, 1));
  backend_.prepare_batches(options_.parallel);
  ready_ = true;
}

void Engine::complete(std::unique_ptr<Job> job, GenerationResult result) {
  metrics_.requests_total++;
  if (result.finish == FinishReason::Error) metrics_.requests_failed++;
  if (result.finish == FinishReason::Cancelled) metrics_.requests_cancelled++;
  job->promise.set_value(std::move(result));
  if (job->request.on_done) job->request.on_done();
}

void Engine::worker() {
  for (;;) {
    // Admission: queued requests join the running batch while slots are free (FIFO).
    std::vector<std::unique_ptr<Job>> admitted;
    bool stopping = false;
    if (running_ == 0) last_step_end_.reset();  // the wait below is idle time, not overhead
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || running_ > 0; });
      stopping = stopping_;
      if (stopping && running_ == 0 && queue_.empty()) return;
      while (!queue_.empty() && running_ < options_.parallel) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
        running_++;
      }
    }
    for (auto& job : admitted) admit(std::move(job));
    // After a device fault nothing runs: every request fails with the reason.
    if (faulted_.load(std::memory_order_acquire)) {
      const std::string f = fault();
      for (auto& slot : slots_)
        if (slot->job)
          finish(*slot, FinishReason::Error,
                 "the device failed earlier (" + f + "); restart the server");
      continue;
    }

    // Requests cancelled (client gone, shutdown) leave before the step.
    for (auto& slot : slots_) {
      if (!slot->job) continue;
      if (stopping) *slot->job->request.cancelled = true;
      if (slot->job->request.cancelled->load()) finish(*slot, FinishReason::Cancelled);
    }

    std::vector<Planned>& plan = plan_step();
    if (plan.empty()) continue;
    std::vector<BatchItem>& items = items_;  // reused: no allocation per step
    items.assign(plan.size(), BatchItem{});
    int takers = 0;  // sequences that take a token in this step (decoding or ending a prompt)
    StepRecord record;
    for (size_t i = 0; i < plan.size(); ++i) {
      Slot& s = *plan[i].slot;
      Running& run = *s.run;
      BatchItem& it = items[i];
      it.state = s.state.get();
      it.ids =
          plan[i].prompt_piece
              ? std::span<const int32_t>(s.job->request.prompt).subspan(run.prompt_pos, plan[i].n)
              : std::span<const int32_t>(&run.pending, 1);
      it.sample = plan[i].sample;
      it.sample_index = uint64_t(run.res.tokens.size());
      it.constraint = plan[i].sample ? s.job->request.constraint.get() : nullptr;
      if (!plan[i].prompt_piece || run.prompt_pos + plan[i].n == s.job->request.prompt.size())
        takers++;
      if (plan[i].prompt_piece) {
        record.prompt_pieces++;
        record.prompt_tokens += int64_t(plan[i].n);
      } else {
        record.decode_rows++;
      }
    }
    record.takers = takers;
    metrics_.steps_total++;
    if (takers > 0) metrics_.batch_size.observe(takers);
    std::vector<StepResult> results;
    const auto step_start = Clock::now();
    if (last_step_end_) {
      record.gap_seconds = std::chrono::duration<double>(step_start - *last_step_end_).count();
      metrics_.step_gap_seconds.observe(record.gap_seconds);
    }
    last_step_end_.reset();
    try {
      results = backend_.step_batch(items);
      if (results.size() != items.size())
        fail("step_batch returned {} results for {} items", results.size(), items.size());
      last_step_end_ = Clock::now();
      record.seconds = std::chrono::duration<double>(*last_step_end_ - step_start).count();
      metrics_.step_seconds.observe(record.seconds);
    } catch (const DeviceFault& e) {
      // A sticky device error: this process cannot compute any more (docs/hardening.md). Fail
      // this batch, remember the reason (/health turns 503), drop the snapshots.
      {
        std::lock_guard lock(mutex_);
        fault_ = e.what();
      }
      faulted_.store(true, std::memory_order_release);
      cache_.clear();  // snapshots may live on the failed device
      for (auto& p : plan) {
        p.slot->state.reset();
        p.slot->consumed.clear();
        finish(*p.slot, FinishReason::Error, std::string("device fault: ") + e.what());
      }
      continue;
    } catch (const std::exception& e) {
      // The states of this batch are unknown now: fail its requests, drop their states.
      for (auto& p : plan) {
        p.slot->state.reset();
        p.slot->consumed.clear();
        finish(*p.slot, FinishReason::Error, e.what());
      }
      continue;
    }
    for (size_t i = 0; i < plan.size(); ++i) {
      Slot& s = *plan[i].slot;
      try {
        apply(s, plan[i], results[i]);
      } catch (const std::exception& e) {
        if (s.job) finish(s, FinishReason::Error, e.what());
      }
    }
    if (step_observer_) step_observer_(record);
  }
}

// Picks the slot for a prompt and how many of its ids are already in that slot's state: a free
// slot whose live sequence the prompt extends (no copy), else the longest prompt-reuse snapshot
// restored into a free slot, else a fresh state. The slot given up is an empty one, else the
// least recently used.
Engine::Slot& Engine::choose_slot(const std::vector<int32_t>& prompt, size_t& reused) {
  const size_t snap_len = cache_.match_length(prompt);
  Slot* live = nullptr;
  Slot* victim = nullptr;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (s.job) continue;
    const size_t n = s.consumed.size();
    if (s.state && n > 0 && n < prompt.size() && n >= snap_len &&
        (!live || n > live->consumed.size()) &&
        std::equal(s.consumed.begin(), s.consumed.end(), prompt.begin()))
      live = &s;
    auto rank = [](const Slot& x) { return x.state && !x.consumed.empty() ? x.last_used + 1 : 0; };
    if (!victim || rank(s) < rank(*victim)) victim = &s;
  }
  if (live) {
    reused = live->consumed.size();
    return *live;
  }
  reused = 0;
  // A state that has consumed nothing is as fresh as a new one (the slots' states at start-up).
  if (snap_len == 0 && victim->state && victim->state->position() == 0) return *victim;
  // The victim's state is released before its replacement is made: the slots' memory was sized
  // for one state each.
  victim->state.reset();
  victim->consumed.clear();
  if (snap_len > 0) {
    auto [snap, len] = cache_.lookup(prompt);
    victim->state = std::move(snap);
    reused = len;
    victim->consumed.assign(prompt.begin(), prompt.begin() + std::ptrdiff_t(len));
  } else {
    victim->state = backend_.new_sequence(options_.context_size);
  }
  return *victim;
}

void Engine::admit(std::unique_ptr<Job> job) {
  GenerationRequest& rq = job->request;
  GenerationResult early;
  early.prompt_tokens = int64_t(rq.prompt.size());
  early.queue_s = seconds_since(job->queued_at);
  if (rq.cancelled->load()) {
    early.finish = FinishReason::Cancelled;
    running_--;
    complete(std::move(job), std::move(early));
    return;
  }
  Slot* slot = nullptr;
  size_t reused = 0;
  try {
    slot = &choose_slot(rq.prompt, reused);
    backend_.begin_sampling(*slot->state, rq.prompt, rq.sampling);
  } catch (const std::exception& e) {
    if (slot) {
      slot->state.reset();
      slot->consumed.clear();
    }
    early.finish = FinishReason::Error;
    early.error = e.what();
    running_--;
    complete(std::move(job), std::move(early));
    return;
  }
  metrics_.queue_time.observe(early.queue_s);
  auto run = std::make_unique<Running>(tokenizer_, rq);
  run->order = ++admissions_;
  run->admitted = Clock::now();
  run->res = early;
  run->res.cached_tokens = int64_t(reused);
  run->prompt_pos = reused;
  run->thinking = rq.starts_in_reasoning && rq.thinking_budget >= 0;
  metrics_.prompt_tokens_total += rq.prompt.size();
  metrics_.cached_prompt_tokens_total += reused;
  for (size_t m : rq.snapshot_at)
    if (m > reused && m < rq.prompt.size()) run->marks.push_back(m);
  std::sort(run->marks.begin(), run->marks.end());
  run->marks.erase(std::unique(run->marks.begin(), run->marks.end()), run->marks.end());
  slot->last_used = run->order;
  slot->job = std::move(job);
  slot->run = std::move(run);
}

// True when the sequence's next token is a think_close id instead of a sampled one.
static bool forcing(const GenerationRequest& rq, const Running& run) {
  return run.thinking && int64_t(run.res.tokens.size()) >= rq.thinking_budget &&
         run.forced < rq.think_close.size();
}

std::vector<Engine::Planned>& Engine::plan_step() {
  // Both reused from step to step (no allocation per step).
  std::vector<Planned>& plan = plan_;
  std::vector<Slot*>& reading = reading_;  // sequences still reading their prompt
  plan.clear();
  reading.clear();
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.job) continue;
    if (!s.run->decoding) {
      reading.push_back(&s);
      continue;
    }
    Planned p;
    p.slot = &s;
    p.sample = !forcing(s.job->request, *s.run);
    plan.push_back(p);
  }
  // Prompt pieces fill what the decode tokens leave of the budget, oldest request first; the
  // oldest always gets at least one token, so a prompt is never starved.
  std::sort(reading.begin(), reading.end(),
            [](const Slot* a, const Slot* b) { return a->run->order < b->run->order; });
  int64_t budget = options_.step_token_budget - int64_t(plan.size());
  const size_t chunk = size_t(std::max<int64_t>(1, options_.prefill_chunk));
  for (Slot* s : reading) {
    if (budget <= 0 && s != reading.front()) break;
    const Running& run = *s->run;
    const auto& prompt = s->job->request.prompt;
    size_t n = std::min(chunk, prompt.size() - run.prompt_pos);
    n = std::min(n, size_t(std::max<int64_t>(1, budget)));
    if (run.mark < run.marks.size()) n = std::min(n, run.marks[run.mark] - run.prompt_pos);
    Planned p;
    p.slot = s;
    p.prompt_piece = true;
    p.n = n;
    const bool last = run.prompt_pos + n == prompt.size();
    p.sample = last && !forcing(s->job->request, run);
    plan.push_back(p);
    budget -= int64_t(n);
  }
  return plan;
}

void Engine::apply(Slot& s, const Planned& p, StepResult& r) {
  Running& run = *s.run;
  const GenerationRequest& rq = s.job->request;
  if (p.prompt_piece) {
    s.consumed.insert(s.consumed.end(), rq.prompt.begin() + std::ptrdiff_t(run.prompt_pos),
                      rq.prompt.begin() + std::ptrdiff_t(run.prompt_pos + p.n));
    run.prompt_pos += p.n;
    if (run.mark < run.marks.size() && run.prompt_pos == run.marks[run.mark]) {
      store_snapshot(*s.state, s.consumed);
      ++run.mark;
    }
    if (run.prompt_pos < rq.prompt.size()) return;
    // The last piece: the first token.
    run.res.prefill_s = seconds_since(run.admitted);
    metrics_.time_to_first_token.observe(run.res.prefill_s);
    store_snapshot(*s.state, s.consumed);  // the snapshot "after the prompt"
    run.decoding = true;
    run.decode_start = run.last_token_at = Clock::now();
  } else {
    s.consumed.push_back(run.pending);
  }
  if (p.sample)
    take(s, r.token, r.logprob, std::move(r.top));
  else
    take(s, rq.think_close[run.forced++], 0.f, {});
}

// The sequence takes `token` (sampled or forced): stream it, then decide whether it goes on.
void Engine::take(Slot& s, int32_t token, float logprob,
                  std::vector<std::pair<int32_t, float>> top) {
  Running& run = *s.run;
  GenerationRequest& rq = s.job->request;
  run.res.tokens.push_back(token);
  metrics_.generated_tokens_total++;
  if (run.res.tokens.size() > 1) {
    const auto now = Clock::now();
    metrics_.time_per_output_token.observe(
        std::chrono::duration<double>(now - run.last_token_at).count());
    run.last_token_at = now;
  }
  if (rq.constraint) rq.constraint->accept(token);
  // The thinking ends with a sampled think_end_id, or once every think_close id was forced (the
  // close usually starts with think_end_id itself: that one must not stop the forcing).
  if (run.thinking && ((run.forced == 0 && token == rq.think_end_id) ||
                       (run.forced > 0 && run.forced == rq.think_close.size())))
    run.thinking = false;
  const bool stop_id =
      std::find(rq.stop_ids.begin(), rq.stop_ids.end(), token) != rq.stop_ids.end();
  TokenEvent ev;
  ev.id = token;
  ev.logprob = logprob;
  ev.top_logprobs = std::move(top);
  if (!stop_id) ev.text = run.stops.push(run.decoder.push(token));
  run.res.text += ev.text;
  if (rq.on_token && !rq.on_token(ev)) *rq.cancelled = true;
  if (stop_id || run.stops.stopped()) return finish(s, FinishReason::Stop);
  if (rq.cancelled->load()) return finish(s, FinishReason::Cancelled);
  if (int64_t(run.res.tokens.size()) >= rq.max_tokens ||
      s.state->position() + 1 >= options_.context_size)
    return finish(s, FinishReason::Length);
  run.pending = token;
}

void Engine::store_snapshot(const SequenceState& state, const std::vector<int32_t>& tokens) {
  if (!cache_.enabled()) return;
  const auto t0 = Clock::now();
  cache_.store(state, tokens);
  metrics_.snapshot_seconds.observe(seconds_since(t0));
}

// The request leaves its slot. The slot keeps its state and the ids it consumed (a next prompt
// that extends them continues it), except after a failure.
void Engine::finish(Slot& s, FinishReason reason, const std::string& error) {
  Running& run = *s.run;
  GenerationRequest& rq = s.job->request;
  GenerationResult res = std::move(run.res);
  res.finish = reason;
  res.error = error;
  if (run.decoding)
    res.decode_s = seconds_since(run.decode_start);
  else
    res.prefill_s = seconds_since(run.admitted);
  // Text still held back (incomplete UTF-8 at a length cut, a partial stop string).
  if (reason == FinishReason::Stop || reason == FinishReason::Length) {
    TokenEvent tail;
    tail.text = run.stops.stopped() ? "" : run.stops.push(run.decoder.flush()) + run.stops.flush();
    if (!tail.text.empty()) {
      res.text += tail.text;
      try {
        if (rq.on_token) rq.on_token(tail);
      } catch (const std::exception&) {
        // The consumer failed on the last text; the result still carries it.
      }
    }
  }
  // The snapshot "after the answer": the prompt and every generated token but the last.
  if (s.state && run.decoding && reason != FinishReason::Cancelled &&
      reason != FinishReason::Error) {
    try {
      store_snapshot(*s.state, s.consumed);
    } catch (const std::exception&) {
      // No snapshot (out of memory for the copy): the answer stands.
    }
  }
  s.last_used = ++admissions_;
  s.run.reset();
  running_--;
  complete(std::move(s.job), std::move(res));
}

}  // namespace lilac
