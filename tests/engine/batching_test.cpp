// Continuous batching in the engine (docs/batching.md), on the demo model with the CPU backend:
// every answer of a batch equals the same request run alone, requests join and leave a running
// batch, prompts are read in budgeted pieces between decode steps, cancellation and failures free
// their slots, the queue is bounded, the thinking budget forces the close ids, constraints see
// every token, and slots that do not fit fail at start-up.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <regex>
#include <thread>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "support/scripted_backend.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using namespace std::chrono_literals;

std::string demo_dir() {
  return data_root() + "/../../models/demo";
}

struct Demo {
  std::unique_ptr<Model> model = load_model(demo_dir());
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_model_dir(demo_dir());
  cpu::CpuBackend cpu{model->config, model->weights};
};

// What one step_batch call carried.
struct StepRecord {
  int decode = 0;        // items feeding one token that were not prompt pieces (ids.size() == 1)
  int pieces = 0;        // items with several ids (prompt pieces)
  int not_sampling = 0;  // items with sample == false
  size_t tokens = 0;     // ids fed in all
};

// Wraps a backend: records every step_batch call, optionally fails one, and can slow steps down.
class BatchRecorder : public Backend {
 public:
  explicit BatchRecorder(Backend& inner) : inner_(inner) {}
  std::string name() const override { return "recorder"; }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t n) override {
    new_sequences++;
    return inner_.new_sequence(n);
  }
  void forward(SequenceState& st, std::span<const int32_t> ids, std::span<float> logits,
               bool all) override {
    inner_.forward(st, ids, logits, all);
  }
  void begin_sampling(SequenceState& st, std::span<const int32_t> prompt,
                      const SamplingParams& p) override {
    inner_.begin_sampling(st, prompt, p);
  }
  StepResult step(SequenceState& st, std::span<const int32_t> ids, uint64_t i) override {
    return inner_.step(st, ids, i);
  }
  std::vector<StepResult> step_batch(std::span<const BatchItem> items) override {
    StepRecord r;
    for (const auto& it : items) {
      (it.ids.size() == 1 ? r.decode : r.pieces)++;
      if (!it.sample) r.not_sampling++;
      r.tokens += it.ids.size();
    }
    {
      std::lock_guard lock(mutex);
      steps.push_back(r);
    }
    if (delay > 0s) std::this_thread::sleep_for(delay);
    if (fail_next.exchange(false)) throw Error("injected device failure");
    return inner_.step_batch(items);
  }
  std::unique_ptr<SequenceState> clone(const SequenceState& s) override { return inner_.clone(s); }
  std::unique_ptr<SequenceState> clone_with_capacity(const SequenceState& s, int64_t n) override {
    return inner_.clone_with_capacity(s, n);
  }
  size_t state_bytes(const SequenceState& s) const override { return inner_.state_bytes(s); }

  std::vector<StepRecord> recorded() {
    std::lock_guard lock(mutex);
    return steps;
  }
  std::mutex mutex;
  std::vector<StepRecord> steps;
  std::atomic<bool> fail_next{false};
  std::atomic<int> new_sequences{0};
  std::chrono::milliseconds delay{0};

 private:
  Backend& inner_;
};

std::vector<int32_t> prompt_of(const Tokenizer& tok, int i) {
  std::string text = "request number " + std::to_string(i) + ":";
  for (int k = 0; k < i % 5; ++k) text += " and some more words";
  return tok.encode(text, true);
}

GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest rq;
  rq.prompt = std::move(prompt);
  rq.sampling.temperature = 0;
  rq.max_tokens = max_tokens;
  return rq;
}

// The number of decode steps that carried more than one sequence, from /metrics' histogram.
uint64_t batched_steps(const Metrics& m) {
  const std::string text = m.render(0, 0);
  std::smatch one, count;
  std::regex le1("lilac_batch_size_bucket\\{le=\"1\"\\} (\\d+)");
  std::regex total("lilac_batch_size_count (\\d+)");
  EXPECT_TRUE(std::regex_search(text, one, le1)) << text;
  EXPECT_TRUE(std::regex_search(text, count, total)) << text;
  return std::stoull(count[1]) - std::stoull(one[1]);
}

