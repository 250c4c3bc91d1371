#include "engine/metrics.h"

#include <fmt/format.h>

namespace lilac {

void Histogram::observe(double v) {
  std::lock_guard lock(mutex_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  n_++;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  std::string s = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    s += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  s += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_,
                   name, n_);
  return s;
}

std::string Metrics::render(size_t queue_length, size_t running) const {
  std::string s;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    s += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  counter("lilac_requests_total", "Generation requests completed or failed", requests_total.load());
  counter("lilac_requests_failed_total", "Requests that ended in an error", requests_failed.load());
  counter("lilac_requests_cancelled_total", "Requests cancelled (client gone, shutdown)",
          requests_cancelled.load());
  counter("lilac_requests_rejected_total", "Requests refused because the queue was full",
          requests_rejected.load());
  counter("lilac_prompt_tokens_total", "Prompt tokens processed", prompt_tokens_total.load());
  counter("lilac_cached_prompt_tokens_total", "Prompt tokens reused from snapshots",
          cached_prompt_tokens_total.load());
  counter("lilac_generation_tokens_total", "Tokens generated", generated_tokens_total.load());
  counter("lilac_steps_total", "Batched steps run (decode tokens and prompt pieces)",
          steps_total.load());
  s += fmt::format(
      "# HELP lilac_queue_length Requests waiting\n# TYPE lilac_queue_length "
      "gauge\nlilac_queue_length {}\n",
      queue_length);
  s += fmt::format(
      "# HELP lilac_running Sequences running (admitted into a slot)\n# TYPE lilac_running "
      "gauge\nlilac_running {}\n",
      running);
  s += fmt::format(
      "# HELP lilac_slots Sequence slots (--parallel)\n# TYPE lilac_slots gauge\nlilac_slots "
      "{}\n",
      slots);
  s += time_to_first_token.render("lilac_time_to_first_token_seconds",
                                  "Time from start of processing to the first token");
  s += time_per_output_token.render("lilac_time_per_output_token_seconds",
                                    "Time between generated tokens");
  s += queue_time.render("lilac_queue_time_seconds", "Time requests waited in the queue");
  s += batch_size.render("lilac_batch_size", "Sequences that took a token per step (decode steps)");
  s += step_seconds.render("lilac_step_seconds", "Time of the backend's batched step call");
  s += step_gap_seconds.render(
      "lilac_step_gap_seconds",
      "Engine time between consecutive steps while sequences run (host overhead per step)");
  s += snapshot_seconds.render("lilac_snapshot_seconds", "Time to store a prompt-reuse snapshot");
  return s;
}

}  // namespace lilac
