// The decode step's static schedule (decode_schedule.h): the builder (its checks are in
// decode_schedule_check.cpp, its timing model in decode_schedule_model.cpp).
#include "model/decode_schedule.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "util/error.h"

namespace lilac {

const char* task_op_name(TaskOp op) {
  switch (op) {
    case TaskOp::Embed:
      return "embed";
    case TaskOp::InProj:
      return "in_proj";
    case TaskOp::GdnHead:
      return "gdn_head";
    case TaskOp::QkvProj:
      return "qkv_proj";
    case TaskOp::AttnSplit:
      return "attn_split";
    case TaskOp::AttnCombine:
      return "attn_combine";
    case TaskOp::OutProj:
      return "out_proj";
    case TaskOp::Router:
      return "router";
    case TaskOp::TopK:
      return "top_k";
    case TaskOp::SharedGateUp:
      return "shared_gate_up";
    case TaskOp::ExpertGateUp:
      return "expert_gate_up";
    case TaskOp::ExpertDown:
      return "expert_down";
    case TaskOp::LmHead:
      return "lm_head";
    case TaskOp::Sample:
      return "sample";
  }
  return "?";
}

const char* buffer_name(Buffer b) {
  static const char* const names[kBufferCount] = {
      "h",     "x",   "proj",       "mix",    "attn_partial", "router_logits",
      "top_k", "act", "act_shared", "logits", "token"};
  return names[int(b)];
}

namespace {

// Appends tasks in the global order, with their waits and buffer ranges, and assigns each to a
// block (place()): deterministic, and every block's list follows the global order.
class Builder {
 public:
  static constexpr size_t kMaxTasks = 4'000'000;  // ~0.5 GB of tasks and ranges

  Builder(DecodeSchedule& s, int active)
      : s_(s), load_(size_t(s.options.blocks), 0.0), op_load_(load_), active_(active) {
    s_.block_tasks.assign(size_t(s.options.blocks), {});
  }

  int32_t counter(std::string name) {
    s_.counters.push_back({std::move(name), 0});
    return int32_t(s_.counters.size() - 1);
  }

  // Waits of the next tasks (the full producer counts of these counters, as they stand now:
  // every producer of a counter is added before its first waiter).
  void waits(std::initializer_list<int32_t> counters) { waits_.assign(counters); }
  void waits(const std::vector<int32_t>& counters) { waits_ = counters; }

  DecodeTask& add(TaskOp op, int32_t layer, int64_t begin, int64_t end, int32_t signal,
                  std::initializer_list<BufferRange> ranges) {
    if (s_.tasks.size() >= kMaxTasks)
      fail(
          "decode schedule: more than {} tasks ({} rows, context {}): fewer rows, a shorter "
          "context or longer attention slices",
          kMaxTasks, s_.options.rows, s_.options.context);
    DecodeTask t{};
    t.op = op;
    t.layer = layer;
    t.begin = begin;
    t.end = end;
    t.row_begin = 0;
    t.row_end = s_.options.rows;
    t.signal = signal;
    t.wait_begin = uint32_t(s_.waits.size());
    for (int32_t c : waits_) s_.waits.push_back({c, s_.counters[size_t(c)].producers});
    t.wait_count = uint32_t(waits_.size());
    t.range_begin = uint32_t(s_.ranges.size());
    s_.ranges.insert(s_.ranges.end(), ranges);
    t.range_count = uint32_t(ranges.size());
    ++s_.counters[size_t(signal)].producers;
    s_.tasks.push_back(t);
    return s_.tasks.back();
  }

  // Adds a buffer range to task i (its ranges must be the last ones added: they stay contiguous).
  void also(size_t i, BufferRange r) {
    DecodeTask& t = s_.tasks[i];
    if (t.range_begin + t.range_count != s_.ranges.size()) {  // move its ranges to the end
      const std::vector<BufferRange> mine(s_.ranges.begin() + t.range_begin,
                                          s_.ranges.begin() + t.range_begin + t.range_count);
      t.range_begin = uint32_t(s_.ranges.size());
      s_.ranges.insert(s_.ranges.end(), mine.begin(), mine.end());
    }
    s_.ranges.push_back(r);
    ++t.range_count;
  }