TEST(EngineBatching, EveryAnswerOfABatchEqualsTheRequestAlone) {
  Demo d;
  constexpr int N = 12;
  std::vector<std::vector<int32_t>> alone(N);
  {
    EngineOptions eo;
    eo.context_size = 512;
    eo.snapshot_budget = 0;
    Engine e(d.cpu, *d.tok, eo);
    for (int i = 0; i < N; ++i)
      alone[size_t(i)] = e.submit(greedy_request(prompt_of(*d.tok, i), 8 + i % 7)).get().tokens;
  }
  // Sampled requests with seeds reproduce in a batch too (each sequence has its own Philox).
  auto sampled = [&](int i) {
    GenerationRequest rq = greedy_request(prompt_of(*d.tok, i), 10);
    rq.sampling.temperature = 1.0f;
    rq.sampling.top_k = 40;
    rq.sampling.seed = uint64_t(100 + i);
    return rq;
  };
  std::vector<int32_t> sampled_alone;
  {
    EngineOptions eo;
    eo.context_size = 512;
    Engine e(d.cpu, *d.tok, eo);
    sampled_alone = e.submit(sampled(3)).get().tokens;
  }
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 4;
  eo.step_token_budget = 24;
  eo.prefill_chunk = 8;
  eo.queue_capacity = 64;
  eo.snapshot_budget = 0;
  BatchRecorder rec(d.cpu);
  Engine e(rec, *d.tok, eo);
  std::vector<std::future<GenerationResult>> futures;
  for (int i = 0; i < N; ++i)
    futures.push_back(e.submit(greedy_request(prompt_of(*d.tok, i), 8 + i % 7)));
  auto sampled_future = e.submit(sampled(3));
  for (int i = 0; i < N; ++i) {
    GenerationResult r = futures[size_t(i)].get();
    ASSERT_NE(r.finish, FinishReason::Error) << r.error;
    EXPECT_EQ(r.tokens, alone[size_t(i)]) << "request " << i;
  }
  EXPECT_EQ(sampled_future.get().tokens, sampled_alone);
  EXPECT_GT(batched_steps(e.metrics()), 0u);
  size_t most = 0;
  for (const auto& s : rec.recorded()) {
    EXPECT_LE(s.decode + s.pieces, 4) << "at most `parallel` sequences per step";
    EXPECT_LE(s.tokens, 24u) << "the step token budget holds";
    most = std::max(most, size_t(s.decode + s.pieces));
  }
  EXPECT_EQ(most, 4u);
  EXPECT_EQ(e.running(), 0u);
}

TEST(EngineBatching, RequestsJoinAndLeaveARunningBatch) {
  Demo d;
  EngineOptions eo;
  eo.context_size = 1024;
  eo.parallel = 2;
  eo.prefill_chunk = 16;
  eo.step_token_budget = 20;
  BatchRecorder rec(d.cpu);
  Engine e(rec, *d.tok, eo);
  // A long answer; once it has streamed 5 tokens, a second request with a long prompt joins.
  std::vector<int32_t> alone_long, alone_short;
  {
    EngineOptions one = eo;
    one.parallel = 1;
    Engine a(d.cpu, *d.tok, one);
    alone_long = a.submit(greedy_request(prompt_of(*d.tok, 1), 60)).get().tokens;
  }
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 6; ++i) {
    auto p = prompt_of(*d.tok, 4);
    long_prompt.insert(long_prompt.end(), p.begin(), p.end());
  }
  {
    EngineOptions one = eo;
    one.parallel = 1;
    Engine a(d.cpu, *d.tok, one);
    alone_short = a.submit(greedy_request(long_prompt, 3)).get().tokens;
  }
  std::promise<void> five;
  std::atomic<int> streamed{0};
  std::atomic<int> streamed_when_short_done{-1};
  GenerationRequest lr = greedy_request(prompt_of(*d.tok, 1), 60);
  lr.on_token = [&](const TokenEvent& ev) {
    if (ev.id >= 0 && ++streamed == 5) five.set_value();
    return true;
  };
  auto long_future = e.submit(std::move(lr));
  five.get_future().wait();
  GenerationResult short_result = e.submit(greedy_request(long_prompt, 3)).get();
  streamed_when_short_done = streamed.load();
  GenerationResult long_result = long_future.get();
  EXPECT_EQ(short_result.tokens, alone_short);
  EXPECT_EQ(long_result.tokens, alone_long);
  EXPECT_LT(streamed_when_short_done.load(), 60) << "the short request left while the long ran";
  // The long prompt was read in pieces interleaved with the long answer's decode steps.
  int mixed = 0;
  for (const auto& s : rec.recorded()) {
    EXPECT_LE(s.tokens, 20u);
    if (s.decode >= 1 && s.pieces >= 1) mixed++;
  }
  EXPECT_GE(mixed, 2) << "prompt pieces and decode tokens share steps";
}

