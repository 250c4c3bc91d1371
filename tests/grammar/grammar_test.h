// Helpers of the grammar tests: a matcher over a grammar text and a vocabulary, and the brute-force
// mask (each token tried on a copy of the matcher) the fast mask must equal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace lilac::grammar::test {

// `walk_threads` as GrammarIndex takes it (0: automatic, 1 for these small vocabularies); a walk
// with more than one thread always uses the pool.
inline std::shared_ptr<GrammarIndex> index_for(const std::string& gbnf,
                                               std::shared_ptr<const Vocabulary> vocab,
                                               int walk_threads = 0) {
  auto idx =
      std::make_shared<GrammarIndex>(std::make_shared<const Grammar>(parse_gbnf(gbnf)),
                                     std::move(vocab), GrammarIndex::kContextDepth, walk_threads);
  idx->set_parallel_walk_ms(0);  // these walks are short: share every one of them all the same
  return idx;
}

// A vocabulary of every single byte of `alphabet`, their pairs, and `extra`; ids from 1 (0 is an
// empty special token), the last id the end token.
inline std::shared_ptr<const Vocabulary> small_vocab(const std::string& alphabet,
                                                     const std::vector<std::string>& extra) {
  std::vector<std::string> t{""};
  for (char a : alphabet) t.push_back(std::string(1, a));
  for (char a : alphabet)
    for (char b : alphabet) t.push_back(std::string{a, b});
  for (const auto& e : extra) t.push_back(e);
  t.push_back("");
  const int32_t end = int32_t(t.size() - 1);
  return std::make_shared<const Vocabulary>(std::move(t), std::vector<int32_t>{end});
}

// Whether the whole text is in the grammar's language.
inline bool matches(const std::string& gbnf, const std::string& text) {
  auto idx = index_for(gbnf, small_vocab("a", {}));
  Matcher m(idx);
  return m.accept_bytes(text) && m.complete();
}

inline std::vector<int32_t> allowed_ids(Matcher& m) {
  std::vector<uint32_t> bits((size_t(m.vocab().size()) + 31) / 32);
  m.fill_mask(bits);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < m.vocab().size(); ++t)
    if (bits[size_t(t) / 32] >> (t % 32) & 1u) ids.push_back(t);
  return ids;
}

inline std::vector<int32_t> brute_force_ids(const Matcher& m) {
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < m.vocab().size(); ++t) {
    Matcher copy = m;
    if (copy.accept_token(t)) ids.push_back(t);
  }
  return ids;
}

}  // namespace lilac::grammar::test
