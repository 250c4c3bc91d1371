// Prompt reuse across turns. The KV cache could be truncated to a common prefix, the Gated
// DeltaNet state cannot, so reuse works from snapshots: a copy of the whole sequence state after
// some exact token sequence (after each prompt and after each answer of recent conversations).
// A new prompt starts from the longest snapshot whose tokens are a prefix of it. Least recently
// used snapshots are evicted to stay within a byte budget.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "model/backend.h"

namespace lilac {

class PrefixCache {
 public:
  // Restored snapshots get room for `context_size` tokens; stored ones only for their own.
  PrefixCache(Backend& backend, size_t budget_bytes, int64_t context_size)
      : backend_(backend), budget_(budget_bytes), context_size_(context_size) {}

  // Stores a snapshot (a compact clone: room for its own tokens only) of `state`, which has
  // consumed exactly `tokens`. Replaces an entry with the same tokens; skipped when the snapshot
  // alone exceeds the budget.
  void store(const SequenceState& state, std::span<const int32_t> tokens);
  // Whether snapshots are kept at all (a budget above zero).
  bool enabled() const { return budget_ > 0; }

  // The longest snapshot whose tokens are a prefix of `prompt` (at most prompt.size() - 1 tokens,
  // so at least one token is left to feed and sample from). Returns a fresh clone the caller owns
  // and the number of prompt tokens it covers; {nullptr, 0} when nothing matches.
  std::pair<std::unique_ptr<SequenceState>, size_t> lookup(std::span<const int32_t> prompt);
  // The number of prompt tokens lookup() would cover, without cloning (0: nothing matches).
  size_t match_length(std::span<const int32_t> prompt) const;

  // Bytes the snapshots hold: their states' buffers (capacity), token lists and entries.
  size_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<SequenceState> state;
    size_t bytes;
  };
  void evict_to(size_t budget);
  std::list<Entry>::const_iterator best_match(std::span<const int32_t> prompt) const;

  Backend& backend_;
  size_t budget_;
  int64_t context_size_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

// Length of the common prefix of two id sequences.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

}  // namespace lilac
