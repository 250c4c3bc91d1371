#include "bench/bench.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>

#include "model/cost.h"

namespace lilac {

std::vector<int32_t> bench_prompt(int64_t L, int32_t n_real, int64_t offset) {
  std::vector<int32_t> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i)
    ids[size_t(i)] =
        int32_t((uint64_t(uint32_t(uint64_t(i + offset) * 2654435761ull))) % uint64_t(n_real));
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
  double prefill_s, decode_s, sampled_s = 0;
  double first_step_s = 0;  // the first decode step alone (inside decode_s)
  std::vector<int32_t> ids, sampled_ids;
};

RoundResult one_round(Backend& backend, const std::vector<int32_t>& prompt, const BenchOptions& o) {
  using clock = std::chrono::steady_clock;
  const int64_t sampled_steps = o.sampled ? o.decode_steps : 0;
  auto seq = backend.new_sequence(int64_t(prompt.size()) + o.decode_steps + sampled_steps + 1);
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
  auto t_first = t1;
  for (int i = 0; i < o.decode_steps; ++i) {
    r.ids.push_back(tok);
    tok = backend.step(*seq, std::span<const int32_t>(&tok, 1), uint64_t(i + 1)).token;
    if (i == 0) t_first = clock::now();
  }
  auto t2 = clock::now();
  r.first_step_s = std::chrono::duration<double>(t_first - t1).count();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(t2 - t1).count();
  if (o.sampled) {
    // The same sequence goes on with the sampling parameters; the penalty history is everything
    // it has seen (the prompt and the greedy tokens), as a request's would be.
    std::vector<int32_t> seen = prompt;
    seen.insert(seen.end(), r.ids.begin(), r.ids.end());
    backend.begin_sampling(*seq, seen, *o.sampled);
    auto t3 = clock::now();
    for (int i = 0; i < o.decode_steps; ++i) {
      r.sampled_ids.push_back(tok);
      tok = backend.step(*seq, std::span<const int32_t>(&tok, 1), uint64_t(i)).token;
    }
    r.sampled_s = std::chrono::duration<double>(clock::now() - t3).count();
  }
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
      row.decode_first_step_s.push_back(res.first_step_s);
      if (o.sampled) {
        row.sampled_decode_s.push_back(res.sampled_s);
        row.sampled_digest = fnv1a(res.sampled_ids);
      }
      if (o.progress)
        o.progress(
            fmt::format("context {:>6}  round {}  prefill {:.3f} s  decode {:.3f} s (first step "
                        "{:.2f} ms)  digest {}{}",
                        L, r, res.prefill_s, res.decode_s, 1e3 * res.first_step_s, d,
                        o.sampled ? fmt::format("  sampled decode {:.3f} s", res.sampled_s) : ""));
    }
    row.digest = first_digest;
    if (o.sampled) row.sampled_decode_tok_s = o.decode_steps / median(row.sampled_decode_s);
    row.prefill_tok_s = double(L) / median(row.prefill_s);
    double step_s = median(row.decode_s) / o.decode_steps;
    row.decode_tok_s = 1.0 / step_s;
    if (o.decode_steps > 1) {
      std::vector<double> rest;
      for (size_t i = 0; i < row.decode_s.size(); ++i)
        rest.push_back(row.decode_s[i] - row.decode_first_step_s[i]);
      row.decode_rest_tok_s = (o.decode_steps - 1) / median(rest);
    }
    // The decode steps run at contexts L .. L+steps; use the middle one for the byte count.
    row.decode_bw_fraction =
        decode_bytes(cfg, L + o.decode_steps / 2, o.bytes_per_weight, o.state_bytes_per_value) /
        step_s / o.copy_bandwidth;
    row.prefill_tflops = prefill_flops(cfg, L) / median(row.prefill_s) / 1e12;
    rows.push_back(row);
  }
  return rows;
}

std::string bench_table(const std::vector<BenchRow>& rows) {
  const bool sampled = !rows.empty() && !rows[0].sampled_decode_s.empty();
  std::string s = fmt::format("{:>8} {:>14} {:>13} {:>12} {:>12}", "context", "prefill tok/s",
                              "decode tok/s", "decode %bw", "prefill TF/s");
  if (sampled) s += fmt::format(" {:>14} {:>9}", "sampled tok/s", "vs greedy");
  s += "  digest\n";
  double sp = 0, sd = 0, ss = 0;
  for (const auto& r : rows) {
    s += fmt::format("{:>8} {:>14.1f} {:>13.2f} {:>11.1f}% {:>12.2f}", r.context, r.prefill_tok_s,
                     r.decode_tok_s, 100 * r.decode_bw_fraction, r.prefill_tflops);
    if (sampled)
      s += fmt::format(" {:>14.2f} {:>8.1f}%", r.sampled_decode_tok_s,
                       100 * (r.sampled_decode_tok_s / r.decode_tok_s - 1));
    s += fmt::format("  {}{}\n", r.digest, r.digest_stable ? "" : " (UNSTABLE)");
    sp += r.prefill_tok_s;
    sd += r.decode_tok_s;
    ss += r.sampled_decode_tok_s;
  }
  if (!rows.empty()) {
    const double n = double(rows.size());
    s += fmt::format("{:>8} {:>14.1f} {:>13.2f}", "mean", sp / n, sd / n);
    if (sampled) s += fmt::format(" {:>12} {:>12} {:>14.2f}", "", "", ss / n);
    s += "\n";
  }
  return s;
}

