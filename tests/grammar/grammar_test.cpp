#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "grammar/constraint.h"
#include "grammar/matcher.h"
#include "grammar_test.h"
#include "util/error.h"

namespace lilac::grammar {
namespace {

using test::matches;

TEST(GrammarParse, LiteralsAlternativesAndGroups) {
  const std::string g = R"(root ::= "ab" ("c" | "de") x  # comment
x ::= "!" | )";
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "abde!"));
  EXPECT_FALSE(matches(g, "abd"));
  EXPECT_FALSE(matches(g, "abcd"));
  EXPECT_FALSE(matches(g, "ab"));
}

TEST(GrammarParse, RepetitionOperators) {
  EXPECT_TRUE(matches(R"(root ::= "a"* "b")", "b"));
  EXPECT_TRUE(matches(R"(root ::= "a"* "b")", "aaab"));
  EXPECT_FALSE(matches(R"(root ::= "a"+ "b")", "b"));
  EXPECT_TRUE(matches(R"(root ::= ("ab"){2,3})", "abab"));
  EXPECT_TRUE(matches(R"(root ::= ("ab"){2,3})", "ababab"));
  EXPECT_FALSE(matches(R"(root ::= ("ab"){2,3})", "abababab"));
  EXPECT_FALSE(matches(R"(root ::= ("ab"){2,3})", "ab"));
  EXPECT_TRUE(matches(R"(root ::= ("ab"){2,})", "abababababab"));
  EXPECT_TRUE(matches(R"(root ::= "x"? "y")", "y"));
}

TEST(GrammarParse, ClassesAreCodePointsInUtf8) {
  const std::string g = R"(root ::= [a-cé-ê]{2,3})";
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "aéê"));
  EXPECT_FALSE(matches(g, "aë"));  // outside the range
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "abcd"));
  const std::string neg = R"(root ::= [^"\\]+)";
  EXPECT_TRUE(matches(neg, "x😀y"));
  EXPECT_FALSE(matches(neg, "x\"y"));
  EXPECT_FALSE(matches(neg, "\xC0\x80"));      // overlong
  EXPECT_FALSE(matches(neg, "\xED\xA0\x80"));  // a surrogate
  EXPECT_TRUE(matches(R"(root ::= . . .)", "a\xE2\x82\xAC\n"));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\n")", "A\xC3\xA9\n"));
}

TEST(GrammarParse, RulesSpanLinesAndReferEachOther) {
  const std::string g = R"(
root ::= list
list ::= "[" (item ("," item)*)? "]"
item ::= [0-9]+
       | list
)";
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[1,[2,[]],33]"));
  EXPECT_FALSE(matches(g, "[1,]"));
}

TEST(GrammarParse, ErrorsNameTheProblem) {
  auto message = [](const std::string& g) {
    try {
      parse_gbnf(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("x ::= \"a\"").find("no 'root'"), std::string::npos);
  EXPECT_NE(message("root ::= y").find("'y' is used but never defined"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(message("root ::= x \"a\"\nx ::= \"\" | root").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(message("root ::= \"a").find("unterminated literal"), std::string::npos);
  EXPECT_NE(message("root ::= [b-a]").find("line 1"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(message("root ::= ((\"ab\"){1000}){1000}").find("too large"), std::string::npos);
}

TEST(GrammarMatcher, EndTokenOnlyWhenComplete) {
  auto vocab = test::small_vocab("ab", {});
  auto idx = test::index_for(R"(root ::= "a" "b"?)", vocab);
  Matcher m(idx);
  const int32_t end = vocab->end_tokens()[0];
  EXPECT_FALSE(m.accept_token(end));
  EXPECT_TRUE(m.accept_bytes("a"));
  EXPECT_TRUE(m.complete());
  auto allowed = test::allowed_ids(m);
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), end), allowed.end());
  EXPECT_TRUE(m.accept_token(end));
  EXPECT_TRUE(m.finished());
  EXPECT_TRUE(test::allowed_ids(m).empty());
}

TEST(GrammarMatcher, RejectedTokenLeavesTheStateUnchanged) {
  auto idx = test::index_for(R"(root ::= "ab" "c")", test::small_vocab("abc", {}));
  Matcher m(idx);
  EXPECT_FALSE(m.accept_bytes("ac"));
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.complete());
}

// The mask equals trying every token, along random walks through several grammars (the cached
// context-independent split and the uncertain-token walk together).
TEST(GrammarMatcher, MaskEqualsBruteForce) {
  const std::vector<std::string> extra = {
      "\"",       "\",",      "\":",  "{\"",   "\"}", "true",  "tr",   "ue",      "null",
      "12",       "-1",       "0.",   ".5",    "e+",  "é",     "\xC3", "\xA9",    "😀",
      "\xF0\x9F", "\x98\x80", "ab\"", "}",     "]",   "[",     ",\"",  " ",       "  ",
      "\n",       "\\n",      "\\",   "\\u00", "e9",  "\"a\"", "aaaa", "bbbbbbbb"};
  auto vocab = test::small_vocab("ab\"{}:,0123 ", extra);
  const std::vector<std::string> grammars = {
      R"(root ::= "{" ws (kv ("," ws kv)*)? "}"
kv ::= str ws ":" ws (str | num | "true" | "null") ws
str ::= "\"" [^"\\\x00-\x1F]{0,6} "\""
num ::= "-"? [0-9]{1,3} ("." [0-9]{1,2})?
ws ::= [ \n]{0,2})",
      R"(root ::= "\"" [^"\\]* ("\\" ["n\\] [^"\\]*)* "\"")",
      R"(root ::= ("a" | "ab" | "abb") ("b"* | "a") "\"")",
      R"(root ::= x x
x ::= [aé😀]{1,4} | "{" x "}")",
      // Runs longer than the longest token: counts past its length share cache entries.
      R"(root ::= "\"" [ab ]{0,30} "\"" [ab]{12,20} "}")",
  };
  // One thread, and the walk of a new context split over 3 and 7 threads (ranges that start
  // inside shared prefixes).
  for (int threads : {1, 3, 7}) {
    std::mt19937 rng(7);
    for (const auto& g : grammars) {
      SCOPED_TRACE(g + " threads " + std::to_string(threads));
      auto idx = test::index_for(g, vocab, threads);
      for (int run = 0; run < 8; ++run) {
        Matcher m(idx);
        for (int step = 0; step < 24 && !m.finished(); ++step) {
          const auto fast = test::allowed_ids(m);
          ASSERT_EQ(fast, test::brute_force_ids(m)) << "run " << run << " step " << step;
          if (fast.empty()) break;
          ASSERT_TRUE(m.accept_token(fast[rng() % fast.size()]));
        }
      }
    }
  }
}

