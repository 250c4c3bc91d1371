#include "bench/bench.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>

#include "model/cost.h"

namespace lilac {

std::vector<int32_t> bench_prompt(int64_t L, int32_t n_real) {
  std::vector<int32_t> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i)
    ids[size_t(i)] = int32_t((uint64_t(uint32_t(uint64_t(i) * 2654435761ull))) % uint64_t(n_real));
  return ids;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : ids)
    for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(id) >> (8 * b)) & 0xff)) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

struct RoundResult {
  double prefill_s, decode_s;
  std::vector<int32_t> ids;
};

RoundResult one_round(Backend& backend, const std::vector<int32_t>& prompt, const BenchOptions& o) {
  using clock = std::chrono::steady_clock;
  auto seq = backend.new_sequence(int64_t(prompt.size()) + o.decode_steps + 1);
  SamplingParams greedy;
  greedy.temperature = 0;
  backend.begin_sampling(*seq, prompt, greedy);
  RoundResult r;
  auto t0 = clock::now();
  StepResult first;
  const int64_t T = int64_t(prompt.size());
  const int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : T;
  for (int64_t s = 0; s < T; s += chunk) {
    int64_t n = std::min(chunk, T - s);
    std::span<const int32_t> part(prompt.data() + s, size_t(n));
    if (s + n < T)
      backend.forward(*seq, part, {}, false);
    else
      first = backend.step(*seq, part, 0);
  }
  auto t1 = clock::now();
  int32_t tok = first.token;
  for (int i = 0; i < o.decode_steps; ++i) {
    r.ids.push_back(tok);
    tok = backend.step(*seq, std::span<const int32_t>(&tok, 1), uint64_t(i + 1)).token;
  }
  auto t2 = clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return r;
}

}  // namespace

std::vector<BenchRow> run_bench(Backend& backend, const BenchOptions& o) {
  const ModelConfig& cfg = backend.config();
  const int32_t n_real = o.n_real_tokens > 0 ? o.n_real_tokens : int32_t(cfg.vocab);
  std::vector<BenchRow> rows;
  for (int64_t L : o.lengths) {
    BenchRow row;
    row.context = L;
    auto prompt = bench_prompt(L, n_real);
    std::string first_digest;
    for (int r = -1; r < o.rounds; ++r) {  // r = -1: warm-up, not counted
      RoundResult res = one_round(backend, prompt, o);
      std::string d = fnv1a(res.ids);
      if (first_digest.empty()) first_digest = d;
      row.digest_stable = row.digest_stable && d == first_digest;
      if (r < 0) continue;
      row.prefill_s.push_back(res.prefill_s);
      row.decode_s.push_back(res.decode_s);
      if (o.progress)
        o.progress(
            fmt::format("context {:>6}  round {}  prefill {:.3f} s  decode {:.3f} s  digest {}", L,
                        r, res.prefill_s, res.decode_s, d));
    }
    row.digest = first_digest;
    row.prefill_tok_s = double(L) / median(row.prefill_s);
    double step_s = median(row.decode_s) / o.decode_steps;
    row.decode_tok_s = 1.0 / step_s;
    // The decode steps run at contexts L .. L+steps; use the middle one for the byte count.
    row.decode_bw_fraction =
        decode_bytes(cfg, L + o.decode_steps / 2, o.bytes_per_weight) / step_s / o.copy_bandwidth;
    row.prefill_tflops = prefill_flops(cfg, L) / median(row.prefill_s) / 1e12;
    rows.push_back(row);
  }
  return rows;
}

std::string bench_table(const std::vector<BenchRow>& rows) {
  std::string s = fmt::format("{:>8} {:>14} {:>13} {:>12} {:>12}  {}\n", "context", "prefill tok/s",
                              "decode tok/s", "decode %bw", "prefill TF/s", "digest");
  double sp = 0, sd = 0;
  for (const auto& r : rows) {
    s += fmt::format("{:>8} {:>14.1f} {:>13.2f} {:>11.1f}% {:>12.2f}  {}{}\n", r.context,
                     r.prefill_tok_s, r.decode_tok_s, 100 * r.decode_bw_fraction, r.prefill_tflops,
                     r.digest, r.digest_stable ? "" : " (UNSTABLE)");
    sp += r.prefill_tok_s;
    sd += r.decode_tok_s;
  }
  if (!rows.empty())
    s += fmt::format("{:>8} {:>14.1f} {:>13.2f}\n", "mean", sp / double(rows.size()),
                     sd / double(rows.size()));
  return s;
}

nlohmann::json bench_json(const std::vector<BenchRow>& rows, const nlohmann::json& header) {
  nlohmann::json j = header;
  j["results"] = nlohmann::json::array();
  double sp = 0, sd = 0;
  for (const auto& r : rows) {
    j["results"].push_back({{"context", r.context},
                            {"prefill_tok_s", r.prefill_tok_s},
                            {"decode_tok_s", r.decode_tok_s},
                            {"prefill_s_rounds", r.prefill_s},
                            {"decode_s_rounds", r.decode_s},
                            {"decode_bw_fraction", r.decode_bw_fraction},
                            {"prefill_tflops", r.prefill_tflops},
                            {"digest", r.digest},
                            {"digest_stable", r.digest_stable}});
    sp += r.prefill_tok_s;
    sd += r.decode_tok_s;
  }
  j["mean_prefill_tok_s"] = rows.empty() ? 0 : sp / double(rows.size());
  j["mean_decode_tok_s"] = rows.empty() ? 0 : sd / double(rows.size());
  return j;
}

}  // namespace lilac
