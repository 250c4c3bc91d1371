// GBNF text -> Grammar (grammar.h): a recursive-descent parser that lowers as it goes.
#include "grammar/grammar.h"

#include <algorithm>
#include <map>

#include "util/error.h"
#include "util/utf8.h"

namespace lilac::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int32_t kMaxRepeat = 100000;
constexpr int64_t kMaxElements = 2000000;

using Element = Grammar::Element;
using Kind = Grammar::Kind;
using Sequence = std::vector<Element>;

// Sorted, merged ranges with the surrogates D800-DFFF cut out.
std::vector<std::pair<uint32_t, uint32_t>> normalise(std::vector<std::pair<uint32_t, uint32_t>> r) {
  std::vector<std::pair<uint32_t, uint32_t>> cut;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    hi = std::min(hi, kMaxCodePoint);
    if (lo < 0xD800 && hi >= 0xD800) {
      cut.push_back({lo, 0xD7FF});
      lo = 0xD800;
    }
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (lo <= hi) cut.push_back({lo, hi});
  }
  std::sort(cut.begin(), cut.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto x : cut) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Grammar run() {
    skip(true);
    while (i_ < s_.size()) {
      const size_t at = i_;
      std::string name = name_token();
      if (name.empty()) error(at, "expected a rule name");
      skip(false);
      if (s_.substr(i_, 3) != "::=") error(i_, "expected '::=' after the rule name '" + name + "'");
      i_ += 3;
      const int32_t r = rule_id(name);
      if (defined_[size_t(r)]) error(at, "rule '" + name + "' is defined twice");
      defined_[size_t(r)] = true;
      alts_[size_t(r)] = alternatives();
      skip(true);
      if (i_ < s_.size() && s_[i_] == ')') error(i_, "unbalanced ')'");
    }
    for (size_t r = 0; r < defined_.size(); ++r)
      if (!defined_[r]) fail("grammar: rule '{}' is used but never defined", g_.rule_names[r]);
    auto root = by_name_.find("root");
    if (root == by_name_.end()) fail("grammar: there is no 'root' rule");
    g_.root = root->second;
    check_left_recursion();
    for (const auto& alts : alts_) {
      std::vector<int32_t> starts;
      for (const auto& seq : alts) {
        starts.push_back(int32_t(g_.elements.size()));
        g_.elements.insert(g_.elements.end(), seq.begin(), seq.end());
        g_.elements.push_back({Kind::End, 0});
      }
      g_.rules.push_back(std::move(starts));
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("grammar: {} (line {}, column {})", what, line, col);
  }

  // Spaces and comments; newlines too when `newlines`.
  void skip(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }
  std::string name_token() {
    const size_t b = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }

  int32_t rule_id(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    const int32_t r = new_rule(name);
    by_name_[name] = r;
    defined_[size_t(r)] = false;
    return r;
  }
  int32_t new_rule(const std::string& name) {
    g_.rule_names.push_back(name);
    alts_.emplace_back();
    defined_.push_back(true);
    return int32_t(alts_.size() - 1);
  }
  int32_t helper_rule(std::vector<Sequence> alts) {
    std::string name = std::to_string(alts_.size());
    name.insert(name.begin(), '_');
    const int32_t r = new_rule(name);
    alts_[size_t(r)] = std::move(alts);
    return r;
  }

  // One UTF-8 code point of the grammar text.
  uint32_t text_code_point() {
    const auto c = uint8_t(s_[i_]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i_ + size_t(n) >= s_.size() + (n == 0 ? 1 : 0)) error(i_, "invalid UTF-8");
    uint32_t cp = n == 0 ? c : n == 1 ? c & 0x1Fu : n == 2 ? c & 0x0Fu : c & 0x07u;
    for (int k = 1; k <= n; ++k) {
      const auto d = uint8_t(s_[i_ + size_t(k)]);
      if ((d & 0xC0) != 0x80) error(i_, "invalid UTF-8");
      cp = cp << 6 | (d & 0x3Fu);
    }
    i_ += size_t(n) + 1;
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      if (i_ >= s_.size() || !std::isxdigit(uint8_t(s_[i_]))) error(i_, "expected a hex digit");
      const char c = s_[i_];
      v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      error(i_, "escape is not a Unicode scalar value");
    return v;
  }

  // A character of a literal or class, escapes resolved.
  uint32_t literal_char() {
    if (i_ >= s_.size()) error(i_, "unexpected end of the grammar");
    if (s_[i_] != '\\') return text_code_point();
    if (++i_ >= s_.size()) error(i_, "unexpected end after '\\'");
    const char c = s_[i_++];
    switch (c) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
        return uint32_t(uint8_t(c));
      default:
        error(i_ - 1, std::string("unknown escape '\\") + c + "'");
    }
  }

  int32_t byte_set(const std::array<uint64_t, 4>& set) {
    auto it = set_index_.find(set);
    if (it != set_index_.end()) return it->second;
    g_.byte_sets.push_back(set);
    return set_index_[set] = int32_t(g_.byte_sets.size() - 1);
  }
  Element single_byte(uint8_t b) {
    std::array<uint64_t, 4> set{};
    set[b >> 6] |= uint64_t(1) << (b & 63);
    return {Kind::Bytes, byte_set(set)};
  }

  // A class item: its class index, and the element that matches one character of it.
  int32_t add_class(CodePointClass c) {
    g_.classes.push_back(std::move(c));
    return int32_t(g_.classes.size() - 1);
  }
  Element one_of_class(int32_t cls) {
    const CodePointClass& c = g_.classes[size_t(cls)];
    if (!c.ranges.empty() && c.ranges.back().second < 0x80) {
      std::array<uint64_t, 4> set{};
      for (auto [lo, hi] : c.ranges)
        for (uint32_t b = lo; b <= hi; ++b) set[b >> 6] |= uint64_t(1) << (b & 63);
      return {Kind::Bytes, byte_set(set)};
    }
    return run(cls, 1, 1);
  }
  Element run(int32_t cls, int32_t min, int32_t max) {
    g_.runs.push_back({cls, min, max});
    return {Kind::Run, int32_t(g_.runs.size() - 1)};
  }

  int32_t char_class() {
    ++i_;  // [
    bool negated = false;
    if (i_ < s_.size() && s_[i_] == '^') {
      negated = true;
      ++i_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> r;
    while (true) {
      if (i_ >= s_.size()) error(i_, "unterminated character class");
      if (s_[i_] == ']') break;
      const uint32_t lo = literal_char();
      uint32_t hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        hi = literal_char();
        if (hi < lo) error(i_, "class range out of order");
      }
      r.push_back({lo, hi});
    }
    ++i_;  // ]
    r = normalise(std::move(r));
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> c;
      uint32_t next = 0;
      for (auto [lo, hi] : r) {
        if (lo > next) c.push_back({next, lo - 1});
        next = hi + 1;
      }
      if (next <= kMaxCodePoint) c.push_back({next, kMaxCodePoint});
      r = normalise(std::move(c));
    }
    if (r.empty()) error(i_, "the character class is empty");
    return add_class(CodePointClass{std::move(r)});
  }

  // {m}, {m,}, {m,n}: returns (min, max).
  std::pair<int32_t, int32_t> bounds() {
    ++i_;  // {
    auto number = [&] {
      skip(false);
      const size_t b = i_;
      int64_t v = 0;
      while (i_ < s_.size() && std::isdigit(uint8_t(s_[i_]))) {
        v = v * 10 + (s_[i_++] - '0');
        if (v > kMaxRepeat) error(b, "repetition bound too large");
      }
      if (i_ == b) error(i_, "expected a number in {}");
      skip(false);
      return int32_t(v);
    };
    const int32_t m = number();
    int32_t n = m;
    if (i_ < s_.size() && s_[i_] == ',') {
      ++i_;
      skip(false);
      n = (i_ < s_.size() && s_[i_] == '}') ? Grammar::kUnbounded : number();
    }
    if (i_ >= s_.size() || s_[i_] != '}') error(i_, "expected '}'");
    ++i_;
    if (n < m) error(i_, "repetition {m,n} with n < m");
    return {m, n};
  }

  Sequence repeat(const Sequence& x, int32_t min, int32_t max) {
    // Nested bounded repetitions multiply: keep the compiled grammar to a sane size.
    const int64_t copies = int64_t(min) + (max == Grammar::kUnbounded ? 1 : int64_t(max) - min);
    size_ += copies * int64_t(x.size() + 1);
    if (size_ > kMaxElements)
      error(i_, "the grammar is too large (repetitions expand to over 2M elements)");
    Sequence out;
    for (int32_t k = 0; k < min; ++k) out.insert(out.end(), x.begin(), x.end());
    if (max == Grammar::kUnbounded) {
      const int32_t r = helper_rule({});
      Sequence loop = x;
      loop.push_back({Kind::Ref, r});
      alts_[size_t(r)] = {loop, {}};
      out.push_back({Kind::Ref, r});
    } else if (max > min) {
      int32_t inner = -1;
      for (int32_t k = max - min; k >= 1; --k) {
        Sequence seq = x;
        if (inner >= 0) seq.push_back({Kind::Ref, inner});
        inner = helper_rule({seq, {}});
      }
      out.push_back({Kind::Ref, inner});
    }
    return out;
  }

  Sequence item() {
    const size_t at = i_;
    Sequence seq;
    int32_t cls = -1;
    const char c = s_[i_];
    if (c == '"') {
      ++i_;
      while (true) {
        if (i_ >= s_.size()) error(at, "unterminated literal");
        if (s_[i_] == '"') break;
        for (char b : utf8_encode(literal_char())) seq.push_back(single_byte(uint8_t(b)));
      }
      ++i_;
    } else if (c == '[') {
      cls = char_class();
    } else if (c == '.') {
      ++i_;
      cls = add_class(CodePointClass{normalise({{0, kMaxCodePoint}})});
    } else if (c == '(') {
      ++i_;
      auto alts = alternatives();
      skip(true);
      if (i_ >= s_.size() || s_[i_] != ')') error(at, "unbalanced '('");
      ++i_;
      if (alts.size() == 1)
        seq = std::move(alts[0]);
      else
        seq.push_back({Kind::Ref, helper_rule(std::move(alts))});
    } else if (name_char(c)) {
      seq.push_back({Kind::Ref, rule_id(name_token())});
    } else {
      error(at, std::string("unexpected character '") + c + "'");
    }
    // Postfix operators.
    if (i_ < s_.size() && (s_[i_] == '*' || s_[i_] == '+' || s_[i_] == '?' || s_[i_] == '{')) {
      int32_t min = 0, max = Grammar::kUnbounded;
      if (s_[i_] == '{') {
        std::tie(min, max) = bounds();
      } else {
        min = s_[i_] == '+' ? 1 : 0;
        max = s_[i_] == '?' ? 1 : Grammar::kUnbounded;
        ++i_;
      }
      if (cls >= 0) return {run(cls, min, max)};
      return repeat(seq, min, max);
    }
    if (cls >= 0) return {one_of_class(cls)};
    return seq;
  }

  Sequence sequence() {
    Sequence seq;
    while (true) {
      skip(true);
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')') break;
      if (name_char(s_[i_])) {  // the start of the next rule ends this one
        const size_t save = i_;
        name_token();
        skip(false);
        const bool next_rule = s_.substr(i_, 3) == "::=";
        i_ = save;
        if (next_rule) break;
      }
      Sequence x = item();
      seq.insert(seq.end(), x.begin(), x.end());
    }
    return seq;
  }

  std::vector<Sequence> alternatives() {
    std::vector<Sequence> alts{sequence()};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    return alts;
  }

  void check_left_recursion() {
    const size_t n = alts_.size();
    std::vector<bool> nullable(n, false);
    auto elem_nullable = [&](const Element& e) {
      if (e.kind == Kind::Ref) return bool(nullable[size_t(e.arg)]);
      if (e.kind == Kind::Run) return g_.runs[size_t(e.arg)].min == 0;
      return false;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& seq : alts_[r])
          if (std::all_of(seq.begin(), seq.end(), elem_nullable)) {
            nullable[r] = changed = true;
            break;
          }
      }
    }
    // Rules reachable at the left edge of each rule: a cycle is left recursion (the matcher's
    // expansion would not terminate).
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (const auto& seq : alts_[r])
        for (const auto& e : seq) {
          if (e.kind == Kind::Ref) left[r].push_back(e.arg);
          if (!elem_nullable(e)) break;
        }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<size_t, size_t>> stack;
    for (size_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      stack.push_back({start, 0});
      color[start] = 1;
      while (!stack.empty()) {
        auto& [r, k] = stack.back();
        if (k == left[r].size()) {
          color[r] = 2;
          stack.pop_back();
          continue;
        }
        const auto next = size_t(left[r][k++]);
        if (color[next] == 1)
          fail("grammar: rule '{}' is left-recursive (it can reach itself without consuming input)",
               g_.rule_names[next]);
        if (color[next] == 0) {
          color[next] = 1;
          stack.push_back({next, 0});
        }
      }
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  int64_t size_ = 0;  // elements created by repetitions
  Grammar g_;
  std::vector<std::vector<Sequence>> alts_;
  std::vector<bool> defined_;
  std::map<std::string, int32_t> by_name_;
  std::map<std::array<uint64_t, 4>, int32_t> set_index_;
};

}  // namespace

bool CodePointClass::contains(uint32_t cp) const {
  return intersects(cp, cp);
}

bool CodePointClass::intersects(uint32_t lo, uint32_t hi) const {
  // The first range ending at or after lo.
  auto it = std::lower_bound(
      ranges.begin(), ranges.end(), lo,
      [](const std::pair<uint32_t, uint32_t>& r, uint32_t v) { return r.second < v; });
  return it != ranges.end() && it->first <= hi;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  append_utf8(s, char32_t(cp));
  return s;
}

std::string gbnf_literal(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out = "\"";
  for (char ch : s) {
    const auto c = uint8_t(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

Grammar parse_gbnf(std::string_view text) {
  return Parser(text).run();
}

}  // namespace lilac::grammar
