// Jinja parser: tokens -> Program. Statements: if/elif/else, for (with `if` filter, else, tuple
// targets), set (plain, block, namespace attribute), macro, call, filter, with, break, continue,
// generation. Expressions follow Jinja2's precedence, loosest first:
//
//   expr    := or ('if' or ('else' expr)?)*
//   or      := and ('or' and)*            and := not ('and' not)*
//   not     := 'not' not | compare        compare := math1 (('=='|'!='|'<'|...|'in'|'not in')
//   math1)* math1   := concat (('+'|'-') concat)* concat := math2 ('~' math2)* math2   := pow
//   (('*'|'/'|'//'|'%') pow)* pow := unary ('**' unary)* unary   := ('-'|'+') unary-without-filters
//   | primary postfix* (('|' filter) | ('is' test) | call)* postfix := '.' name | '.' integer | '['
//   subscript ']' | '(' args ')'
//
// so `-x|abs` is `(-x)|abs` and `a + b is string` tests only b, as in Jinja2.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace lilac::jinja {

// Throws lilac::Error "NAME:LINE:COL: syntax error: ..." on a malformed template.
// The result has its scopes analysed (analyze_scopes).
std::unique_ptr<Program> parse(const std::vector<Token>& tokens, const std::string& name);

// jinja_scopes.cpp: fills the `undefined` lists of the program, its blocks and macros.
void analyze_scopes(Program& prog);

}  // namespace lilac::jinja
