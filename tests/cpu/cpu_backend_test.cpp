// The CPU backend against the HF transformers fixtures (tiny-a, both checkpoint layouts).
#include "cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <cstring>
#include "../max_abs_diff.h"
#include "../test_data.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct Reference {
  std::vector<int32_t> prompt, decode_ids;
  std::vector<float> prefill_logits, hidden, decode_logits;
  Reference() {
    auto f = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
    prompt = read_i32(*f, "prompt_ids");
    decode_ids = read_i32(*f, "decode_ids");
    prefill_logits = read_f32(*f, "prefill_logits");
    hidden = read_f32(*f, "prefill_hidden_states");
    decode_logits = read_f32(*f, "decode_logits");
  }
};

const Reference& ref() {
  static Reference r;
  return r;
}

class CpuBackendFixture : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    model = load_model(data_path(GetParam()));
    // The fixtures come from an HF model cast bf16 -> f32, which rounded RoPE's inv_freq.
    model->config.rope_inv_freq_bf16 = true;
    backend = std::make_unique<cpu::CpuBackend>(model->config, model->weights);
  }
  std::vector<float> prefill(SequenceState& s, std::span<const int32_t> ids) {
    std::vector<float> out(ids.size() * size_t(model->config.vocab));
    backend->forward(s, ids, out, true);
    return out;
  }
  std::unique_ptr<Model> model;
  std::unique_ptr<cpu::CpuBackend> backend;
};

TEST_P(CpuBackendFixture, PrefillLogitsAndHiddenStatesMatchHF) {
  const auto& r = ref();
  const int64_t T = int64_t(r.prompt.size()), H = model->config.hidden;
  std::map<std::string, std::vector<float>> hidden;
  backend->set_trace(
      [&](const std::string& name, const float* d, const std::vector<int64_t>& shape) {
        if (name.starts_with("hidden.") || name == "final_norm")
          hidden[name].assign(d, d + shape[0] * shape[1]);
      });
  auto seq = backend->new_sequence(64);
  auto logits = prefill(*seq, r.prompt);
  auto [err, at] = max_abs_diff(logits.data(), r.prefill_logits.data(), logits.size());
  EXPECT_LE(err, 1e-4) << "prefill_logits worst at token " << at / 512 << " id " << at % 512;
  ASSERT_EQ(hidden.size(), size_t(model->config.layers + 2));
  // HF's hidden_states: the embedding, then the residual after each layer but the last, whose
  // entry is taken after the final norm (the fixture's description says before; the data says
  // after: its rows have RMS ~1). docs/model-notes.md.
  for (int64_t i = 0; i <= model->config.layers; ++i) {
    const auto& h = hidden[i == model->config.layers ? "final_norm" : fmt::format("hidden.{}", i)];
    auto [e, w] = max_abs_diff(h.data(), &r.hidden[size_t(i * T * H)], size_t(T * H));
    EXPECT_LE(e, 1e-4) << "prefill_hidden_states[" << i << "] (after "
                       << (i ? "layer " + std::to_string(i - 1) : "embedding")
                       << ") worst at token " << w / size_t(H);
  }
}

TEST_P(CpuBackendFixture, GreedyDecodeMatchesHF) {
  const auto& r = ref();
  const int64_t V = model->config.vocab;
  auto seq = backend->new_sequence(64);
  auto logits = prefill(*seq, r.prompt);
  int32_t next = int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
  std::vector<float> step(static_cast<size_t>(V));
  for (size_t j = 0; j < r.decode_ids.size(); ++j) {
    ASSERT_EQ(next, r.decode_ids[j]) << "greedy id differs at decode step " << j;
    backend->forward(*seq, std::span(&next, 1), step, false);
    auto [err, at] = max_abs_diff(step.data(), &r.decode_logits[j * size_t(V)], size_t(V));
    EXPECT_LE(err, 1e-4) << "decode_logits step " << j << " worst at id " << at;
    next = int32_t(std::max_element(step.begin(), step.end()) - step.begin());
  }
  EXPECT_EQ(seq->position(), int64_t(r.prompt.size() + r.decode_ids.size()));
}

TEST_P(CpuBackendFixture, PromptInPiecesGivesTheSameLogits) {
  const auto& r = ref();
  const size_t V = size_t(model->config.vocab), T = r.prompt.size();
  auto whole_seq = backend->new_sequence(64);
  auto whole = prefill(*whole_seq, r.prompt);

  auto split_seq = backend->new_sequence(64);
  auto a = prefill(*split_seq, std::span(r.prompt).first(13));
  auto b = prefill(*split_seq, std::span(r.prompt).subspan(13));
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_LE(max_abs_diff(a.data(), whole.data(), T * V).first, 1e-5) << "13 + 27 tokens";

  auto single_seq = backend->new_sequence(64);
  std::vector<float> ones;
  for (size_t t = 0; t < T; ++t) {
    auto l = prefill(*single_seq, std::span(r.prompt).subspan(t, 1));
    ones.insert(ones.end(), l.begin(), l.end());
  }
  EXPECT_LE(max_abs_diff(ones.data(), whole.data(), T * V).first, 1e-5) << "40 x 1 token";
}