TEST(EngineBatching, PromptReuseWorksPerSlot) {
  Demo d;
  EngineOptions eo;
  eo.context_size = 1024;
  eo.parallel = 3;
  Engine e(d.cpu, *d.tok, eo);
  auto base = prompt_of(*d.tok, 2);
  GenerationResult first = e.submit(greedy_request(base, 6)).get();
  // A second turn extending the first prompt + answer reuses the slot's live state or a snapshot,
  // and equals a cold run.
  std::vector<int32_t> turn2 = base;
  turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
  auto more = d.tok->encode(" next", true);
  turn2.insert(turn2.end(), more.begin(), more.end());
  // Meanwhile other requests occupy the other slots.
  auto other1 = e.submit(greedy_request(prompt_of(*d.tok, 7), 20));
  auto other2 = e.submit(greedy_request(prompt_of(*d.tok, 8), 20));
  GenerationResult warm = e.submit(greedy_request(turn2, 6)).get();
  EXPECT_GE(warm.cached_tokens, int64_t(base.size()));
  EngineOptions cold_options = eo;
  cold_options.snapshot_budget = 0;
  Engine cold(d.cpu, *d.tok, cold_options);
  EXPECT_EQ(cold.submit(greedy_request(turn2, 6)).get().tokens, warm.tokens);
  other1.get();
  other2.get();
}

// A histogram's _count in /metrics' text.
uint64_t histogram_count(const std::string& text, const std::string& name) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(text, m, std::regex(name + "_count (\\d+)"))) << name;
  return m.empty() ? 0 : std::stoull(m[1]);
}

// /metrics splits a step's time: every step_batch call is timed; the gap between consecutive
// steps is counted only while sequences run (not the idle wait before the first step of a
// request); every snapshot store is timed, two per request here (after the prompt, after the
// answer), none without a snapshot budget.
TEST(EngineBatching, MetricsTimeStepsGapsAndSnapshots) {
  Demo d;
  for (size_t budget : {size_t(0), size_t(256) << 20}) {
    SCOPED_TRACE("snapshot budget " + std::to_string(budget));
    EngineOptions eo;
    eo.context_size = 512;
    eo.parallel = 2;
    eo.snapshot_budget = budget;
    Engine e(d.cpu, *d.tok, eo);
    for (int i = 0; i < 2; ++i) e.submit(greedy_request(prompt_of(*d.tok, i), 5)).get();
    const std::string text = e.metrics().render(0, 0);
    const uint64_t steps = e.metrics().steps_total.load();
    EXPECT_GE(steps, 10u);  // at least one prompt piece and 4 decode steps per request
    EXPECT_EQ(histogram_count(text, "lilac_step_seconds"), steps);
    // The requests ran one after the other: each one's first step follows an idle wait.
    EXPECT_EQ(histogram_count(text, "lilac_step_gap_seconds"), steps - 2);
    EXPECT_EQ(histogram_count(text, "lilac_snapshot_seconds"), budget ? 4u : 0u);
  }
}

