// The decode schedule's checks (decode_schedule.h): coverage, no deadlock, no race.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "model/decode_schedule.h"

namespace lilac {
namespace {

using Problems = std::vector<std::string>;

// The units [0, n) of one op of one layer (one KV head or GDN head), each covered exactly once.
void check_cover(std::vector<std::pair<int64_t, int64_t>> spans, int64_t n, const std::string& what,
                 Problems& out) {
  std::sort(spans.begin(), spans.end());
  int64_t next = 0;
  for (auto [b, e] : spans) {
    if (b != next || e <= b) {
      out.push_back(fmt::format("{}: [{}, {}) after {} (of {})", what, b, e, next, n));
      return;
    }
    next = e;
  }
  if (next != n) out.push_back(fmt::format("{}: covers {} of {}", what, next, n));
}

void check_coverage(const ModelConfig& c, const DecodeSchedule& s, Problems& out) {
  // (op, layer, head or KV head and slice) -> spans
  std::map<std::tuple<TaskOp, int32_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> spans;
  for (const DecodeTask& t : s.tasks) {
    if (t.op == TaskOp::AttnSplit)  // per (KV head, slice): the rows
      spans[{t.op, t.layer, t.begin * 1000000 + t.end}].push_back({t.row_begin, t.row_end});
    else if (t.op == TaskOp::GdnHead)  // per head: the rows
      spans[{t.op, t.layer, t.begin}].push_back({t.row_begin, t.row_end});
    else
      spans[{t.op, t.layer, -1}].push_back({t.begin, t.end});
  }
  const int64_t H = c.hidden, B = s.options.rows;
  auto expect = [&](TaskOp op, int32_t layer, int64_t key, int64_t n) {
    const std::string what = fmt::format("{} of layer {} ({})", task_op_name(op), layer, key);
    auto it = spans.find({op, layer, key});
    if (it == spans.end()) return out.push_back(what + ": no task");
    check_cover(std::move(it->second), n, what, out);
    spans.erase(it);
  };
  expect(TaskOp::Embed, -1, -1, B);
  for (int32_t l = 0; l < int32_t(c.layers); ++l) {
    if (c.layer_types[size_t(l)] == LayerType::GatedDeltaNet) {
      expect(TaskOp::InProj, l, -1, int64_t(s.in_proj_row.size()));
      for (int64_t hv = 0; hv < c.gdn_value_heads; ++hv) expect(TaskOp::GdnHead, l, hv, B);
    } else {
      expect(TaskOp::QkvProj, l, -1, c.q_proj_rows() + 2 * c.kv_dim());
      const int64_t tokens = s.options.context + 1, n = s.options.attn_split_tokens;
      for (int64_t g = 0; g < c.kv_heads; ++g)
        for (int64_t sl = 0; sl < (tokens + n - 1) / n; ++sl)
          expect(TaskOp::AttnSplit, l, g * 1000000 + sl, B);
      expect(TaskOp::AttnCombine, l, -1, c.kv_heads);
    }
    expect(TaskOp::OutProj, l, -1, H);
    expect(TaskOp::Router, l, -1, c.experts + 1);
    expect(TaskOp::TopK, l, -1, B);
    expect(TaskOp::SharedGateUp, l, -1, c.shared_intermediate);
    expect(TaskOp::ExpertGateUp, l, -1,
           s.options.gate_up_parts > 0 ? s.options.gate_up_parts : s.options.blocks);
    expect(TaskOp::ExpertDown, l, -1, H);
  }
  expect(TaskOp::LmHead, -1, -1, c.vocab);
  expect(TaskOp::Sample, -1, -1, B);
  for (auto& [key, v] : spans)
    out.push_back(fmt::format("{} of layer {}: {} unexpected tasks", task_op_name(std::get<0>(key)),
                              std::get<1>(key), v.size()));
  // in_proj's row order is a permutation of its rows.
  std::vector<int64_t> rows = s.in_proj_row;
  std::sort(rows.begin(), rows.end());
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] != int64_t(i)) {
      out.push_back(fmt::format("in_proj row order: not a permutation at {}", i));
      break;
    }
}

