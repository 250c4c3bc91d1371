// Encoding, decoding and streaming for BpeTokenizer (loading is in tokenizer_load.cpp).
#include <algorithm>
#include <cstring>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace lilac {
namespace tok {

ByteLevel::ByteLevel() {
  cp_to_byte.fill(-1);
  // Printable Latin-1 bytes map to themselves; the other 68 bytes to U+0100, U+0101, ... in order.
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_cp[b] = printable ? char32_t(b) : next++;
    cp_to_byte[byte_to_cp[b]] = int16_t(b);
  }
}

std::string ByteLevel::to_bytes(std::string_view token, bool* mapped) const {
  std::string out;
  out.reserve(token.size());
  // Tokens are valid UTF-8 (they come from JSON); a char outside the map means the whole token
  // is taken as its own UTF-8, like HF's ByteLevel decoder does.
  for (size_t i = 0; i < token.size();) {
    char32_t c = unicode::next_cp(token, i);
    if (c >= cp_to_byte.size() || cp_to_byte[c] < 0) {
      if (mapped) *mapped = false;
      return std::string(token);
    }
    out.push_back(char(cp_to_byte[c]));
  }
  if (mapped) *mapped = true;
  return out;
}

std::string ByteLevel::to_chars(std::string_view bytes) const {
  std::string out;
  for (char b : bytes) unicode::append_utf8(out, byte_to_cp[uint8_t(b)]);
  return out;
}

const ByteLevel& byte_level() {
  static const ByteLevel bl;
  return bl;
}

// ---- added tokens ----------------------------------------------------------------------------

void AddedMatcher::build(std::vector<const AddedToken*> tokens) {
  std::erase_if(tokens, [](const AddedToken* t) { return t->content.empty(); });
  std::stable_sort(tokens.begin(), tokens.end(), [](const AddedToken* a, const AddedToken* b) {
    return a->content.size() > b->content.size();
  });
  tokens_ = std::move(tokens);
  for (auto& v : first_) v.clear();
  for (size_t i = 0; i < tokens_.size(); ++i)
    first_[uint8_t(tokens_[i]->content[0])].push_back(uint32_t(i));
}

bool AddedMatcher::find(std::string_view text, size_t from, size_t& start, size_t& stop,
                        const AddedToken*& tok) const {
  for (size_t i = from; i < text.size(); ++i) {
    const auto& cands = first_[uint8_t(text[i])];
    if (cands.empty()) continue;
    for (uint32_t k : cands) {
      const std::string& c = tokens_[k]->content;
      if (text.size() - i < c.size() || std::memcmp(text.data() + i, c.data(), c.size()) != 0)
        continue;
      tok = tokens_[k];
      start = i;
      stop = i + c.size();
      if (tok->lstrip) {
        // Step back over whole white-space code points, not into the previous match.
        while (start > from) {
          size_t p = start - 1;
          while (p > from && (uint8_t(text[p]) & 0xC0) == 0x80) --p;
          size_t q = p;
          if (!unicode::is_white_space(unicode::next_cp(text, q))) break;
          start = p;
        }
      }
      if (tok->rstrip) {
        while (stop < text.size()) {
          size_t q = stop;
          if (!unicode::is_white_space(unicode::next_cp(text, q))) break;
          stop = q;
        }
      }
      return true;
    }
  }
  return false;
}

// ---- the piece cache -------------------------------------------------------------------------

bool PieceCache::lookup(std::string_view piece, size_t hash, std::vector<int32_t>& out) const {
  Shard& s = shards_[hash % kShards];
  std::lock_guard lock(s.mu);
  auto it = s.map.find(piece);
  if (it == s.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void PieceCache::insert(std::string_view piece, size_t hash, const int32_t* ids, size_t n) {
  Shard& s = shards_[hash % kShards];
  std::lock_guard lock(s.mu);
  if (s.map.size() >= per_shard_) s.map.clear();
  s.map.try_emplace(std::string(piece), ids, ids + n);
}

// ---- encode ----------------------------------------------------------------------------------

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1 && bpe.byte_id(uint8_t(piece[0])) >= 0) {
    out.push_back(bpe.byte_id(uint8_t(piece[0])));
    return;
  }
  if (ignore_merges) {
    int32_t id = vocab.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  bool cacheable = piece.size() <= PieceCache::kMaxPiece;
  size_t hash = cacheable ? std::hash<std::string_view>{}(piece) : 0;
  if (cacheable && cache_.lookup(piece, hash, out)) return;
  size_t first = out.size();
  bpe.encode_word(piece, out);
  if (cacheable) cache_.insert(piece, hash, out.data() + first, out.size() - first);
}

void BpeTokenizer::encode_normalized(std::string_view seg, std::vector<int32_t>& out) const {
  if (!splitter) {
    if (!seg.empty()) encode_piece(seg, out);
    return;
  }
  splitter->split(seg, [&](std::string_view piece) { encode_piece(piece, out); });
}

void BpeTokenizer::encode_segment(std::string_view seg, bool parse_special,
                                  std::vector<int32_t>& out) const {
  if (seg.empty()) return;
  std::string normalized;
  if (nfc && !unicode::is_nfc_quick(seg)) {
    normalized = unicode::nfc(seg);
    seg = normalized;
  }
  if (!parse_special || normalized_matcher.empty()) {
    encode_normalized(seg, out);
    return;
  }
  // Added tokens with normalized = true are matched in the normalized text (HF does the same).
  size_t pos = 0, start, stop;
  const AddedToken* t;
  while (normalized_matcher.find(seg, pos, start, stop, t)) {
    encode_normalized(seg.substr(pos, start - pos), out);
    out.push_back(t->id);
    pos = stop;
  }
  encode_normalized(seg.substr(pos), out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  size_t bad = unicode::first_invalid_utf8(text);
  if (bad != std::string_view::npos)
    fail("invalid UTF-8 in the text to encode at byte offset {} (byte 0x{:02X})", bad,
         uint8_t(text[bad]));
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!parse_special || raw_matcher.empty()) {
    encode_segment(text, parse_special, out);
    return out;
  }
  size_t pos = 0, start, stop;
  const AddedToken* t;
  while (raw_matcher.find(text, pos, start, stop, t)) {
    encode_segment(text.substr(pos, start - pos), parse_special, out);
    out.push_back(t->id);
    pos = stop;
  }
  encode_segment(text.substr(pos), parse_special, out);
  return out;
}

// ---- decode ----------------------------------------------------------------------------------

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= size()) fail("token id {} is out of range [0, {})", id, size());
    if (skip_special && (flags_[id] & kSpecial)) continue;
    out += id_bytes_[id];
  }
  return out;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& a : added)
    if (a.content == token) return a.id;
  int32_t id = vocab.find(token);
  if (id >= 0) return id;
  return std::nullopt;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= size()) fail("token id {} is out of range [0, {})", id, size());
  return id_bytes_[id];
}

}  // namespace tok

// ---- streaming -------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  size_t n = unicode::complete_utf8_prefix(pending_);
  if (n == 0) return {};
  std::string out = unicode::to_valid_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = unicode::to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace lilac
