// UTF-8 handling and NFC. NFC is checked against the Unicode Consortium's NormalizationTest.txt
// (Unicode 15.0.0, from Debian's unicode-data, gzipped in tests/data/tokenizer/).
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "../test_data.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_file.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using unicode::nfc;

std::string utf8(std::u32string_view cps) {
  std::string s;
  for (char32_t c : cps) unicode::append_utf8(s, c);
  return s;
}

std::string hex_field(const std::string& field) {
  std::string out;
  std::istringstream in(field);
  std::string h;
  while (in >> h) unicode::append_utf8(out, char32_t(std::stoul(h, nullptr, 16)));
  return out;
}

TEST(TokenizerUnicode, NormalizationTestNfc) {
  std::string text =
      tok::read_file_maybe_gz(data_path("tokenizer/NormalizationTest-15.0.0.txt.gz"));
  std::istringstream in(text);
  std::string line;
  std::set<char32_t> part1;
  bool in_part1 = false;
  size_t cases = 0, failures = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '@') {
      in_part1 = line.rfind("@Part1", 0) == 0;
      continue;
    }
    std::vector<std::string> c;
    std::istringstream fields(line);
    std::string f;
    while (c.size() < 5 && std::getline(fields, f, ';')) c.push_back(hex_field(f));
    ASSERT_EQ(c.size(), 5u) << line;
    if (in_part1) {
      size_t i = 0;
      part1.insert(unicode::next_cp(c[0], i));
    }
    // NFC: c2 == toNFC(c1) == toNFC(c2) == toNFC(c3); c4 == toNFC(c4) == toNFC(c5).
    const std::pair<int, int> checks[] = {{0, 1}, {1, 1}, {2, 1}, {3, 3}, {4, 3}};
    for (auto [from, want] : checks) {
      ++cases;
      if (nfc(c[from]) != c[want] && ++failures <= 10)
        ADD_FAILURE() << "NFC of column " << from + 1 << " wrong on: " << line;
      // The quick check may only say "already NFC" of text that is.
      if (unicode::is_nfc_quick(c[from]) && c[from] != c[want] && ++failures <= 10)
        ADD_FAILURE() << "quick check accepted non-NFC column " << from + 1 << ": " << line;
    }
  }
  EXPECT_GT(cases, 90000u);
  EXPECT_EQ(failures, 0u);
  // Every code point not in part 1 is its own NFC.
  size_t others = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if ((cp >= 0xD800 && cp < 0xE000) || part1.count(cp)) continue;
    std::string s = utf8(std::u32string(1, cp));
    if (nfc(s) != s) ++others;
  }
  EXPECT_EQ(others, 0u);
}

TEST(TokenizerUnicode, NfcExamples) {
  EXPECT_EQ(nfc("cafe\xCC\x81"), "caf\xC3\xA9");                 // e + U+0301 -> é
  EXPECT_EQ(nfc("A\xCC\x8A"), "\xC3\x85");                       // A + ring -> Å
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                    // U+212B ANGSTROM SIGN
  EXPECT_EQ(nfc(utf8(U"\u1100\u1161\u11A8")), utf8(U"\uAC01"));  // Hangul L V T
  EXPECT_EQ(nfc(utf8(U"a\u0323\u0302b")), utf8(U"\u1EADb"));     // reorder, compose
  EXPECT_EQ(nfc(utf8(U"a\u0302\u0323")), utf8(U"\u1EAD"));       // marks out of order
  EXPECT_EQ(nfc(utf8(U"plain ascii")), "plain ascii");
  // A long already-NFC prefix is kept and only the tail from the last boundary is redone.
  std::string prefix(1000, 'x');
  EXPECT_EQ(nfc(prefix + "e\xCC\x81"), prefix + "\xC3\xA9");
  EXPECT_TRUE(unicode::is_nfc_quick("hello"));
  EXPECT_TRUE(unicode::is_nfc_quick("caf\xC3\xA9"));
  EXPECT_FALSE(unicode::is_nfc_quick("cafe\xCC\x81"));
}

