// Tokenizer throughput: encoding tests/data/tokenizer/tok_bench.txt on one thread (bytes/s), the
// same with a cold pre-token cache, decoding, and the load time of the 11 MB tokenizer.json.
// Reference: HF `tokenizers` (Rust, one thread) encodes tok_bench.txt at 1.1-1.4 MB/s on the
// GPU machine's CPU (docs/model.md section 10).
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace {

std::string data(const std::string& rel) {
  return std::string(LILAC_TEST_DATA) + "/" + rel;
}

std::string bench_text() {
  std::ifstream f(data("tokenizer/tok_bench.txt"), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::unique_ptr<lilac::Tokenizer> load_qwen35() {
  lilac::TokenizerOptions opt;
  opt.force_qwen35_regex = true;
  return lilac::Tokenizer::from_file(data("tokenizer/qwen3-tokenizer.json.gz"), opt);
}

const lilac::Tokenizer& tokenizer() {
  static const auto tok = load_qwen35();
  return *tok;
}

// Steady state: the pre-token cache is warm after the first pass (a server's normal case).
void BM_Encode(benchmark::State& state) {
  const std::string text = bench_text();
  const auto& tok = tokenizer();
  size_t ids = 0;
  for (auto _ : state) {
    auto out = tok.encode(text, true);
    ids = out.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["ids"] = double(ids);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Each iteration on a freshly loaded tokenizer: an empty cache (load time not counted).
void BM_EncodeColdCache(benchmark::State& state) {
  const std::string text = bench_text();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = load_qwen35();
    state.ResumeTiming();
    auto out = tok->encode(text, true);
    benchmark::DoNotOptimize(out.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_EncodeColdCache)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_Decode(benchmark::State& state) {
  const std::string text = bench_text();
  const auto& tok = tokenizer();
  auto ids = tok.encode(text, true);
  for (auto _ : state) {
    auto out = tok.decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

// tokenizer.json (151,669 ids, 11.4 MB, gunzip included) to a ready tokenizer.
void BM_Load(benchmark::State& state) {
  for (auto _ : state) {
    auto tok = lilac::Tokenizer::from_file(data("tokenizer/qwen3-tokenizer.json.gz"));
    benchmark::DoNotOptimize(tok.get());
  }
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
