#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "chat/jinja_text.h"
#include "util/error.h"

namespace lilac::jinja {

void syntax_error(const std::string& name, int line, int col, const std::string& msg) {
  fail("{}:{}:{}: syntax error: {}", name, line, col, msg);
}

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  Lexer(std::string src, const std::string& name, const LexOptions& opt)
      : src_(std::move(src)), name_(name), opt_(opt) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit_data(pos, src_.substr(pos));
        break;
      }
      char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                      ? src_[tag + 2]
                      : 0;
      size_t raw_end = kind == '%' ? match_raw_begin(tag) : 0;
      emit_data(pos,
                strip_before(src_.substr(pos, tag - pos), sign, kind != '{', line_start_at(pos)));
      size_t body = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(tag, body);
      } else if (raw_end) {
        pos = lex_raw(raw_end);
      } else {
        pos = lex_tag(tag, body, kind == '{');
      }
    }
    Token eof;
    eof.type = Tok::Eof;
    locate(src_.size(), eof);
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  std::string src_;
  const std::string& name_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  mutable size_t col_pos_ = 0;  // locate()'s last position and its column
  mutable int col_ = 1;

  // Columns count code points. Tokens are located left to right, so the count continues from the
  // previous position on the same line (a long one-line template stays linear).
  void locate(size_t pos, Token& t) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    size_t ls = *(it - 1);
    t.line = int(it - line_starts_.begin());
    if (col_pos_ < ls || col_pos_ > pos) {
      col_pos_ = ls;
      col_ = 1;
    }
    col_ += int(text::cp_length(std::string_view(src_).substr(col_pos_, pos - col_pos_)));
    col_pos_ = pos;
    t.col = col_;
  }

  [[noreturn]] void error(size_t pos, const std::string& msg) const {
    Token t;
    locate(pos, t);
    syntax_error(name_, t.line, t.col, msg);
  }

  // Jinja2 decides lstrip from whether the previous match ended with a newline (or this is the
  // start of the template), which is whether the text begins a line.
  bool line_start_at(size_t pos) const { return pos == 0 || src_[pos - 1] == '\n'; }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
    return std::string::npos;
  }

  // Whitespace control for the text before a tag; `block` is false for `{{`.
  std::string strip_before(std::string text, char sign, bool block, bool line_starting) const {
    if (sign == '-') return text::strip(text, nullptr, false, true);
    if (sign == '+' || !block || !opt_.lstrip_blocks) return text;
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if (l_pos == 0 && !line_starting) return text;
    std::string_view tail = std::string_view(text).substr(l_pos);
    if (tail.empty()) return text;
    for (size_t i = 0; i < tail.size();)
      if (!text::is_space(text::next_cp(tail, i))) return text;
    return text.substr(0, l_pos);
  }

  void emit_data(size_t pos, std::string text) {
    if (text.empty()) return;
    Token t;
    t.type = Tok::Data;
    t.text = std::move(text);
    locate(pos, t);
    out_.push_back(std::move(t));
  }

  size_t skip_ws(size_t p) const {
    while (p < src_.size()) {
      size_t q = p;
      if (!text::is_space(text::next_cp(src_, q))) break;
      p = q;
    }
    return p;
  }

  // After a tag's closing delimiter at `end`: `-` strips all following whitespace; otherwise
  // trim_blocks drops one newline (only for block and comment tags).
  size_t after_end(size_t end, char sign, bool trim) const {
    if (sign == '-') return skip_ws(end);
    if (sign != '+' && trim && opt_.trim_blocks && end < src_.size() && src_[end] == '\n')
      return end + 1;
    return end;
  }

  bool word_at(size_t p, const char* w) const {
    size_t n = std::strlen(w);
    return src_.compare(p, n, w) == 0 && (p + n >= src_.size() || !is_name_char(src_[p + n]));
  }

  // `{%[-+]? raw [-]?%}`: returns the position just past it, or 0 when the tag is not raw.
  size_t match_raw_begin(size_t tag) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_ws(p);
    if (!word_at(p, "raw")) return 0;
    p = skip_ws(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_ws(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  size_t lex_raw(size_t start) {
    for (size_t p = src_.find("{%", start); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      q = skip_ws(q);
      if (!word_at(q, "endraw")) continue;
      q = skip_ws(q + 6);
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      emit_data(start,
                strip_before(src_.substr(start, p - start), sign, true, line_start_at(start)));
      return after_end(q + 2, end_sign, true);
    }
    error(start, "missing end of raw directive");
  }

  size_t lex_comment(size_t tag, size_t body) {
    size_t e = src_.find("#}", body);
    if (e == std::string::npos) error(tag, "missing end of comment tag");
    char sign = e > body && (src_[e - 1] == '-' || src_[e - 1] == '+') ? src_[e - 1] : 0;
    return after_end(e + 2, sign, true);
  }

  size_t lex_tag(size_t tag, size_t p, bool var) {
    Token begin;
    begin.type = var ? Tok::VarBegin : Tok::BlockBegin;
    locate(tag, begin);
    out_.push_back(begin);
    std::vector<char> stack;  // expected closing brackets
    const char* close = var ? "}}" : "%}";
    while (true) {
      p = skip_ws(p);
      if (p >= src_.size())
        error(tag, var ? "unexpected end of template, expected '}}'"
                       : "unexpected end of template, expected '%}'");
      if (stack.empty()) {
        char sign = (src_[p] == '-' || (!var && src_[p] == '+')) ? src_[p] : 0;
        if (src_.compare(p + (sign ? 1 : 0), 2, close) == 0) {
          Token end;
          end.type = var ? Tok::VarEnd : Tok::BlockEnd;
          locate(p, end);
          out_.push_back(end);
          return after_end(p + (sign ? 3 : 2), sign, !var);
        }
      }
      p = lex_token(p, stack);
    }
  }

  size_t lex_token(size_t p, std::vector<char>& stack) {
    Token t;
    locate(p, t);
    char c = src_[p];
    if (is_digit(c)) return lex_number(p, t);
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      t.type = Tok::Name;
      t.text = src_.substr(p, e - p);
      out_.push_back(std::move(t));
      return e;
    }
    if (c == '\'' || c == '"') {
      size_t e = p + 1;
      while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
      if (e >= src_.size()) error(p, "unterminated string literal");
      t.type = Tok::String;
      try {
        t.text = text::unescape_literal(std::string_view(src_).substr(p + 1, e - p - 1));
      } catch (const Error& err) {
        error(p, err.what());
      }
      out_.push_back(std::move(t));
      return e + 1;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                       "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                       "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (src_.compare(p, n, op) != 0) continue;
      if (n == 1 && (c == '(' || c == '[' || c == '{')) {
        stack.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        if (stack.empty()) error(p, fmt::format("unexpected '{}'", c));
        if (stack.back() != c)
          error(p, fmt::format("unexpected '{}', expected '{}'", c, stack.back()));
        stack.pop_back();
      }
      t.type = Tok::Op;
      t.text = op;
      out_.push_back(std::move(t));
      return p + n;
    }
    size_t q = p;
    std::string ch;
    text::append_cp(ch, text::next_cp(src_, q));
    error(p, fmt::format("unexpected char '{}'", ch));
  }

  // integer := digits ('_' digits)* ; float := integer '.' integer [exp] | integer exp.
  // A number right after '.' is never a float, so `x.0.1` is x[0][1] as in Jinja2.
  size_t lex_number(size_t p, Token& t) {
    auto digits = [&](size_t q) {
      if (q >= src_.size() || !is_digit(src_[q])) return q;
      while (q < src_.size() && (is_digit(src_[q]) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1]))))
        ++q;
      return q;
    };
    size_t e = digits(p);
    bool is_float = false;
    bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t q = e + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          e = digits(q);
          is_float = true;
        }
      }
    }
    std::string num = src_.substr(p, e - p);
    num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
    if (is_float) {
      t.type = Tok::Float;
      t.fval = std::strtod(num.c_str(), nullptr);
    } else {
      t.type = Tok::Int;
      errno = 0;
      t.ival = std::strtoll(num.c_str(), nullptr, 10);
      if (errno == ERANGE) error(p, "integer literal too large");
    }
    t.text = num;
    out_.push_back(std::move(t));
    return e;
  }
};

std::string normalise_newlines(const std::string& s, bool keep_trailing_newline) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name,
                            const LexOptions& opt) {
  return Lexer(normalise_newlines(source, opt.keep_trailing_newline), name, opt).run();
}

}  // namespace lilac::jinja
