#include "chat/jinja_text.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>

#include "util/error.h"
#include "util/utf8.h"

namespace lilac::jinja::text {

uint32_t next_cp(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  i += len;
  return cp;
}

void append_cp(std::string& out, uint32_t cp) {
  append_utf8(out, char32_t(cp));
}

static bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t cp_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_cp(s, i);
  return n;
}

std::vector<size_t> cp_offsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    off.push_back(i);
    next_cp(s, i);
  }
  off.push_back(s.size());
  return off;
}

size_t cp_index(std::string_view s, size_t byte) {
  return cp_length(s.substr(0, byte));
}

bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_linebreak(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

// CPython treats categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs (except ' ') as non-printable.
// Without Unicode tables this covers the controls, the spaces and the format characters a chat
// message realistically holds; other unassigned code points print as themselves.
bool is_printable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  if (c >= 0xF0000 || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F)) return false;
  return true;
}

namespace {

// Unicode case mapping and classification come from the C library's C.UTF-8 locale (glibc
// ships it built in); without it only ASCII is mapped.
locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
  return loc;
}

uint32_t to_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t l = utf8_locale();
  return l ? uint32_t(towupper_l(wint_t(c), l)) : c;
}
uint32_t to_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t l = utf8_locale();
  return l ? uint32_t(towlower_l(wint_t(c), l)) : c;
}
bool cp_is_upper(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  locale_t l = utf8_locale();
  return l && iswupper_l(wint_t(c), l);
}
bool cp_is_lower(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  locale_t l = utf8_locale();
  return l && iswlower_l(wint_t(c), l);
}
bool cp_is_cased(uint32_t c) {
  return cp_is_upper(c) || cp_is_lower(c) || to_upper(c) != to_lower(c);
}

template <typename F>
std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_cp(out, f(next_cp(s, i)));
  return out;
}

}  // namespace

bool is_word_char(uint32_t c) {
  if (c < 0x80) return c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
  locale_t l = utf8_locale();
  return l ? bool(iswalnum_l(wint_t(c), l)) : !is_space(c);
}

// Python applies Unicode's full case mappings (SpecialCasing.txt), which may change the length;
// the C library only has the one-to-one ones. These are the unconditional multi-character
// mappings of Latin text that chat templates can meet.
static const char* special_upper(uint32_t c) {
  switch (c) {
    case 0xDF:
      return "SS";  // ß
    case 0x149:
      return "\u02BCN";  // ŉ
    case 0xFB00:
      return "FF";
    case 0xFB01:
      return "FI";
    case 0xFB02:
      return "FL";
    case 0xFB03:
      return "FFI";
    case 0xFB04:
      return "FFL";
    case 0xFB05:
    case 0xFB06:
      return "ST";
    default:
      return nullptr;
  }
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_cp(s, i);
    if (const char* sp = special_upper(c))
      out += sp;
    else
      append_cp(out, to_upper(c));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_cp(s, i);
    if (c == 0x130)
      out += "i\u0307";  // İ: i + combining dot above
    else
      append_cp(out, to_lower(c));
  }
  return out;
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_cps(s, [&](uint32_t c) {
    uint32_t r = first ? to_upper(c) : to_lower(c);
    first = false;
    return r;
  });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](uint32_t c) {
    uint32_t r = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cp_is_cased(c);
    return r;
  });
}

