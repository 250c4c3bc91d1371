// Stop strings over streamed text and the snapshot cache.
#include <gtest/gtest.h>

#include "engine/prefix_cache.h"
#include "engine/stop_matcher.h"

namespace lilac::test {
namespace {

TEST(StopMatcher, HoldsBackPartialMatchesAndStops) {
  StopMatcher m({"END", "xyz"});
  EXPECT_EQ(m.push("hello E"), "hello ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X more"), "ENX more");  // not a stop after all: released
  EXPECT_EQ(m.push(" stuff EN"), " stuff ");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("D and after"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EarliestStopWinsAndFlushReleasesTheRest) {
  StopMatcher m({"bc", "abcd"});
  EXPECT_EQ(m.push("xxabcd"), "xx");  // "abcd" starts first
  EXPECT_EQ(m.matched(), "abcd");
  StopMatcher m2({"cd", "abcd"});
  EXPECT_EQ(m2.push("xxab"), "xx");
  EXPECT_EQ(m2.push("cdyy"), "");
  EXPECT_EQ(m2.matched(), "abcd");
  StopMatcher n({"zz"});
  EXPECT_EQ(n.push("abz"), "ab");
  EXPECT_EQ(n.flush(), "z");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
  StopMatcher multibyte({"ö!"});
  EXPECT_EQ(multibyte.push("schön"), "schön");
  EXPECT_EQ(multibyte.push("ö"), "");
  EXPECT_EQ(multibyte.push("!x"), "");
  EXPECT_TRUE(multibyte.stopped());
}

}  // namespace
}  // namespace lilac::test
