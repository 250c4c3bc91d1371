#include "grammar/constraint.h"

#include <algorithm>

namespace lilac::grammar {

GrammarConstraint::GrammarConstraint(std::shared_ptr<GrammarIndex> index, int32_t open_after)
    : matcher_(index), open_after_(open_after) {}

void GrammarConstraint::allowed_tokens(std::span<uint32_t> allowed) {
  if (!active()) {
    std::fill(allowed.begin(), allowed.end(), ~0u);
    return;
  }
  matcher_.fill_mask(allowed);
  // Nothing allowed (a forced token left the grammar, or it is finished): allow the end tokens,
  // so the sequence stops instead of sampling from an empty distribution.
  if (std::all_of(allowed.begin(), allowed.end(), [](uint32_t w) { return w == 0; }))
    for (int32_t id : matcher_.vocab().end_tokens())
      if (size_t(id) / 32 < allowed.size()) allowed[size_t(id) / 32] |= 1u << (id % 32);
}

void GrammarConstraint::accept(int32_t token) {
  if (!active()) {
    if (token == open_after_) open_after_ = -1;
    return;
  }
  if (!matcher_.accept_token(token)) ++rejected_;
}

}  // namespace lilac::grammar
