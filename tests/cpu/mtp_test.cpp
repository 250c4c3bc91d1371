// The CPU backend's multi-token-prediction head against HF transformers (the tiny-a-mtp fixture:
// tiny-a's architecture with its own trunk and the head the real checkpoint ships; docs/model.md
// section 8): the head per position from the trunk's normed hidden states, three chained drafts,
// and greedy speculative decoding with one draft per step (the trunk's verify pass rolled back
// on rejection), whose emitted tokens are the trunk's own greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../max_abs_diff.h"
#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct MtpReference {
  std::vector<int32_t> prompt, input_ids, chain_ids, draft_ids, accepted, emitted, spec_ids;
  std::vector<float> input_hidden, hidden, logits, chain_logits, draft_logits;
  MtpReference() {
    auto f = SafetensorsFile::open(data_path("tiny-a-mtp/mtp_reference.safetensors"));
    prompt = read_i32(*f, "prompt_ids");
    input_ids = read_i32(*f, "mtp_input_ids");
    input_hidden = read_f32(*f, "mtp_input_hidden");
    hidden = read_f32(*f, "mtp_hidden");
    logits = read_f32(*f, "mtp_logits");
    chain_ids = read_i32(*f, "chain_ids");
    chain_logits = read_f32(*f, "chain_logits");
    draft_ids = read_i32(*f, "spec_draft_ids");
    draft_logits = read_f32(*f, "spec_draft_logits");
    accepted = read_i32(*f, "spec_accepted");
    emitted = read_i32(*f, "spec_emitted");
    spec_ids = read_i32(*f, "spec_ids");
  }
};

const MtpReference& ref() {
  static MtpReference r;
  return r;
}

int32_t argmax(const float* row, int64_t n) {
  return int32_t(std::max_element(row, row + n) - row);
}

// The fixture is float32 arithmetic on the bf16 weights, as this backend's: the trunk fixtures'
// bound, 1e-5 (measured: normed hidden 4.7e-6, head hidden 2.9e-6, logits 1.3-2.4e-6).
constexpr double kHiddenTol = 1e-5, kLogitTol = 1e-5;

class Mtp : public ::testing::Test {
 protected:
  void SetUp() override {
    model = load_model(data_path("tiny-a-mtp"));
    // Made after 2026-12-01: RoPE's inverse frequencies in f32, as HF computes them at load.
    ASSERT_FALSE(model->config.rope_inv_freq_bf16);
    backend = std::make_unique<cpu::CpuBackend>(model->config, model->weights);
    ASSERT_TRUE(backend->has_mtp());
    H = model->config.hidden;
    V = model->config.vocab;
  }
  std::unique_ptr<Model> model;
  std::unique_ptr<cpu::CpuBackend> backend;
  int64_t H = 0, V = 0;
};

// The trunk's normed hidden states are the head's inputs; the head per position (teacher forced:
// the next prompt token, then the trunk's greedy token) gives HF's hidden states and logits.
TEST_F(Mtp, HeadPerPositionMatchesHF) {
  const auto& r = ref();
  const int64_t T = int64_t(r.prompt.size());
  auto seq = backend->new_sequence(T + 1);
  std::vector<float> normed(size_t(T * H)), trunk_logits(size_t(T * V));
  backend->forward_normed(*seq, r.prompt, normed.data(), trunk_logits.data());
  EXPECT_LT(max_abs_diff(normed.data(), r.input_hidden.data(), normed.size()).first, kHiddenTol);
  // The last input id is the trunk's greedy next token.
  EXPECT_EQ(argmax(&trunk_logits[size_t((T - 1) * V)], V), r.input_ids.back());

  auto mtp = backend->new_mtp_sequence(T + 4);
  std::vector<float> out(size_t(T * H)), logits(size_t(T * V));
  backend->mtp_forward(*mtp, r.input_hidden.data(), r.input_ids, out.data(), logits.data());
  EXPECT_EQ(mtp->position(), T);
  EXPECT_LT(max_abs_diff(out.data(), r.hidden.data(), out.size()).first, kHiddenTol);
  EXPECT_LT(max_abs_diff(logits.data(), r.logits.data(), logits.size()).first, kLogitTol);
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(argmax(&logits[size_t(t * V)], V), argmax(&r.logits[size_t(t * V)], V)) << t;

  // The same positions in two calls (the KV cache carried over) give the same values.
  auto split = backend->new_mtp_sequence(T);
  std::vector<float> out2(size_t(T * H)), logits2(size_t(T * V));
  const int64_t a = 17;
  backend->mtp_forward(*split, r.input_hidden.data(), std::span(r.input_ids).first(size_t(a)),
                       out2.data(), logits2.data());
  backend->mtp_forward(*split, &r.input_hidden[size_t(a * H)],
                       std::span(r.input_ids).subspan(size_t(a)), &out2[size_t(a * H)],
                       &logits2[size_t(a * V)]);
  EXPECT_LT(max_abs_diff(logits2.data(), logits.data(), logits.size()).first, 1e-5);
}

// Three drafts chained from the end of the prompt: each call takes the head's own output as the
// hidden state and the token it just drafted, one position further.
TEST_F(Mtp, ChainedDraftsMatchHF) {
  const auto& r = ref();
  const int64_t T = int64_t(r.prompt.size());
  auto mtp = backend->new_mtp_sequence(T + 4);
  std::vector<float> out(size_t(T * H)), logits(size_t(T * V));
  backend->mtp_forward(*mtp, r.input_hidden.data(), r.input_ids, out.data(), logits.data());
  std::vector<float> h(out.end() - H, out.end()), row(logits.end() - V, logits.end());
  for (size_t i = 0; i < r.chain_ids.size(); ++i) {
    SCOPED_TRACE("draft " + std::to_string(i));
    EXPECT_LT(max_abs_diff(row.data(), &r.chain_logits[i * size_t(V)], size_t(V)).first, kLogitTol);
    const int32_t d = argmax(row.data(), V);
    ASSERT_EQ(d, r.chain_ids[i]);
    std::vector<float> next_h(static_cast<size_t>(H));
    backend->mtp_forward(*mtp, h.data(), std::span(&d, 1), next_h.data(), row.data());
    h = next_h;
  }
  EXPECT_EQ(mtp->position(), T + int64_t(r.chain_ids.size()));
}

