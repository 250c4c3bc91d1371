// Counters and latency histograms for /metrics (Prometheus text format).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace lilac {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus lines for metric `name` (cumulative buckets, _sum, _count).
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> requests_failed{0};
  std::atomic<uint64_t> requests_cancelled{0};
  std::atomic<uint64_t> requests_rejected{0};  // queue full
  std::atomic<uint64_t> prompt_tokens_total{0};
  std::atomic<uint64_t> cached_prompt_tokens_total{0};
  std::atomic<uint64_t> generated_tokens_total{0};
  Histogram time_to_first_token{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram time_per_output_token{{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1}};
  Histogram queue_time{{0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60}};
  // Sequences that took a token, per step in which any did (continuous batching).
  Histogram batch_size{{1, 2, 4, 8, 16, 32, 64, 128}};
  std::atomic<uint64_t> steps_total{0};  // batched steps run (decode and prompt pieces)
  // Where a step's time goes: the backend's step_batch call (device work and the backend's own
  // host work), the engine's time between the end of one step and the start of the next while
  // sequences are running (planning, streaming the tokens, snapshots: the host overhead a
  // client sees on top of the step), and each prompt-reuse snapshot's copy.
  Histogram step_seconds{{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5}};
  Histogram step_gap_seconds{
      {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.1}};
  Histogram snapshot_seconds{{1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1}};
  int slots = 1;  // sequence slots (--parallel)

  // The whole exposition, with the current queue length and running sequences as gauges.
  std::string render(size_t queue_length, size_t running) const;
};

}  // namespace lilac
