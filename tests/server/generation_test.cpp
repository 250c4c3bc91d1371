// server::Generation: token events, and the end of the request, reach consumers blocked in next()
// as they happen (the wake-ups happen off the engine thread, generation.cpp's Waker), for several
// requests at once.
#include "server/generation.h"

#include <gtest/gtest.h>

#include <thread>

#include "../test_data.h"
#include "io/checkpoint.h"
#include "support/scripted_backend.h"

namespace lilac::test {
namespace {

using namespace std::chrono_literals;

std::string demo_dir() {
  return data_root() + "/../../models/demo";
}

TEST(Generation, ConsumersWaitingInNextGetEveryTokenAndTheEndWithoutTheirTimeout) {
  auto tok = Tokenizer::from_model_dir(demo_dir());
  const ModelConfig cfg = load_model_config(demo_dir());
  server::ScriptedResponse script;
  script.ids = tok->encode("one two three four five six seven eight", false);
  script.eos = false;
  server::ScriptedBackend backend(cfg, *tok, {script});
  backend.set_step_delay(0.01);  // consumers are blocked in next() when each token comes
  EngineOptions eo;
  eo.context_size = 256;
  eo.parallel = 4;
  Engine engine(backend, *tok, eo);

  constexpr int kRequests = 4, kTokens = 12;
  // A lost wake-up leaves a consumer asleep until its timeout: 20 s, against ~10 ms per step.
  constexpr auto kTimeout = 20s;
  std::vector<std::unique_ptr<server::Generation>> gens;
  for (int i = 0; i < kRequests; ++i) {
    GenerationRequest rq;
    rq.prompt = tok->encode("hello " + std::to_string(i), false);
    rq.sampling.temperature = 0;
    rq.max_tokens = kTokens;
    server::ParseOptions parse;
    parse.chat = false;
    gens.push_back(std::make_unique<server::Generation>(engine, std::move(rq), parse));
  }
  std::vector<std::chrono::steady_clock::duration> slowest(kRequests);
  std::vector<int> received(kRequests, 0);
  std::vector<int> finished(kRequests, 0);  // not vector<bool>: one thread per element
  std::vector<std::thread> consumers;
  for (int i = 0; i < kRequests; ++i)
    consumers.emplace_back([&, i] {
      // Up to the end of the request: the engine's completion wakes the consumer too (until s9
      // the last next() slept until its timeout).
      for (;;) {
        const auto start = std::chrono::steady_clock::now();
        auto chunk =
            gens[size_t(i)]->next(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout));
        slowest[size_t(i)] = std::max(slowest[size_t(i)], std::chrono::steady_clock::now() - start);
        received[size_t(i)] += int(chunk.logprobs.size());
        if (chunk.finished) {
          finished[size_t(i)] = 1;
          break;
        }
      }
    });
  for (auto& t : consumers) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(received[size_t(i)], kTokens) << "request " << i;
    EXPECT_EQ(finished[size_t(i)], 1) << "request " << i;
    EXPECT_LT(slowest[size_t(i)], 5s) << "request " << i << " waited for its timeout";
  }
}

}  // namespace
}  // namespace lilac::test
