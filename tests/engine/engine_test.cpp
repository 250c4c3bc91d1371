// The engine on the demo model (CPU backend, real tokenizer and chat template): multi-turn prompt
// reuse gives exactly the logits of a cold run, seeds reproduce, the queue is bounded, requests
// cancel mid-decode.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>

#include "../test_data.h"
#include "chat/chat_template.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "server/generation.h"
#include "support/scripted_backend.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string demo_dir() {
  return data_root() + "/../../models/demo";
}

// The CPU backend, recording the logits of every forward() that asks for them.
class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return "recording"; }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t n) override { return inner_.new_sequence(n); }
  void forward(SequenceState& st, std::span<const int32_t> ids, std::span<float> logits,
               bool all) override {
    inner_.forward(st, ids, logits, all);
    if (!logits.empty()) calls.emplace_back(logits.begin(), logits.end());
    forwarded += ids.size();
  }
  std::unique_ptr<SequenceState> clone(const SequenceState& s) override { return inner_.clone(s); }
  size_t state_bytes(const SequenceState& s) const override { return inner_.state_bytes(s); }
  std::vector<std::vector<float>> calls;
  size_t forwarded = 0;

 private:
  Backend& inner_;
};

struct Demo {
  std::unique_ptr<Model> model = load_model(demo_dir());
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_model_dir(demo_dir());
  std::unique_ptr<ChatTemplate> tmpl = ChatTemplate::from_model_dir(demo_dir());
  cpu::CpuBackend cpu{model->config, model->weights};
};

GenerationResult generate(Engine& e, const std::vector<int32_t>& prompt, const SamplingParams& sp,
                          int64_t max_tokens, std::vector<size_t> snapshot_at = {}) {
  GenerationRequest rq;
  rq.prompt = prompt;
  rq.sampling = sp;
  rq.max_tokens = max_tokens;
  rq.snapshot_at = std::move(snapshot_at);
  return e.submit(std::move(rq)).get();
}

TEST(Engine, SecondTurnReusesThePromptWithExactLogits) {
  Demo d;
  RecordingBackend warm_backend(d.cpu);
  EngineOptions eo;
  eo.context_size = 2048;
  Engine warm(warm_backend, *d.tok, eo);
  SamplingParams greedy;
  greedy.temperature = 0;

  // Turn 1, through the server's generation path (parser splits reasoning from the answer).
  json messages = json::array({{{"role", "system"}, {"content", "You are terse."}},
                               {{"role", "user"}, {"content", "Name a colour, café?"}}});
  const std::string p1 = d.tmpl->render(messages, json::array(), {});
  const auto ids1 = d.tok->encode(p1, true);
  GenerationRequest rq;
  rq.prompt = ids1;
  rq.sampling = greedy;
  rq.max_tokens = 12;
  rq.stop_ids = d.tok->eos_ids();
  rq.snapshot_at = {server::last_turn_start(ids1, *d.tok)};
  server::ParseOptions po;
  po.in_reasoning = server::prompt_opens_reasoning(p1);
  server::Generation g1(warm, std::move(rq), po);
  std::string reasoning, content;
  for (;;) {
    auto c = g1.next(50ms);
    reasoning += c.reasoning;
    content += c.content;
    if (c.finished) break;
  }
  ASSERT_NE(g1.result().finish, FinishReason::Error) << g1.result().error;
  EXPECT_EQ(g1.result().cached_tokens, 0);

  // Turn 2: turn 1's prompt + its answer + a new user message, rendered by the template.
  json answer = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) answer["reasoning_content"] = reasoning;
  messages.push_back(answer);
  messages.push_back({{"role", "user"}, {"content", "And another one?"}});
  const auto ids2 = d.tok->encode(d.tmpl->render(messages, json::array(), {}), true);
  ASSERT_GT(ids2.size(), ids1.size());
  warm_backend.calls.clear();
  warm_backend.forwarded = 0;
  GenerationResult r2 = generate(warm, ids2, greedy, 4, {server::last_turn_start(ids2, *d.tok)});
  ASSERT_EQ(r2.finish == FinishReason::Error, false) << r2.error;
  EXPECT_GT(r2.cached_tokens, 0);
  EXPECT_EQ(warm_backend.forwarded + size_t(r2.cached_tokens), ids2.size() + r2.tokens.size() - 1)
      << "only the tokens after the snapshot are prefilled";
  ASSERT_FALSE(warm_backend.calls.empty());

  // A cold engine on the same prompt: no reuse, and the same logits bit for bit.
  RecordingBackend cold_backend(d.cpu);
  Engine cold(cold_backend, *d.tok, eo);
  GenerationResult c2 = generate(cold, ids2, greedy, 4);
  EXPECT_EQ(c2.cached_tokens, 0);
  ASSERT_EQ(cold_backend.calls.size(), warm_backend.calls.size());
  for (size_t i = 0; i < cold_backend.calls.size(); ++i) {
    ASSERT_EQ(cold_backend.calls[i].size(), warm_backend.calls[i].size());
    EXPECT_EQ(std::memcmp(cold_backend.calls[i].data(), warm_backend.calls[i].data(),
                          cold_backend.calls[i].size() * sizeof(float)),
              0)
        << "logits of step " << i << " differ";
  }
  EXPECT_EQ(c2.tokens, r2.tokens);
}