// The step observer sees every step with what it carried: here two requests together, so the
// steps' decode rows and prompt tokens add up to the requests' answers and prompts.
TEST(EngineBatching, StepObserverSeesEveryStep) {
  Demo d;
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 2;
  eo.snapshot_budget = 0;  // the second prompt reads all its tokens
  const int kTokens = 6;
  std::vector<std::vector<int32_t>> prompts = {prompt_of(*d.tok, 0), prompt_of(*d.tok, 1)};
  // Written on the engine thread; read once the engine is gone (its destructor joins the thread:
  // the last step's observer call may come after the requests' futures are ready).
  std::vector<lilac::StepRecord> records;
  uint64_t steps = 0;
  {
    Engine e(d.cpu, *d.tok, eo);
    e.set_step_observer([&](const lilac::StepRecord& r) { records.push_back(r); });
    auto f0 = e.submit(greedy_request(prompts[0], kTokens));
    auto f1 = e.submit(greedy_request(prompts[1], kTokens));
    const GenerationResult r0 = f0.get(), r1 = f1.get();
    ASSERT_EQ(r0.tokens.size(), size_t(kTokens));
    ASSERT_EQ(r1.tokens.size(), size_t(kTokens));
    steps = e.metrics().steps_total.load();  // final: no step starts after both are done
  }
  ASSERT_EQ(records.size(), steps);
  int64_t decode = 0, prompt = 0, takers = 0, idle = 0;
  for (const lilac::StepRecord& r : records) {
    decode += r.decode_rows;
    prompt += r.prompt_tokens;
    takers += r.takers;
    idle += r.gap_seconds < 0;
    EXPECT_GT(r.seconds, 0);
    EXPECT_LE(r.takers, r.decode_rows + r.prompt_pieces);
  }
  // Each answer's first token ends its prompt; the other kTokens - 1 are decode rows. (The
  // last token is taken without a further step.)
  EXPECT_EQ(decode, 2 * (kTokens - 1));
  EXPECT_EQ(prompt, int64_t(prompts[0].size() + prompts[1].size()));
  EXPECT_EQ(takers, 2 * kTokens);
  EXPECT_GE(idle, 1);  // the first step follows an idle wait
}

struct Scripted {
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_model_dir(demo_dir());
  ModelConfig cfg = load_model_config(demo_dir());
  std::unique_ptr<server::ScriptedBackend> backend;
  explicit Scripted(std::vector<int32_t> ids, double delay = 0) {
    server::ScriptedResponse r;
    r.ids = std::move(ids);
    r.eos = false;
    backend = std::make_unique<server::ScriptedBackend>(cfg, *tok,
                                                        std::vector<server::ScriptedResponse>{r});
    backend->set_step_delay(delay);
  }
};

bool wait_for(const std::function<bool()>& cond) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!cond())
    if (std::chrono::steady_clock::now() > until)
      return false;
    else
      std::this_thread::sleep_for(1ms);
  return true;
}

TEST(EngineBatching, QueueFullOnlyWhenSlotsAndQueueAreTaken) {
  Scripted s({10, 11, 12}, 0.002);
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 2;
  eo.queue_capacity = 1;
  Engine e(*s.backend, *s.tok, eo);
  const auto prompt = s.tok->encode("hello", true);
  auto a = e.submit(greedy_request(prompt, 150));
  ASSERT_TRUE(wait_for([&] { return e.running() == 1; }));  // out of the one-place queue
  auto b = e.submit(greedy_request(prompt, 150));
  ASSERT_TRUE(wait_for([&] { return e.running() == 2 && e.queue_length() == 0; }));
  auto c = e.submit(greedy_request(prompt, 2));  // waits in the queue
  EXPECT_THROW(e.submit(greedy_request(prompt, 2)), QueueFull);
  EXPECT_EQ(e.metrics().requests_rejected, 1u);
  EXPECT_EQ(c.get().tokens.size(), 2u);
  EXPECT_EQ(a.get().tokens.size(), 150u);
  EXPECT_EQ(b.get().tokens.size(), 150u);
}

TEST(EngineBatching, CancellationFreesTheSlot) {
  Scripted s({10, 11, 12}, 0.002);
  EngineOptions eo;
  eo.context_size = 100000;
  eo.parallel = 2;
  Engine e(*s.backend, *s.tok, eo);
  const auto prompt = s.tok->encode("hello", true);
  GenerationRequest endless1 = greedy_request(prompt, 90000), endless2 = endless1;
  auto flag1 = endless1.cancelled;
  endless2.cancelled = std::make_shared<std::atomic<bool>>(false);
  auto flag2 = endless2.cancelled;
  auto f1 = e.submit(std::move(endless1));
  auto f2 = e.submit(std::move(endless2));
  ASSERT_TRUE(wait_for([&] { return e.running() == 2; }));
  auto queued = e.submit(greedy_request(prompt, 5));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(e.queue_length(), 1u) << "both slots are taken";
  *flag1 = true;  // the first client leaves: its slot takes the queued request
  EXPECT_EQ(f1.get().finish, FinishReason::Cancelled);
  GenerationResult q = queued.get();
  EXPECT_EQ(q.finish, FinishReason::Length);
  EXPECT_EQ(q.tokens.size(), 5u);
  EXPECT_EQ(e.running(), 1u) << "the second endless request still runs";
  *flag2 = true;
  EXPECT_EQ(f2.get().finish, FinishReason::Cancelled);
  EXPECT_TRUE(wait_for([&] { return e.running() == 0; }));
  EXPECT_EQ(e.metrics().requests_cancelled, 2u);
}

