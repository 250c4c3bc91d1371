// Jinja2's static scoping, which decides what a name means at the start of a scope. Jinja2
// compiles each scope (the template, a for-loop body, its else block, a macro or call body, a
// set/filter/with block) into Python code that first initialises the names the scope assigns:
//
//   - a name assigned unconditionally before any use in the scope, and not known to an enclosing
//     scope, starts *undefined*, even when the render context has it:
//       {% for i in l %}{% for j in l %}{{ n }}{% endfor %}{% set n = i %}{% endfor %}
//     prints nothing for n in every iteration;
//   - any other name (used before assigned, or assigned only inside if/else branches) starts as
//     the enclosing value, and a loop body starts afresh in every iteration.
//
// This pass reproduces jinja2/idtracking.py (Symbols.load / store / branch_update, and which
// nodes a scope's visitor enters) and records, per scope, the names that start undefined; the
// evaluator binds them to Undefined when it enters the scope. Everything else is found by the
// evaluator's ordinary lookup through the enclosing scopes.
#include <map>
#include <set>

#include "chat/jinja_parser.h"

namespace lilac::jinja {

namespace {

enum class Ref : uint8_t { Param, Resolve, Alias, Undefined };

struct Symbols {
  const Symbols* parent = nullptr;
  std::map<std::string, Ref> refs;
  std::set<std::string> stores;

  bool find_ref(const std::string& n) const {
    for (const Symbols* s = this; s; s = s->parent)
      if (s->refs.count(n)) return true;
    return false;
  }
  void load(const std::string& n) {
    if (!find_ref(n)) refs[n] = Ref::Resolve;
  }
  void store(const std::string& n) {
    stores.insert(n);
    if (refs.count(n)) return;
    refs[n] = parent && parent->find_ref(n) ? Ref::Alias : Ref::Undefined;
  }
  void param(const std::string& n) {
    stores.insert(n);
    refs[n] = Ref::Param;
  }
  // After if/elif/else: a name stored in some branch starts as the outer value.
  void branch_update(const std::vector<Symbols>& branches) {
    std::set<std::string> branch_stores;
    for (const Symbols& b : branches) branch_stores.insert(b.stores.begin(), b.stores.end());
    for (const std::string& n : stores) branch_stores.erase(n);
    for (const Symbols& b : branches) {
      for (const auto& [n, r] : b.refs) refs[n] = r;
      stores.insert(b.stores.begin(), b.stores.end());
    }
    for (const std::string& n : branch_stores)
      if (!(parent && parent->find_ref(n))) refs[n] = Ref::Resolve;
  }
  std::vector<std::string> undefined() const {
    std::vector<std::string> out;
    for (const auto& [n, r] : refs)
      if (r == Ref::Undefined) out.push_back(n);
    return out;
  }
};

void visit_expr(const Expr* e, Symbols& s) {
  if (!e) return;
  if (e->kind == ExprKind::Name) s.load(e->name);
  for (const auto& c : e->sub) visit_expr(c.get(), s);
  for (const auto& a : e->args) visit_expr(a.value.get(), s);
}

void store_target(const Target& t, Symbols& s) {
  if (!t.attr.empty()) return s.load(t.names[0]);  // {% set ns.x %} reads ns
  for (const auto& n : t.names) s.store(n);
}

std::vector<std::string> analyze_body(const Body& body, const Symbols* parent,
                                      const std::vector<std::string>& params);

// What a scope's own visitor sees of one statement; nested scopes are analysed on their own,
// with this scope as parent (after this scope is complete, as Jinja2 generates code).
void visit_stmt(const Stmt& st, Symbols& s) {
  switch (st.kind) {
    case StmtKind::Print:
      visit_expr(st.expr.get(), s);
      break;
    case StmtKind::If: {
      visit_expr(st.branches[0].first.get(), s);
      // Jinja2's If node: body, then the elif chain (each elif's test and body), then else.
      std::vector<Symbols> branches;
      Symbols body = s, elifs = s, else_ = s;
      for (const auto& x : st.branches[0].second) visit_stmt(*x, body);
      for (size_t k = 1; k < st.branches.size(); ++k) {
        const auto& [cond, stmts] = st.branches[k];
        if (!cond) {
          for (const auto& x : stmts) visit_stmt(*x, else_);
          continue;
        }
        visit_expr(cond.get(), elifs);
        Symbols inner = elifs;
        for (const auto& x : stmts) visit_stmt(*x, inner);
        elifs.branch_update({inner});
      }
      s.branch_update({body, elifs, else_});
      break;
    }
    case StmtKind::For:
      visit_expr(st.expr.get(), s);
      break;
    case StmtKind::Set:
      visit_expr(st.expr.get(), s);
      store_target(st.target, s);
      break;
    case StmtKind::SetBlock:
      store_target(st.target, s);
      break;
    case StmtKind::Macro:
      s.store(st.macro->name);
      break;
    case StmtKind::CallBlock:
      visit_expr(st.expr.get(), s);
      break;
    case StmtKind::FilterBlock:
      visit_expr(st.expr.get(), s);
      break;
    case StmtKind::With:
      for (const auto& [t, e] : st.assigns) visit_expr(e.get(), s);
      break;
    case StmtKind::Scope:
      for (const auto& x : st.body) visit_stmt(*x, s);
      break;
    default:
      break;
  }
}

// Records the nested scopes' lists, once `s` (their parent) is complete.
void analyze_nested(const Body& body, const Symbols& s) {
  for (const auto& p : body) {
    Stmt& st = *p;
    switch (st.kind) {
      case StmtKind::If:
        for (auto& [c, b] : st.branches) analyze_nested(b, s);
        break;
      case StmtKind::Scope:
        analyze_nested(st.body, s);
        break;
      case StmtKind::For:
        st.undefined = analyze_body(st.body, &s, st.target.names);
        st.else_undefined = analyze_body(st.else_body, &s, {});
        break;
      case StmtKind::SetBlock:
      case StmtKind::FilterBlock:
        st.undefined = analyze_body(st.body, &s, {});
        break;
      case StmtKind::With: {
        std::vector<std::string> names;
        for (const auto& [t, e] : st.assigns)
          names.insert(names.end(), t.names.begin(), t.names.end());
        st.undefined = analyze_body(st.body, &s, names);
        break;
      }
      case StmtKind::Macro:
      case StmtKind::CallBlock: {
        MacroDef& m = *st.macro;
        std::vector<std::string> params = {"varargs", "kwargs", "caller"};
        for (const auto& [n, d] : m.params) params.push_back(n);
        m.undefined = analyze_body(m.body, &s, params);
        break;
      }
      default:
        break;
    }
  }
}

std::vector<std::string> analyze_body(const Body& body, const Symbols* parent,
                                      const std::vector<std::string>& params) {
  Symbols s;
  s.parent = parent;
  for (const auto& p : params) s.param(p);
  s.param("loop");
  for (const auto& x : body) visit_stmt(*x, s);
  analyze_nested(body, s);
  return s.undefined();
}

}  // namespace

void analyze_scopes(Program& prog) {
  prog.undefined = analyze_body(prog.body, nullptr, {});
}

}  // namespace lilac::jinja
