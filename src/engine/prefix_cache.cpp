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
  // Compact: a slot's state has room for the whole context, the snapshot only for its tokens.
  // The budget counts everything the entry holds: the snapshot's buffers (their capacity, not
  // their size), the token list and the entry itself.
  Entry e{std::vector<int32_t>(tokens.begin(), tokens.end()),
          backend_.clone_with_capacity(state, state.position()), 0};
  e.bytes = backend_.state_bytes(*e.state) + e.tokens.capacity() * sizeof(int32_t) + sizeof(Entry);
  if (e.bytes > budget_) return;
  evict_to(budget_ - e.bytes);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
}

std::list<PrefixCache::Entry>::const_iterator PrefixCache::best_match(
    std::span<const int32_t> prompt) const {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const auto& t = it->tokens;
    if (t.size() >= prompt.size() || (best != entries_.end() && t.size() <= best->tokens.size()))
      continue;
    if (std::equal(t.begin(), t.end(), prompt.begin())) best = it;
  }
  return best;
}

size_t PrefixCache::match_length(std::span<const int32_t> prompt) const {
  auto best = best_match(prompt);
  return best == entries_.end() ? 0 : best->tokens.size();
}

std::pair<std::unique_ptr<SequenceState>, size_t> PrefixCache::lookup(
    std::span<const int32_t> prompt) {
  auto best = best_match(prompt);
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
