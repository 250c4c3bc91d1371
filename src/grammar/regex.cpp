// A JSON-schema `pattern` (ECMAScript regex subset) -> a GBNF expression (json_schema.h).
//
// Supported: literals, escapes (\d \w \s \D \W \S \. \\ \n \t \xHH \uHHHH ...), classes [...] and
// [^...] with ranges, `.`, groups (...) and (?:...), alternation, quantifiers * + ? {m} {m,}
// {m,n} (lazy forms too: the language is the same), ^ at the start and $ at the end. The
// expression matches the whole string: an unanchored pattern is generated as if anchored (every
// string it produces contains a match, so it validates). Characters a JSON string must escape are
// written escaped (" as \", \ as \\); control characters inside classes are never produced.
#include <algorithm>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace lilac::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

Ranges minus(const Ranges& r, uint32_t lo, uint32_t hi) {
  Ranges out;
  for (auto [a, b] : r) {
    if (b < lo || a > hi) {
      out.push_back({a, b});
      continue;
    }
    if (a < lo) out.push_back({a, lo - 1});
    if (b > hi) out.push_back({hi + 1, b});
  }
  return out;
}

bool has(const Ranges& r, uint32_t c) {
  return std::any_of(r.begin(), r.end(), [&](auto x) { return x.first <= c && c <= x.second; });
}

std::string class_char(uint32_t c) {
  if (c == ']' || c == '\\' || c == '-' || c == '^' || c == '[' || c == '"')
    return std::string("\\") + char(c);
  if (c < 0x20 || c == 0x7F) return fmt::format("\\x{:02X}", c);
  if (c >= 0xD800) return c > 0xFFFF ? fmt::format("\\U{:08X}", c) : fmt::format("\\u{:04X}", c);
  return utf8_encode(c);
}

class RegexCompiler {
 public:
  RegexCompiler(const std::string& p, bool json) : p_(p), json_(json) {}

