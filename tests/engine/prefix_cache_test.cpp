// PrefixCache's byte budget (issue 10, item 10): it counts everything a snapshot holds (the
// state's buffers, the token list it is keyed by, the entry), and stays within the budget however
// many snapshots are stored.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "../server/server_fixture.h"

namespace lilac::test {
namespace {

struct Scripted {
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_model_dir(demo_dir());
  ModelConfig config = load_model_config(demo_dir());
  server::ScriptedBackend backend{config, *tokenizer, {server::ScriptedResponse{"", {1}, true}}};

  // A state that has consumed ids start, start+1, ... (n of them).
  std::pair<std::unique_ptr<SequenceState>, std::vector<int32_t>> state(int32_t start, size_t n) {
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), start);
    auto st = backend.new_sequence(int64_t(n) + 8);
    std::vector<float> logits(size_t(config.vocab));
    backend.forward(*st, ids, logits, false);
    return {std::move(st), ids};
  }
};

TEST(PrefixCache, TheBudgetCountsTheTokenListToo) {
  Scripted s;
  PrefixCache cache(s.backend, 1 << 20, 4096);
  auto [st, ids] = s.state(1, 2000);
  cache.store(*st, ids);
  ASSERT_EQ(cache.entries(), 1u);
  // The snapshot holds its state and the 2000 ids it is looked up by.
  EXPECT_GE(cache.bytes(), s.backend.state_bytes(*st) + ids.size() * sizeof(int32_t));
}

TEST(PrefixCache, LevelsOffAtTheBudget) {
  Scripted s;
  const size_t budget = 64 << 10;
  PrefixCache cache(s.backend, budget, 4096);
  size_t peak = 0;
  for (int i = 0; i < 500; ++i) {
    auto [st, ids] = s.state(i * 7, size_t(50 + (i * 37) % 400));
    cache.store(*st, ids);
    peak = std::max(peak, cache.bytes());
    ASSERT_LE(cache.bytes(), budget) << "after " << i + 1 << " stores";
  }
  EXPECT_GT(peak, budget / 2);  // it was used, not just refused
  // A snapshot larger than the whole budget is not stored at all.
  auto [big, big_ids] = s.state(1, 20000);
  const size_t before = cache.entries();
  cache.store(*big, big_ids);
  EXPECT_EQ(cache.entries(), before);
  // Lookups still find what is stored.
  auto [st, ids] = s.state(100000, 300);
  cache.store(*st, ids);
  std::vector<int32_t> longer = ids;
  longer.push_back(5);
  EXPECT_EQ(cache.lookup(longer).second, ids.size());
}

}  // namespace
}  // namespace lilac::test
