#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "util/error.h"

namespace lilac::tok {

const char* const kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space (PropList.txt), which is what \s means to Oniguruma and Rust regex.
constexpr const char* kWhiteSpaceItems =
    R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: match data for one pair (only the overall match is read) and a JIT
// stack larger than the 32 KB default, so that long runs of one class never overflow it.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (!data || !context || !stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string rewrite_whitespace_classes(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[++i];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : "[" + std::string(kWhiteSpaceItems) + "]";
      } else if (n == 'S') {
        if (in_class) fail("pre-tokenizer regex: \\S inside a bracket class is not supported");
        out += "[^" + std::string(kWhiteSpaceItems) + "]";
      } else if (n == 'Q') {
        // \Q...\E quotes literally: copy through untouched.
        size_t e = p.find("\\E", i + 1);
        size_t stop = e == std::string::npos ? p.size() : e + 2;
        out.append(p, i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:name:] inside a bracket class.
      size_t e = p.find(":]", i + 2);
      if (e != std::string::npos) {
        out.append(p, i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexSplitter::RegexSplitter(const std::string& pattern) {
  std::string rewritten = rewrite_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code)
    fail("pre-tokenizer regex does not compile ({} at offset {} of the rewritten pattern): {}",
         pcre2_message(err), err_off, pattern);
  code_ = code;
  // Without JIT (a platform PCRE2 lacks it for) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool RegexSplitter::next_match(std::string_view text, size_t from, size_t& start,
                               size_t& end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& ms = match_state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (;;) {
    // The text was validated once by the caller: no per-call UTF check (it would be O(n) each).
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, ms.data, ms.context)
                  : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, ms.data,
                                ms.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) fail("pre-tokenizer regex failed on the input: {}", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
    start = ov[0];
    end = ov[1];
    if (end > start) return true;
    // An empty match is no piece (HF skips them): retry one code point further on.
    if (start >= text.size()) return false;
    from = start + 1;
    while (from < text.size() && (static_cast<uint8_t>(text[from]) & 0xC0) == 0x80) ++from;
  }
}

}  // namespace lilac::tok
