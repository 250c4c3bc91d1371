// The decode schedule's timing model (decode_schedule_model.h).
#include "model/decode_schedule_model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "util/error.h"

namespace lilac {
namespace {

// One block's share of DRAM over time: busy intervals, sorted and disjoint. place() streams d
// microseconds of bytes from s0 on into the earliest gaps (a fill may be split around the other
// fill's bytes) and returns when the last byte arrives.
class Share {
 public:
  double place(double s0, double d) {
    double t = s0;
    size_t i = 0;
    while (i < busy_.size() && busy_[i].second <= t) ++i;
    while (d > 0) {
      if (i < busy_.size() && busy_[i].first <= t) {  // inside a busy interval: skip it
        t = busy_[i].second;
        ++i;
        continue;
      }
      const double gap_end = i < busy_.size() ? busy_[i].first : INFINITY;
      const double take = std::min(d, gap_end - t);
      busy_.insert(busy_.begin() + std::ptrdiff_t(i), {t, t + take});
      ++i;
      t += take;
      d -= take;
    }
    merge();
    return t;
  }

 private:
  void merge() {
    size_t o = 0;
    for (size_t i = 1; i < busy_.size(); ++i) {
      if (busy_[i].first <= busy_[o].second + 1e-9)
        busy_[o].second = std::max(busy_[o].second, busy_[i].second);
      else
        busy_[++o] = busy_[i];
    }
    if (!busy_.empty()) busy_.resize(o + 1);
  }
  std::vector<std::pair<double, double>> busy_;
};

}  // namespace

std::string SchedulePrediction::summary() const {
  return fmt::format(
      "step {:.1f} us ({:.1f} MB, floor {:.1f} us = {:.0f}%, busiest block {:.1f} us, "
      "{} active slots)",
      step_us, dram_bytes / 1e6, floor_us, 100.0 * floor_us / step_us, busiest_block_us,
      active_slots);
}

std::string SchedulePrediction::critical_path() const {
  std::string out;
  for (size_t op = 0; op < critical_us.size(); ++op)
    if (critical_us[op] >= 0.05)
      out += fmt::format("{}{} {:.1f}", out.empty() ? "" : ", ", task_op_name(TaskOp(op)),
                         critical_us[op]);
  return out;
}

SchedulePrediction predict_decode_step(const ModelConfig& c, const DecodeSchedule& s,
                                       const ScheduleTiming& t) {
  if (t.dram_bytes_per_us <= 0 || t.sync_us < 0 || t.task_us < 0 || t.epilogue_us < 0 ||
      t.ring_bytes <= 0 || t.flops_per_us <= 0)
    fail("decode schedule model: bad timing parameters");
  const int blocks = int(s.block_tasks.size());
  const double rate = t.dram_bytes_per_us / blocks;  // one block's share
  SchedulePrediction p;
  p.active_slots = t.active_slots >= 0 ? t.active_slots : expected_active_slots(c, s.options.rows);
  p.active_slots = std::min(p.active_slots, s.slots);

  const size_t n = s.tasks.size();
  std::vector<double> end(n, 0), bytes(n, 0);
  std::vector<double> counter_done(s.counters.size(), 0);
  std::vector<double> topk_done(size_t(c.layers), 0);
  // Per block: position in its list, and its tasks' cumulative bytes (for the ring).
  std::vector<int32_t> block_of(n, -1), index_in_block(n, -1);
  for (int b = 0; b < blocks; ++b)
    for (size_t m = 0; m < s.block_tasks[size_t(b)].size(); ++m) {
      block_of[size_t(s.block_tasks[size_t(b)][m])] = b;
      index_in_block[size_t(s.block_tasks[size_t(b)][m])] = int32_t(m);
    }
  std::vector<std::vector<double>> cum(
      static_cast<size_t>(blocks));  // cum[b][m]: bytes of tasks 0..m-1
  std::vector<double> ahead_end(size_t(blocks), 0), routed_end(size_t(blocks), 0);
  std::vector<double> free_at(size_t(blocks), 0);
  std::vector<Share> share(static_cast<size_t>(blocks));
  std::vector<double> block_bytes(size_t(blocks), 0);
  // The critical path: the task each task's start waited for (the block's previous task, or
  // the last producer of its latest counter), -1 for none.
  std::vector<int64_t> pred(n, -1), block_last(size_t(blocks), -1);
  std::vector<int64_t> counter_last(s.counters.size(), -1);

  for (size_t i = 0; i < n; ++i) {
    const DecodeTask& task = s.tasks[i];
    const int b = block_of[i];
    if (b < 0) fail("decode schedule model: task {} is on no block", i);
    // This step's bytes of the task: its weights known ahead, and the routed experts' part.
    const double ahead = double(task.ahead_bytes);
    const double routed = double(task.routed_bytes_per_slot) * p.active_slots;
    const double by = ahead + routed;
    bytes[i] = by;
    std::vector<double>& cb = cum[size_t(b)];
    const size_t m = size_t(index_in_block[i]);
    if (cb.empty()) cb.push_back(0);
    cb.push_back(cb.back() + by);  // cb[m + 1]
    block_bytes[size_t(b)] += by;
    // The ring is taken in list order: this task's bytes may start once the tasks before the
    // first one that still fits (with this one) have ended.
    double ring_free = 0;
    if (by > 0) {
      size_t first = m;
      while (first > 0 && cb[m + 1] - cb[first - 1] <= t.ring_bytes) --first;
      if (first > 0) ring_free = end[size_t(s.block_tasks[size_t(b)][first - 1])];
    }
    // Two fills, each in list order: the bytes known ahead, and the routed bytes from the
    // layer's top-k on (so a block does not stop streaming its next tasks' weights while the
    // top-k is chosen), sharing the block's share of DRAM bandwidth (Share).
    double ready = 0;
    int64_t ready_pred = -1;
    for (uint32_t w = task.wait_begin; w < task.wait_begin + task.wait_count; ++w) {
      const auto cw = size_t(s.waits[w].counter);
      if (counter_done[cw] + t.sync_us >= ready) {
        ready = counter_done[cw] + t.sync_us;
        ready_pred = counter_last[cw];
      }
    }
    if (!t.stream_ahead) ring_free = std::max(ring_free, std::max(ready, free_at[size_t(b)]));
    double arrived = 0;
    if (ahead > 0) {
      ahead_end[size_t(b)] =
          share[size_t(b)].place(std::max(ahead_end[size_t(b)], ring_free), ahead / rate);
      arrived = ahead_end[size_t(b)];
    }
    if (routed > 0) {
      double from = std::max(routed_end[size_t(b)], ring_free);
      if (task.layer >= 0) from = std::max(from, topk_done[size_t(task.layer)] + t.sync_us);
      routed_end[size_t(b)] = share[size_t(b)].place(from, routed / rate);
      arrived = std::max(arrived, routed_end[size_t(b)]);
    }

    const double start = std::max(free_at[size_t(b)], ready);
    end[i] = std::max(start + t.task_us + task.flops / t.flops_per_us,
                      by > 0 ? arrived + t.epilogue_us : 0.0);
    pred[i] = ready >= free_at[size_t(b)] ? ready_pred : block_last[size_t(b)];
    free_at[size_t(b)] = end[i];
    block_last[size_t(b)] = int64_t(i);
    double& done = counter_done[size_t(task.signal)];
    if (end[i] >= done) counter_last[size_t(task.signal)] = int64_t(i);
    done = std::max(done, end[i]);
    if (task.op == TaskOp::TopK && task.layer >= 0)
      topk_done[size_t(task.layer)] = std::max(topk_done[size_t(task.layer)], end[i]);
    p.step_us = std::max(p.step_us, end[i]);
    p.dram_bytes += by;
  }
  p.floor_us = p.dram_bytes / t.dram_bytes_per_us;
  // Walk the critical path back from the last task to end, each task's share from its
  // predecessor's end to its own (waiting, the counter's latency, its bytes, its own chain).
  int64_t last = -1;
  for (size_t i = 0; i < n; ++i)
    if (last < 0 || end[i] > end[size_t(last)]) last = int64_t(i);
  p.critical_us.assign(size_t(TaskOp::Sample) + 1, 0.0);
  for (int64_t i = last; i >= 0; i = pred[size_t(i)])
    p.critical_us[size_t(s.tasks[size_t(i)].op)] +=
        end[size_t(i)] - (pred[size_t(i)] >= 0 ? end[size_t(pred[size_t(i)])] : 0.0);
  for (double bb : block_bytes) p.busiest_block_us = std::max(p.busiest_block_us, bb / rate);
  return p;
}

}  // namespace lilac
