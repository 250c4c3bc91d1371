// The one Tokenizer implementation: HF byte-level BPE (see tokenizer.h). Internal header:
// tokenizer_load.cpp builds it from the files, tokenizer.cpp encodes and decodes.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_index.h"

namespace lilac::tok {

// GPT-2's byte <-> unicode map: every byte becomes a printable code point (< U+0144).
struct ByteLevel {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, 512> cp_to_byte{};  // -1 where cp is no byte's image
  ByteLevel();
  // The bytes a vocab string stands for, or the string itself when some char is no byte's
  // image (HF's ByteLevel decoder then falls back to the token's own UTF-8).
  std::string to_bytes(std::string_view token, bool* mapped = nullptr) const;
  std::string to_chars(std::string_view bytes) const;
};
const ByteLevel& byte_level();

struct AddedToken {
  std::string content;  // matched as bytes; NFC'd when `normalized`
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// Finds added tokens in text: leftmost match, longest at that position (HF's Aho-Corasick
// LeftmostLongest), then widened over white space for lstrip / rstrip.
class AddedMatcher {
 public:
  void build(std::vector<const AddedToken*> tokens);
  bool empty() const { return tokens_.empty(); }
  // First match in text[from, end): [start, stop) and the token. False when none.
  bool find(std::string_view text, size_t from, size_t& start, size_t& stop,
            const AddedToken*& tok) const;

 private:
  std::vector<const AddedToken*> tokens_;         // longest first
  std::array<std::vector<uint32_t>, 256> first_;  // by first byte: indexes into tokens_
};

// A bounded, thread-safe map from pre-token bytes to their BPE ids. Sharded by hash so that
// threads encoding at once rarely wait on one lock; a full shard is simply emptied.
class PieceCache {
 public:
  static constexpr size_t kMaxPiece = 64;  // longer pieces are rare and not worth the memory
  explicit PieceCache(size_t capacity) : per_shard_(capacity / kShards + 1) {}
  bool lookup(std::string_view piece, size_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, size_t hash, const int32_t* ids, size_t n);

 private:
  static constexpr size_t kShards = 16;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  size_t per_shard_;
  mutable std::array<Shard, kShards> shards_;
};

class BpeTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  int32_t size() const override { return int32_t(id_bytes_.size()); }
  std::optional<int32_t> token_id(std::string_view token) const override;
  std::string token_bytes(int32_t id) const override;
  bool is_special(int32_t id) const override {
    return id >= 0 && id < size() && (flags_[id] & kSpecial);
  }
  const std::vector<int32_t>& eos_ids() const override { return eos_; }

  // ---- filled by the loader (tokenizer_load.cpp) ----
  bool nfc = false;
  bool ignore_merges = false;
  std::unique_ptr<RegexSplitter> splitter;  // null: the whole segment is one piece
  Bpe bpe;
  VocabIndex vocab;  // BPE token bytes -> id (over id_bytes_)
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;  // tokens with normalized false / true
  std::vector<std::string> id_bytes_;            // every id's bytes ("" for unused ids)
  enum : uint8_t { kSpecial = 1, kAdded = 2 };
  std::vector<uint8_t> flags_;
  std::vector<int32_t> eos_;
  std::string source;  // the tokenizer.json path, for messages

 private:
  // Normalizes and pre-tokenizes one stretch of text free of raw added tokens.
  void encode_segment(std::string_view seg, bool parse_special, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view seg, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  mutable PieceCache cache_{1 << 16};
};

}  // namespace lilac::tok