TEST_P(CpuBackendFixture, FreshSequenceHasNoLeakedState) {
  const auto& r = ref();
  auto s1 = backend->new_sequence(64);
  auto first = prefill(*s1, r.prompt);
  // Run more tokens through s1, then start a second sequence: it must see none of s1's state.
  prefill(*s1, std::span(r.decode_ids));
  auto s2 = backend->new_sequence(64);
  auto second = prefill(*s2, r.prompt);
  EXPECT_EQ(first, second);
  // A clone continues exactly like its source.
  auto s3 = backend->clone(*s2);
  std::vector<float> x(size_t(model->config.vocab)), y(size_t(model->config.vocab));
  backend->forward(*s2, std::span(&r.decode_ids[0], 1), x, false);
  backend->forward(*s3, std::span(&r.decode_ids[0], 1), y, false);
  EXPECT_EQ(x, y);
  EXPECT_GT(backend->state_bytes(*s3), 0u);
}

TEST_P(CpuBackendFixture, RejectsBadInputWithoutTouchingState) {
  auto seq = backend->new_sequence(8);
  std::vector<float> out(size_t(model->config.vocab));
  int32_t bad = int32_t(model->config.vocab);
  EXPECT_THROW(backend->forward(*seq, std::span(&bad, 1), out, false), Error);
  std::vector<int32_t> too_many(9, 1);
  EXPECT_THROW(backend->forward(*seq, too_many, {}, false), Error);
  EXPECT_EQ(seq->position(), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpuBackendFixture,
                         ::testing::Values("tiny-a", "tiny-a-per-expert"), [](const auto& p) {
                           return std::string(p.param) == "tiny-a" ? "Hub" : "PerExpert";
                         });

TEST(CpuBackendLayouts, HubAndPerExpertAreBitIdentical) {
  auto hub = load_model(data_path("tiny-a"));
  auto per = load_model(data_path("tiny-a-per-expert"));
  hub->config.rope_inv_freq_bf16 = per->config.rope_inv_freq_bf16 = true;
  cpu::CpuBackend a(hub->config, hub->weights), b(per->config, per->weights);
  const auto& r = ref();
  std::vector<float> la(r.prompt.size() * 512), lb(r.prompt.size() * 512);
  auto sa = a.new_sequence(64), sb = b.new_sequence(64);
  a.forward(*sa, r.prompt, la, true);
  b.forward(*sb, r.prompt, lb, true);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
}

// The f32 inv_freq (HF's own default) differs from the fixture only through RoPE: token 0 (no
// rotation) matches exactly, later tokens by about 1e-3. This pins down where the fixture's
// bf16-rounded frequencies show, so the knob above cannot hide a real error elsewhere.
TEST(CpuBackendRope, F32InvFreqDiffersOnlyThroughRotation) {
  auto m = load_model(data_path("tiny-a"));
  cpu::CpuBackend b(m->config, m->weights);
  const auto& r = ref();
  std::vector<float> l(r.prompt.size() * 512);
  auto s = b.new_sequence(64);
  b.forward(*s, r.prompt, l, true);
  EXPECT_LE(max_abs_diff(l.data(), r.prefill_logits.data(), 512).first, 1e-5);
  double err = max_abs_diff(l.data(), r.prefill_logits.data(), l.size()).first;
  EXPECT_GT(err, 2e-4);
  EXPECT_LT(err, 5e-3);
}

}  // namespace
}  // namespace lilac::test

namespace lilac::test {
namespace {

// bf16 activation rounding (the GPU's precision) stays within the fixture's bf16 tolerance and
// really changes the numbers (so the switch is wired).
TEST(CpuBackendBf16, ActivationRoundingMatchesTheFixtureLoosely) {
  auto m = load_model(data_path("tiny-a"));
  m->config.rope_inv_freq_bf16 = true;
  cpu::CpuBackend exact(m->config, m->weights), rounded(m->config, m->weights);
  rounded.set_bf16_activations(true);
  const auto& r = ref();
  std::vector<float> a(r.prompt.size() * 512), b(r.prompt.size() * 512);
  auto sa = exact.new_sequence(64), sb = rounded.new_sequence(64);
  exact.forward(*sa, r.prompt, a, true);
  rounded.forward(*sb, r.prompt, b, true);
  double err = max_abs_diff(b.data(), r.prefill_logits.data(), b.size()).first;
  EXPECT_LT(err, 5e-2);
  EXPECT_GT(max_abs_diff(a.data(), b.data(), a.size()).first, 1e-4);
}

}  // namespace
}  // namespace lilac::test
