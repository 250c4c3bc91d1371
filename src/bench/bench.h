// The benchmark protocol (docs/benchmarking.md section 1) over any Backend: for each context length
// L, from a fresh sequence, prefill L synthetic ids (prefill tok/s = L / time to first token), then
// exactly `decode_steps` greedy decode steps (decode tok/s = steps / their time); one warm-up round
// per length, then `rounds` timed rounds, median reported; a digest of the greedy tokens per
// length.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
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
  double bytes_per_weight = 2.0;
  double copy_bandwidth = 4.3e12;  // measured device copy rate, bytes/s (roofline denominator)
  double matmul_rate = 790e12;     // measured bf16 dense rate, FLOP/s
  std::function<void(const std::string&)> progress;  // one line per finished round
};

struct BenchRow {
  int64_t context = 0;
  std::vector<double> prefill_s, decode_s;  // every round
  double prefill_tok_s = 0, decode_tok_s = 0;
  std::string digest;  // of the decoded ids (FNV-1a 64, hex)
  bool digest_stable = true;
  double decode_bw_fraction = 0;  // decode bytes per token / step time / copy bandwidth
  double prefill_tflops = 0;
};

// id_i = ((i * 2654435761) mod 2^32) mod n_real
std::vector<int32_t> bench_prompt(int64_t L, int32_t n_real);

std::vector<BenchRow> run_bench(Backend& backend, const BenchOptions& options);

// The table printed on stdout and the JSON document written by `lilac bench --json`.
std::string bench_table(const std::vector<BenchRow>& rows);
nlohmann::json bench_json(const std::vector<BenchRow>& rows, const nlohmann::json& header);

}  // namespace lilac
