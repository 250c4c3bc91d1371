// The persistent decode step's schedule (model/decode_schedule.h): built for the real model and
// the small test configs at several batch sizes, it covers every weight row once and passes the
// deadlock and race checks; the checks find the faults planted in it; the timing model
// (model/decode_schedule_model.h) reduces to the byte floor when latencies are zero.
#include "model/decode_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "model/cost.h"
#include "model/decode_schedule_model.h"
#include "model/qwen36.h"
#include "test_data.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

DecodeSchedule build(const ModelConfig& c, int rows, int blocks = 132) {
  ScheduleOptions o;
  o.rows = rows;
  o.blocks = blocks;
  return build_decode_schedule(c, o);
}

TEST(DecodeSchedule, FullSizeIsSafeAtEveryBatchSize) {
  const ModelConfig c = qwen36_35b_a3b_config();
  for (int rows : {1, 3, 16, 64}) {
    const DecodeSchedule s = build(c, rows);
    EXPECT_EQ(s.slots, std::min<int>(int(c.experts), 8 * rows));
    EXPECT_EQ(joined(check_decode_schedule(c, s)), "") << rows << " rows";
  }
}

TEST(DecodeSchedule, SmallConfigsAndOddBlockCountsAreSafe) {
  const ModelConfig demo = load_model_config(demo_model_dir());
  const ModelConfig tiny = load_model_config(data_path("tiny-a"));
  for (const ModelConfig* c : {&demo, &tiny})
    for (int blocks : {1, 7, 132})
      for (int rows : {1, 5}) {
        const DecodeSchedule s = build(*c, rows, blocks);
        EXPECT_EQ(joined(check_decode_schedule(*c, s)), "") << rows << " rows, " << blocks;
      }
  ScheduleOptions o;
  o.in_proj_by_key_head = false;  // one in_proj counter per layer
  o.proj_tile_rows = 5;           // tiles that do not divide the rows
  o.gate_up_parts = 7;
  o.shared_tile = 3;
  o.down_tile_rows = 9;
  o.attn_split_tokens = 3;
  EXPECT_EQ(joined(check_decode_schedule(tiny, build_decode_schedule(tiny, o))), "");
}