static bool case_check(std::string_view s, bool want_lower) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_cp(s, i);
    if (want_lower ? cp_is_upper(c) : cp_is_lower(c)) return false;
    if (want_lower ? cp_is_lower(c) : cp_is_upper(c)) cased = true;
  }
  return cased;
}
bool is_lower(std::string_view s) {
  return case_check(s, true);
}
bool is_upper(std::string_view s) {
  return case_check(s, false);
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars)
    for (size_t i = 0; i < chars->size();) set.push_back(next_cp(*chars, i));
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  std::vector<size_t> off = cp_offsets(s);
  size_t n = off.size() - 1, b = 0, e = n;
  auto cp_at = [&](size_t k) {
    size_t i = off[k];
    return next_cp(s, i);
  };
  if (left)
    while (b < e && strip_it(cp_at(b))) ++b;
  if (right)
    while (e > b && strip_it(cp_at(e - 1))) --e;
  return std::string(s.substr(off[b], off[e] - off[b]));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t p = s.find(*sep, start);
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(start, p - start));
      start = p + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_space(next_cp(s, j))) break;
    i = j;
  }
  while (i < s.size()) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      // The remainder keeps its inner and trailing whitespace (CPython semantics).
      out.emplace_back(s.substr(i));
      return out;
    }
    size_t start = i, end = i;
    while (i < s.size()) {
      size_t j = i;
      if (is_space(next_cp(s, j))) break;
      i = end = j;
    }
    out.emplace_back(s.substr(start, end - start));
    while (i < s.size()) {
      size_t j = i;
      if (!is_space(next_cp(s, j))) break;
      i = j;
    }
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t p = s.rfind(*sep, end - sep->size());
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<size_t> off = cp_offsets(s);
  auto space_at = [&](size_t k) {
    size_t i = off[k];
    return is_space(next_cp(s, i));
  };
  size_t e = off.size() - 1;
  while (e > 0 && space_at(e - 1)) --e;
  while (e > 0) {
    if (int64_t(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, off[e]));
      break;
    }
    size_t b = e;
    while (b > 0 && !space_at(b - 1)) --b;
    out.emplace_back(s.substr(off[b], off[e] - off[b]));
    e = b;
    while (e > 0 && space_at(e - 1)) --e;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t j = i;
    uint32_t c = next_cp(s, j);
    if (!is_linebreak(c)) {
      i = j;
      continue;
    }
    size_t brk_end = j;
    if (c == '\r' && j < s.size() && s[j] == '\n') brk_end = j + 1;
    out.emplace_back(s.substr(start, (keepends ? brk_end : i) - start));
    start = i = brk_end;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // CPython inserts `repl` before every code point and at the end.
    int64_t done = 0;
    for (size_t i = 0; i < s.size();) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      size_t j = i;
      next_cp(s, j);
      out += s.substr(i, j - i);
      i = j;
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(old, start);
    if (p == std::string_view::npos) break;
    out += s.substr(start, p - start);
    out += repl;
    start = p + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(cp_length(s)) + 1;
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string_view::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  size_t p = reverse ? s.rfind(sub) : s.find(sub);
  return p == std::string_view::npos ? -1 : int64_t(cp_index(s, p));
}

std::string center(std::string_view s, int64_t width, std::string_view fill) {
  int64_t len = int64_t(cp_length(s));
  if (width <= len) return std::string(s);
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

std::string py_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_cp(s, i);
    if (c == uint32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c)) {
      char buf[16];
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
      else if (c < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", c);
      out += buf;
    } else {
      append_cp(out, c);
    }
  }
  out += q;
  return out;
}

std::string unescape_literal(std::string_view body) {
  std::string out;
  auto hex = [&](size_t& i, int digits, uint32_t& cp) {
    if (i + digits > body.size()) return false;
    cp = 0;
    for (int k = 0; k < digits; ++k) {
      char h = body[i + k];
      int v = (h >= '0' && h <= '9')   ? h - '0'
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                       : -1;
      if (v < 0) return false;
      cp = cp * 16 + uint32_t(v);
    }
    i += digits;
    return true;
  };
  for (size_t i = 0; i < body.size();) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      ++i;
      continue;
    }
    char e = body[i + 1];
    i += 2;
    uint32_t cp = 0;
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // backslash-newline continues the line
      case 'x':
      case 'u':
      case 'U':
        if (!hex(i, e == 'x' ? 2 : e == 'u' ? 4 : 8, cp) || cp > 0x10FFFF)
          fail("invalid \\{} escape in string literal", e);
        append_cp(out, cp);
        break;
      default:
        if (e >= '0' && e <= '7') {
          cp = uint32_t(e - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i)
            cp = cp * 8 + uint32_t(body[i] - '0');
          append_cp(out, cp);
        } else {
          // Unknown escapes stay as written, as in Python.
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

}  // namespace lilac::jinja::text
