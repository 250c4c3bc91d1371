// router_tie.h's judgement of two sides' expert choices (no GPU needed).
#include "router_tie.h"

#include <gtest/gtest.h>

#include <vector>

namespace lilac::test {
namespace {

// Six experts, top 2. The reference (want) ranks 5 > 4 > 3 > ...; its 2nd (k-th) logit is 4.0.
const std::vector<float> kWant = {0.f, 1.f, 2.f, 3.999f, 4.f, 5.f};

TEST(RouterTie, SameSetsInAnyOrderDoNotDiffer) {
  const RouteComparison r = compare_routes({4, 5}, {5, 4}, kWant, kWant);
  EXPECT_FALSE(r.differ);
  EXPECT_TRUE(r.near_tie);
}

TEST(RouterTie, ASwapAcrossANearTieIsATie) {
  std::vector<float> got = kWant;
  got[3] = 4.0005f, got[4] = 3.9995f;  // the sides differ by ~1e-3; 3 and 4 are 1e-3 apart
  const RouteComparison r = compare_routes({3, 5}, {4, 5}, got, kWant);
  EXPECT_TRUE(r.differ);
  EXPECT_TRUE(r.near_tie);
  EXPECT_NEAR(r.logit_diff, 1.5e-3, 1e-6);  // |4.0005 - 3.999| at expert 3
}

TEST(RouterTie, ASwapAcrossAClearMarginIsNot) {
  std::vector<float> got = kWant;
  got[4] = 3.9999f;  // the sides differ by 1e-4, but expert 2 is 2.0 below the k-th
  const RouteComparison r = compare_routes({2, 5}, {4, 5}, got, kWant);
  EXPECT_TRUE(r.differ);
  EXPECT_FALSE(r.near_tie);
}

TEST(RouterTie, LogitsOfDifferentSizesAreNotATie) {
  const std::vector<float> short_logits(5, 0.f);
  const RouteComparison r = compare_routes({3, 5}, {4, 5}, short_logits, kWant);
  EXPECT_TRUE(r.differ);
  EXPECT_FALSE(r.near_tie);
}

TEST(RouterTie, AChunkCountsItsTokens) {
  // Three tokens: the same, a near tie, a clear difference.
  std::vector<float> want_logits, got_logits;
  for (int t = 0; t < 3; ++t) want_logits.insert(want_logits.end(), kWant.begin(), kWant.end());
  got_logits = want_logits;
  got_logits[6 + 3] = 4.0005f, got_logits[6 + 4] = 3.9995f;
  const std::vector<float> want_ids = {4, 5, 4, 5, 4, 5}, got_ids = {5, 4, 3, 5, 0, 5};
  const ChunkRoutes r = compare_chunk_routes(got_ids, want_ids, got_logits, want_logits, 2);
  EXPECT_EQ(r.tokens, 3);
  EXPECT_EQ(r.differ, 2);
  EXPECT_EQ(r.not_tied, 1);
}

}  // namespace
}  // namespace lilac::test
