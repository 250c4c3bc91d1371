// Property tests on random Unicode with fixed seeds (all planes, combining marks, emoji ZWJ
// sequences, white-space classes, CR/LF runs, added-token strings), invalid UTF-8, streaming.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/unicode.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace lilac::test {
namespace {

// Deterministic everywhere: mt19937_64's sequence is fixed by the standard; distributions are
// not, so they are not used.
class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) { return rng_() % n; }
  char32_t in(char32_t lo, char32_t hi) { return lo + char32_t(below(hi - lo + 1)); }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  std::mt19937_64 rng_;
};

void put(std::string& s, char32_t c) {
  unicode::append_utf8(s, c);
}

// One random chunk of text of a random kind.
void random_chunk(Gen& g, std::string& s) {
  static const std::vector<char32_t> kSpaces = {0x9,    0xA,    0xB,    0xC,    0xD,    0x20,
                                                0x85,   0xA0,   0x1680, 0x180E, 0x2000, 0x2003,
                                                0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  static const std::vector<std::pair<char32_t, char32_t>> kMarks = {
      {0x300, 0x36F},   {0x483, 0x489},   {0x591, 0x5C7},   {0x64B, 0x65F},
      {0x900, 0x903},   {0x93A, 0x94F},   {0xE31, 0xE3A},   {0x1AB0, 0x1ACE},
      {0x1DC0, 0x1DFF}, {0x20D0, 0x20F0}, {0x302A, 0x302F}, {0x1D165, 0x1D169}};
  static const std::vector<std::string> kWords = {
      "the",     "The",      "don't",         "I'M",         "we'LL", "'s",           "x",
      "123",     "3.14",     "naïve",         "東京",        "Ω",     "<|im_start|>", "<|im_end|>",
      "<think>", "</think>", "<|endoftext|>", "<tool_call>", "<|im_", "<think",       "|>",
      "<",       ">"};
  switch (g.below(12)) {
    case 0:  // printable ASCII
      for (int n = 1 + int(g.below(12)); n > 0; --n) put(s, g.in(0x20, 0x7E));
      break;
    case 1:  // white space of every class, and U+180E which is not
      for (int n = 1 + int(g.below(5)); n > 0; --n) put(s, g.pick(kSpaces));
      break;
    case 2:  // CR/LF runs
      for (int n = 1 + int(g.below(8)); n > 0; --n) s += g.below(2) ? '\r' : '\n';
      break;
    case 3: {  // a base (sometimes none) and a pile of combining marks
      if (g.below(4)) put(s, g.below(2) ? g.in('a', 'z') : g.in(0x3B1, 0x3C9));
      for (int n = 1 + int(g.below(4)); n > 0; --n) {
        auto [lo, hi] = g.pick(kMarks);
        put(s, g.in(lo, hi));
      }
      break;
    }
    case 4: {  // emoji: ZWJ families, skin tones, VS16, flags, keycaps
      int n = 1 + int(g.below(4));
      for (int i = 0; i < n; ++i) {
        if (i) put(s, 0x200D);
        put(s, g.in(0x1F466, 0x1F469));
        if (g.below(2)) put(s, g.in(0x1F3FB, 0x1F3FF));
      }
      if (g.below(2)) put(s, 0xFE0F);
      if (g.below(3) == 0) {
        put(s, g.in(0x1F1E6, 0x1F1FF));
        put(s, g.in(0x1F1E6, 0x1F1FF));
      }
      if (g.below(4) == 0) {
        put(s, g.in('0', '9'));
        put(s, 0xFE0F);
        put(s, 0x20E3);
      }
      break;
    }
    case 5:  // any plane, unassigned, private use and noncharacters included (no surrogates)
    case 6: {
      char32_t c = g.in(0, 0x10FFFF);
      if (c >= 0xD800 && c < 0xE000) c -= 0x800;
      put(s, c);
      break;
    }
    case 7: {  // BMP
      char32_t c = g.in(0x80, 0xFFFD);
      if (c >= 0xD800 && c < 0xE000) c = 0xFFFD;
      put(s, c);
      break;
    }
    case 8:  // Hangul: conjoining jamo (compose under NFC) and syllables
      for (int n = 1 + int(g.below(3)); n > 0; --n) {
        put(s, g.in(0x1100, 0x1112));
        put(s, g.in(0x1161, 0x1175));
        if (g.below(2)) put(s, g.in(0x11A8, 0x11C2));
        if (g.below(2)) put(s, g.in(0xAC00, 0xD7A3));
      }
      break;
    case 9:  // CJK
      for (int n = 1 + int(g.below(6)); n > 0; --n) put(s, g.in(0x4E00, 0x9FFF));
      break;
    default:  // words, contractions, added-token strings and fragments of them
      s += g.pick(kWords);
      break;
  }
}

std::string random_text(Gen& g) {
  std::string s;
  for (int n = int(g.below(40)); n > 0; --n) random_chunk(g, s);
  return s;
}

// An independent model of what parse_special = true must decode to: the text cut at added-token
// strings (leftmost, longest first), each stretch between them NFC'd on its own.
std::string expected_with_specials(const std::string& s) {
  std::vector<std::string> added;
  for (const auto& [content, id] : qwen3_added_tokens()) added.push_back(content);
  std::string out;
  size_t pos = 0, seg = 0;
  while (pos < s.size()) {
    const std::string* best = nullptr;
    for (const std::string& a : added)
      if (s.compare(pos, a.size(), a) == 0 && (!best || a.size() > best->size())) best = &a;
    if (!best) {
      ++pos;
      continue;
    }
    out += unicode::nfc(s.substr(seg, pos - seg)) + *best;
    pos += best->size();
    seg = pos;
  }
  return out + unicode::nfc(s.substr(seg));
}

class TokenizerProperty : public ::testing::TestWithParam<uint64_t> {};

TEST_P(TokenizerProperty, RoundTripIsNfc) {
  Gen g(GetParam());
  int32_t first_added = INT32_MAX;
  for (const auto& [content, id] : qwen3_added_tokens()) first_added = std::min(first_added, id);
  for (int i = 0; i < 400; ++i) {
    std::string s = random_text(g);
    ASSERT_EQ(unicode::first_invalid_utf8(s), std::string_view::npos);
    for (const Tokenizer* tok : {&qwen3_tokenizer(), &qwen35_tokenizer()}) {
      std::vector<int32_t> plain = tok->encode(s, false);
      ASSERT_EQ(tok->decode(plain), unicode::nfc(s)) << nlohmann::json(s).dump();
      for (int32_t id : plain) ASSERT_LT(id, first_added) << "an added token from plain text";
      ASSERT_EQ(tok->encode(unicode::nfc(s), false), plain);
      std::vector<int32_t> special = tok->encode(s, true);
      ASSERT_EQ(tok->decode(special), expected_with_specials(s)) << nlohmann::json(s).dump();
    }
  }
}

// Streaming gives exactly the full decode, in pieces that are each valid UTF-8.
TEST_P(TokenizerProperty, StreamingEqualsDecode) {
  Gen g(GetParam() * 7919);
  const Tokenizer& tok = qwen35_tokenizer();
  for (int i = 0; i < 300; ++i) {
    std::string s = random_text(g);
    std::vector<int32_t> ids = tok.encode(s);
    for (bool skip : {false, true}) {
      StreamDecoder d(tok, skip);
      std::string out;
      for (int32_t id : ids) {
        std::string part = d.push(id);
        ASSERT_EQ(unicode::first_invalid_utf8(part), std::string_view::npos);
        out += part;
      }
      out += d.flush();
      ASSERT_EQ(out, tok.decode(ids, skip)) << nlohmann::json(s).dump();
    }
  }
}

// Random bytes: valid UTF-8 round-trips, anything else is a lilac::Error naming the offset of the
// first bad byte; nothing crashes.
TEST_P(TokenizerProperty, RandomBytesNeverCrash) {
  Gen g(GetParam() + 17);
  const Tokenizer& tok = qwen3_tokenizer();
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    for (int n = int(g.below(24)); n > 0; --n) {
      uint64_t k = g.below(4);
      s += char(k == 0 ? g.in(0, 0x7F) : k == 1 ? g.in(0x80, 0xBF) : g.in(0xC0, 0xFF));
    }
    size_t bad = unicode::first_invalid_utf8(s);
    if (bad == std::string_view::npos) {
      EXPECT_EQ(tok.decode(tok.encode(s)), unicode::nfc(s));
      continue;
    }
    ++rejected;
    try {
      tok.encode(s);
      ADD_FAILURE() << "invalid UTF-8 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);
}

INSTANTIATE_TEST_SUITE_P(TokenizerSeeds, TokenizerProperty, ::testing::Values(1, 2, 3, 20240601));

}  // namespace
}  // namespace lilac::test
