// A context-free grammar over bytes, compiled from a GBNF-like text (the syntax of llama.cpp's
// GBNF; docs/structured-output.md).
//
// Text syntax:
//   name ::= alternatives          rule names: [a-zA-Z0-9_-]+; the start rule is `root`
//   alternatives := seq ("|" seq)*  seq := item*   (an empty seq matches the empty string)
//   item := "literal" | [class] | [^class] | . | name | ( alternatives ), each optionally followed
//           by * + ? {m} {m,} {m,n}
//   escapes in literals and classes: \n \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH
//   # comments run to the end of the line
// Classes and literals are over Unicode code points (UTF-8 in the output; surrogates are never
// produced).
//
// Compiled form: rules of alternatives, each alternative a sequence of elements in one flat array
// ending with End. Literals become single-byte sets; a class that is all ASCII becomes one byte
// set, any other class a rule of UTF-8 byte sequences. A repeated class ([a-z]{0,8}, [^"]*, .+)
// becomes one Run element (a counted run of code points, cheap for the token mask); other
// repetitions become rules (x* -> R ::= x R | empty). Left recursion is rejected.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lilac::grammar {

// A set of code points: sorted, disjoint, non-adjacent closed ranges without surrogates.
struct CodePointClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool contains(uint32_t cp) const;
  // Whether some code point in [lo, hi] is in the class.
  bool intersects(uint32_t lo, uint32_t hi) const;
};

struct Grammar {
  enum class Kind : uint8_t { Bytes, Ref, Run, End };
  struct Element {
    Kind kind = Kind::End;
    int32_t arg = 0;  // Bytes: set index; Ref: rule index; Run: run index
  };
  struct Run {
    int32_t cls = 0;  // index into classes
    int32_t min = 0;
    int32_t max = 0;  // kUnbounded: no limit
  };
  static constexpr int32_t kUnbounded = std::numeric_limits<int32_t>::max();

  std::vector<Element> elements;
  std::vector<std::array<uint64_t, 4>> byte_sets;
  std::vector<CodePointClass> classes;
  std::vector<Run> runs;
  std::vector<std::vector<int32_t>> rules;  // per rule: where each alternative starts in elements
  std::vector<std::string> rule_names;
  int32_t root = -1;

  bool byte_in(int32_t set, uint8_t b) const {
    return (byte_sets[size_t(set)][b >> 6] >> (b & 63)) & 1u;
  }
};

// Compiles GBNF text; throws lilac::Error naming the line and column of a syntax error, an
// undefined rule, a missing `root`, or left recursion.
Grammar parse_gbnf(std::string_view text);

// Escapes a string as a GBNF literal, quotes included.
std::string gbnf_literal(std::string_view s);

// UTF-8 encoding of one code point (cp <= 0x10FFFF, not a surrogate).
std::string utf8_encode(uint32_t cp);

}  // namespace lilac::grammar
