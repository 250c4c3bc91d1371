// A decode step as a static schedule of tasks: the plan a persistent decode kernel runs
// (docs/persistent-decode.md, "The schedule"). Plain data, built from the config alone, with the
// checks that make it safe to run on resident blocks that wait on each other through counters:
//
//   - every weight row of every projection and expert is covered by exactly one task;
//   - no deadlock: a task waits only on counters whose producers all come earlier in one global
//     order, and every block's list follows that order (so the earliest unfinished task can
//     always run: its producers are finished and nothing before it on its block is waiting);
//   - no race: two tasks that touch the same part of a buffer, one of them writing, are ordered
//     by the counters (one happens before the other);
//
// and a timing model that predicts the step from bytes, the counters' latency and the per-block
// weight ring (decode_schedule_model.h). No kernel runs it yet.
//
// Tasks and counters. A task is a tile of one op of one layer (a row range of a projection, a
// head of the GDN or of attention, a part of the routed experts' columns, ...). When
// its stores are done it adds 1 to its counter (`signal`); a task that needs another op's output
// waits until that op's counter reaches its producer count (`waits`: always the full count, so a
// wait names exactly the set of tasks it follows). Counters are per step; a kernel that never
// resets them compares with step * count.
//
// Rows of B sequences (a batched step), or the k + 1 rows of each of B / (k + 1) speculative
// verify passes (rows_per_sequence; docs/speculative.md), share every task: a projection tile
// multiplies its rows for all B; a GDN or attention task runs its head (or a few rows of it) for
// all B; routed experts come as `slots`, up to min(E, k B) distinct experts per step, filled on the
// device from the step's top-k.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace lilac {

enum class TaskOp : uint8_t {
  Embed,         // the token rows of embed_tokens -> h
  InProj,        // GDN in_proj rows (input norm fused: every task normalises h) -> proj
  GdnHead,       // one value head: conv, recurrent step, gated norm -> mix
  QkvProj,       // attention q (+gate), k, v rows (input norm fused) -> proj
  AttnSplit,     // one KV head over one slice of the context -> partials
  AttnCombine,   // one KV head's partials merged, q-gate applied -> mix
  OutProj,       // out_proj / o_proj rows: h += W mix
  Router,        // post norm + router rows (E experts + the shared expert gate) -> logits;
                 // the task holding row 0 also stores the normed x the experts read
  TopK,          // top-k of every row's logits -> the step's expert slots and weights
  SharedGateUp,  // shared expert: act_s = silu(gate x) * (up x) over an intermediate range
  ExpertGateUp,  // routed: act = silu(gate x) * (up x), one part of the active slots' columns
  ExpertDown,    // h rows += sum_j w_j down_j act_j + sigmoid(g) down_s act_s (all slots)
  LmHead,        // final norm + lm_head rows -> vocab logits
  Sample,        // the next token of every row
};
const char* task_op_name(TaskOp op);

// Activation buffers, shared by all layers (a layer's GDN state and KV cache are its own and
// touched by one task per head, so they are not tracked).
enum class Buffer : uint8_t {
  H,
  X,
  Proj,
  Mix,
  AttnPartial,
  RouterLogits,
  TopK,
  Act,
  ActShared,
  Logits,
  Token
};
constexpr int kBufferCount = 11;
const char* buffer_name(Buffer b);

// Columns [begin, end) of rows [row_begin, row_end) of a buffer, read or written by a task.
struct BufferRange {
  Buffer buffer;
  int64_t begin, end;
  bool write;
  int32_t row_begin, row_end;
};

struct CounterWait {
  int32_t counter;
  int32_t count;  // the counter's producer count
};

