// BPE merging over token ids, in byte space: a pre-token's bytes start as one-byte tokens and the
// lowest-ranked adjacent pair is merged until none applies. That is HF tokenizers' algorithm
// (models/bpe/word.rs): a min-heap of candidate merges ordered by (rank, left position), stale
// entries skipped when popped, so the ids are identical to HF's.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace lilac::tok {

class Bpe {
 public:
  Bpe() { byte_ids_.fill(-1); }

  // The id of the one-byte token for byte b (HF: the GPT-2 byte-to-unicode char of b).
  void set_byte_id(uint8_t b, int32_t id) { byte_ids_[b] = id; }
  int32_t byte_id(uint8_t b) const { return byte_ids_[b]; }

  // Merge `rank` (its line in merges): (a, b) -> merged. A later duplicate of a pair replaces the
  // earlier one, as in HF. Call finish() after the last.
  void add_merge(int32_t a, int32_t b, int32_t merged, uint32_t rank);
  void finish();
  size_t merge_count() const { return count_; }

  // Appends the ids of one pre-token. Bytes without a one-byte token are dropped (HF does the
  // same when the model has no unk token; byte-level vocabularies have all 256).
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  struct Entry {
    uint64_t key;  // a << 32 | b; kEmpty for a free slot
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  const Entry* find(int32_t a, int32_t b) const;

  std::array<int32_t, 256> byte_ids_;
  std::vector<Entry> pending_;  // add_merge's input until finish()
  std::vector<Entry> table_;    // open addressing, linear probing, power-of-two size
  int shift_ = 64;
  size_t count_ = 0;
};

}  // namespace lilac::tok