TEST(EngineBatching, AFailedStepFailsItsBatchAndServingGoesOn) {
  Demo d;
  BatchRecorder rec(d.cpu);
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 2;
  Engine e(rec, *d.tok, eo);
  rec.delay = 5ms;
  std::promise<void> started;
  std::atomic<bool> once{false};
  GenerationRequest a = greedy_request(prompt_of(*d.tok, 1), 200);
  a.on_token = [&](const TokenEvent&) {
    if (!once.exchange(true)) started.set_value();
    return true;
  };
  auto fa = e.submit(std::move(a));
  auto fb = e.submit(greedy_request(prompt_of(*d.tok, 2), 200));
  started.get_future().wait();
  rec.fail_next = true;
  GenerationResult ra = fa.get(), rb = fb.get();
  EXPECT_EQ(ra.finish, FinishReason::Error);
  EXPECT_NE(ra.error.find("injected device failure"), std::string::npos) << ra.error;
  EXPECT_EQ(rb.finish, FinishReason::Error);
  EXPECT_EQ(e.running(), 0u);
  rec.delay = 0ms;
  GenerationResult after = e.submit(greedy_request(prompt_of(*d.tok, 3), 4)).get();
  EXPECT_EQ(after.finish, FinishReason::Length) << after.error;
  EXPECT_EQ(after.tokens.size(), 4u);
  EXPECT_EQ(e.metrics().requests_failed, 2u);
}

// Records every token accepted; allows only the ids in `allowed` (all when empty).
class RecordingConstraint : public TokenConstraint {
 public:
  explicit RecordingConstraint(std::vector<int32_t> allowed = {}) : allowed_(std::move(allowed)) {}
  void allowed_tokens(std::span<uint32_t> mask) override {
    masks++;
    std::fill(mask.begin(), mask.end(), allowed_.empty() ? ~0u : 0u);
    for (int32_t t : allowed_) mask[size_t(t) / 32] |= 1u << (t % 32);
  }
  void accept(int32_t token) override { accepted.push_back(token); }
  std::vector<int32_t> accepted;
  int masks = 0;

 private:
  std::vector<int32_t> allowed_;
};

TEST(EngineBatching, ThinkingBudgetForcesTheCloseIds) {
  Scripted s({20, 21, 22, 23, 24, 25, 26, 27, 28, 29});
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 2;
  Engine e(*s.backend, *s.tok, eo);
  const auto prompt = s.tok->encode("hello", true);
  auto run = [&](int64_t budget, bool in_reasoning, int32_t end_id) {
    GenerationRequest rq = greedy_request(prompt, 8);
    rq.starts_in_reasoning = in_reasoning;
    rq.thinking_budget = budget;
    rq.think_end_id = end_id;
    rq.think_close = {90, 91, 92};
    std::vector<int32_t> streamed;
    rq.on_token = [&streamed](const TokenEvent& ev) {
      if (ev.id >= 0) streamed.push_back(ev.id);
      return true;
    };
    GenerationResult r = e.submit(std::move(rq)).get();
    EXPECT_EQ(r.tokens, streamed) << "forced ids stream as token events";
    return r.tokens;
  };
  // Budget 3: three thinking tokens, the close ids one per step, then the answer is sampled (the
  // script continues at the sample index, after the forced ids).
  EXPECT_EQ(run(3, true, 92), (std::vector<int32_t>{20, 21, 22, 90, 91, 92, 26, 27}));
  EXPECT_EQ(run(0, true, 92), (std::vector<int32_t>{90, 91, 92, 23, 24, 25, 26, 27}));
  // The model closed its thinking itself (think_end_id 21) before the budget: nothing forced.
  EXPECT_EQ(run(3, true, 21), (std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27}));
  // Not in reasoning, or no budget: nothing forced.
  EXPECT_EQ(run(3, false, 92), (std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27}));
  EXPECT_EQ(run(-1, true, 92), (std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27}));
  // max_tokens counts the forced ids.
  GenerationRequest rq = greedy_request(prompt, 4);
  rq.starts_in_reasoning = true;
  rq.thinking_budget = 2;
  rq.think_close = {90, 91, 92};
  EXPECT_EQ(e.submit(std::move(rq)).get().tokens, (std::vector<int32_t>{20, 21, 90, 91}));
}