TEST(Engine, SeedReproducesAndDiffers) {
  Demo d;
  const auto ids = d.tok->encode(
      d.tmpl->render(json::array({{{"role", "user"}, {"content", "hi"}}}), json::array(), {}));
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_p = 0.95f;
  sp.top_k = 50;
  auto run = [&](uint64_t seed) {
    EngineOptions eo;
    eo.context_size = 512;
    Engine e(d.cpu, *d.tok, eo);
    sp.seed = seed;
    return generate(e, ids, sp, 24).tokens;
  };
  const auto a = run(42), b = run(42), c = run(43);
  ASSERT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The same engine twice (the second run reuses snapshots) gives the same tokens too.
  EngineOptions eo;
  eo.context_size = 512;
  Engine e(d.cpu, *d.tok, eo);
  sp.seed = 42;
  const std::vector<size_t> mark = {server::last_turn_start(ids, *d.tok)};
  auto first = generate(e, ids, sp, 24, mark);
  auto second = generate(e, ids, sp, 24, mark);
  EXPECT_GT(second.cached_tokens, 0);
  EXPECT_EQ(first.tokens, a);
  EXPECT_EQ(second.tokens, a);
}

struct Scripted {
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_model_dir(demo_dir());
  ModelConfig cfg = load_model_config(demo_dir());
  std::unique_ptr<server::ScriptedBackend> backend;
  explicit Scripted(double delay) {
    server::ScriptedResponse r;
    r.ids = tok->encode("tick tock ", true);
    r.eos = false;
    backend = std::make_unique<server::ScriptedBackend>(cfg, *tok,
                                                        std::vector<server::ScriptedResponse>{r});
    backend->set_step_delay(delay);
    script_ids = r.ids;
  }
  std::vector<int32_t> script_ids;
  // The id the script samples at index i (it repeats its last id once it runs out).
  int32_t scripted_at(size_t i) const { return script_ids[std::min(i, script_ids.size() - 1)]; }
};

TEST(Engine, QueueFullThrowsAndQueuedRequestsRun) {
  Scripted s(0.01);
  EngineOptions eo;
  eo.context_size = 512;
  eo.queue_capacity = 1;
  Engine e(*s.backend, *s.tok, eo);
  const auto prompt = s.tok->encode("hello", true);
  auto req = [&](int64_t n) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = n;
    return r;
  };
  auto running = e.submit(req(30));
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (!e.busy() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(e.busy());
  auto queued = e.submit(req(2));
  EXPECT_THROW(e.submit(req(2)), QueueFull);
  EXPECT_EQ(e.metrics().requests_rejected, 1u);
  EXPECT_EQ(running.get().tokens.size(), 30u);
  EXPECT_EQ(queued.get().tokens.size(), 2u);
  // Bad requests are refused at submit with lilac::Error, nothing queued.
  EXPECT_THROW(e.submit(req(0)), Error);
  GenerationRequest empty;
  EXPECT_THROW(e.submit(std::move(empty)), Error);
  GenerationRequest too_long;
  too_long.prompt.assign(600, 1);
  EXPECT_THROW(e.submit(std::move(too_long)), Error);
}