  std::string run() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    std::string e = alternation();
    if (i_ < p_.size() && p_[i_] == '$' && i_ + 1 == p_.size()) ++i_;
    if (i_ < p_.size()) error(std::string("unexpected '") + p_[i_] + "'");
    return "(" + e + ")";
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw SchemaError(fmt::format("pattern '{}': {} (at offset {})", p_, what, i_));
  }

  std::string alternation() {
    std::string e = concat();
    while (i_ < p_.size() && p_[i_] == '|') {
      ++i_;
      e += " | " + concat();
    }
    return e;
  }

  std::string concat() {
    std::string e;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$' && i_ + 1 == p_.size()) break;
      std::string a = atom();
      if (!e.empty()) e += ' ';
      e += quantified(a);
    }
    return e.empty() ? "\"\"" : e;
  }

  // The atom with its quantifier, if any.
  std::string quantified(const std::string& a) {
    if (i_ >= p_.size()) return a;
    std::string q;
    const char c = p_[i_];
    if (c == '*' || c == '+' || c == '?') {
      q = c;
      ++i_;
    } else if (c == '{' && i_ + 1 < p_.size() && std::isdigit(uint8_t(p_[i_ + 1]))) {
      const size_t close = p_.find('}', i_);
      if (close == std::string::npos) error("unterminated {m,n}");
      q = p_.substr(i_, close - i_ + 1);
      for (char d : q)
        if (!std::isdigit(uint8_t(d)) && d != ',' && d != '{' && d != '}') error("bad {m,n}");
      i_ = close + 1;
    } else {
      return a;
    }
    if (i_ < p_.size() && p_[i_] == '?') ++i_;  // lazy: the same strings
    if (i_ < p_.size() && (p_[i_] == '+' || p_[i_] == '*'))
      error("possessive or stacked quantifiers are not supported");
    return a + q;
  }

  // One character as an atom.
  std::string literal(uint32_t c) {
    if (json_) {
      if (c == '"') return "\"\\\\\\\"\"";
      if (c == '\\') return "\"\\\\\\\\\"";
      if (c == '\n') return "\"\\\\n\"";
      if (c == '\t') return "\"\\\\t\"";
      if (c == '\r') return "\"\\\\r\"";
      if (c < 0x20) return fmt::format("\"\\\\u{:04x}\"", c);
    } else if (c < 0x20) {
      error("control characters cannot appear in a tool-call string value");
    }
    return gbnf_literal(utf8_encode(c));
  }

  // A set of characters as an atom (group of alternatives when escapes are needed).
  std::string set(Ranges r) {
    r = minus(r, 0xD800, 0xDFFF);
    std::vector<std::string> alts;
    if (json_) {
      if (has(r, '"')) alts.push_back(literal('"'));
      if (has(r, '\\')) alts.push_back(literal('\\'));
      r = minus(minus(minus(r, '"', '"'), '\\', '\\'), 0, 0x1F);
    } else {
      r = minus(r, 0, 0x1F);
    }
    std::sort(r.begin(), r.end());
    if (!r.empty()) {
      std::string cls = "[";
      for (auto [lo, hi] : r)
        cls += lo == hi ? class_char(lo) : class_char(lo) + "-" + class_char(hi);
      alts.insert(alts.begin(), cls + "]");
    }
    if (alts.empty()) error("a character class that matches nothing a JSON string can hold");
    if (alts.size() == 1) return alts[0];
    std::string g = "(";
    for (size_t k = 0; k < alts.size(); ++k) g += (k ? " | " : "") + alts[k];
    return g + ")";
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k, ++i_) {
      if (i_ >= p_.size() || !std::isxdigit(uint8_t(p_[i_]))) error("bad hex escape");
      const char c = p_[i_];
      v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  uint32_t code_point() {
    const auto c = uint8_t(p_[i_]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : 3;
    uint32_t cp = n == 0 ? c : n == 1 ? c & 0x1Fu : n == 2 ? c & 0x0Fu : c & 0x07u;
    ++i_;
    for (int k = 0; k < n; ++k, ++i_) {
      if (i_ >= p_.size()) error("invalid UTF-8");
      cp = cp << 6 | (uint8_t(p_[i_]) & 0x3Fu);
    }
    return cp;
  }

  // After a backslash: a class escape (\d ...) as ranges, or one character.
  Ranges escape() {
    if (i_ >= p_.size()) error("trailing backslash");
    const char c = p_[i_++];
    const Ranges digit = {{'0', '9'}};
    const Ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd':
        return digit;
      case 'D':
        return complement(digit);
      case 'w':
        return word;
      case 'W':
        return complement(word);
      case 's':
        return space;
      case 'S':
        return complement(space);
      case 'n':
        return {{'\n', '\n'}};
      case 't':
        return {{'\t', '\t'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case 'x': {
        uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v = hex(4);
        return {{v, v}};
      }
      case 'b':
      case 'B':
        error("word boundaries (\\b, \\B) are not supported");
      default:
        if (std::isdigit(uint8_t(c))) error("backreferences are not supported");
        if (std::isalpha(uint8_t(c))) error(std::string("the escape \\") + c + " is not supported");
        return {{uint32_t(uint8_t(c)), uint32_t(uint8_t(c))}};
    }
  }

  std::string atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (i_ < p_.size() && p_[i_] == '?') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':')
          i_ += 2;
        else
          error("lookaround and named groups are not supported");
      }
      std::string e = alternation();
      if (i_ >= p_.size() || p_[i_] != ')') error("unbalanced '('");
      ++i_;
      return "(" + e + ")";
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return set(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++i_;
      Ranges r = escape();
      if (r.size() == 1 && r[0].first == r[0].second) return literal(r[0].first);
      return set(r);
    }
    if (c == '^' || c == '$') error("anchors are supported only at the start and the end");
    if (c == '*' || c == '+' || c == '?' || c == '{') error("a quantifier with nothing to repeat");
    return literal(code_point());
  }

  std::string char_class() {
    ++i_;  // [
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) error("unterminated character class");
      if (p_[i_] == ']' && !first) break;
      first = false;
      Ranges item;
      if (p_[i_] == '\\') {
        ++i_;
        item = escape();
      } else {
        const uint32_t v = code_point();
        item = {{v, v}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() &&
          p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (p_[i_] == '\\') {
          ++i_;
          Ranges h = escape();
          if (h.size() != 1 || h[0].first != h[0].second) error("bad class range");
          hi = h[0].first;
        } else {
          hi = code_point();
        }
        if (hi < item[0].first) error("class range out of order");
        item[0].second = hi;
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    ++i_;  // ]
    return set(negated ? complement(r) : r);
  }

  const std::string& p_;
  bool json_;
  size_t i_ = 0;
};

}  // namespace

std::string regex_to_gbnf(const std::string& pattern, bool json) {
  return RegexCompiler(pattern, json).run();
}

}  // namespace lilac::grammar
