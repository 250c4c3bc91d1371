// A timing model of the decode schedule (decode_schedule.h) on resident blocks: what the
// persistent decode step should take, from bytes, the counters' latency and each block's weight
// ring, before any kernel runs it (docs/persistent-decode.md, "The schedule"). A model for
// predictions and what-ifs, not a measurement: its parameters are the ones the GPU measurements
// so far suggest (docs/kernels.md) and are stated with every figure.
//
// Each block runs its list in order. Its weight ring (`ring_bytes` of shared memory) is taken in
// the same order, a task's bytes once the tasks it would overwrite have ended, and filled by two
// streams at the block's share of DRAM bandwidth: the bytes known ahead (weights, GDN state, KV
// rows), and the routed experts' weights from the layer's top-k on, so that waiting for the
// top-k does not stop the stream of the next tasks' weights. A task starts when its block is free
// and `sync_us` after its counters complete, and ends `task_us` plus its compute after it starts,
// or `epilogue_us` after its last byte arrives, whichever is later. Since producers come before
// waiters in the global order and every block's list follows it, one pass over the tasks in that
// order computes every time.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/decode_schedule.h"

namespace lilac {

struct ScheduleTiming {
  double dram_bytes_per_us = 4.3e6;  // the whole GPU (H200: ~4.3 TB/s), shared evenly by the blocks
  // A counter's release to a waiter's acquire that sees it. Measured (s26, H200, the chain
  // bench): a link of dependent GEMVs with almost no bytes costs 1.57-1.88 us through a counter,
  // 1.43 us through a PDL kernel boundary, the task's own chain included; with the calibration's
  // 3 us boundaries and 2.5 us tasks a counter is ~3.15 us (docs/persistent-decode.md). The
  // default stays s25's assumption, which that document's first table was computed with;
  // `lilac schedule --sync-us` takes the measured cost.
  double sync_us = 1.0;
  double task_us = 1.5;      // a task's own chain with its weights there: activations from L2, the
                             // reduction, the stores
  double epilogue_us = 0.3;  // after a task's last weight byte: the last MMAs, the stores
  double ring_bytes = 160.0 * 1024;  // per block: shared memory for weights streamed ahead
  double flops_per_us = 1.5e6;       // per block (H200 bf16 tensor cores ~790 TFLOP/s over 132
                                     // SMs is 6e6; 4-bit dequantisation in the loop: a quarter)
  // false: a task's bytes start only once its waits are met (today's kernel per op, whose loads
  // follow griddepcontrol.wait): the model of the current path, to calibrate against.
  bool stream_ahead = true;
  int active_slots = -1;  // routed slots holding an expert: -1 = expected_active_slots
};

struct SchedulePrediction {
  double step_us = 0;           // the last task's end
  double dram_bytes = 0;        // bytes streamed by the step
  double floor_us = 0;          // dram_bytes at the full bandwidth
  double busiest_block_us = 0;  // the most bytes one block streams, at its share
  int active_slots = 0;
  // The step's critical path (each task's start bound by its block's previous task or by its
  // latest counter), its time per op (TaskOp index): the model's "exposed time" per op.
  std::vector<double> critical_us;
  std::string summary() const;
  std::string critical_path() const;  // "in_proj 120.5, gdn_head 80.2, ..." (us)
};

SchedulePrediction predict_decode_step(const ModelConfig& c, const DecodeSchedule& s,
                                       const ScheduleTiming& t);

}  // namespace lilac
