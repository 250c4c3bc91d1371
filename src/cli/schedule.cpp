// `lilac schedule [--model DIR] [--rows 1,16,64] [--drafts K] [--blocks N] [--context N]
// [--weights q4|bf16] [--gdn-state f32|bf16] [--tbps X] [--sync-us X] [--task-us X] [--ring-kb N]
// [--kernel-per-op]`: the persistent decode step's static schedule (model/decode_schedule.h) for
// the config (the full-size Qwen3.6-35B-A3B unless --model), its checks (coverage, no deadlock,
// no race: exit 1 on a problem) and the step time its timing model predicts
// (model/decode_schedule_model.h) with the stated parameters. --drafts K: each of --rows is a
// speculative verify pass of K + 1 rows. No GPU: a plan's numbers, for docs/persistent-decode.md.
#include <cstdio>

#include <fmt/format.h>

#include "cli/command.h"
#include "model/decode_schedule.h"
#include "model/decode_schedule_model.h"
#include "model/qwen36.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

struct ScheduleArgs {
  std::string model, weights = "q4", state = "f32";
  std::vector<int> rows{1, 16, 64};
  int blocks = 132, drafts = 0;
  int64_t context = 1024;
  ScheduleTiming timing;
  double ring_kb = 160, tbps = 4.3;
  bool kernel_per_op = false;
};

int run_schedule(ScheduleArgs a) {
  const ModelConfig c = a.model.empty() ? qwen36_35b_a3b_config() : load_model_config(a.model);
  if (a.weights != "q4" && a.weights != "bf16") fail("--weights: q4 or bf16, not '{}'", a.weights);
  if (a.state != "f32" && a.state != "bf16") fail("--gdn-state: f32 or bf16, not '{}'", a.state);
  a.timing.ring_bytes = a.ring_kb * 1024;
  a.timing.dram_bytes_per_us = a.tbps * 1e6;
  a.timing.stream_ahead = !a.kernel_per_op;
  std::printf("model %s\n", c.summary().c_str());
  std::printf(
      "timing: %.2f TB/s over %d blocks, sync %.2f us, task %.2f us, epilogue %.2f us, "
      "ring %.0f KB%s, %.2f TFLOP/s per block; %s weights, %s GDN state, context %lld\n",
      a.timing.dram_bytes_per_us / 1e6, a.blocks, a.timing.sync_us, a.timing.task_us,
      a.timing.epilogue_us, a.ring_kb, a.kernel_per_op ? " (kernel per op)" : "",
      a.timing.flops_per_us / 1e6, a.weights.c_str(), a.state.c_str(), (long long)a.context);
  int status = 0;
  for (int rows : a.rows) {
    ScheduleOptions o;
    o.rows_per_sequence = a.drafts + 1;
    o.rows = rows * o.rows_per_sequence;
    o.blocks = a.blocks;
    o.context = a.context;
    if (a.weights == "bf16") o.weight_bytes_per_value = o.router_bytes_per_value = 2.0;
    o.state_bytes_per_value = a.state == "bf16" ? 2.0 : 4.0;
    const DecodeSchedule s = build_decode_schedule(c, o);
    const std::vector<std::string> problems = check_decode_schedule(c, s);
    const SchedulePrediction p = predict_decode_step(c, s, a.timing);
    if (a.drafts == 0)
      std::printf("rows %3d: %zu tasks, %zu counters; %s; %.0f tok/s\n", rows, s.tasks.size(),
                  s.counters.size(), p.summary().c_str(), double(rows) * 1e6 / p.step_us);
    else  // a verify step emits 1 to drafts + 1 tokens per sequence
      std::printf("verify passes %3d x %d rows: %zu tasks, %zu counters; %s; %.0f steps/s\n", rows,
                  o.rows_per_sequence, s.tasks.size(), s.counters.size(), p.summary().c_str(),
                  1e6 / p.step_us);
    std::printf("  critical path (us): %s\n", p.critical_path().c_str());
    for (const std::string& problem : problems) std::printf("  problem: %s\n", problem.c_str());
    if (!problems.empty()) status = 1;
  }
  return status;
}

const Command kSchedule{
    "schedule", "The persistent decode step's schedule: checks and predicted step time",
    [](CLI::App& app) {
      auto a = std::make_shared<ScheduleArgs>();
      app.add_option("--model", a->model, "Model directory (its config.json); default: full size");
      app.add_option("--rows", a->rows, "Rows per step (sequences, or verify rows)")
          ->delimiter(',')
          ->check(CLI::Range(1, 4096));
      app.add_option("--drafts", a->drafts,
                     "Speculative drafts per sequence: each of --rows is a verify pass of "
                     "drafts + 1 rows")
          ->check(CLI::Range(0, 16));
      app.add_option("--blocks", a->blocks, "Resident blocks (SMs)")->check(CLI::Range(1, 4096));
      app.add_option("--context", a->context, "Context tokens")->check(CLI::Range(0, 1 << 24));
      app.add_option("--weights", a->weights, "q4 or bf16");
      app.add_option("--gdn-state", a->state, "f32 or bf16");
      app.add_option("--tbps", a->tbps, "DRAM bandwidth the streams reach, TB/s")
          ->check(CLI::Range(0.01, 100.0));
      app.add_option("--sync-us", a->timing.sync_us, "Counter release to acquire")
          ->check(CLI::Range(0.0, 1e3));
      app.add_option("--task-us", a->timing.task_us, "A task's own chain")
          ->check(CLI::Range(0.0, 1e3));
      app.add_option("--epilogue-us", a->timing.epilogue_us, "After a task's last byte")
          ->check(CLI::Range(0.0, 1e3));
      app.add_flag("--kernel-per-op", a->kernel_per_op,
                   "Model today's path: no task's bytes before its waits are met");
      app.add_option("--ring-kb", a->ring_kb, "Weight ring per block")->check(CLI::Range(1.0, 1e9));
      return Runner([a] { return run_schedule(*a); });
    }};

}  // namespace
}  // namespace lilac::cli
