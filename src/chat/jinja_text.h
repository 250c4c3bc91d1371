// Python str semantics over UTF-8 std::string, for the Jinja engine: templates index, slice,
// strip, split and case-map strings by code point exactly as CPython does, because the chat
// templates they render were written and tested against Python. Invalid UTF-8 bytes are treated
// as one code point each (U+FFFD for classification), so nothing here throws on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lilac::jinja::text {

// Decodes the code point at s[i], advancing i past it.
uint32_t next_cp(std::string_view s, size_t& i);
void append_cp(std::string& out, uint32_t cp);
size_t cp_length(std::string_view s);
// Byte offset of every code point start, plus s.size() at the end (size cp_length(s) + 1).
std::vector<size_t> cp_offsets(std::string_view s);
// Code point index of byte offset `byte` (which must be a code point boundary).
size_t cp_index(std::string_view s, size_t byte);

bool is_space(uint32_t cp);      // str.isspace
bool is_linebreak(uint32_t cp);  // a str.splitlines boundary (\r\n counts once)
bool is_printable(uint32_t cp);  // str.isprintable, close enough for repr (see .cpp)
bool is_word_char(uint32_t cp);  // regex \w (str mode)

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize
std::string py_title(std::string_view s);    // str.title
bool is_lower(std::string_view s);           // str.islower
bool is_upper(std::string_view s);           // str.isupper

// strip family; chars == nullptr strips whitespace (str.strip()), else any of chars' code points.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split / str.rsplit; sep == nullptr splits on whitespace runs and drops empty parts.
// maxsplit < 0: no limit. Throws lilac::Error on an empty separator (ValueError in Python).
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
int64_t count(std::string_view s, std::string_view sub);  // non-overlapping, in code points sense
// str.find / str.rfind: code point index or -1.
int64_t find(std::string_view s, std::string_view sub, bool reverse);
std::string center(std::string_view s, int64_t width, std::string_view fill = " ");

// repr() of a str: quotes chosen as CPython does, non-printables escaped.
std::string py_repr(std::string_view s);
// A Jinja string literal's body decoded the way Jinja does (Python "unicode-escape").
std::string unescape_literal(std::string_view body);

}  // namespace lilac::jinja::text
