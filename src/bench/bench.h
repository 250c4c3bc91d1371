// The benchmark protocol (docs/benchmarking.md section 1) over any Backend: for each context length
// L, from a fresh sequence, prefill L synthetic ids (prefill tok/s = L / time to first token), then
// exactly `decode_steps` greedy decode steps (decode tok/s = steps / their time; the first step's
// time is also kept apart, as are the other steps' rate); one warm-up round
// per length, then `rounds` timed rounds, median reported; a digest of the greedy tokens per
// length. With `sampled` set, each round then switches the same sequence to those sampling
// parameters (begin_sampling with the prompt and the greedy tokens as history) and times
// `decode_steps` sampled steps more (at context L + decode_steps: no second prefill).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/backend.h"

namespace lilac {

struct BenchOptions {
  std::vector<int64_t> lengths = {256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
  int rounds = 3;
  int decode_steps = 64;
  int64_t prefill_chunk = 0;  // 0: the backend's own chunking (one forward call)
  int32_t n_real_tokens = 0;  // ids of the synthetic prompt are < this (0: the model's vocab)
  std::optional<SamplingParams> sampled;  // also time sampled decode with these (seeded)
  double bytes_per_weight = 2.0;
  double state_bytes_per_value = 4.0;  // the GDN recurrent state's format: 4 f32, 2 bf16
  double copy_bandwidth = 4.3e12;      // measured device copy rate, bytes/s (roofline denominator)
  double matmul_rate = 790e12;         // measured bf16 dense rate, FLOP/s
  std::function<void(const std::string&)> progress;  // one line per finished round
};

struct BenchRow {
  int64_t context = 0;
  std::vector<double> prefill_s, decode_s;  // every round
  double prefill_tok_s = 0, decode_tok_s = 0;
  // The first decode step of every round (inside decode_s: a fresh sequence's first step may pay
  // one-off costs, such as the CUDA backend capturing its decode graph), and the rate of the
  // other decode_steps - 1 steps (median over rounds; 0 with one step). Reported beside
  // decode_tok_s, which stays the protocol's figure.
  std::vector<double> decode_first_step_s;
  double decode_rest_tok_s = 0;
  std::string digest;  // of the decoded ids (FNV-1a 64, hex)
  bool digest_stable = true;
  std::vector<double> sampled_decode_s;  // every round (empty: not timed)
  double sampled_decode_tok_s = 0;
  std::string sampled_digest;     // of the sampled ids (a fixed seed: the same every round)
  double decode_bw_fraction = 0;  // decode bytes per token / step time / copy bandwidth
  double prefill_tflops = 0;
};

// id_i = (((i + offset) * 2654435761) mod 2^32) mod n_real
std::vector<int32_t> bench_prompt(int64_t L, int32_t n_real, int64_t offset = 0);

std::vector<BenchRow> run_bench(Backend& backend, const BenchOptions& options);

// Concurrency (continuous batching): for each N, N sequences each prefilled with a prompt of
// `prompt_tokens` synthetic ids (sequence s reads the ids from offset s * prompt_tokens, so the
// prompts differ; sequence 0's is the protocol's), then `warmup_steps` untimed and
// `decode_steps` timed greedy decode steps, each one Backend::step_batch call over all N.
struct ConcurrencyOptions {
  std::vector<int> levels = {1, 2, 4, 8, 16, 32, 64};
  int64_t prompt_tokens = 1024;
  int decode_steps = 64;
  int warmup_steps = 2;
  int32_t n_real_tokens = 0;  // as in BenchOptions
  std::function<void(const std::string&)> progress;
};

struct ConcurrencyRow {
  int concurrency = 0;
  int decode_steps = 0;
  double step_ms = 0;           // one batched decode step
  double output_tok_s = 0;      // summed over the streams
  double per_stream_tok_s = 0;  // one stream's rate
  double prefill_s = 0;         // the N prompts, one after the other (not the measure)
  std::string first_digest;     // of sequence 0's greedy tokens: equal at every N when batching
                                // is exact
};

std::vector<ConcurrencyRow> run_concurrency_bench(Backend& backend, const ConcurrencyOptions& o);

// The table printed on stdout and the JSON document written by `lilac bench --json`.
std::string bench_table(const std::vector<BenchRow>& rows);
std::string concurrency_table(const std::vector<ConcurrencyRow>& rows);
nlohmann::json bench_json(const std::vector<BenchRow>& rows, const nlohmann::json& header);
// `bench_json` with "concurrency_results" beside "results".
nlohmann::json concurrency_json(const std::vector<ConcurrencyRow>& rows);

}  // namespace lilac