TEST(DecodeSchedule, SizesItCannotHonourAreRefused) {
  const ModelConfig c = qwen36_35b_a3b_config();
  ScheduleOptions o;
  o.rows = 0;
  EXPECT_THAT([&] { build_decode_schedule(c, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("bad options")));
  o.rows = 1;
  o.context = 1'000'000;  // a slice per token: millions of tasks, refused before they are made
  o.attn_split_tokens = 1;
  EXPECT_THAT([&] { build_decode_schedule(c, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("more than 4000000 tasks")));
}

TEST(DecodeSchedule, AVerifyPassKeepsASequencesRowsTogether) {
  const ModelConfig c = qwen36_35b_a3b_config();
  for (int sequences : {1, 2, 16})
    for (int drafts : {1, 3}) {
      ScheduleOptions o;
      o.rows_per_sequence = drafts + 1;
      o.rows = sequences * o.rows_per_sequence;
      const DecodeSchedule s = build_decode_schedule(c, o);
      EXPECT_EQ(joined(check_decode_schedule(c, s)), "") << sequences << " x " << drafts + 1;
      for (const DecodeTask& t : s.tasks) {
        if (t.op != TaskOp::GdnHead && t.op != TaskOp::AttnSplit) continue;
        // The recurrence runs a sequence's rows in order in one task.
        if (t.op == TaskOp::GdnHead) {
          EXPECT_EQ(t.row_begin % o.rows_per_sequence, 0);
          EXPECT_EQ(t.row_end % o.rows_per_sequence, 0);
        }
        // A split reads the k and v of its sequence's rows before its own.
        const BufferRange& proj = s.ranges[t.range_begin];
        ASSERT_EQ(proj.buffer, Buffer::Proj);
        EXPECT_EQ(proj.row_begin % o.rows_per_sequence, 0);
      }
    }
  ScheduleOptions bad;
  bad.rows = 5;
  bad.rows_per_sequence = 2;
  EXPECT_THAT([&] { build_decode_schedule(c, bad); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rows 5 in sequences of 2")));
}

TEST(DecodeSchedule, GdnHeadsWaitOnTheirKeyHeadOnly) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const DecodeSchedule s = build(c, 1);
  int heads = 0;
  for (const DecodeTask& t : s.tasks) {
    if (t.op != TaskOp::GdnHead) continue;
    ASSERT_EQ(t.wait_count, 1u);
    const CounterWait& w = s.waits[t.wait_begin];
    const int64_t per = c.gdn_value_heads / c.gdn_key_heads;
    EXPECT_THAT(s.counters[size_t(w.counter)].name,
                HasSubstr(fmt::format("in_proj group {}", t.begin / per)));
    // 2 Dk + per (2 Dv + 2) = 772 rows per key head, in 132 / 16 = 8 parts of 97 rows, rounded
    // up to 104: 8 tiles per key head.
    EXPECT_EQ(w.count, 8);
    ++heads;
  }
  EXPECT_EQ(heads, 30 * 32);
}

TEST(DecodeSchedule, ChecksFindPlantedFaults) {
  const ModelConfig c = load_model_config(data_path("tiny-a"));
  const DecodeSchedule good = build(c, 2, 5);
  ASSERT_EQ(joined(check_decode_schedule(c, good)), "");
  auto first = [&](const DecodeSchedule& s, TaskOp op) {
    for (size_t i = 0; i < s.tasks.size(); ++i)
      if (s.tasks[i].op == op) return i;
    return size_t(0);
  };
  {  // out_proj no longer waits for the mixer: it writes h while in_proj may still read it
    DecodeSchedule s = good;
    for (DecodeTask& t : s.tasks)
      if (t.op == TaskOp::OutProj && t.layer == 1) t.wait_count = 0;
    EXPECT_THAT(joined(check_decode_schedule(c, s)), HasSubstr("race on h"));
  }
  {  // a task waits on a counter whose producers come later
    DecodeSchedule s = good;
    const size_t i = first(s, TaskOp::InProj);
    s.waits[s.tasks[i].wait_begin].counter = s.tasks[first(s, TaskOp::LmHead)].signal;
    EXPECT_THAT(joined(check_decode_schedule(c, s)), HasSubstr("waits on 'lm_head'"));
  }
  {  // a wait for fewer than all producers
    DecodeSchedule s = good;
    s.waits[s.tasks[first(s, TaskOp::TopK)].wait_begin].count -= 1;
    EXPECT_THAT(joined(check_decode_schedule(c, s)), HasSubstr("waits on 'layer 0 router'"));
  }
  {  // a block's list out of the global order
    DecodeSchedule s = good;
    std::swap(s.block_tasks[0][0], s.block_tasks[0][1]);
    EXPECT_THAT(joined(check_decode_schedule(c, s)), HasSubstr("block 0: task"));
  }
  {  // a weight tile lost
    DecodeSchedule s = good;
    s.tasks[first(s, TaskOp::ExpertDown)].end -= 1;
    EXPECT_THAT(joined(check_decode_schedule(c, s)), HasSubstr("expert_down of layer 0"));
  }
}

TEST(DecodeScheduleModel, BytesAreTheCostModelsDecodeBytes) {
  const ModelConfig c = qwen36_35b_a3b_config();
  ScheduleOptions o;
  o.router_bytes_per_value = o.weight_bytes_per_value;  // the cost model's one width
  o.context = 1024;
  const DecodeSchedule s = build_decode_schedule(c, o);
  const SchedulePrediction p = predict_decode_step(c, s, ScheduleTiming{});
  // decode_bytes reads `context` KV rows; the step attends over its own row too.
  const double kv_row = double(c.count_layers(LayerType::FullAttention) * 2 * c.kv_dim() * 2);
  EXPECT_NEAR(p.dram_bytes, decode_bytes(c, 1024, 0.5625, 4.0) + kv_row, 1e-4 * p.dram_bytes);
  EXPECT_EQ(p.active_slots, 8);
}

TEST(DecodeScheduleModel, WithoutLatenciesTheStepIsItsBytes) {
  const ModelConfig c = qwen36_35b_a3b_config();
  ScheduleTiming ideal;
  ideal.sync_us = ideal.task_us = ideal.epilogue_us = 0;
  ideal.ring_bytes = 1e12;
  ideal.flops_per_us = 1e12;
  for (int rows : {1, 16, 64}) {
    const DecodeSchedule s = build(c, rows);
    const SchedulePrediction p = predict_decode_step(c, s, ideal);
    // The busiest block's bytes at its share, and those spread evenly over the blocks.
    EXPECT_GE(p.step_us, p.floor_us * 0.999) << p.summary();
    EXPECT_LE(p.step_us, p.busiest_block_us * 1.001) << p.summary();
    EXPECT_LE(p.busiest_block_us, p.floor_us * 1.10) << p.summary();
    // More latency never makes it faster.
    ScheduleTiming slow = ideal;
    slow.sync_us = 1.0;
    EXPECT_GT(predict_decode_step(c, s, slow).step_us, p.step_us);
  }
}

TEST(DecodeScheduleModel, OneRowIsAChainOfDependentTasks) {
  // At one row the step is latency: its critical path runs through every op of every layer, and
  // each microsecond more per dependency costs about one per link (7 per GDN layer: in_proj, GDN
  // head, out_proj, router, top-k, gate_up, down; 8 per attention layer; lm_head, sample).
  const ModelConfig c = qwen36_35b_a3b_config();
  const DecodeSchedule s = build(c, 1);
  ScheduleTiming t;
  const SchedulePrediction p = predict_decode_step(c, s, t);
  for (TaskOp op : {TaskOp::InProj, TaskOp::GdnHead, TaskOp::QkvProj, TaskOp::AttnSplit,
                    TaskOp::AttnCombine, TaskOp::OutProj, TaskOp::Router, TaskOp::TopK,
                    TaskOp::ExpertGateUp, TaskOp::ExpertDown, TaskOp::LmHead, TaskOp::Sample})
    EXPECT_GT(p.critical_us[size_t(op)], 0.0) << task_op_name(op) << ": " << p.critical_path();
  double sum = 0;
  for (double v : p.critical_us) sum += v;
  EXPECT_NEAR(sum, p.step_us, 1e-6 * p.step_us);
  // Today's path (no bytes before the waits): every link pays the extra microsecond.
  ScheduleTiming kernels = t;
  kernels.stream_ahead = false;
  const double base = predict_decode_step(c, s, kernels).step_us;
  kernels.sync_us += 1.0;
  const double links = predict_decode_step(c, s, kernels).step_us - base;
  EXPECT_GT(links, 30 * 7 + 10 * 8 - 10) << p.critical_path();
  EXPECT_LT(links, 30 * 7 + 10 * 8 + 10) << p.critical_path();
  // Streaming ahead, some links are bound by their bytes instead: it costs no more.
  t.sync_us += 1.0;
  EXPECT_LE(predict_decode_step(c, s, t).step_us - p.step_us, links);
}

}  // namespace
}  // namespace lilac::test
