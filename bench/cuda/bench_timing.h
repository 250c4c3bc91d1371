// Timing helpers of the CUDA microbenchmarks: medians of event-timed runs on one stream, plain or
// as CUDA graph replays (the way a decode step runs).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "cuda/common.h"

namespace lilac::bench {

// Median seconds of `n` runs of `run` on `s` (an event pair around each), after `warm` untimed
// runs.
inline double median_seconds(cudaStream_t s, int n, const std::function<void()>& run,
                             int warm = 1) {
  for (int w = 0; w < warm; ++w) run();
  LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  LILAC_CUDA_CHECK(cudaEventCreate(&a));
  LILAC_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < n; ++i) {
    LILAC_CUDA_CHECK(cudaEventRecord(a, s));
    run();
    LILAC_CUDA_CHECK(cudaEventRecord(b, s));
    LILAC_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  LILAC_CUDA_CHECK(cudaEventDestroy(a));
  LILAC_CUDA_CHECK(cudaEventDestroy(b));
  return double(ms[ms.size() / 2]) * 1e-3;
}

// Median seconds of one replay of a graph holding everything `record` launches on `s`. `record`
// runs once uncaptured first (one-time host setup: occupancy queries, PDL checks).
inline double median_graph_replay_seconds(cudaStream_t s, int runs,
                                          const std::function<void()>& record) {
  record();
  LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double t = median_seconds(
      s, runs, [&] { LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 3);
  LILAC_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LILAC_CUDA_CHECK(cudaGraphDestroy(graph));
  return t;
}

}  // namespace lilac::bench
