// Jinja lexer: template source -> a flat token stream, as Jinja2's own lexer produces it.
//
//   template := (DATA | '{{' expr-tokens '}}' | '{%' expr-tokens '%}' | '{#' ... '#}' | raw)*
//
// Whitespace control is applied here, with Jinja2's exact rules (transformers renders chat
// templates with trim_blocks=True and lstrip_blocks=True):
//   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag; `-%}` / `-}}` / `-#}` after it.
//   - trim_blocks: the first newline after `%}` or `#}` is dropped (`+%}` keeps it). `{% raw %}`
//     itself does not trim (a Jinja2 quirk); `{% endraw %}` does.
//   - lstrip_blocks: spaces/tabs between the start of a line and `{%` / `{#` are dropped
//     (`{%+` keeps them); the text counts as a line start after a newline or at the start.
//   - line endings are normalised to \n and one trailing newline of the source is dropped.
// Inside a tag, `}}` / `%}` only end it when brackets are balanced, so `{{ {'a': {}} }}` works.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lilac::jinja {

enum class Tok : uint8_t {
  Data,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  Eof
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // Data text, name, decoded string literal, operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1, col = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws lilac::Error "NAME:LINE:COL: syntax error: ..." on malformed input.
std::vector<Token> tokenize(const std::string& source, const std::string& name,
                            const LexOptions& opt);

[[noreturn]] void syntax_error(const std::string& name, int line, int col, const std::string& msg);

}  // namespace lilac::jinja
