// CpuBackend::step_batch (one pass over all items' rows) against the reference loop
// (Backend::step_batch: the items one by one): the same tokens, logprobs and top logprobs and the
// same states, bit for bit, for a mix of decode items, prompt pieces, constraints, seeds and
// penalties; on the BF16 tiny-a fixture and on its 4-bit quantization.
#include <gtest/gtest.h>

#include <cstring>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "io/quantize.h"
#include "util/error.h"

namespace lilac::test {
namespace {

class OddTokensOnly : public TokenConstraint {
 public:
  void allowed_tokens(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0xAAAAAAAAu);
  }
  void accept(int32_t) override {}
};

std::vector<int32_t> ids(int n, int seed) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((i * 37 + seed * 101 + 5) % 500));
  return v;
}

bool same_rows(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0)
      return false;
  return true;
}

bool same_state(const cpu::CpuSequenceState& a, const cpu::CpuSequenceState& b) {
  return a.position() == b.position() && same_rows(a.k_cache, b.k_cache) &&
         same_rows(a.v_cache, b.v_cache) && same_rows(a.conv_state, b.conv_state) &&
         same_rows(a.recurrent, b.recurrent);
}

void check_batch_equals_loop(Model& model) {
  cpu::CpuBackend b(model.config, model.weights);
  b.set_sampling_vocab(500);
  // Five sequences at different positions: three decoding, one reading a prompt piece without
  // sampling, one reading its last piece (sampling, constrained).
  constexpr int kN = 5;
  std::vector<std::unique_ptr<SequenceState>> batched, looped;
  SamplingParams greedy, seeded;
  greedy.temperature = 0;
  greedy.top_logprobs = 3;
  seeded.temperature = 0.9f;
  seeded.top_k = 20;
  seeded.seed = 7;
  seeded.repetition_penalty = 1.3f;
  seeded.presence_penalty = 0.5f;
  for (int s = 0; s < kN; ++s) {
    auto st = b.new_sequence(256);
    const auto prompt = ids(3 + 4 * s, s);
    b.begin_sampling(*st, prompt, s % 2 ? seeded : greedy);
    b.forward(*st, prompt, {}, false);
    looped.push_back(b.clone(*st));
    batched.push_back(std::move(st));
  }
  OddTokensOnly odd;
  std::vector<int32_t> last = {11, 12, 13, 14, 15};
  const auto piece = ids(9, 42), final_piece = ids(6, 43);
  for (int step = 0; step < 6; ++step) {
    auto items_for = [&](std::vector<std::unique_ptr<SequenceState>>& states) {
      std::vector<BatchItem> items(kN);
      for (int s = 0; s < kN; ++s) {
        items[size_t(s)].state = states[size_t(s)].get();
        items[size_t(s)].ids = std::span<const int32_t>(&last[size_t(s)], 1);
        items[size_t(s)].sample_index = uint64_t(step);
      }
      items[3].ids = piece;
      items[3].sample = false;
      items[4].ids = final_piece;
      items[4].constraint = &odd;
      return items;
    };
    auto bi = items_for(batched), li = items_for(looped);
    auto rb = b.step_batch(bi);
    auto rl = b.Backend::step_batch(li);
    ASSERT_EQ(rb.size(), size_t(kN));
    for (int s = 0; s < kN; ++s) {
      EXPECT_EQ(rb[size_t(s)].token, rl[size_t(s)].token) << "step " << step << " item " << s;
      EXPECT_EQ(std::memcmp(&rb[size_t(s)].logprob, &rl[size_t(s)].logprob, 4), 0);
      EXPECT_EQ(rb[size_t(s)].top, rl[size_t(s)].top);
      EXPECT_TRUE(same_state(static_cast<cpu::CpuSequenceState&>(*batched[size_t(s)]),
                             static_cast<cpu::CpuSequenceState&>(*looped[size_t(s)])))
          << "step " << step << " item " << s;
    }
    EXPECT_EQ(rb[3].token, -1) << "a piece that does not sample gives no token";
    EXPECT_EQ(rb[4].token % 2, 1) << "the constraint holds";
    for (int s = 0; s < 3; ++s) last[size_t(s)] = rb[size_t(s)].token;
  }
}

TEST(CpuStepBatch, EqualsTheItemsOneByOneBf16) {
  auto model = load_model(data_path("tiny-a"));
  check_batch_equals_loop(*model);
}

TEST(CpuStepBatch, EqualsTheItemsOneByOne4Bit) {
  auto model = load_model(data_path("tiny-a"));
  quantize_model_in_memory(*model);
  check_batch_equals_loop(*model);
}

TEST(CpuStepBatch, RefusesBadItemsBeforeChangingAnyState) {
  auto model = load_model(data_path("tiny-a"));
  cpu::CpuBackend b(model->config, model->weights);
  auto a = b.new_sequence(8), c = b.new_sequence(8);
  const std::vector<int32_t> one = {1}, many = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<BatchItem> twice(2);
  twice[0].state = twice[1].state = a.get();
  twice[0].ids = twice[1].ids = one;
  EXPECT_THROW(b.step_batch(twice), Error);
  std::vector<BatchItem> overflow(2);
  overflow[0].state = a.get();
  overflow[0].ids = one;
  overflow[1].state = c.get();
  overflow[1].ids = many;  // 9 tokens in a context of 8
  EXPECT_THROW(b.step_batch(overflow), Error);
  EXPECT_EQ(a->position(), 0);
  EXPECT_EQ(c->position(), 0);
}

}  // namespace
}  // namespace lilac::test