TEST(EngineBatching, ConstraintMasksTheSampledTokensOfItsSequenceOnly) {
  Demo d;
  EngineOptions eo;
  eo.context_size = 512;
  eo.parallel = 2;
  Engine e(d.cpu, *d.tok, eo);
  auto c = std::make_shared<RecordingConstraint>(std::vector<int32_t>{65, 66, 67});
  GenerationRequest constrained = greedy_request(prompt_of(*d.tok, 1), 12);
  constrained.constraint = c;
  auto fc = e.submit(std::move(constrained));
  auto ff = e.submit(greedy_request(prompt_of(*d.tok, 1), 12));
  GenerationResult rc = fc.get(), rf = ff.get();
  ASSERT_EQ(rc.tokens.size(), 12u);
  for (int32_t t : rc.tokens) EXPECT_TRUE(t >= 65 && t <= 67) << t;
  EXPECT_EQ(c->accepted, rc.tokens);
  EXPECT_EQ(c->masks, 12);
  bool outside = false;
  for (int32_t t : rf.tokens) outside = outside || t < 65 || t > 67;
  EXPECT_TRUE(outside) << "the unconstrained neighbour is not masked";

  // With a thinking budget, the forced close ids are accepted too, and only sampled tokens are
  // masked.
  auto all = std::make_shared<RecordingConstraint>();
  GenerationRequest thinking = greedy_request(prompt_of(*d.tok, 2), 9);
  thinking.constraint = all;
  thinking.starts_in_reasoning = true;
  thinking.thinking_budget = 2;
  thinking.think_close = {300, 301, 302};
  thinking.think_end_id = 302;
  GenerationResult rt = e.submit(std::move(thinking)).get();
  ASSERT_EQ(rt.tokens.size(), 9u);
  EXPECT_EQ(std::vector<int32_t>(rt.tokens.begin() + 2, rt.tokens.begin() + 5),
            (std::vector<int32_t>{300, 301, 302}));
  EXPECT_EQ(all->accepted, rt.tokens);
  EXPECT_EQ(all->masks, 6);
}

TEST(EngineBatching, SlotsThatDoNotFitFailAtStartUp) {
  Demo d;
  EngineOptions fits;
  fits.context_size = 4096;
  fits.parallel = 3;
  Engine e(d.cpu, *d.tok, fits);
  const SlotMemory& m = e.slot_memory();
  // The first requests use the states allocated at start-up; a slot's used state is replaced by
  // a fresh one only when its contents cannot serve the next prompt.
  BatchRecorder rec(d.cpu);
  Engine counted(rec, *d.tok, fits);
  const int at_start = rec.new_sequences;
  EXPECT_EQ(at_start, 3 + 2) << "three slots, and two tiny states to measure one";
  for (int i = 0; i < 3; ++i) counted.submit(greedy_request(prompt_of(*d.tok, i), 2)).get();
  EXPECT_EQ(rec.new_sequences, at_start);
  counted.submit(greedy_request(prompt_of(*d.tok, 3), 2)).get();
  EXPECT_EQ(rec.new_sequences, at_start + 1);
  // The demo model: one attention layer, 2 kv heads x 64 dims, K and V in f32 on the CPU.
  EXPECT_EQ(m.kv_per_token, size_t(2 * 2 * 64 * 4));
  EXPECT_GT(m.fixed, 0u);
  EXPECT_EQ(m.per_slot, m.fixed + m.kv_per_token * 4096);
  EXPECT_EQ(m.total, 3 * m.per_slot);
  EngineOptions huge = fits;
  huge.context_size = int64_t(1) << 40;  // 512 TiB of KV cache per slot
  try {
    Engine too_big(d.cpu, *d.tok, huge);
    ADD_FAILURE() << "slots of 2^40 tokens were allocated";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("do not fit"), std::string::npos) << what;
    EXPECT_NE(what.find("MiB"), std::string::npos) << what;
    EXPECT_NE(what.find("--parallel"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lilac::test