TEST(TokenizerUnicode, Utf8Validation) {
  using unicode::first_invalid_utf8;
  constexpr size_t npos = std::string_view::npos;
  EXPECT_EQ(first_invalid_utf8("hello \xE2\x82\xAC \xF0\x9F\x98\x80"), npos);
  EXPECT_EQ(first_invalid_utf8(std::string("a\0b", 3)), npos);  // NUL is valid
  EXPECT_EQ(first_invalid_utf8("abc\x80"), 3u);                 // stray continuation
  EXPECT_EQ(first_invalid_utf8("ab\xC0\xAF"), 2u);              // overlong '/'
  EXPECT_EQ(first_invalid_utf8("x\xE0\x80\xAF"), 1u);           // overlong 3-byte
  EXPECT_EQ(first_invalid_utf8("x\xED\xA0\x80"), 1u);           // surrogate U+D800
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);        // > U+10FFFF
  EXPECT_EQ(first_invalid_utf8("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(first_invalid_utf8("12345678\xE2\x82"), 8u);  // truncated at the end
  EXPECT_EQ(first_invalid_utf8("\xFF"), 0u);
}

TEST(TokenizerUnicode, LossyAndCompletePrefix) {
  using unicode::complete_utf8_prefix;
  EXPECT_EQ(complete_utf8_prefix("ab"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);      // may still complete
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82\xAC"), 5u);  // complete
  EXPECT_EQ(complete_utf8_prefix("ab\xF0"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x41"), 4u);  // can never complete: emit as is
  EXPECT_EQ(complete_utf8_prefix("ab\xC0"), 3u);      // never a lead byte
  EXPECT_EQ(complete_utf8_prefix("ab\x80"), 3u);
  EXPECT_EQ(unicode::to_valid_utf8("a\xE2\x82"
                                   "b"),
            "a\xEF\xBF\xBD"
            "b");  // one U+FFFD per subpart
  EXPECT_EQ(unicode::to_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
}

std::vector<std::string> pieces(const tok::RegexSplitter& r, std::string_view text) {
  std::vector<std::string> out;
  r.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// \s is Unicode White_Space as in HF's regex engines: U+180E (Cf since Unicode 6.3) is not white
// space, though PCRE2's own UCP \s matches it.
TEST(TokenizerUnicode, RegexWhitespaceIsUnicodeWhiteSpace) {
  tok::RegexSplitter r(R"(\s+|\S+)");
  EXPECT_TRUE(r.jit());
  for (char32_t w : {0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2005, 0x200A,
                     0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) {
    std::string ws = utf8(std::u32string(1, w));
    EXPECT_EQ(pieces(r, "a" + ws + "b"), (std::vector<std::string>{"a", ws, "b"}))
        << std::hex << uint32_t(w);
  }
  for (char32_t nw : {0x180E, 0x200B, 0xFEFF, 0x200D}) {
    std::string s = "a" + utf8(std::u32string(1, nw)) + "b";
    EXPECT_EQ(pieces(r, s), std::vector<std::string>{s}) << std::hex << uint32_t(nw);
  }
  // In a bracket class too: [^\s...] then does take U+180E.
  tok::RegexSplitter q(tok::kQwen35Regex);
  std::string mvs = utf8(U"\u180E\u180E!");
  EXPECT_EQ(pieces(q, mvs), std::vector<std::string>{mvs});
  std::string nel = utf8(U"\u0085");
  EXPECT_EQ(pieces(q, nel + nel + "!"), (std::vector<std::string>{nel, nel, "!"}));
}

TEST(TokenizerUnicode, RegexRewriteKeepsOtherSyntax) {
  EXPECT_EQ(tok::rewrite_whitespace_classes(R"(\d\\s[\]a]\Q\s\E)"), R"(\d\\s[\]a]\Q\s\E)");
  EXPECT_NE(tok::rewrite_whitespace_classes(R"([^\s])").find("\\x{3000}"), std::string::npos);
  EXPECT_THROW(tok::rewrite_whitespace_classes(R"([\S])"), Error);
  EXPECT_THROW(tok::RegexSplitter("(unclosed"), Error);
}

// Pieces always tile the input, even on huge single-class runs (the JIT stack must not overflow).
TEST(TokenizerUnicode, RegexLongRuns) {
  tok::RegexSplitter q(tok::kQwen35Regex);
  for (std::string run : {std::string(1 << 20, ' '), std::string(1 << 20, 'a'),
                          std::string(1 << 20, '\n'), std::string(1 << 19, '!') + "\r\n"}) {
    std::string joined;
    q.split(run, [&](std::string_view p) { joined += p; });
    EXPECT_EQ(joined, run);
  }
}

}  // namespace
}  // namespace lilac::test