nlohmann::json bench_json(const std::vector<BenchRow>& rows, const nlohmann::json& header) {
  nlohmann::json j = header;
  j["results"] = nlohmann::json::array();
  double sp = 0, sd = 0, ss = 0;
  for (const auto& r : rows) {
    ss += r.sampled_decode_tok_s;
    j["results"].push_back({{"context", r.context},
                            {"prefill_tok_s", r.prefill_tok_s},
                            {"decode_tok_s", r.decode_tok_s},
                            {"prefill_s_rounds", r.prefill_s},
                            {"decode_s_rounds", r.decode_s},
                            {"decode_first_step_s_rounds", r.decode_first_step_s},
                            {"decode_rest_tok_s", r.decode_rest_tok_s},
                            {"decode_bw_fraction", r.decode_bw_fraction},
                            {"prefill_tflops", r.prefill_tflops},
                            {"digest", r.digest},
                            {"digest_stable", r.digest_stable}});
    if (!r.sampled_decode_s.empty()) {
      auto& row = j["results"].back();
      row["sampled_decode_tok_s"] = r.sampled_decode_tok_s;
      row["sampled_decode_s_rounds"] = r.sampled_decode_s;
      row["sampled_digest"] = r.sampled_digest;
    }
    sp += r.prefill_tok_s;
    sd += r.decode_tok_s;
  }
  j["mean_prefill_tok_s"] = rows.empty() ? 0 : sp / double(rows.size());
  j["mean_decode_tok_s"] = rows.empty() ? 0 : sd / double(rows.size());
  if (!rows.empty() && !rows[0].sampled_decode_s.empty())
    j["mean_sampled_decode_tok_s"] = ss / double(rows.size());
  return j;
}

std::vector<ConcurrencyRow> run_concurrency_bench(Backend& backend, const ConcurrencyOptions& o) {
  using clock = std::chrono::steady_clock;
  const int32_t n_real = o.n_real_tokens > 0 ? o.n_real_tokens : int32_t(backend.config().vocab);
  const int64_t L = o.prompt_tokens;
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<ConcurrencyRow> rows;
  for (int N : o.levels) {
    ConcurrencyRow row;
    row.concurrency = N;
    row.decode_steps = o.decode_steps;
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int32_t> last(size_t(N), 0), first_tokens;
    const auto t0 = clock::now();
    for (int s = 0; s < N; ++s) {
      prompts.push_back(bench_prompt(L, n_real, int64_t(s) * L));
      seqs.push_back(backend.new_sequence(L + o.warmup_steps + o.decode_steps + 2));
      backend.begin_sampling(*seqs.back(), prompts.back(), greedy);
      BatchItem item;
      item.state = seqs.back().get();
      item.ids = prompts.back();
      last[size_t(s)] = backend.step_batch(std::span<const BatchItem>(&item, 1)).at(0).token;
    }
    row.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
    std::vector<BatchItem> items(static_cast<size_t>(N));
    auto decode = [&](int step) {
      for (int s = 0; s < N; ++s) {
        BatchItem& it = items[size_t(s)];
        it.state = seqs[size_t(s)].get();
        it.ids = std::span<const int32_t>(&last[size_t(s)], 1);
        it.sample_index = uint64_t(step + 1);
      }
      first_tokens.push_back(last[0]);
      auto res = backend.step_batch(items);
      for (int s = 0; s < N; ++s) last[size_t(s)] = res[size_t(s)].token;
    };
    for (int i = 0; i < o.warmup_steps; ++i) decode(i);
    const auto t1 = clock::now();
    for (int i = 0; i < o.decode_steps; ++i) decode(o.warmup_steps + i);
    const double secs = std::chrono::duration<double>(clock::now() - t1).count();
    row.step_ms = 1e3 * secs / o.decode_steps;
    row.per_stream_tok_s = o.decode_steps / secs;
    row.output_tok_s = double(N) * row.per_stream_tok_s;
    row.first_digest = fnv1a(first_tokens);
    if (o.progress)
      o.progress(fmt::format(
          "concurrency {:>3}  prefill {:.3f} s  step {:.3f} ms  {:.1f} tok/s ({:.1f} per stream)",
          N, row.prefill_s, row.step_ms, row.output_tok_s, row.per_stream_tok_s));
    rows.push_back(row);
  }
  return rows;
}

std::string concurrency_table(const std::vector<ConcurrencyRow>& rows) {
  std::string s = fmt::format("{:>11} {:>14} {:>16} {:>10}  {}\n", "concurrency", "output tok/s",
                              "per stream tok/s", "step ms", "digest of stream 0");
  for (const auto& r : rows)
    s += fmt::format("{:>11} {:>14.1f} {:>16.2f} {:>10.3f}  {}\n", r.concurrency, r.output_tok_s,
                     r.per_stream_tok_s, r.step_ms, r.first_digest);
  return s;
}

nlohmann::json concurrency_json(const std::vector<ConcurrencyRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows)
    a.push_back({{"concurrency", r.concurrency},
                 {"output_tok_s", r.output_tok_s},
                 {"per_stream_tok_s", r.per_stream_tok_s},
                 {"step_ms", r.step_ms},
                 {"decode_steps", r.decode_steps},
                 {"prefill_s", r.prefill_s},
                 {"stream0_digest", r.first_digest}});
  return a;
}

}  // namespace lilac
