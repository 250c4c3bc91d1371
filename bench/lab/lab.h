// The kernel lab (docs/kernels.md, "Kernel lab"): numbered versions of a kernel, the ones that
// lost included, run against the same inputs, each checked against the CPU twin (max error
// printed: a lab run is also a correctness check) and timed the way the microbenchmarks time the
// decode kernels (a CUDA graph of launches rotating over the model's layers, median of replays).
// The highest version of an op is the one src/cuda runs, called through its production launcher;
// the earlier ones are kept here as they were when they lost. One binary, lilac_cuda_bench_lab:
//   lilac_cuda_bench_lab [--op NAME] [--version N] [--runs N] [--list]
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "twins/host_data.h"

namespace lilac::lab {

struct Options {
  int runs = 21;  // timed graph replays per measurement (the median is reported)
};

// One numbered version of an op.
struct Version {
  int number;
  const char* name;     // e.g. "counter"
  const char* summary;  // what it tried, in a line
  bool production;      // the version src/cuda runs
};

// An op of the lab: its versions, and a runner that checks version `v` against the CPU twin,
// prints the errors and the timings, and returns whether the check passed.
struct Op {
  const char* name;
  const char* shapes;
  std::vector<Version> versions;
  std::function<bool(const Options&, const Version&)> run;
};

Op gdn_decode_op();
Op attention_decode_op();
Op q_gemv_rows_op();
Op q_gemm_op();
Op q_moe_grouped_op();
Op q_moe_small_op();
Op sampling_op();

// ---- helpers shared by the ops -------------------------------------------------------------

// Random inputs, host <-> device copies and bf16 rounding: the GPU tests' (tests/cuda/twins,
// without GoogleTest; each op's inputs, CPU twin and tolerances are there too).
using test::download;
using test::download_bf16_as_f32;
using test::upload;
using test::upload_bf16;

// got against want element by element: the largest |got - want| and the largest ratio of it to
// the tolerance atol + rtol |want| (<= 1: within tolerance; NaN counts as a failure).
struct Error {
  double max_abs = 0, worst = 0;
  bool ok() const { return worst <= 1.0; }
};
Error compare(const std::vector<float>& got, const std::vector<float>& want, double atol,
              double rtol);
// Folds `e` into `into` (the larger of each).
void merge(Error& into, const Error& e);
// One line: "  check <what>: max |err| 1.2e-04 (0.31 of the tolerance) ok|FAIL".
bool report_check(const std::string& what, const Error& e);

// Microseconds per call of launch(i) (i = 0..launches-1, all on stream s), measured as the median
// of `runs` replays of one CUDA graph holding the `launches` calls, divided by `launches`.
double graph_us(cudaStream_t s, int runs, int launches, const std::function<void(int)>& launch);

}  // namespace lilac::lab