TEST(Engine, CancelMidDecode) {
  Scripted s(0.005);
  EngineOptions eo;
  eo.context_size = 4096;
  Engine e(*s.backend, *s.tok, eo);
  GenerationRequest r;
  r.prompt = s.tok->encode("hello", true);
  r.max_tokens = 1000;
  auto flag = r.cancelled;
  int seen = 0;
  r.on_token = [&](const TokenEvent&) {
    if (++seen == 5) *flag = true;
    return true;
  };
  GenerationResult res = e.submit(std::move(r)).get();
  EXPECT_EQ(res.finish, FinishReason::Cancelled);
  EXPECT_EQ(res.tokens.size(), 5u);
  EXPECT_EQ(e.metrics().requests_cancelled, 1u);
  // on_token returning false cancels too.
  GenerationRequest r2;
  r2.prompt = s.tok->encode("hello", true);
  r2.max_tokens = 1000;
  r2.on_token = [](const TokenEvent&) { return false; };
  EXPECT_EQ(e.submit(std::move(r2)).get().tokens.size(), 1u);
  // Shutdown cancels what is queued and running.
  GenerationRequest r3;
  r3.prompt = s.tok->encode("hello", true);
  r3.max_tokens = 100000;
  auto f3 = e.submit(std::move(r3));
  GenerationRequest r4 = GenerationRequest{};
  r4.prompt = s.tok->encode("hello", true);
  auto f4 = e.submit(std::move(r4));
  std::this_thread::sleep_for(20ms);
  e.shutdown();
  EXPECT_EQ(f3.get().finish, FinishReason::Cancelled);
  EXPECT_EQ(f4.get().finish, FinishReason::Cancelled);
  EXPECT_THROW(e.submit(GenerationRequest{}), Error);
}

TEST(Engine, ThinkingBudgetClosesTheThinkingAndTheAnswerFollows) {
  // The script thinks forever (no eos); a budget of 6 tokens cuts it.
  Scripted s(0);
  Engine e(*s.backend, *s.tok, EngineOptions{});
  const auto close = s.tok->encode("</think>\n\n", true);
  ASSERT_GE(close.size(), 2u);
  auto run = [&](int64_t budget, bool in_reasoning, int32_t end_id) {
    GenerationRequest r;
    r.prompt = s.tok->encode("hello", true);
    r.max_tokens = 20;
    r.thinking_budget = budget;
    r.think_end_id = end_id;
    r.think_close = close;
    r.starts_in_reasoning = in_reasoning;
    return e.submit(std::move(r)).get();
  };
  const int32_t end_id = close[0];
  GenerationResult cut = run(6, true, end_id);
  ASSERT_EQ(cut.tokens.size(), 20u);  // the forced ids count in max_tokens
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(cut.tokens[i], s.scripted_at(i)) << i;
  for (size_t i = 0; i < close.size(); ++i) EXPECT_EQ(cut.tokens[6 + i], close[i]) << i;
  // Then sampling resumes (the script goes on where its index is).
  EXPECT_EQ(cut.tokens[6 + close.size()], s.scripted_at(6 + close.size()));
  const size_t at = cut.text.find("</think>\n\n");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(cut.text.substr(0, at),
            s.tok->decode(std::vector<int32_t>(cut.tokens.begin(), cut.tokens.begin() + 6)));
  // Budget 0: the thinking closes at once.
  GenerationResult none = run(0, true, end_id);
  EXPECT_EQ(std::vector<int32_t>(none.tokens.begin(), none.tokens.begin() + close.size()), close);
  // No budget, or a prompt not in reasoning: nothing forced.
  for (GenerationResult r : {run(-1, true, end_id), run(6, false, end_id)})
    for (size_t i = 0; i < r.tokens.size(); ++i) EXPECT_EQ(r.tokens[i], s.scripted_at(i)) << i;
}

}  // namespace
}  // namespace lilac::test