// Greedy speculative decoding, one draft per step: the trunk verifies [last token, draft] in one
// checkpointed pass; on agreement both the draft and the trunk's next token are emitted, else the
// trunk's own token, and the trunk rolls back to the last accepted token (rollback: its first
// row). The head then takes the new positions. The drafts, their logits and acceptance are HF's,
// and the emitted tokens are plain greedy decoding's.
TEST_F(Mtp, SpeculativeGreedyMatchesHF) {
  const auto& r = ref();
  const int64_t T = int64_t(r.prompt.size()), steps = int64_t(r.draft_ids.size());
  auto seq = backend->new_sequence(T + 2 * steps + 2);
  auto mtp = backend->new_mtp_sequence(T + 2 * steps + 2);
  std::vector<float> normed(size_t(T * H)), tl(size_t(T * V));
  backend->forward_normed(*seq, r.prompt, normed.data(), tl.data());
  int32_t last = argmax(&tl[size_t((T - 1) * V)], V);  // the first emitted token
  std::vector<int32_t> emitted = {last};
  // The head over the prompt: position p takes token p + 1 (the last one: `last`).
  std::vector<int32_t> next(r.prompt.begin() + 1, r.prompt.end());
  next.push_back(last);
  std::vector<float> out(size_t(T * H)), ml(size_t(T * V));
  backend->mtp_forward(*mtp, normed.data(), next, out.data(), ml.data());
  std::vector<float> draft_row(ml.end() - V, ml.end());

  for (int64_t s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    EXPECT_LT(max_abs_diff(draft_row.data(), &r.draft_logits[size_t(s * V)], size_t(V)).first,
              kLogitTol);
    const int32_t draft = argmax(draft_row.data(), V);
    ASSERT_EQ(draft, r.draft_ids[size_t(s)]);
    const int32_t pair[2] = {last, draft};
    std::vector<float> vn(size_t(2 * H)), vl(size_t(2 * V));
    backend->forward_checkpointed(*seq, pair, vn.data(), vl.data());
    const int32_t t0 = argmax(vl.data(), V);
    const bool accept = t0 == draft;
    EXPECT_EQ(int(accept), r.accepted[size_t(s)]);
    std::vector<int32_t> head_next;
    if (accept) {
      const int32_t bonus = argmax(&vl[size_t(V)], V);
      emitted.push_back(draft);
      emitted.push_back(bonus);
      head_next = {draft, bonus};
      last = bonus;
    } else {
      backend->rollback(*seq, 1);  // keep `last`'s row: its hidden state is vn's first row
      emitted.push_back(t0);
      head_next = {t0};
      last = t0;
    }
    EXPECT_EQ(int(head_next.size()), r.emitted[size_t(s)]);
    std::vector<float> ho(head_next.size() * size_t(H)), hl(head_next.size() * size_t(V));
    backend->mtp_forward(*mtp, vn.data(), head_next, ho.data(), hl.data());
    draft_row.assign(hl.end() - V, hl.end());
  }
  EXPECT_EQ(emitted, r.spec_ids);

  // Plain greedy decoding of the trunk gives the same tokens.
  auto plain = backend->new_sequence(T + int64_t(r.spec_ids.size()) + 1);
  std::vector<float> row(static_cast<size_t>(V));
  backend->forward(*plain, r.prompt, row, false);
  std::vector<int32_t> greedy = {argmax(row.data(), V)};
  while (greedy.size() < r.spec_ids.size()) {
    backend->forward(*plain, std::span(&greedy.back(), 1), row, false);
    greedy.push_back(argmax(row.data(), V));
  }
  EXPECT_EQ(greedy, r.spec_ids);
}

TEST_F(Mtp, BadInputsAreNamedErrors) {
  const auto& r = ref();
  auto mtp = backend->new_mtp_sequence(2);
  std::vector<float> h(size_t(3 * H), 0.f), out(size_t(3 * H));
  const int32_t bad = int32_t(V);
  EXPECT_THROW(backend->mtp_forward(*mtp, h.data(), std::span(&bad, 1), out.data(), nullptr),
               Error);
  const int32_t three[3] = {1, 2, 3};
  EXPECT_THROW(backend->mtp_forward(*mtp, h.data(), three, out.data(), nullptr), Error)
      << "3 positions into a head state of 2";
  auto trunk_state = backend->new_sequence(4);
  EXPECT_THROW(backend->mtp_forward(*trunk_state, h.data(), std::span(&r.input_ids[0], 1),
                                    out.data(), nullptr),
               Error)
      << "a trunk state is not the head's";
  EXPECT_EQ(mtp->position(), 0) << "nothing moved";
}

// A checkpoint without the head: named errors, not a crash.
TEST(MtpAbsent, NamedErrorWithoutHead) {
  auto m = load_model(data_path("tiny-a"));
  cpu::CpuBackend b(m->config, m->weights);
  EXPECT_FALSE(b.has_mtp());
  EXPECT_THROW(b.new_mtp_sequence(4), Error);
}

}  // namespace
}  // namespace lilac::test
