#include "chat/jinja_parser.h"

#include <fmt/format.h>
#include <algorithm>

#include "util/error.h"

namespace lilac::jinja {

namespace {

// Nesting of expressions and blocks; deeper templates are rejected rather than risking the stack
// (the parser, evaluator and destructors all recurse over the tree). kMaxExprHeight also bounds
// long left-associative chains such as 1+1+...+1, which parse iteratively but nest.
constexpr int kMaxParseDepth = 200;
constexpr int kMaxExprHeight = 400;

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const std::string& name) : t_(toks), name_(name) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->name = name_;
    prog->body = subparse({}, nullptr);
    return prog;
  }

 private:
  const std::vector<Token>& t_;
  const std::string& name_;
  size_t p_ = 0;
  int depth_ = 0;
  std::vector<int> loop_depth_{0};  // for-loops open in the current macro (or top level)
  std::vector<MacroDef*> macros_;
  int loop_refs_ = 0;  // how many times the name `loop` has been parsed

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseDepth) p.error(p.cur(), "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& advance() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }

  [[noreturn]] void error(const Token& t, const std::string& msg) const {
    syntax_error(name_, t.line, t.col, msg);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof:
        return "end of template";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::BlockEnd:
        return "'%}'";
      case Tok::VarBegin:
        return "'{{'";
      case Tok::BlockBegin:
        return "'{%'";
      case Tok::String:
        return "string";
      case Tok::Data:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* w) const { return cur().type == Tok::Name && cur().text == w; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* w) {
    if (!is_name(w)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name)
      error(cur(), fmt::format("expected a name, got {}", describe(cur())));
    return advance().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd)
      error(cur(), fmt::format("expected end of statement '%}}', got {}", describe(cur())));
    advance();
  }

  ExprPtr node(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  ExprPtr finish(ExprPtr e) {
    int h = 0;
    for (const auto& c : e->sub)
      if (c) h = std::max(h, c->height);
    for (const auto& a : e->args) h = std::max(h, a.value->height);
    e->height = h + 1;
    if (e->height > kMaxExprHeight) error(t_[p_], "expression nested too deeply");
    return e;
  }

  // ---- statements ----------------------------------------------------------------------------

  static std::string expected(std::initializer_list<const char*> ends) {
    std::string want;
    for (const char* e : ends) {
      if (!want.empty()) want.append(" or ");
      want.append(1, '\'').append(e).append(1, '\'');
    }
    return want;
  }

  // Parses until `{% <one of ends> ...`; consumes `{%` and the end word, stores it in *found.
  Body subparse(std::initializer_list<const char*> ends, std::string* found,
                const Token* opener = nullptr) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() == 0) return body;
        error(opener ? *opener : t,
              fmt::format("unexpected end of template: this block needs {}", expected(ends)));
      }
      if (t.type == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == Tok::VarBegin) {
        advance();
        auto s = stmt_at(StmtKind::Print, t);
        s->expr = parse_tuple(true, {}, false);
        if (cur().type != Tok::VarEnd)
          error(cur(),
                fmt::format("expected end of print statement '}}}}', got {}", describe(cur())));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& word = peek();
        if (word.type == Tok::Name &&
            std::any_of(ends.begin(), ends.end(), [&](const char* e) { return word.text == e; })) {
          advance();
          advance();
          if (found) *found = word.text;
          return body;
        }
        if (word.type == Tok::Name &&
            (word.text.rfind("end", 0) == 0 || word.text == "elif" || word.text == "else")) {
          if (ends.size() == 0)
            error(word, fmt::format("unexpected '{}' (no open block it closes)", word.text));
          error(word, fmt::format("unexpected '{}': the block opened at line {} needs {}",
                                  word.text, opener ? opener->line : word.line, expected(ends)));
        }
        advance();
        body.push_back(parse_statement(t));
      } else {
        error(t, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  StmtPtr stmt_at(StmtKind k, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  StmtPtr parse_statement(const Token& open) {
    const Token& word = cur();
    if (word.type != Tok::Name)
      error(word, fmt::format("expected a tag name, got {}", describe(word)));
    std::string w = advance().text;
    if (w == "if") return parse_if(open);
    if (w == "for") return parse_for(open);
    if (w == "set") return parse_set(open);
    if (w == "macro") return parse_macro(open);
    if (w == "call") return parse_call_block(open);
    if (w == "filter") return parse_filter_block(open);
    if (w == "with") return parse_with(open);
    if (w == "generation") {
      auto s = stmt_at(StmtKind::Scope, open);
      expect_block_end();
      s->body = subparse({"endgeneration"}, nullptr, &open);
      expect_block_end();
      return s;
    }
    if (w == "break" || w == "continue") {
      if (loop_depth_.back() == 0) error(word, fmt::format("'{}' outside of a loop", w));
      auto s = stmt_at(w == "break" ? StmtKind::Break : StmtKind::Continue, open);
      expect_block_end();
      return s;
    }
    static const char* const kUnsupported[] = {"include", "import", "from",      "extends",
                                               "block",   "do",     "autoescape"};
    for (const char* u : kUnsupported)
      if (w == u) error(word, fmt::format("tag '{}' is not supported in chat templates", w));
    if (w.rfind("end", 0) == 0 || w == "elif" || w == "else")
      error(word, fmt::format("unexpected '{}' (no open block it closes)", w));
    error(word, fmt::format("unknown tag '{}'", w));
  }

  StmtPtr parse_if(const Token& open) {
    auto s = stmt_at(StmtKind::If, open);
    ExprPtr cond = parse_tuple(false, {}, false);
    while (true) {
      expect_block_end();
      std::string found;
      Body body = subparse({"elif", "else", "endif"}, &found, &open);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (found == "elif") {
        cond = parse_tuple(false, {}, false);
      } else if (found == "else") {
        expect_block_end();
        s->branches.emplace_back(nullptr, subparse({"endif"}, nullptr, &open));
        break;
      } else {
        break;
      }
    }
    expect_block_end();
    return s;
  }

  Target parse_target(bool with_namespace) {
    Target tg;
    const Token& first = cur();
    if (with_namespace && first.type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      tg.names.push_back(advance().text);
      advance();
      tg.attr = expect_name();
      return tg;
    }
    bool paren = skip_op("(");
    while (true) {
      tg.names.push_back(expect_name());
      if (!skip_op(",")) break;
      tg.tuple = true;
      if (cur().type != Tok::Name) break;  // trailing comma
    }
    if (paren) {
      expect_op(")");
      tg.tuple = true;
    }
    for (const auto& n : tg.names)
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        error(first, fmt::format("cannot assign to '{}'", n));
    return tg;
  }

  StmtPtr parse_for(const Token& open) {
    auto s = stmt_at(StmtKind::For, open);
    s->target = parse_target(false);
    if (!skip_name("in")) error(cur(), fmt::format("expected 'in', got {}", describe(cur())));
    s->expr = parse_tuple(false, {"recursive", "if"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) error(cur(), "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_.back();
    int refs_before = loop_refs_;
    std::string found;
    s->body = subparse({"endfor", "else"}, &found, &open);
    --loop_depth_.back();
    s->uses_loop = loop_refs_ != refs_before;
    if (found == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"}, nullptr, &open);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(const Token& open) {
    Target tg = parse_target(true);
    if (skip_op("=")) {
      auto s = stmt_at(StmtKind::Set, open);
      s->target = std::move(tg);
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    auto s = stmt_at(StmtKind::SetBlock, open);
    if (tg.tuple) error(open, "a block set cannot unpack into several names");
    s->target = std::move(tg);
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    expect_block_end();
    s->body = subparse({"endset"}, nullptr, &open);
    expect_block_end();
    return s;
  }

  void parse_params(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string pname = expect_name();
      ExprPtr def;
      if (skip_op("="))
        def = parse_expression(true);
      else if (!m.params.empty() && m.params.back().second)
        error(cur(), "non-default argument follows default argument");
      m.params.emplace_back(std::move(pname), std::move(def));
    }
    advance();
  }

  Body parse_macro_body(MacroDef& m, const Token& open, const char* end) {
    macros_.push_back(&m);
    loop_depth_.push_back(0);
    Body b = subparse({end}, nullptr, &open);
    loop_depth_.pop_back();
    macros_.pop_back();
    return b;
  }

  StmtPtr parse_macro(const Token& open) {
    auto s = stmt_at(StmtKind::Macro, open);
    s->macro = std::make_shared<MacroDef>();
    s->macro->name = expect_name();
    parse_params(*s->macro);
    expect_block_end();
    s->macro->body = parse_macro_body(*s->macro, open, "endmacro");
    if (cur().type == Tok::Name) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(const Token& open) {
    auto s = stmt_at(StmtKind::CallBlock, open);
    s->macro = std::make_shared<MacroDef>();
    s->macro->name = "caller";
    if (is_op("(")) parse_params(*s->macro);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) error(open, "expected a call expression after 'call'");
    expect_block_end();
    s->macro->body = parse_macro_body(*s->macro, open, "endcall");
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(const Token& open) {
    auto s = stmt_at(StmtKind::FilterBlock, open);
    s->expr = parse_filter(nullptr, true);
    expect_block_end();
    s->body = subparse({"endfilter"}, nullptr, &open);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(const Token& open) {
    auto s = stmt_at(StmtKind::With, open);
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target tg = parse_target(false);
      expect_op("=");
      s->assigns.emplace_back(std::move(tg), parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"}, nullptr, &open);
    expect_block_end();
    return s;
  }

  // ---- expressions ---------------------------------------------------------------------------

  bool tuple_end(const std::vector<const char*>& extra_end, bool explicit_parens) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::Eof) return true;
    if (explicit_parens && t.type == Tok::Op && t.text == ")") return true;
    if (t.type == Tok::Name)
      for (const char* e : extra_end)
        if (t.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<const char*>& extra_end,
                      bool explicit_parens) {
    const Token& start = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end, explicit_parens)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens)
        error(cur(), fmt::format("expected an expression, got {}", describe(cur())));
    }
    auto e = node(ExprKind::Tuple, start);
    e->sub = std::move(items);
    return finish(std::move(e));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& at = advance();
      auto c = node(ExprKind::Cond, at);
      c->sub.push_back(std::move(e));
      c->sub.push_back(parse_or());
      c->sub.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      e = finish(std::move(c));
    }
    return e;
  }

  ExprPtr binary(ExprKind k, ExprPtr l, ExprPtr r, const Token& at, std::string op = {}) {
    auto e = node(k, at);
    e->name = std::move(op);
    e->sub.push_back(std::move(l));
    e->sub.push_back(std::move(r));
    return finish(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& at = advance();
      e = binary(ExprKind::Or, std::move(e), parse_and(), at);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& at = advance();
      e = binary(ExprKind::And, std::move(e), parse_not(), at);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      const Token& at = advance();
      auto e = node(ExprKind::Not, at);
      e->sub.push_back(parse_not());
      return finish(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& start = cur();
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                t.text == "<=" || t.text == ">" || t.text == ">=")) {
        ops.push_back(advance().text);
      } else if (is_name("in")) {
        advance();
        ops.push_back("in");
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        advance();
        advance();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = node(ExprKind::Compare, start);
    e->sub.push_back(std::move(first));
    for (auto& r : rest) e->sub.push_back(std::move(r));
    e->ops = std::move(ops);
    return finish(std::move(e));
  }

  template <typename Next>
  ExprPtr left_assoc(std::initializer_list<const char*> ops, Next next) {
    ExprPtr e = (this->*next)();
    while (cur().type == Tok::Op &&
           std::any_of(ops.begin(), ops.end(), [&](const char* o) { return cur().text == o; })) {
      const Token& at = advance();
      e = binary(ExprKind::Binary, std::move(e), (this->*next)(), at, at.text);
    }
    return e;
  }

  ExprPtr parse_math1() { return left_assoc({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return left_assoc({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return left_assoc({"**"}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    const Token& t = cur();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      advance();
      e = node(t.text == "-" ? ExprKind::Neg : ExprKind::Pos, t);
      e->sub.push_back(parse_unary(false));
      e = finish(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::Name: {
        advance();
        auto e = node(ExprKind::Const, t);
        if (t.text == "true" || t.text == "True")
          e->value = Value(true);
        else if (t.text == "false" || t.text == "False")
          e->value = Value(false);
        else if (t.text == "none" || t.text == "None")
          e->value = Value::none();
        else {
          e->kind = ExprKind::Name;
          e->name = t.text;
          if (t.text == "loop") ++loop_refs_;
          for (MacroDef* m : macros_) {
            if (t.text == "varargs") m->uses_varargs = true;
            if (t.text == "kwargs") m->uses_kwargs = true;
            if (t.text == "caller") m->uses_caller = true;
          }
        }
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) s += advance().text;  // adjacent literals concatenate
        auto e = node(ExprKind::Const, t);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::Int:
      case Tok::Float: {
        advance();
        auto e = node(ExprKind::Const, t);
        e->value = t.type == Tok::Int ? Value(t.ival) : Value(t.fval);
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[" || t.text == "{") {
          bool is_dict = t.text == "{";
          const char* close = is_dict ? "}" : "]";
          advance();
          auto e = node(is_dict ? ExprKind::DictLit : ExprKind::ListLit, t);
          while (!is_op(close)) {
            if (!e->sub.empty()) expect_op(",");
            if (is_op(close)) break;
            e->sub.push_back(parse_expression(true));
            if (is_dict) {
              expect_op(":");
              e->sub.push_back(parse_expression(true));
            }
          }
          advance();
          return finish(std::move(e));
        }
        break;
      default:
        break;
    }
    error(t, fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& t = cur();
      if (is_op(".")) {
        advance();
        const Token& a = cur();
        if (a.type == Tok::Name) {
          auto n = node(ExprKind::Attr, a);
          n->name = advance().text;
          n->sub.push_back(std::move(e));
          e = finish(std::move(n));
        } else if (a.type == Tok::Int) {
          auto key = node(ExprKind::Const, a);
          key->value = Value(advance().ival);
          e = binary(ExprKind::Item, std::move(e), std::move(key), a);
        } else {
          error(a, fmt::format("expected an attribute name after '.', got {}", describe(a)));
        }
      } else if (is_op("[")) {
        advance();
        e = parse_subscript(std::move(e), t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, const Token& at) {
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]")) parts[1] = parse_expression(true);
      if (skip_op(":") && !is_op("]")) parts[2] = parse_expression(true);
    }
    if (is_op(",")) error(cur(), "multiple subscripts are not supported");
    expect_op("]");
    if (!slice) return binary(ExprKind::Item, std::move(obj), std::move(parts[0]), at);
    auto e = node(ExprKind::Slice, at);
    e->sub.push_back(std::move(obj));
    for (auto& p : parts) e->sub.push_back(std::move(p));
    return finish(std::move(e));
  }

  std::vector<Arg> parse_args() {
    expect_op("(");
    std::vector<Arg> args;
    bool seen_kw = false;
    while (!is_op(")")) {
      if (!args.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error(cur(), "*args and **kwargs in calls are not supported");
      Arg a;
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        a.name = advance().text;
        advance();
        seen_kw = true;
      } else if (seen_kw) {
        error(cur(), "positional argument follows keyword argument");
      }
      a.value = parse_expression(true);
      args.push_back(std::move(a));
    }
    advance();
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur());
    e->args = parse_args();
    e->sub.push_back(std::move(callee));
    return finish(std::move(e));
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      advance();
      n.append(1, '.').append(expect_name());  // (not += "." + ...: GCC 12 -Wrestrict bug)
    }
    return n;
  }

  ExprPtr parse_filter(ExprPtr e, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) advance();
      start_inline = false;
      const Token& at = cur();
      auto f = node(ExprKind::Filter, at);
      f->name = dotted_name();
      if (is_op("(")) f->args = parse_args();
      f->sub.push_back(std::move(e));
      e = finish(std::move(f));
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    const Token& at = advance();  // 'is'
    bool negated = skip_name("not");
    auto t = node(ExprKind::Test, at);
    t->name = dotted_name();
    const Token& c = cur();
    if (is_op("(")) {
      t->args = parse_args();
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int ||
                c.type == Tok::Float ||
                (c.type == Tok::Op && (c.text == "(" || c.text == "[" || c.text == "{"))) &&
               !(c.type == Tok::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (is_name("is")) error(c, "you cannot chain multiple tests with 'is'");
      Arg a;
      a.value = parse_postfix(parse_primary());
      t->args.push_back(std::move(a));
    }
    t->sub.push_back(std::move(e));
    t = finish(std::move(t));
    if (!negated) return t;
    auto n = node(ExprKind::Not, at);
    n->sub.push_back(std::move(t));
    return finish(std::move(n));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|"))
        e = parse_filter(std::move(e), false);
      else if (is_name("is"))
        e = parse_test(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }
};

}  // namespace

std::unique_ptr<Program> parse(const std::vector<Token>& tokens, const std::string& name) {
  std::unique_ptr<Program> prog = Parser(tokens, name).run();
  analyze_scopes(*prog);
  return prog;
}

}  // namespace lilac::jinja
