#include "tokenizer/unicode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tokenizer/unicode_tables.h"
#include "util/utf8.h"

namespace lilac::unicode {
namespace {

namespace ut = unicode_tables;

// Hangul syllable arithmetic (Unicode 15, section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

// Length of the well-formed sequence at s[i] (> 0, valid = true), or of the maximal ill-formed
// subpart there (>= 1, valid = false): the longest prefix of a well-formed sequence.
size_t scan(std::string_view s, size_t i, bool& valid) {
  auto b = static_cast<uint8_t>(s[i]);
  valid = true;
  if (b < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    valid = false;
    return 1;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      valid = false;
      return k;
    }
    auto c = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) {
      valid = false;
      return k;
    }
  }
  return need;
}

inline uint8_t two_stage(const uint8_t* stage1, const uint8_t* stage2, char32_t cp) {
  if (cp >= 0x110000) return 0;
  return stage2[size_t(stage1[cp >> 8]) * 256 + (cp & 0xFF)];
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t si = cp - kSBase;
    out.push_back(kLBase + si / kNCount);
    out.push_back(kVBase + (si % kNCount) / kTCount);
    if (si % kTCount) out.push_back(kTBase + si % kTCount);
    return;
  }
  // Everything with a canonical decomposition is >= U+00C0; skip the search for ASCII/Latin-1 low.
  if (cp >= 0xC0) {
    const ut::Decomposition* end = ut::kDecompositions + ut::kDecompositionCount;
    const ut::Decomposition* it =
        std::lower_bound(ut::kDecompositions, end, cp,
                         [](const ut::Decomposition& d, char32_t c) { return d.cp < c; });
    if (it != end && it->cp == cp) {
      out.insert(out.end(), ut::kDecompositionPool + it->offset,
                 ut::kDecompositionPool + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  uint64_t key = (uint64_t(a) << 21) | b;
  const ut::Composition* end = ut::kCompositions + ut::kCompositionCount;
  const ut::Composition* it = std::lower_bound(
      ut::kCompositions, end, key, [](const ut::Composition& c, uint64_t k) { return c.key < k; });
  return it != end && it->key == key ? it->composite : 0;
}

// NFC of valid UTF-8 `s`, appended to out: decompose, order marks, recompose.
void normalize_slow(std::string& out, std::string_view s) {
  thread_local std::vector<char32_t> cps;
  thread_local std::vector<uint8_t> cls;
  cps.clear();
  for (size_t i = 0; i < s.size();) decompose(next_cp(s, i), cps);
  cls.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ccc(cps[i]);
  // Canonical ordering: stable insertion sort of every run of non-starters by class.
  for (size_t i = 1; i < cps.size(); ++i) {
    if (cls[i] == 0) continue;
    for (size_t j = i; j > 0 && cls[j - 1] > cls[j]; --j) {
      std::swap(cps[j - 1], cps[j]);
      std::swap(cls[j - 1], cls[j]);
    }
  }
  // Canonical composition, in place: [0, n) is the output so far; `starter` indexes its last
  // starter (or npos). A char composes with the starter unless a char between them has class 0
  // or a class >= its own (it is "blocked").
  size_t n = 0, starter = std::string_view::npos;
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    uint8_t cc = cls[i];
    if (starter != std::string_view::npos) {
      bool adjacent = starter == n - 1;
      if (adjacent || cls[n - 1] < cc) {
        if (char32_t p = compose(cps[starter], c)) {
          cps[starter] = p;
          continue;
        }
      }
    }
    cps[n] = c;
    cls[n] = cc;
    if (cc == 0) starter = n;
    ++n;
  }
  for (size_t i = 0; i < n; ++i) append_utf8(out, cps[i]);
}

}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    bool valid;
    size_t len = scan(s, i, valid);
    if (!valid) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t cp) {
  lilac::append_utf8(out, cp);
}

uint8_t ccc(char32_t cp) {
  return two_stage(ut::kCccStage1, ut::kCccStage2, cp);
}
uint8_t nfc_quick_check(char32_t cp) {
  return two_stage(ut::kNfcQcStage1, ut::kNfcQcStage2, cp);
}

namespace {

// UAX #15 quick check. Returns npos when the answer is Yes, else the byte offset from which
// normalization must run: the last "boundary before" (a starter whose NFC_QC is Yes) preceding
// the first code point that is not Yes. Text before such a boundary never interacts with text
// after it, so the prefix is already NFC.
size_t quick_check_from(std::string_view s) {
  size_t i = 0, boundary = 0;
  uint8_t last_cc = 0;
  while (i < s.size()) {
    // ASCII is NFC_QC Yes with class 0: eight bytes at a time.
    if (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (!(w & 0x8080808080808080ULL)) {
        last_cc = 0;
        boundary = i + 7;
        i += 8;
        continue;
      }
    }
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      last_cc = 0;
      boundary = i++;
      continue;
    }
    size_t at = i;
    char32_t cp = next_cp(s, i);
    uint8_t cc = ccc(cp);
    uint8_t qc = nfc_quick_check(cp);
    if (qc != 0 || (cc != 0 && last_cc > cc)) return boundary;
    if (cc == 0) boundary = at;
    last_cc = cc;
  }
  return std::string_view::npos;
}

}  // namespace

bool is_nfc_quick(std::string_view s) {
  return quick_check_from(s) == std::string_view::npos;
}

void append_nfc(std::string& out, std::string_view s) {
  size_t from = quick_check_from(s);
  if (from == std::string_view::npos) {
    out.append(s);
    return;
  }
  out.append(s.substr(0, from));
  normalize_slow(out, s.substr(from));
}

std::string nfc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_nfc(out, s);
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Only the last (at most 3) bytes can be an unfinished sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i > start;) {
    --i;
    auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) return s.size();
    if (b >= 0xC0) {
      if (b < 0xC2 || b > 0xF4) return s.size();  // never starts a sequence
      bool valid;
      size_t len = scan(s, i, valid);
      // Ill-formed before the end: it will never complete. Reaching the end: it may.
      if (!valid && i + len == s.size()) return i;
      return s.size();
    }
  }
  return s.size();
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool valid;
    size_t len = scan(s, i, valid);
    if (valid) {
      out.append(s.substr(i, len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += len;
  }
  return out;
}

}  // namespace lilac::unicode