struct DecodeTask {
  TaskOp op;
  int32_t layer;  // -1: Embed, LmHead, Sample
  int64_t begin;  // the op's units [begin, end): weight rows, heads, intermediate columns, parts
  int64_t end;    // (ExpertGateUp); AttnSplit: begin = KV head, end = context slice index
  int32_t row_begin, row_end;  // the batch rows it computes: all B, except GdnHead and AttnSplit
  int32_t signal;              // the counter this task adds 1 to
  // Bytes streamed from DRAM that do not depend on this step's activations: weights, the GDN
  // state, the KV rows of earlier positions. `routed`: the routed experts' weights, known only
  // once the layer's top-k is: this task's bytes per active slot.
  int64_t ahead_bytes = 0;
  int64_t routed_bytes_per_slot = 0;
  double flops = 0;  // multiply-adds x 2, all B rows (active slots for routed work)
  uint32_t wait_begin = 0, wait_count = 0;    // into DecodeSchedule::waits
  uint32_t range_begin = 0, range_count = 0;  // into DecodeSchedule::ranges
};

struct ScheduleCounter {
  std::string name;   // "layer 3 in_proj group 5"
  int32_t producers;  // tasks that signal it
};

struct ScheduleOptions {
  int rows = 1;               // B: rows per step
  int rows_per_sequence = 1;  // 1: B sequences; k + 1: B / (k + 1) speculative verify passes of
                              // k drafts (a GDN task takes a sequence's rows, in order)
  int blocks = 132;           // resident blocks (one per SM of an H200)
  int64_t context = 1024;     // tokens of context (attention reads)
  // Weight rows per projection task (in_proj, qkv, out_proj / o_proj, router) and per lm_head
  // task; 0: about one task per block, rounded up to 16.
  int64_t proj_tile_rows = 0;
  int64_t lm_head_tile_rows = 0;
  // 0: about one task per block (an op's bytes spread over all SMs): the routed gate_up's parts
  // (of the active slots' intermediate columns), shared gate_up columns per task (a multiple of
  // 8), down rows per task (a multiple of 8).
  int64_t gate_up_parts = 0, shared_tile = 0, down_tile_rows = 0;
  int64_t attn_split_tokens = 256;  // context tokens per AttnSplit task
  bool in_proj_by_key_head = true;  // one in_proj counter per key head (a GDN head waits on its
                                    // own key head's rows only); false: one for all of in_proj
  double weight_bytes_per_value = 0.5625;  // 4-bit MLX affine, group 64; 2.0 for BF16
  double router_bytes_per_value = 1.0625;  // 8-bit (router, shared expert gate); 2.0 for BF16
  double state_bytes_per_value = 4.0;      // GDN recurrent state: 4 f32, 2 bf16
};

struct DecodeSchedule {
  ScheduleOptions options;
  int slots = 0;                  // routed expert slots per layer: min(E, k B)
  std::vector<DecodeTask> tasks;  // in the global order (a topological order of the waits)
  std::vector<CounterWait> waits;
  std::vector<BufferRange> ranges;
  std::vector<ScheduleCounter> counters;
  std::vector<std::vector<int32_t>> block_tasks;  // per block, task indices, increasing
  // in_proj rows are grouped by key head so a GDN head waits on its group only: proj column c of
  // group g holds in_proj row in_proj_row[c] (q, k of key head g, then v, z, b, a of its value
  // heads). Empty for configs without GDN layers.
  std::vector<int64_t> in_proj_row;
};

// The distinct experts B rows select under a uniform router, E (1 - (1 - k/E)^B), rounded: the
// routed slots a step is expected to fill (the device fills slots 0.. in order), for placing
// the routed tasks and for the timing model.
int expected_active_slots(const ModelConfig& c, int rows);

// Builds the step's schedule for the config. Throws lilac::Error on options it cannot honour.
DecodeSchedule build_decode_schedule(const ModelConfig& c, const ScheduleOptions& options);

// The checks above; returns the problems found, an empty list when the schedule is safe to run.
std::vector<std::string> check_decode_schedule(const ModelConfig& c, const DecodeSchedule& s);

}  // namespace lilac
