// The CPU backend's speculative verify pass (docs/speculative.md): a pass over T rows that keeps
// every Gated DeltaNet layer's states after each row, rolled back to its first n rows, leaves the
// sequence bit for bit as if only those n rows had been forwarded, with either state format.
#include <gtest/gtest.h>

#include <vector>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "util/error.h"

namespace lilac::test {
namespace {

class Rollback : public ::testing::TestWithParam<GdnStateFormat> {
 protected:
  void SetUp() override {
    model = load_model(data_path("tiny-a"));
    backend = std::make_unique<cpu::CpuBackend>(model->config, model->weights);
    backend->set_gdn_state_format(GetParam());
  }
  // A sequence after a 20-token prompt.
  std::unique_ptr<SequenceState> prefilled() {
    auto s = backend->new_sequence(64);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back((i * 37 + 11) % 512);
    backend->forward(*s, prompt, {}, false);
    return s;
  }
  static const cpu::CpuSequenceState& cpu(const SequenceState& s) {
    return static_cast<const cpu::CpuSequenceState&>(s);
  }
  std::unique_ptr<Model> model;
  std::unique_ptr<cpu::CpuBackend> backend;
};

TEST_P(Rollback, EqualsForwardingTheKeptRows) {
  const std::vector<int32_t> rows = {7, 300, 42, 511, 5};
  const int64_t T = int64_t(rows.size()), H = model->config.hidden, V = model->config.vocab;
  for (int64_t n = 1; n <= T; ++n) {
    SCOPED_TRACE("keep " + std::to_string(n));
    auto verified = prefilled();
    std::vector<float> normed(size_t(T * H)), logits(size_t(T * V));
    backend->forward_checkpointed(*verified, rows, normed.data(), logits.data());
    backend->rollback(*verified, n);

    auto plain = prefilled();
    std::vector<float> pn(size_t(n * H)), pl(size_t(n * V));
    backend->forward_normed(*plain, std::span(rows).first(size_t(n)), pn.data(), pl.data());
    // The pass's first n rows are the plain pass's (the same arithmetic).
    EXPECT_EQ(std::vector<float>(normed.begin(), normed.begin() + n * H), pn);
    EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + n * V), pl);
    // Logits without the normed rows asked for: the same logits.
    auto bare = prefilled();
    std::vector<float> bl(size_t(n * V));
    backend->forward_normed(*bare, std::span(rows).first(size_t(n)), nullptr, bl.data());
    EXPECT_EQ(bl, pl);

    const auto &a = cpu(*verified), &b = cpu(*plain);
    EXPECT_EQ(a.position(), b.position());
    EXPECT_EQ(a.conv_state, b.conv_state);
    EXPECT_EQ(a.recurrent, b.recurrent);
    EXPECT_EQ(a.k_cache, b.k_cache);
    EXPECT_EQ(a.v_cache, b.v_cache);

    // And they go on alike.
    const int32_t next = 99;
    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
    backend->forward(*verified, std::span(&next, 1), la, false);
    backend->forward(*plain, std::span(&next, 1), lb, false);
    EXPECT_EQ(la, lb);
  }
}

TEST_P(Rollback, MisuseIsANamedError) {
  auto s = prefilled();
  EXPECT_THROW(backend->rollback(*s, 1), Error) << "no verify pass";
  const std::vector<int32_t> rows = {1, 2, 3};
  backend->forward_checkpointed(*s, rows, nullptr, nullptr);
  EXPECT_THROW(backend->rollback(*s, 0), Error);
  EXPECT_THROW(backend->rollback(*s, 4), Error);
  const int32_t one = 4;
  backend->forward(*s, std::span(&one, 1), {}, false);
  EXPECT_THROW(backend->rollback(*s, 2), Error) << "the sequence moved on: checkpoints dropped";
  EXPECT_EQ(s->position(), 24);
  // A pass that fails (a bad id) leaves no checkpoints and no half-set flag behind.
  const std::vector<int32_t> bad = {1, 512};
  EXPECT_THROW(backend->forward_checkpointed(*s, bad, nullptr, nullptr), Error);
  EXPECT_FALSE(cpu(*s).checkpointing);
  EXPECT_THROW(backend->rollback(*s, 1), Error);
}

INSTANTIATE_TEST_SUITE_P(StateFormats, Rollback,
                         ::testing::Values(GdnStateFormat::f32, GdnStateFormat::bf16),
                         [](const auto& p) {
                           return p.param == GdnStateFormat::f32 ? std::string("f32")
                                                                 : std::string("bf16");
                         });

}  // namespace
}  // namespace lilac::test
