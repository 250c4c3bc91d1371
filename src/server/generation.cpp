#include "server/generation.h"

#include <thread>

namespace lilac::server {

namespace {

// Wakes the consumers of token events off the engine thread. A consumer waits on its channel's
// condition variable between tokens, so every token of a step costs a futex wake (a system call
// and a scheduler IPI, several microseconds) that the engine worker would otherwise pay between
// two steps, once per running sequence (issue #11: perf put ~30% of the serving path's host time
// there). The worker pushes the event under the channel's mutex and posts the condition variable
// here; this thread does the wakes, so the worker pays at most one wake per burst of tokens. The
// event is pushed before the post, so a consumer never misses it.
class Waker {
 public:
  // Never destroyed: engine threads may post until the process ends.
  static Waker& instance() {
    static Waker* waker = new Waker;
    return *waker;
  }
  void post(std::shared_ptr<std::condition_variable> cv) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(cv));
      wake = sleeping_;
      sleeping_ = false;
    }
    if (wake) cv_.notify_one();
  }

 private:
  Waker() {
    std::thread([this] { run(); }).detach();
  }
  void run() {
    std::vector<std::shared_ptr<std::condition_variable>> batch;
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        sleeping_ = true;
        cv_.wait(lock, [&] { return !sleeping_; });
        continue;
      }
      batch.swap(pending_);
      lock.unlock();
      for (auto& c : batch) c->notify_one();
      batch.clear();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<std::condition_variable>> pending_;
  bool sleeping_ = false;
};

}  // namespace

Generation::Generation(Engine& engine, GenerationRequest request, ParseOptions parse)
    : parse_(std::move(parse)) {
  cancelled_ = request.cancelled;
  std::weak_ptr<Channel> weak = channel_;
  request.on_token = [weak](const TokenEvent& ev) {
    auto ch = weak.lock();
    if (!ch) return false;  // the consumer is gone
    {
      std::lock_guard lock(ch->mutex);
      ch->events.push_back(ev);
    }
    Waker::instance().post(std::shared_ptr<std::condition_variable>(ch, &ch->cv));
    return true;
  };
  // Without it, next() would notice the end only at its poll timeout (100 ms after the last
  // token: every response ended that much late, measured in the s9 HTTP runs).
  request.on_done = [weak] {
    auto ch = weak.lock();
    if (!ch) return;
    {
      std::lock_guard lock(ch->mutex);
      ch->done = true;
    }
    Waker::instance().post(std::shared_ptr<std::condition_variable>(ch, &ch->cv));
  };
  if (parse_.chat) parser_.emplace(parse_.in_reasoning, parse_.tools, parse_.stream_calls);
  future_ = engine.submit(std::move(request));
}

Generation::~Generation() {
  if (!done_) *cancelled_ = true;
}

void Generation::absorb(const ParsedDelta& d, GenerationChunk& out) {
  out.reasoning += d.reasoning;
  out.content += d.content;
  // A call's CallStart comes before its other pieces and its tool_calls entry: it decides the
  // call's index, or that it is dropped (beyond max_tool_calls).
  for (const ParsedPiece& p : d.pieces) {
    if (p.index < 0) {
      if (!out.pieces.empty() && out.pieces.back().kind == p.kind)
        out.pieces.back().text += p.text;
      else
        out.pieces.push_back(p);
      continue;
    }
    if (p.kind == ParsedPiece::Kind::CallStart) {
      const bool keep = parse_.max_tool_calls < 0 || calls_seen_ < parse_.max_tool_calls;
      call_index_[p.index] = keep ? calls_seen_++ : -1;
    }
    auto at = call_index_.find(p.index);
    if (at == call_index_.end() || at->second < 0) continue;
    out.pieces.push_back(p);
    out.pieces.back().index = at->second;
  }
  for (const auto& call : d.tool_calls) {
    auto at = call_index_.find(call.first);
    if (at != call_index_.end() && at->second >= 0)
      out.tool_calls.push_back({at->second, call.second});
  }
}

GenerationChunk Generation::next(std::chrono::milliseconds timeout) {
  GenerationChunk out;
  if (done_) {
    out.finished = true;
    return out;
  }
  std::deque<TokenEvent> events;
  bool finished = false;
  {
    std::unique_lock lock(channel_->mutex);
    // The engine pushes every event, then completes the future, then sets `done`: once done is
    // seen, the events taken here are the last ones and the future is ready.
    if (channel_->events.empty() && !channel_->done) {
      channel_->cv.wait_for(lock, timeout,
                            [&] { return !channel_->events.empty() || channel_->done; });
      if (channel_->events.empty() && !channel_->done) {  // a future made ready without on_done
        lock.unlock();
        finished = future_.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready;
        lock.lock();
      }
    }
    finished = finished || channel_->done;
    events.swap(channel_->events);
  }
  for (auto& ev : events) {
    if (ev.id >= 0) out.logprobs.push_back({ev.id, ev.logprob, std::move(ev.top_logprobs)});
    if (ev.text.empty()) continue;
    if (parser_)
      absorb(parser_->push(ev.text), out);
    else
      out.content += ev.text;
  }
  if (finished) {
    result_ = future_.get();
    if (parser_) absorb(parser_->finish(), out);
    done_ = true;
    out.finished = true;
  }
  return out;
}

bool prompt_opens_reasoning(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  return prompt.find("</think>", open) == std::string::npos;
}

size_t last_turn_start(const std::vector<int32_t>& prompt, const Tokenizer& tokenizer) {
  auto im_start = tokenizer.token_id("<|im_start|>");
  if (!im_start) return 0;
  for (size_t i = prompt.size(); i-- > 0;)
    if (prompt[i] == *im_start) return i;
  return 0;
}

}  // namespace lilac::server