// No deadlock on resident blocks: producers of every awaited counter come before the waiter in
// the global order, each wait is the counter's full producer count, every block's list is
// increasing, and every task is on exactly one block.
void check_order(const DecodeSchedule& s, Problems& out) {
  const size_t n = s.tasks.size();
  std::vector<int32_t> producers(s.counters.size(), 0);
  std::vector<int64_t> last_producer(s.counters.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t c = s.tasks[i].signal;
    if (c < 0 || size_t(c) >= s.counters.size())
      return out.push_back(fmt::format("task {} signals counter {}", i, c));
    ++producers[size_t(c)];
    last_producer[size_t(c)] = int64_t(i);
  }
  for (size_t c = 0; c < s.counters.size(); ++c)
    if (producers[c] != s.counters[c].producers)
      out.push_back(fmt::format("counter '{}': {} producers, {} signal it", s.counters[c].name,
                                s.counters[c].producers, producers[c]));
  for (size_t i = 0; i < n; ++i) {
    const DecodeTask& t = s.tasks[i];
    for (uint32_t w = t.wait_begin; w < t.wait_begin + t.wait_count; ++w) {
      const CounterWait& cw = s.waits[w];
      const auto ci = size_t(cw.counter);
      if (ci >= s.counters.size() || cw.count != producers[ci] || last_producer[ci] >= int64_t(i))
        out.push_back(fmt::format(
            "task {} ({} of layer {}) waits on '{}' for {} of {} producers, "
            "the last at {}",
            i, task_op_name(t.op), t.layer, ci < s.counters.size() ? s.counters[ci].name : "?",
            cw.count, ci < s.counters.size() ? producers[ci] : 0,
            ci < s.counters.size() ? last_producer[ci] : -1));
    }
  }
  std::vector<int> seen(n, 0);
  for (size_t b = 0; b < s.block_tasks.size(); ++b) {
    int64_t prev = -1;
    for (int32_t i : s.block_tasks[b]) {
      if (i <= prev || size_t(i) >= n) {
        out.push_back(fmt::format("block {}: task {} after {}", b, i, prev));
        break;
      }
      ++seen[size_t(i)];
      prev = i;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (seen[i] != 1) return out.push_back(fmt::format("task {} is on {} blocks", i, seen[i]));
}

// No race: for two tasks touching overlapping columns of a buffer, one of them writing, one
// happens before the other through the counters. before[t]: the counters complete before t
// starts (its waits, and transitively theirs), as bitsets over the counters.
void check_races(const DecodeSchedule& s, Problems& out) {
  const size_t nc = s.counters.size(), words = (nc + 63) / 64;
  std::vector<uint64_t> anc(nc * words, 0);  // per counter: counters complete before it starts
  std::vector<uint64_t> before(s.tasks.size() * words, 0);
  for (size_t i = 0; i < s.tasks.size(); ++i) {
    const DecodeTask& t = s.tasks[i];
    uint64_t* bt = &before[i * words];
    for (uint32_t w = t.wait_begin; w < t.wait_begin + t.wait_count; ++w) {
      const auto c = size_t(s.waits[w].counter);
      bt[c / 64] |= uint64_t(1) << (c % 64);
      for (size_t x = 0; x < words; ++x) bt[x] |= anc[c * words + x];
    }
    uint64_t* ac = &anc[size_t(t.signal) * words];
    for (size_t x = 0; x < words; ++x) ac[x] |= bt[x];
  }
  auto after = [&](size_t later, size_t earlier) {
    const auto c = size_t(s.tasks[earlier].signal);
    return (before[later * words + c / 64] >> (c % 64)) & 1;
  };
  // Ranges deduplicated per (buffer, begin, end, write, counter, waits): one task stands for
  // all that share them.
  struct Use {
    int64_t begin, end;
    bool write;
    int32_t row_begin, row_end;
    int32_t counter;
    size_t task;
  };
  std::vector<std::vector<Use>> uses(kBufferCount);
  std::set<std::tuple<int, int64_t, int64_t, bool, int32_t, int32_t, int32_t, std::vector<int32_t>>>
      seen;
  for (size_t i = 0; i < s.tasks.size(); ++i) {
    const DecodeTask& t = s.tasks[i];
    std::vector<int32_t> waits;
    for (uint32_t w = t.wait_begin; w < t.wait_begin + t.wait_count; ++w)
      waits.push_back(s.waits[w].counter);
    for (uint32_t r = t.range_begin; r < t.range_begin + t.range_count; ++r) {
      const BufferRange& br = s.ranges[r];
      if (seen.insert({int(br.buffer), br.begin, br.end, br.write, br.row_begin, br.row_end,
                       t.signal, waits})
              .second)
        uses[size_t(br.buffer)].push_back(
            {br.begin, br.end, br.write, br.row_begin, br.row_end, t.signal, i});
    }
  }
  size_t reported = 0;
  for (int buf = 0; buf < kBufferCount; ++buf) {
    std::vector<Use>& u = uses[size_t(buf)];
    std::sort(u.begin(), u.end(), [](const Use& a, const Use& b) { return a.begin < b.begin; });
    for (size_t a = 0; a < u.size(); ++a)
      for (size_t b = a + 1; b < u.size() && u[b].begin < u[a].end; ++b) {
        if (!u[a].write && !u[b].write) continue;
        if (u[a].task == u[b].task) continue;
        if (u[a].row_end <= u[b].row_begin || u[b].row_end <= u[a].row_begin) continue;
        if (u[a].counter != u[b].counter &&
            (after(u[a].task, u[b].task) || after(u[b].task, u[a].task)))
          continue;
        if (reported++ < 8)
          out.push_back(fmt::format("race on {} [{}, {}) / [{}, {}): '{}' and '{}' are not ordered",
                                    buffer_name(Buffer(buf)), u[a].begin, u[a].end, u[b].begin,
                                    u[b].end, s.counters[size_t(u[a].counter)].name,
                                    s.counters[size_t(u[b].counter)].name));
      }
  }
}

}  // namespace

std::vector<std::string> check_decode_schedule(const ModelConfig& c, const DecodeSchedule& s) {
  Problems out;
  check_coverage(c, s, out);
  check_order(s, out);
  if (out.empty()) check_races(s, out);
  return out;
}

}  // namespace lilac