// A bounded run at every count: remaining counts past the longest token (clipped), above the
// shared-entry bucket (its long tokens walked each step), and below it (an entry per count).
TEST(GrammarMatcher, MaskEqualsBruteForceAtEveryCountOfARun) {
  auto vocab = test::small_vocab("ab!", {"aaaaaaaa", "abababab", "aaaa!", "aaaaaa!", "a!"});
  auto idx = test::index_for(R"(root ::= [ab]{0,12} "!")", vocab);
  Matcher m(idx);
  for (int count = 0; count <= 12; ++count) {
    ASSERT_EQ(test::allowed_ids(m), test::brute_force_ids(m)) << "count " << count;
    if (count < 12) {
      ASSERT_TRUE(m.accept_bytes("a"));
    }
  }
  ASSERT_TRUE(m.accept_bytes("!"));
  EXPECT_TRUE(m.complete());
}

TEST(GrammarConstraint, OpensAfterTheThinkingToken) {
  auto vocab = test::small_vocab("ab", {"</think>"});
  const int32_t think_end = vocab->size() - 2;
  GrammarConstraint c(test::index_for(R"(root ::= "b")", vocab), think_end);
  std::vector<uint32_t> bits((size_t(vocab->size()) + 31) / 32);
  c.allowed_tokens(bits);
  EXPECT_EQ(bits[0] & 0x6u, 0x6u);  // a and b: anything goes while thinking
  c.accept(1);                      // "a" in the reasoning
  c.accept(think_end);
  EXPECT_TRUE(c.active());
  c.allowed_tokens(bits);
  EXPECT_EQ(bits[0] & 0x6u, 0x4u);  // only b now
  c.accept(2);
  EXPECT_TRUE(c.matcher().complete());
  EXPECT_EQ(c.rejected(), 0);
}

TEST(GrammarConstraint, RejectedTokensAreCountedAndAFinishedGrammarAllowsTheEnd) {
  auto vocab = test::small_vocab("ab", {});
  const int32_t end = vocab->end_tokens()[0];
  GrammarConstraint c(test::index_for(R"(root ::= "a")", vocab));
  c.accept(2);  // "b": not allowed, counted, the state unchanged
  EXPECT_EQ(c.rejected(), 1);
  c.accept(1);
  c.accept(end);
  EXPECT_TRUE(c.matcher().finished());
  std::vector<uint32_t> bits((size_t(vocab->size()) + 31) / 32);
  c.allowed_tokens(bits);  // the matcher allows nothing more: the end token, not an empty mask
  for (int32_t t = 0; t < vocab->size(); ++t)
    EXPECT_EQ(bool(bits[size_t(t) / 32] >> (t % 32) & 1u), t == end) << t;
}

}  // namespace
}  // namespace lilac::grammar
