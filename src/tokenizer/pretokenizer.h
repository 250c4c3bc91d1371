// The Split pre-tokenizer (behaviour Isolated): a PCRE2 regex (UTF + UCP, JIT-compiled) cuts the
// text into pieces; matches and the gaps between them are both pieces, in order.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lilac::tok {

// The Qwen3.5/3.6 pre-tokenizer regex (docs/model.md section 6).
extern const char* const kQwen35Regex;
// GPT-2's, for a bare ByteLevel pre-tokenizer with use_regex = true.
extern const char* const kGpt2Regex;

// HF tokenizers' regexes (Oniguruma, Rust regex) take \s as the Unicode White_Space set. PCRE2's
// UCP \s (10.42) also matches U+180E MONGOLIAN VOWEL SEPARATOR (white space before Unicode 6.3),
// so \s and \S are rewritten to an explicit class of the 25 White_Space code points, inside and
// outside bracket classes. Throws lilac::Error on a \S
// inside a bracket class (not expressible; no known tokenizer uses it).
std::string rewrite_whitespace_classes(const std::string& pattern);

class RegexSplitter {
 public:
  explicit RegexSplitter(const std::string& pattern);  // throws lilac::Error on a bad pattern
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls fn(piece) for every piece of `text` (valid UTF-8), in order; the pieces concatenate to
  // `text`. Safe to call from several threads at once.
  template <typename F>
  void split(std::string_view text, F&& fn) const {
    size_t pos = 0, start, end;
    while (pos < text.size() && next_match(text, pos, start, end)) {
      if (start > pos) fn(text.substr(pos, start - pos));
      fn(text.substr(start, end - start));
      pos = end;
    }
    if (pos < text.size()) fn(text.substr(pos));
  }

  bool jit() const { return jit_; }

 private:
  // The first non-empty match at or after `from`: [start, end). False when there is none.
  bool next_match(std::string_view text, size_t from, size_t& start, size_t& end) const;

  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

}  // namespace lilac::tok
