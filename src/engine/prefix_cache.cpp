#include "engine/prefix_cache.h"

#include <algorithm>

namespace lilac {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

void PrefixCache::store(const SequenceState& state, std::span<const int32_t> tokens) {
  if (budget_ == 0 || tokens.empty()) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->tokens.size() == tokens.size() &&
        std::equal(tokens.begin(), tokens.end(), it->tokens.begin())) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  // Everything the entry holds: the state's buffers (their capacity, not their size), the
  // token list and the entry itself.
  const size_t need =
      backend_.state_bytes(state) + tokens.size() * sizeof(int32_t) + sizeof(Entry);
  if (need > budget_) return;
  evict_to(budget_ - need);
  Entry e{std::vector<int32_t>(tokens.begin(), tokens.end()), backend_.clone(state), 0};
  e.bytes = backend_.state_bytes(*e.state) + e.tokens.capacity() * sizeof(int32_t) + sizeof(Entry);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  evict_to(budget_);  // the clone may hold more than the original (capacity)
}

std::pair<std::unique_ptr<SequenceState>, size_t> PrefixCache::lookup(
    std::span<const int32_t> prompt) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const auto& t = it->tokens;
    if (t.size() >= prompt.size() || (best != entries_.end() && t.size() <= best->tokens.size()))
      continue;
    if (std::equal(t.begin(), t.end(), prompt.begin())) best = it;
  }
  if (best == entries_.end()) return {nullptr, 0};
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  return {backend_.clone_with_capacity(*entries_.front().state, context_size_),
          entries_.front().tokens.size()};
}

void PrefixCache::evict_to(size_t budget) {
  while (bytes_ > budget && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

void PrefixCache::clear() {
  entries_.clear();
  bytes_ = 0;
}

}  // namespace lilac
