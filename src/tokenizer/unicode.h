// UTF-8 and NFC helpers for the tokenizer. All strings are UTF-8 bytes; code points are char32_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lilac::unicode {

// The byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlongs,
// surrogates, > U+10FFFF and truncated sequences are all ill-formed), or npos if `s` is valid.
size_t first_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (which must be valid UTF-8) and advances i past it.
inline char32_t next_cp(std::string_view s, size_t& i) {
  auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    char32_t c = (char32_t(b & 0x1F) << 6) | (uint8_t(s[i + 1]) & 0x3F);
    i += 2;
    return c;
  }
  if (b < 0xF0) {
    char32_t c = (char32_t(b & 0x0F) << 12) | (char32_t(uint8_t(s[i + 1]) & 0x3F) << 6) |
                 (uint8_t(s[i + 2]) & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = (char32_t(b & 0x07) << 18) | (char32_t(uint8_t(s[i + 1]) & 0x3F) << 12) |
               (char32_t(uint8_t(s[i + 2]) & 0x3F) << 6) | (uint8_t(s[i + 3]) & 0x3F);
  i += 4;
  return c;
}

void append_utf8(std::string& out, char32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace and HF tokenizers use).
inline bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Canonical combining class and NFC_Quick_Check (0 Yes, 1 Maybe, 2 No) of a code point.
uint8_t ccc(char32_t cp);
uint8_t nfc_quick_check(char32_t cp);

// True when `s` (valid UTF-8) is certainly already NFC: the UAX #15 quick check answers Yes.
// Pure ASCII answers at once.
bool is_nfc_quick(std::string_view s);

// NFC of valid UTF-8 `s`. Text the quick check accepts is returned unchanged without decoding.
std::string nfc(std::string_view s);
// Same, appending to `out`.
void append_nfc(std::string& out, std::string_view s);

// Length of the longest prefix of s[0, n) that is complete UTF-8 (a trailing sequence cut short
// is excluded; ill-formed bytes count as complete single bytes, they will never complete).
size_t complete_utf8_prefix(std::string_view s);

// `s` with every ill-formed sequence replaced by U+FFFD (one per maximal ill-formed subpart,
// as WHATWG / Rust's from_utf8_lossy do).
std::string to_valid_utf8(std::string_view s);

}  // namespace lilac::unicode
