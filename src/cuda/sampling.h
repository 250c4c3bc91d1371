// Token selection on the GPU (docs/cuda-design.md, "sampling"): the greedy argmax, and a sampler
// with exactly the semantics of lilac::sample_token (model/sampling.h): for the same logits,
// parameters, penalty state, seed and step it picks the same token as the CPU, bit for bit (both
// use the arithmetic of model/sampling_core.h). Everything that changes between decode steps is
// read from device memory, so both can be captured in the decode graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common.h"

namespace lilac {
struct SamplingParams;  // model/sampling.h
}  // namespace lilac

namespace lilac::cuda {

// ---- greedy ------------------------------------------------------------------------------------

// Workspace bytes for argmax over n logits.
size_t argmax_workspace_bytes(int n);

// *out = the lowest id holding the maximum of logits[0, n) (NaN never wins; 0 if all are NaN).
// One launch: ceil(n / 2048) blocks reduce their tiles and fold their winners into a 64-bit key
// in the workspace (atomicMax); the last block to finish (a counter in the workspace) writes the
// id. The workspace (256 bytes, 8-byte aligned) must be zero-filled once after allocation
// (cudaMemset); every launch leaves it that way again. Launched with PDL (launch.h). Twin:
// lilac::argmax.
void argmax(const float* logits, int n, void* workspace, int32_t* out, cudaStream_t stream);
// B rows at once (a batched decode step): out[b] = argmax of logits[b * stride, + n), in one
// launch (grid y = row). The workspace is B * argmax_workspace_bytes(n) bytes, zero-filled once;
// row b uses slice b. Each row's result equals argmax() on that row.
void argmax_batch(const float* logits, int n, size_t stride, int B, void* workspace, int32_t* out,
                  cudaStream_t stream);

// ---- sampling
// ------------------------------------------------------------------------------------

constexpr int kMaxTopLogprobs = 20;

// lilac::SamplingParams plus the step, in device memory (the engine writes it with
// cudaMemcpyAsync before a replay, or lets `advance` move the step on the device).
struct DeviceSamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t top_logprobs = 0;  // clamped to [0, kMaxTopLogprobs]
  uint64_t seed = 0;
  uint64_t step = 0;  // Philox counter of this draw
  // Nonzero: after sampling, step += 1 and the token joins the penalty state (output_counts[token]
  // += 1, seen[token] = 1), as PenaltyState::add_output does: a decode graph can then replay
  // without host updates.
  int32_t advance = 0;
  int32_t reserved = 0;
};

// A request's parameters as the device reads them, with the Philox counter `step`; advance != 0:
// the sampler records the token in the penalty state and moves the step (as the decode graph
// does). top_logprobs is clamped to [0, kMaxTopLogprobs] (the kernels clamp it as well). Host
// code (sampling_params.cpp: model/sampling.h is C++20, the .cu files C++17).
DeviceSamplingParams device_sampling_params(const SamplingParams& p, uint64_t step, int advance);

// The sampler's output, in device memory.
struct DeviceSampleResult {
  int32_t token;  // the sampled id (first field: the next step's embed can read it in place)
  float logprob;  // raw log_softmax of the token (no penalties, no temperature)
  int32_t n_top;  // = min(top_logprobs, 20, n_real)
  int32_t reserved;
  int32_t top_ids[kMaxTopLogprobs];  // the n_top highest raw logits, ties: lower id first
  float top_logprobs[kMaxTopLogprobs];
};

// Workspace bytes for sample() over n_real logits (about 4 bytes per logit plus small tables);
// the same for both paths.
size_t sample_workspace_bytes(int n_real);

// The largest top_k of the small top_k path: 32, one warp lane per element of the kept order in
// its finish kernel, and at most 32 * 31 + 1 < 1024 merge candidates survive its filter (one per
// thread). The model's generation_config asks for top_k = 20; 40 and 50 take the general path.
constexpr int kSmallTopK = 32;

// How sample() realises the contract (both give the same result for every input):
//  General: ten launches (prep, exp, six radix-select passes, walk, finish), any parameters.
//  SmallTopK: three launches (prep, per-tile top_k candidates, merge + finish); only for requests
//    whose params->top_k is in [1, kSmallTopK] (greedy requests too).
// The host picks the path from the request's parameters (sampler_path) and records only that
// path's launches; a captured graph holds one path, so graphs must be keyed by it.
enum class SamplerPath { General, SmallTopK };
// SmallTopK iff 1 <= top_k <= kSmallTopK.
SamplerPath sampler_path(int top_k);

// Samples one token from logits[0, n_real) as lilac::sample_token(logits, n_real, params,
// penalties, params->step) does. output_counts int32 [n_real] and seen uint8 [n_real] are the
// penalty state (both null: no penalties); they are only written when params->advance is set.
// n_real in [1, 2^20]. `path`: see SamplerPath; with SmallTopK, params->top_k (device memory) must
// be in [1, kSmallTopK] whenever the launches run (the host cannot check it; a top_k outside is
// clamped into that range, which is not the contract). Ten or three launches on `stream` (a few
// exit at once, e.g. when greedy or when top_k / top_p are off), each launched with PDL (launch.h:
// it waits for its predecessor before its first read), no host synchronisation, fixed grids:
// graph-capturable. Twin: lilac::sample_token.
void sample(const float* logits, int n_real, DeviceSamplingParams* params, int32_t* output_counts,
            uint8_t* seen, void* workspace, DeviceSampleResult* result, cudaStream_t stream,
            SamplerPath path = SamplerPath::General);

// How many times sample() has recorded each path's launches in this process (a graph capture
// counts once, its replays not at all). For tests and benchmark reports.
struct SamplerLaunchCounts {
  long long general = 0;
  long long small_top_k = 0;
};
SamplerLaunchCounts sampler_launch_counts();

}  // namespace lilac::cuda
