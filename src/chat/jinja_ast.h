// Jinja syntax tree. One node type per family, with documented child slots, keeps the parser and
// the evaluator a pair of switch statements.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace lilac::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : uint8_t {
  Const,    // value
  Name,     // name
  ListLit,  // sub: items
  Tuple,    // sub: items
  DictLit,  // sub: k0, v0, k1, v1, ...
  Attr,     // sub[0].name
  Item,     // sub[0][sub[1]]
  Slice,    // sub[0][sub[1]:sub[2]:sub[3]], absent parts are null
  Call,     // sub[0](args)
  Filter,   // sub[0] | name(args); sub[0] is null in {% filter %} blocks (the body is the operand)
  Test,     // sub[0] is name(args)
  Not,      // not sub[0]
  Neg,      // -sub[0]
  Pos,      // +sub[0]
  Binary,   // sub[0] name sub[1]; name is one of + - * / // % ** ~
  Compare,  // sub[0] ops[0] sub[1] ops[1] sub[2] ...; ops: == != < <= > >= in notin
  And,      // sub[0] and sub[1]
  Or,       // sub[0] or sub[1]
  Cond,     // sub[0] if sub[1] else sub[2]; sub[2] may be null (undefined)
};

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  ExprKind kind = ExprKind::Const;
  int line = 0, col = 0;
  int height = 1;  // of the subtree; the parser bounds it so evaluation cannot exhaust the stack
  Value value;
  std::string name;
  std::vector<ExprPtr> sub;
  std::vector<std::string> ops;
  std::vector<Arg> args;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: `x`, `a, b` (tuple unpacking) or `ns.attr` (namespace attribute).
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // non-empty: names[0].attr
};

struct MacroDef {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
  std::vector<std::string> undefined;  // see Stmt::undefined
};

enum class StmtKind : uint8_t {
  Output,       // text
  Print,        // {{ expr }}
  If,           // branches: (cond, body)..., a final else has a null cond
  For,          // for target in expr [if cond] body [else else_body]
  Set,          // set target = expr
  SetBlock,     // set target [| filter] body endset; expr: the filter chain or null
  Macro,        // macro
  CallBlock,    // call[(macro params)] expr body endcall; macro holds the caller's params/body
  FilterBlock,  // filter chain(expr) body endfilter
  With,         // with assigns body endwith
  Break,
  Continue,
  Scope,  // a body that only groups (transformers' {% generation %})
};

struct Stmt {
  StmtKind kind = StmtKind::Output;
  int line = 0, col = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  Target target;
  Body body, else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<Target, ExprPtr>> assigns;
  std::shared_ptr<MacroDef> macro;
  bool uses_loop = true;  // For: the body mentions `loop` (else the loop object is not built)
  // Names that start undefined in the scope of `body` (For, SetBlock, FilterBlock, With) and of
  // `else_body` (For), shadowing outer values: Jinja2 decides this statically, see
  // jinja_scopes.cpp.
  std::vector<std::string> undefined, else_undefined;
};

struct Program {
  std::string name;
  Body body;
  std::vector<std::string> undefined;  // see Stmt::undefined
};

}  // namespace lilac::jinja
