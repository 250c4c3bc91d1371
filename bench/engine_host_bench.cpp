// Host time per batched step of the serving path (issue #11): the real Engine over a backend
// whose step_batch returns at once, so everything measured is what the worker thread does between
// two step_batch calls (admission and cancellation checks, plan_step, the BatchItems, and per
// sequence: detokenizing with the Qwen tokenizer, stop strings, metrics, the on_token callback)
// plus what the consumers make it wait for. Each request is consumed as the HTTP server does:
// a server::Generation (mutex + deque + condition variable) drained by its own thread with
// next(), the chat output parser on. Counters: host_us_per_step (wall time of the run / steps),
// gap_us (mean time from the end of one step_batch to the start of the next).
//
// Arguments: sequences (running at once) and tokens generated per request (greedy, no eos).
#include <benchmark/benchmark.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/engine.h"
#include "server/generation.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string data(const std::string& rel) {
  return std::string(LILAC_TEST_DATA) + "/" + rel;
}

const lilac::Tokenizer& tokenizer() {
  static const auto tok = [] {
    lilac::TokenizerOptions opt;
    opt.force_qwen35_regex = true;
    return lilac::Tokenizer::from_file(data("tokenizer/qwen3-tokenizer.json.gz"), opt);
  }();
  return *tok;
}

// Real text's ids (a licence text with code-like and multibyte pieces): what each sequence
// "samples", every sequence from its own offset.
const std::vector<int32_t>& text_ids() {
  static const std::vector<int32_t> ids = [] {
    std::ifstream f(data("tokenizer/tok_bench.txt"), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return tokenizer().encode(ss.str(), false);
  }();
  return ids;
}

class InstantState : public lilac::SequenceState {
 public:
  void advance(size_t n) { position_ += int64_t(n); }
};

// A backend that computes nothing: step_batch advances the states and returns the next ids of
// the text. It timestamps its calls, so the gaps between steps are the engine's host time.
class InstantBackend : public lilac::Backend {
 public:
  explicit InstantBackend(int64_t vocab) { config_.vocab = vocab; }
  std::string name() const override { return "instant"; }
  const lilac::ModelConfig& config() const override { return config_; }
  std::unique_ptr<lilac::SequenceState> new_sequence(int64_t) override {
    return std::make_unique<InstantState>();
  }
  void forward(lilac::SequenceState& state, std::span<const int32_t> ids, std::span<float>,
               bool) override {
    static_cast<InstantState&>(state).advance(ids.size());
  }
  void begin_sampling(lilac::SequenceState&, std::span<const int32_t>,
                      const lilac::SamplingParams&) override {}
  std::vector<lilac::StepResult> step_batch(std::span<const lilac::BatchItem> items) override {
    const auto start = Clock::now();
    if (steps_ > 0) gap_ += start - last_end_;
    steps_++;
    const auto& text = text_ids();
    std::vector<lilac::StepResult> out(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      auto& st = static_cast<InstantState&>(*items[i].state);
      st.advance(items[i].ids.size());
      if (items[i].sample)
        out[i].token = text[(size_t(st.position()) * 7 + items[i].sample_index) % text.size()];
    }
    last_end_ = Clock::now();
    return out;
  }
  std::unique_ptr<lilac::SequenceState> clone(const lilac::SequenceState& state) override {
    return std::make_unique<InstantState>(static_cast<const InstantState&>(state));
  }
  size_t state_bytes(const lilac::SequenceState& state) const override {
    return 64 + size_t(state.position());
  }

  uint64_t steps_ = 0;
  Clock::duration gap_{};
  Clock::time_point last_end_;

 private:
  lilac::ModelConfig config_;
};

void BM_EngineHostStep(benchmark::State& state) {
  const int sequences = int(state.range(0));
  const int64_t tokens = state.range(1);
  const auto& tok = tokenizer();
  (void)text_ids();
  uint64_t steps = 0;
  double wall = 0, gap = 0;
  for (auto _ : state) {
    InstantBackend backend(tok.size());
    lilac::EngineOptions opt;
    opt.parallel = sequences;
    opt.context_size = 4096;
    lilac::Engine engine(backend, tok, opt);
    std::vector<std::unique_ptr<lilac::server::Generation>> gens;
    std::vector<std::thread> consumers;
    const auto start = Clock::now();
    for (int i = 0; i < sequences; ++i) {
      lilac::GenerationRequest rq;
      // Distinct prompts (each its own slot's live sequence); 16 ids, a short prefill.
      for (int j = 0; j < 16; ++j) rq.prompt.push_back(text_ids()[size_t(i * 131 + j)]);
      rq.sampling.temperature = 0;
      rq.max_tokens = tokens;
      lilac::server::ParseOptions parse;
      gens.push_back(std::make_unique<lilac::server::Generation>(engine, std::move(rq), parse));
    }
    for (auto& g : gens)
      consumers.emplace_back([&g] {
        size_t bytes = 0;
        for (;;) {
          auto chunk = g->next(std::chrono::milliseconds(100));
          bytes += chunk.content.size() + chunk.reasoning.size();
          if (chunk.finished) break;
        }
        benchmark::DoNotOptimize(bytes);
      });
    for (auto& t : consumers) t.join();
    wall += std::chrono::duration<double>(Clock::now() - start).count();
    steps += backend.steps_;
    gap += std::chrono::duration<double>(backend.gap_).count();
  }
  state.counters["steps"] = double(steps) / double(state.iterations());
  state.counters["host_us_per_step"] = 1e6 * wall / double(steps);
  state.counters["gap_us"] = 1e6 * gap / double(steps);
}
BENCHMARK(BM_EngineHostStep)
    ->Args({16, 1024})
    ->Args({64, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
