// The grammar as a TokenConstraint (model/backend.h): the mask the sampler applies, advanced by
// every token the sequence takes. With thinking on, the constraint opens only once the
// end-of-thinking token has been taken (the reasoning is free text).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "grammar/matcher.h"
#include "model/backend.h"

namespace lilac::grammar {

class GrammarConstraint : public TokenConstraint {
 public:
  // `open_after`: a token id before which everything is allowed (</think>), -1: none.
  GrammarConstraint(std::shared_ptr<GrammarIndex> index, int32_t open_after = -1);
  void allowed_tokens(std::span<uint32_t> allowed) override;
  void accept(int32_t token) override;

  bool active() const { return open_after_ < 0; }
  const Matcher& matcher() const { return matcher_; }
  // Tokens taken that the grammar did not allow (forced ones; never sampled ones).
  int rejected() const { return rejected_; }

 private:
  Matcher matcher_;
  int32_t open_after_;
  int rejected_ = 0;
};

}  // namespace lilac::grammar