  // Places every task added since the last call (their bytes are final by now). The ops are
  // separated by waits, so each op's tasks are spread evenly by themselves: a task goes to the
  // block with the least work of its op so far, then the least work overall, then the lowest
  // index.
  void place() {
    constexpr double kTaskFixedBytes = 32768;  // ~1 us of one SM's share of DRAM bandwidth
    for (; placed_ < s_.tasks.size(); ++placed_) {
      const DecodeTask& t = s_.tasks[placed_];
      if (placed_ == 0 || t.op != s_.tasks[placed_ - 1].op ||
          t.layer != s_.tasks[placed_ - 1].layer)
        std::fill(op_load_.begin(), op_load_.end(), 0.0);
      size_t b = 0;
      for (size_t j = 1; j < load_.size(); ++j)
        if (op_load_[j] < op_load_[b] || (op_load_[j] == op_load_[b] && load_[j] < load_[b])) b = j;
      // Routed work at the expected distinct experts.
      const double routed = double(t.routed_bytes_per_slot) * active_;
      const double cost = double(t.ahead_bytes) + routed + kTaskFixedBytes;
      load_[b] += cost;
      op_load_[b] += cost;
      s_.block_tasks[b].push_back(int32_t(placed_));
    }
  }

 private:
  DecodeSchedule& s_;
  std::vector<double> load_, op_load_;
  int active_;
  std::vector<int32_t> waits_;
  size_t placed_ = 0;
};

int64_t bytes_of(int64_t rows, int64_t cols, double bytes_per_value) {
  return int64_t(double(rows) * double(cols) * bytes_per_value + 0.5);
}

// Tiles [0, n) in steps of `tile`, calling f(begin, end).
template <class F>
void tiles(int64_t n, int64_t tile, F f) {
  for (int64_t b = 0; b < n; b += tile) f(b, std::min(n, b + tile));
}

}  // namespace

int expected_active_slots(const ModelConfig& c, int rows) {
  const double E = double(c.experts), k = double(c.experts_per_token);
  const int n = int(std::lround(E * (1.0 - std::pow(1.0 - k / E, double(rows)))));
  return std::clamp(n, 0, int(std::min<int64_t>(c.experts, c.experts_per_token * rows)));
}

DecodeSchedule build_decode_schedule(const ModelConfig& c, const ScheduleOptions& o) {
  if (o.rows < 1 || o.rows_per_sequence < 1 || o.rows % o.rows_per_sequence != 0 || o.blocks < 1 ||
      o.context < 0 || o.proj_tile_rows < 0 || o.lm_head_tile_rows < 0 || o.gate_up_parts < 0 ||
      o.shared_tile < 0 || o.down_tile_rows < 0 || o.attn_split_tokens < 1)
    fail(
        "decode schedule: bad options (rows {} in sequences of {}, blocks {}, context {}, tiles {} "
        "/ "
        "{} / {} / {} / {} / {})",
        o.rows, o.rows_per_sequence, o.blocks, o.context, o.proj_tile_rows, o.lm_head_tile_rows,
        o.gate_up_parts, o.shared_tile, o.down_tile_rows, o.attn_split_tokens);
  if (c.hidden < 1 || c.layers != int64_t(c.layer_types.size()) || c.experts < 1 ||
      c.experts_per_token < 1 || c.experts_per_token > c.experts)
    fail("decode schedule: config not usable ({})", c.summary());
  DecodeSchedule s;
  s.options = o;
  const int64_t B = o.rows, H = c.hidden, E = c.experts, k = c.experts_per_token;
  const int64_t I = c.expert_intermediate, Is = c.shared_intermediate;
  const double wb = o.weight_bytes_per_value, rb = o.router_bytes_per_value;
  s.slots = int(std::min(E, k * B));
  // About one task per block: n units of each of `units` lists (slots, key-head groups) in
  // max(1, blocks / units) parts each, a part rounded up to a multiple of `round`.
  auto auto_tile = [&](int64_t given, int64_t n, int64_t units, int64_t round = 8) {
    if (given > 0) return std::min(given, n);
    const int64_t parts = std::max(int64_t(1), o.blocks / units), t = (n + parts - 1) / parts;
    return std::clamp((t + round - 1) / round * round, int64_t(1), n);
  };
  auto proj_tile = [&](int64_t n) { return auto_tile(o.proj_tile_rows, n, 1, 16); };
  Builder b(s, expected_active_slots(c, o.rows));
  const int64_t gate_up_parts = o.gate_up_parts > 0 ? o.gate_up_parts : o.blocks;
  const int64_t shared_tile = auto_tile(o.shared_tile, Is, 1);
  const int64_t down_tile = auto_tile(o.down_tile_rows, H, 1);
  // A range of all rows, or of rows [r0, r1).
  auto R = [&](Buffer buf, int64_t b0, int64_t b1, int64_t r0 = 0, int64_t r1 = -1) {
    return BufferRange{buf, b0, b1, false, int32_t(r0), int32_t(r1 < 0 ? B : r1)};
  };
  auto W = [&](Buffer buf, int64_t b0, int64_t b1, int64_t r0 = 0, int64_t r1 = -1) {
    return BufferRange{buf, b0, b1, true, int32_t(r0), int32_t(r1 < 0 ? B : r1)};
  };
  // Batch rows per GDN head task and per attention split: about one task per block, whole
  // sequences (a verify pass's rows run the recurrence in order: one task takes all of them).
  const int64_t Q = o.rows_per_sequence;
  auto rows_per_task = [&](int64_t tasks_per_row) {
    const int64_t r = std::clamp((B * tasks_per_row + o.blocks - 1) / o.blocks, int64_t(1), B);
    return (r + Q - 1) / Q * Q;
  };
  auto sequence_start = [&](int64_t row) { return row / Q * Q; };
  // A projection's tasks: rows [0, n) of a weight [n, cols] at `bpv` bytes per weight in tiles
  // of `tile`, each reading `in` [0, cols) and writing its rows of `out` (columns c0 + rows).
  auto projection = [&](TaskOp op, int32_t l, int64_t n, int64_t tile, int64_t cols, double bpv,
                        int32_t signal, Buffer in, Buffer out, int64_t c0 = 0) {
    tiles(n, tile, [&](int64_t r0, int64_t r1) {
      DecodeTask& t =
          b.add(op, l, c0 + r0, c0 + r1, signal, {R(in, 0, cols), W(out, c0 + r0, c0 + r1)});
      t.ahead_bytes = bytes_of(r1 - r0, cols, bpv);
      t.flops = 2.0 * double(B * (r1 - r0) * cols);
    });
  };

  // in_proj rows by key head: q, k of the key head, then v, z, b, a of each of its value heads.
  const int64_t Hk = c.gdn_key_heads, Hv = c.gdn_value_heads, Dk = c.gdn_key_dim;
  const int64_t Dv = c.gdn_value_dim;
  const bool has_gdn = c.count_layers(LayerType::GatedDeltaNet) > 0;
  int64_t groups = 1, group_cols = 0;
  if (has_gdn) {
    if (Hk < 1 || Hv % Hk != 0) fail("decode schedule: value heads {} by key heads {}", Hv, Hk);
    const int64_t per = Hv / Hk, C = c.gdn_conv_channels();
    for (int64_t g = 0; g < Hk; ++g) {
      for (int64_t i = 0; i < Dk; ++i) s.in_proj_row.push_back(g * Dk + i);
      for (int64_t i = 0; i < Dk; ++i) s.in_proj_row.push_back(Hk * Dk + g * Dk + i);
      for (int64_t hv = g * per; hv < (g + 1) * per; ++hv) {
        for (int64_t i = 0; i < Dv; ++i) s.in_proj_row.push_back(2 * Hk * Dk + hv * Dv + i);
        for (int64_t i = 0; i < Dv; ++i) s.in_proj_row.push_back(C + hv * Dv + i);
        s.in_proj_row.push_back(C + Hv * Dv + hv);
        s.in_proj_row.push_back(C + Hv * Dv + Hv + hv);
      }
    }
    group_cols = int64_t(s.in_proj_row.size()) / Hk;
    if (o.in_proj_by_key_head)
      groups = Hk;
    else
      group_cols = int64_t(s.in_proj_row.size());
  }

  const int32_t embed = b.counter("embed");
  b.waits({});
  b.add(TaskOp::Embed, -1, 0, B, embed, {W(Buffer::H, 0, H)}).ahead_bytes = bytes_of(B, H, wb);
  b.place();
  int32_t h_ready = embed;  // the counter after which h holds this layer's input

  for (int32_t l = 0; l < int32_t(c.layers); ++l) {
    const std::string at = fmt::format("layer {} ", l);
    int32_t mixed = 0;  // the counter after which mix is complete
    int64_t mix_cols = 0;
    if (c.layer_types[size_t(l)] == LayerType::GatedDeltaNet) {
      std::vector<int32_t> group_ready;
      b.waits({h_ready});
      for (int64_t g = 0; g < groups; ++g) {
        group_ready.push_back(b.counter(at + fmt::format("in_proj group {}", g)));
        projection(TaskOp::InProj, l, group_cols, auto_tile(o.proj_tile_rows, group_cols, groups),
                   H, wb, group_ready.back(), Buffer::H, Buffer::Proj, g * group_cols);
      }
      mixed = b.counter(at + "gdn heads");
      mix_cols = Hv * Dv;
      const int64_t per_group = Hv / groups;
      const int64_t gdn_rows = rows_per_task(Hv);
      for (int64_t hv = 0; hv < Hv; ++hv) {
        const int64_t g = hv / per_group;
        b.waits({group_ready[size_t(g)]});
        tiles(B, gdn_rows, [&](int64_t r0, int64_t r1) {
          DecodeTask& t = b.add(TaskOp::GdnHead, l, hv, hv + 1, mixed,
                                {R(Buffer::Proj, g * group_cols, (g + 1) * group_cols, r0, r1),
                                 W(Buffer::Mix, hv * Dv, (hv + 1) * Dv, r0, r1)});
          t.row_begin = int32_t(r0);
          t.row_end = int32_t(r1);
          // The head's recurrent state, read once per sequence and written after every row (a
          // verify pass keeps each row's state for the rollback): both in the block's DRAM share.
          t.ahead_bytes = bytes_of((r1 - r0) / Q + (r1 - r0), Dk * Dv, o.state_bytes_per_value);
          t.flops =
              2.0 * double(r1 - r0) * 4.0 * double(Dk * Dv);  // decay, k^T S, S += k u^T, q^T S
        });
      }
    } else {
      const int64_t qkv = c.q_proj_rows() + 2 * c.kv_dim(), G = c.kv_heads;
      if (G < 1 || c.heads % G != 0) fail("decode schedule: heads {} by KV heads {}", c.heads, G);
      const int32_t qkv_ready = b.counter(at + "qkv");
      b.waits({h_ready});
      projection(TaskOp::QkvProj, l, qkv, proj_tile(qkv), H, wb, qkv_ready, Buffer::H,
                 Buffer::Proj);
      // The context this step attends over (its own row included), in slices per KV head.
      const int64_t tokens = o.context + 1;
      const int64_t S = (tokens + o.attn_split_tokens - 1) / o.attn_split_tokens;
      const int64_t qpg = c.heads / G, D = c.head_dim;
      const int64_t attn_rows = rows_per_task(G * S);
      // The one op whose task count grows with the context: refused before it is built.
      const double attn_tasks = double(c.count_layers(LayerType::FullAttention)) * double(G * S) *
                                double((B + attn_rows - 1) / attn_rows);
      if (attn_tasks > double(Builder::kMaxTasks))
        fail(
            "decode schedule: more than {} tasks ({} rows, context {}): fewer rows, a shorter "
            "context or longer attention slices",
            Builder::kMaxTasks, B, o.context);
      std::vector<int32_t> split_ready;
      b.waits({qkv_ready});
      for (int64_t g = 0; g < G; ++g) {
        split_ready.push_back(b.counter(at + fmt::format("attention kv head {}", g)));
        for (int64_t sl = 0; sl < S; ++sl) {
          const int64_t n = std::min(o.attn_split_tokens, tokens - sl * o.attn_split_tokens);
          const int64_t part = g * S + sl;  // AttnPartial column
          tiles(B, attn_rows, [&](int64_t r0, int64_t r1) {
            DecodeTask& t = b.add(
                TaskOp::AttnSplit, l, g, sl, split_ready.back(),
                // Row r attends over the context and its sequence's rows up to r (their k, v).
                {R(Buffer::Proj, 0, qkv, sequence_start(r0), r1),
                 W(Buffer::AttnPartial, part, part + 1, r0, r1)});
            t.row_begin = int32_t(r0);
            t.row_end = int32_t(r1);
            // The slice's K and V rows (bf16), read once per sequence: a verify pass's rows share
            // them (the bound of the last ones is the pass's own rows, in L2).
            t.ahead_bytes = bytes_of((r1 - sequence_start(r0) + Q - 1) / Q * n, 2 * D, 2.0);
            t.flops = 2.0 * 2.0 * double((r1 - r0) * qpg * n * D);
          });
        }
      }
      mixed = b.counter(at + "attention");
      mix_cols = c.heads * D;
      for (int64_t g = 0; g < G; ++g) {
        b.waits({split_ready[size_t(g)]});
        b.add(TaskOp::AttnCombine, l, g, g + 1, mixed,
              {R(Buffer::Proj, 0, qkv), R(Buffer::AttnPartial, g * S, (g + 1) * S),
               W(Buffer::Mix, g * qpg * D, (g + 1) * qpg * D)});
      }
    }
    // out_proj / o_proj: h rows += W mix.
    const int32_t out_ready = b.counter(at + "out_proj");
    b.waits({mixed});
    projection(TaskOp::OutProj, l, H, proj_tile(H), mix_cols, wb, out_ready, Buffer::Mix,
               Buffer::H);
    b.place();

    // The MoE: router (E rows + the shared expert gate), top-k, experts, down into h.
    const int32_t routed = b.counter(at + "router");
    b.waits({out_ready});
    const size_t first_router_task = s.tasks.size();
    projection(TaskOp::Router, l, E + 1, proj_tile(E + 1), H, rb, routed, Buffer::H,
               Buffer::RouterLogits);
    b.also(first_router_task, W(Buffer::X, 0, H));  // the task holding row 0 stores x
    const int32_t topk = b.counter(at + "top_k");
    b.waits({routed});
    b.add(TaskOp::TopK, l, 0, B, topk,
          {R(Buffer::RouterLogits, 0, E), W(Buffer::TopK, 0, s.slots)});
    const int32_t shared = b.counter(at + "shared gate_up");
    b.waits({routed});  // needs x only: runs while the top-k is chosen
    tiles(Is, shared_tile, [&](int64_t i0, int64_t i1) {
      DecodeTask& t = b.add(TaskOp::SharedGateUp, l, i0, i1, shared,
                            {R(Buffer::X, 0, H), W(Buffer::ActShared, i0, i1)});
      t.ahead_bytes = bytes_of(2 * (i1 - i0), H, wb);
      t.flops = 2.0 * double(B * 2 * (i1 - i0) * H);
    });
    const int32_t gated = b.counter(at + "expert gate_up");
    b.waits({topk});
    // The step's active slots x I intermediate columns, flattened slot-major, in P equal parts
    // (P fixed, about one per block): each part's columns are computed on the device from the
    // count of distinct experts the top-k found, so the parts stay balanced whatever it is. Act
    // is tracked in parts (part p writes its own columns for any count).
    for (int64_t part = 0; part < gate_up_parts; ++part) {
      DecodeTask& t =
          b.add(TaskOp::ExpertGateUp, l, part, part + 1, gated,
                {R(Buffer::X, 0, H), R(Buffer::TopK, 0, s.slots), W(Buffer::Act, part, part + 1)});
      t.routed_bytes_per_slot = bytes_of(2 * I, H, wb) / gate_up_parts;
      t.flops = 2.0 * double(2 * I * H) * double(B * k) / double(gate_up_parts);
    }
    const int32_t down = b.counter(at + "expert down");
    b.waits({gated, shared});
    tiles(H, down_tile, [&](int64_t r0, int64_t r1) {
      DecodeTask& t = b.add(
          TaskOp::ExpertDown, l, r0, r1, down,
          {R(Buffer::Act, 0, gate_up_parts), R(Buffer::ActShared, 0, Is),
           R(Buffer::TopK, 0, s.slots), R(Buffer::RouterLogits, E, E + 1), W(Buffer::H, r0, r1)});
      t.ahead_bytes = bytes_of(r1 - r0, Is, wb);
      t.routed_bytes_per_slot = bytes_of(r1 - r0, I, wb);
      t.flops = 2.0 * double(B * (r1 - r0) * (k * I + Is));
    });
    b.place();
    h_ready = down;
  }

  const int32_t logits = b.counter("lm_head");
  b.waits({h_ready});
  projection(TaskOp::LmHead, -1, c.vocab, auto_tile(o.lm_head_tile_rows, c.vocab, 1, 16), H, wb,
             logits, Buffer::H, Buffer::Logits);
  const int32_t sampled = b.counter("sample");
  b.waits({logits});
  b.add(TaskOp::Sample, -1, 0, B, sampled, {R(Buffer::Logits, 0, c.vocab), W(Buffer::Token, 0, B)});
  b.place();
  return s;
}

}  // namespace lilac
