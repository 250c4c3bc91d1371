// Comparing the experts two sides (GPU and CPU twin) chose for one token. Two correct
// implementations that round differently may pick different experts where the router's k-th and
// (k+1)-th logits nearly tie; the layer's output then says nothing about the kernels. A difference
// is accepted as such a tie only if every expert in one set and not the other has its reference
// router logit within `factor` x the sides' largest router-logit difference of the reference's
// k-th largest chosen logit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace lilac::test {

struct RouteComparison {
  bool differ = false;    // the two sets of experts differ
  bool near_tie = true;   // ... and only by near ties (true when they do not differ)
  double logit_diff = 0;  // the largest router-logit difference between the sides
};

// ids: one token's k chosen experts (as floats, the trace's format; any order); logits: that
// token's E router logits on each side (want = the reference).
inline RouteComparison compare_routes(std::vector<float> got_ids, std::vector<float> want_ids,
                                      std::span<const float> got_logits,
                                      std::span<const float> want_logits, double factor = 10) {
  RouteComparison r;
  std::sort(got_ids.begin(), got_ids.end());
  std::sort(want_ids.begin(), want_ids.end());
  if (got_ids == want_ids) return r;
  r.differ = true;
  if (got_logits.size() != want_logits.size()) {
    r.near_tie = false;
    return r;
  }
  for (size_t e = 0; e < want_logits.size(); ++e)
    r.logit_diff = std::max(r.logit_diff, std::fabs(double(got_logits[e]) - want_logits[e]));
  float kth = INFINITY;
  for (float e : want_ids) kth = std::min(kth, want_logits[size_t(e)]);
  const auto near = [&](float e) {
    return size_t(e) < want_logits.size() &&
           std::fabs(double(want_logits[size_t(e)]) - kth) <= factor * r.logit_diff;
  };
  for (float e : got_ids)
    if (!std::binary_search(want_ids.begin(), want_ids.end(), e))
      r.near_tie = r.near_tie && near(e);
  for (float e : want_ids)
    if (!std::binary_search(got_ids.begin(), got_ids.end(), e)) r.near_tie = r.near_tie && near(e);
  return r;
}

// The same over the T tokens of a prompt chunk: ids [T, k], logits [T, E] on each side.
struct ChunkRoutes {
  int tokens = 0, differ = 0, not_tied = 0;  // tokens; those routed differently; of them, not ties
  double logit_diff = 0;                     // the largest router-logit difference of those
};

inline ChunkRoutes compare_chunk_routes(const std::vector<float>& got_ids,
                                        const std::vector<float>& want_ids,
                                        const std::vector<float>& got_logits,
                                        const std::vector<float>& want_logits, size_t k) {
  ChunkRoutes r;
  r.tokens = int(want_ids.size() / k);
  if (got_ids.size() != want_ids.size() || got_logits.size() != want_logits.size() ||
      r.tokens == 0) {
    r.differ = r.not_tied = r.tokens > 0 ? r.tokens : 1;
    return r;
  }
  const size_t E = want_logits.size() / size_t(r.tokens);
  for (size_t t = 0; t < size_t(r.tokens); ++t) {
    const auto ids = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + ptrdiff_t(t * k), v.begin() + ptrdiff_t((t + 1) * k));
    };
    const RouteComparison c =
        compare_routes(ids(got_ids), ids(want_ids), std::span(got_logits).subspan(t * E, E),
                       std::span(want_logits).subspan(t * E, E));
    if (!c.differ) continue;
    ++r.differ;
    r.not_tied += !c.near_tie;
    r.logit_diff = std::max(r.logit_diff, c.logit_diff);
  }
  return r;
}

// Prints a prompt chunk's routes (the per-op report line of `name`, a layer's topk_ids) and checks
// them: differences only by near ties, and rare: one token per layer at most, where the router
// logits agree to 5e-2 (a wrong router differs by O(1) and would make anything look like a tie).
inline void expect_routes_tied(const std::string& name, const ChunkRoutes& routes) {
  std::printf("  %-28s %d of %d tokens route differently%s\n", name.c_str(), routes.differ,
              routes.tokens, routes.differ ? " (near ties: the layer is not compared)" : "");
  EXPECT_EQ(routes.not_tied, 0) << name << ": experts differ without a near tie (router logits "
                                << "differ by up to " << routes.logit_diff << ")";
  EXPECT_LE(routes.differ, 1) << name;
  EXPECT_LT(routes.logit_diff, 5e-2) << name;
}

}  // namespace lilac::test
