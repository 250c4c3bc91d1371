// The mask cache's shortcuts and its shared walk threads, each against the brute-force mask
// (every token tried on a copy of the matcher).
#include "grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "grammar_test.h"

namespace lilac::grammar {
namespace {

// Tokens that stay inside a run are decided by their character count (InsideRun): at every count
// of a bounded run, with partial UTF-8 characters, and with a run whose next element may take the
// run's own characters (so the tokens too long for the run must still be walked).
TEST(GrammarIndex, InsideRunTokensEqualBruteForceAtEveryCount) {
  const std::vector<std::string> extra = {"aaaaaaaa",
                                          "abababab",
                                          "aaaa!",
                                          "aaaaaa!",
                                          "a!",
                                          "\"",
                                          "a\"",
                                          "ab\"!",
                                          "é",
                                          "éé",
                                          "éa",
                                          "\xC3",
                                          "\xA9",
                                          "\xA9"
                                          "a",
                                          "😀",
                                          "😀a",
                                          "\xF0\x9F",
                                          "\x98\x80",
                                          "a\xC3",
                                          "aaa\"",
                                          "ba",
                                          "bbbbbbbbbbbb"};
  auto vocab = test::small_vocab("ab!\"", extra);
  struct Case {
    std::string gbnf;
    std::string step;  // bytes taken at each count
    int counts;
  };
  const std::vector<Case> cases = {
      // The next element (a quote) cannot start a run character: long tokens are rejected.
      {R"(root ::= "\"" [^"\\]{0,14} "\"" "!")", "a", 14},
      {R"(root ::= "\"" [^"\\]{3,9} "\"")", "é", 9},
      // The next element takes run characters: a token too long for the run may leave it.
      {R"(root ::= [ab]{0,12} "a" "!")", "b", 12},
      {R"(root ::= [ab]{2,9} [a-c]* "!")", "a", 9},
      {R"(root ::= [aé😀]{0,7} "a"? "!")", "😀", 7},
  };
  for (int threads : {1, 4}) {
    for (const auto& c : cases) {
      SCOPED_TRACE(c.gbnf + " threads " + std::to_string(threads));
      auto idx = test::index_for(c.gbnf, vocab, threads);
      Matcher m(idx);
      if (c.gbnf.find("root ::= \"\\\"\"") == 0) {
        ASSERT_TRUE(m.accept_bytes("\""));
      }
      for (int count = 0; count <= c.counts; ++count) {
        ASSERT_EQ(test::allowed_ids(m), test::brute_force_ids(m)) << "count " << count;
        if (count < c.counts) {
          ASSERT_TRUE(m.accept_bytes(c.step)) << "count " << count;
        }
      }
      // Random walks through the same grammar, the cache now warm.
      std::mt19937 rng(11);
      for (int run = 0; run < 6; ++run) {
        Matcher r(idx);
        for (int step = 0; step < 20 && !r.finished(); ++step) {
          const auto fast = test::allowed_ids(r);
          ASSERT_EQ(fast, test::brute_force_ids(r)) << "run " << run << " step " << step;
          if (fast.empty()) break;
          ASSERT_TRUE(r.accept_token(fast[rng() % fast.size()]));
        }
      }
    }
  }
}

// The class table's UTF-8 checks at their edges (overlong forms, surrogates, past U+10FFFF,
// partial characters), for classes that hold every character of a lead byte (the structure alone
// decides) and classes that hold part of one.
TEST(GrammarIndex, InsideRunUtf8EdgesEqualBruteForce) {
  const std::vector<std::string> extra = {"\xE0\xA0\x80",
                                          "\xE0\x9F\xBF",
                                          "\xE0\xA0",
                                          "\xE0\x9F",
                                          "\xED\x9F\xBF",
                                          "\xED\xA0\x80",
                                          "\xED\xA0",
                                          "\xED\x9F",
                                          "\xF4\x8F\xBF\xBF",
                                          "\xF4\x90\x80\x80",
                                          "\xF4\x90",
                                          "\xF4\x8F",
                                          "\xF0\x90\x80\x80",
                                          "\xF0\x8F\xBF\xBF",
                                          "\xF0\x8F",
                                          "\xF0\x90",
                                          "\xC2\x80",
                                          "\xC1\xBF",
                                          "\xDF\xBF",
                                          "\xE1\x80",
                                          "\xEF\xBF\xBF",
                                          "\xE0\xA4\x80"
                                          "a",
                                          "\xA0",
                                          "\xBF\xBF",
                                          "\xF5\x80"};
  auto vocab = test::small_vocab("ab\"", extra);
  const std::vector<std::string> grammars = {
      R"(root ::= "\"" [^"\\\x00-\x1F]{0,6} "\"")",      // every lead byte held whole
      R"(root ::= "\"" [^"\u0800-\u08FF]{0,6} "\"")",    // E0 held in part
      R"(root ::= "\"" [\U00010000-\U0010FFFF]* "\"")",  // only 4-byte leads
      R"(root ::= "\"" [\u00A0-\uFFFF]{0,4} "\"")",      // ED held up to the surrogates
  };
  for (int threads : {1, 3}) {
    std::mt19937 rng(5);
    for (const auto& g : grammars) {
      SCOPED_TRACE(g + " threads " + std::to_string(threads));
      auto idx = test::index_for(g, vocab, threads);
      for (int run = 0; run < 10; ++run) {
        Matcher m(idx);
        for (int step = 0; step < 10 && !m.finished(); ++step) {
          const auto fast = test::allowed_ids(m);
          ASSERT_EQ(fast, test::brute_force_ids(m)) << "run " << run << " step " << step;
          if (fast.empty()) break;
          ASSERT_TRUE(m.accept_token(fast[rng() % fast.size()]));
        }
      }
    }
  }
}

// A run whose class holds most of the vocabulary: only the few tokens outside the class are
// walked (the table's outside list), at every count and unbounded.
TEST(GrammarIndex, FewTokensOutsideTheRunClassEqualBruteForce) {
  std::vector<std::string> extra = {"\"", "a\"", "\"}", "b\"}", "}"};
  for (int len = 3; len <= 5; ++len)
    for (int bits = 0; bits < (1 << len); ++bits) {
      std::string t;
      for (int k = 0; k < len; ++k) t += (bits >> k & 1) ? 'b' : 'a';
      extra.push_back(t);
    }
  auto vocab = test::small_vocab("ab", extra);
  for (const std::string gbnf : {R"(root ::= [ab]{0,6} "\"" "}")", R"(root ::= [ab]* "\"" "}")"}) {
    for (int threads : {1, 4}) {
      SCOPED_TRACE(gbnf + " threads " + std::to_string(threads));
      auto idx = test::index_for(gbnf, vocab, threads);
      Matcher m(idx);
      for (int count = 0; count <= 6; ++count) {
        ASSERT_EQ(test::allowed_ids(m), test::brute_force_ids(m)) << "count " << count;
        if (count < 6) {
          ASSERT_TRUE(m.accept_bytes("b"));
        }
      }
      ASSERT_TRUE(m.accept_bytes("\""));
      ASSERT_EQ(test::allowed_ids(m), test::brute_force_ids(m));
    }
  }
}

// Several sequences meeting new contexts of one index at once: their walks share the pool's
// threads (jobs queued behind each other) and every mask still equals the brute force.
TEST(GrammarIndex, ConcurrentNewContextsEqualBruteForce) {
  auto vocab = test::small_vocab("ab\"{}:, ", {"\",", "\":", "{\"", "\"}", "aaaa", "ab\""});
  auto idx = test::index_for(R"(root ::= "{" (kv ("," kv)*)? "}"
kv ::= "\"" [ab]{0,9} "\"" ":" ("\"" [^"]{0,5} "\"" | "{" (kv ("," kv)*)? "}"))",
                             vocab, 3);
  std::vector<std::string> failures(4);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < failures.size(); ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(uint32_t(100 + w));
      for (int run = 0; run < 6 && failures[w].empty(); ++run) {
        Matcher m(idx);
        for (int step = 0; step < 30 && !m.finished(); ++step) {
          const auto fast = test::allowed_ids(m);
          if (fast != test::brute_force_ids(m)) {
            failures[w] = "run " + std::to_string(run) + " step " + std::to_string(step);
            break;
          }
          if (fast.empty() || !m.accept_token(fast[rng() % fast.size()])) break;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  for (size_t w = 0; w < failures.size(); ++w) EXPECT_EQ(failures[w], "") << "sequence " << w;
  EXPECT_GT(idx->cached_entries(), 4u);
}

}  // namespace
}  // namespace lilac::grammar
