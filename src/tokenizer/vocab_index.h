// bytes -> id over a tokenizer's id table, as one flat open-addressing array of (hash, id) that
// points back into the table: 8 bytes a slot and no per-token allocation, so building and probing
// the 150k-250k entry index stays in cache far better than a node-based map (it was 30% of load).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lilac::tok {

class VocabIndex {
 public:
  // Indexes ids [0, tokens.size()) whose string is non-empty; on duplicates the lowest id wins.
  // `tokens` must outlive the index and not change.
  void build(const std::vector<std::string>& tokens, const std::vector<uint8_t>& include) {
    tokens_ = &tokens;
    size_t size = std::bit_ceil(std::max<size_t>(16, tokens.size() * 2));
    mask_ = size - 1;
    slots_.assign(size, Slot{0, -1});
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (!include[id] || tokens[id].empty()) continue;
      uint32_t h = hash(tokens[id]);
      size_t s = h & mask_;
      bool dup = false;
      for (; slots_[s].id >= 0; s = (s + 1) & mask_)
        if (slots_[s].hash == h && tokens[slots_[s].id] == tokens[id]) dup = true;
      if (!dup) slots_[s] = Slot{h, int32_t(id)};
    }
  }
  int32_t find(std::string_view bytes) const {
    if (slots_.empty()) return -1;
    uint32_t h = hash(bytes);
    for (size_t s = h & mask_; slots_[s].id >= 0; s = (s + 1) & mask_)
      if (slots_[s].hash == h && (*tokens_)[slots_[s].id] == bytes) return slots_[s].id;
    return -1;
  }

 private:
  struct Slot {
    uint32_t hash;
    int32_t id;  // -1: free
  };
  static uint32_t hash(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a final mix for the low bits
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return uint32_t(h ^ (h >> 32));
  }
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace lilac::tok
