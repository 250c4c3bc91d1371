// Statement execution: output, control flow, scopes (see jinja_scopes.cpp for which names a new
// scope starts with), assignments, macros and call blocks.
#include "chat/jinja_eval.h"

namespace lilac::jinja {

Evaluator::Flow Evaluator::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s) {
  DepthGuard g(depth_);
  try {
    return exec_inner(s);
  } catch (const LocatedError&) {
    throw;
  } catch (const RaisedError& err) {
    throw LocatedError(fmt::format("{} (raised by {} line {})", err.what(), prog_.name, s.line));
  } catch (const Error& err) {
    throw LocatedError(fmt::format("{}:{}:{}: {}", prog_.name, s.line, s.col, err.what()));
  }
}

std::string Evaluator::capture(const Body& body, FramePtr frame) {
  std::string buf;
  std::string* saved_out = out_;
  FramePtr saved_frame = frame_;
  out_ = &buf;
  frame_ = std::move(frame);
  struct Restore {
    Evaluator& ev;
    std::string* out;
    FramePtr frame;
    ~Restore() {
      ev.out_ = out;
      ev.frame_ = std::move(frame);
    }
  } restore{*this, saved_out, saved_frame};
  exec_body(body);
  return buf;
}

void Evaluator::bind(Frame& f, const Target& t, const Value& v) {
  if (!t.tuple) {
    f.set(t.names[0], v);
    return;
  }
  List items = iterate(v);
  if (items.size() != t.names.size())
    fail("cannot unpack {} value(s) into {} name(s)", items.size(), t.names.size());
  for (size_t k = 0; k < items.size(); ++k) f.set(t.names[k], items[k]);
}

void Evaluator::assign(const Target& t, const Value& v) {
  if (t.attr.empty()) return bind(*frame_, t, v);
  Value ns = lookup(t.names[0]);
  if (ns.kind() != Value::Kind::Namespace)
    fail("cannot assign attribute on non-namespace object '{}'", t.names[0]);
  // Values are immutable but for namespace attributes, so this is the one way to make a cycle.
  if (v.contains_namespace(ns))
    fail("cannot assign '{}.{}': the value contains the namespace itself", t.names[0], t.attr);
  ns.dict_mut().set(Value(t.attr), v);
}

Evaluator::Flow Evaluator::exec_inner(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::Output:
      write(s.text);
      return Flow::Normal;
    case StmtKind::Print:
      write(eval(*s.expr).to_str());
      return Flow::Normal;
    case StmtKind::If:
      for (const auto& [cond, body] : s.branches)
        if (!cond || eval(*cond).truthy()) return exec_body(body);
      return Flow::Normal;
    case StmtKind::For:
      return exec_for(s);
    case StmtKind::Set:
      assign(s.target, eval(*s.expr));
      return Flow::Normal;
    case StmtKind::SetBlock: {
      Value v(capture(s.body, new_frame(s.undefined)));
      assign(s.target, s.expr ? apply_filter_chain(*s.expr, &v) : v);
      return Flow::Normal;
    }
    case StmtKind::Macro:
      frame_->set(s.macro->name, make_macro(s.macro, frame_));
      return Flow::Normal;
    case StmtKind::CallBlock: {
      const Expr& call_expr = *s.expr;
      Value fn = eval(*call_expr.sub[0]);
      CallArgs args = eval_args(call_expr.args);
      args.kw.emplace_back("caller", make_macro(s.macro, frame_));
      write(call(fn, args).to_str());
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      Value v(capture(s.body, new_frame(s.undefined)));
      write(apply_filter_chain(*s.expr, &v).to_str());
      return Flow::Normal;
    }
    case StmtKind::With: {
      FramePtr f = new_frame(s.undefined);
      for (const auto& [t, e] : s.assigns) bind(*f, t, eval(*e));
      write(capture(s.body, f));
      return Flow::Normal;
    }
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
    case StmtKind::Scope:
      return exec_body(s.body);
  }
  return Flow::Normal;
}

Evaluator::FramePtr Evaluator::new_frame(const std::vector<std::string>& undefined) {
  auto f = std::make_shared<Frame>();
  f->parent = frame_;
  for (const auto& n : undefined) f->set(n, Value::undefined("'" + n + "' is undefined"));
  return f;
}

Evaluator::Flow Evaluator::exec_in(const Body& body, FramePtr frame) {
  FramePtr saved = frame_;
  frame_ = std::move(frame);
  struct Restore {
    FramePtr& slot;
    FramePtr saved;
    ~Restore() { slot = std::move(saved); }
  } restore{frame_, saved};
  return exec_body(body);
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s) {
  List items = iterate(eval(*s.expr));
  if (s.cond) {
    auto f = std::make_shared<Frame>();
    f->parent = frame_;
    // The loop's `if` filter sees the loop variable but not `loop`.
    FramePtr saved = frame_;
    frame_ = f;
    List kept;
    try {
      for (Value& x : items) {
        count_iterations(1);
        bind(*f, s.target, x);
        if (eval(*s.cond).truthy()) kept.push_back(std::move(x));
      }
    } catch (...) {
      frame_ = saved;
      throw;
    }
    frame_ = saved;
    items = std::move(kept);
  }
  // The else block and every iteration run in a fresh scope (Jinja2 re-initialises the body's
  // names each iteration; assignments in the body never outlive it).
  if (items.empty()) return exec_in(s.else_body, new_frame(s.else_undefined));
  const int64_t n = int64_t(items.size());
  // loop.cycle / loop.changed are made once per loop; cycle reads the current index.
  auto index = std::make_shared<int64_t>(0);
  auto last_changed = std::make_shared<Value>();
  Value cycle, changed;
  if (s.uses_loop) {
    cycle = Value::function("loop.cycle", [index](CallArgs& a) {
      if (a.pos.empty()) fail("no items for cycling given");
      return a.pos[size_t(*index) % a.pos.size()];
    });
    changed = Value::function("loop.changed", [last_changed](CallArgs& a) {
      Value cur = Value::list(a.pos);
      if (!last_changed->is_undefined() && equals(*last_changed, cur)) return Value(false);
      *last_changed = cur;
      return Value(true);
    });
  }
  for (int64_t i = 0; i < n; ++i) {
    count_iterations(1);
    FramePtr f = new_frame(s.undefined);
    bind(*f, s.target, items[size_t(i)]);
    if (!s.uses_loop) {
      if (exec_in(s.body, f) == Flow::Break) break;
      continue;
    }
    *index = i;
    Dict loop;
    auto add = [&](const char* k, Value v) { loop.entries.emplace_back(Value(k), std::move(v)); };
    add("index", Value(i + 1));
    add("index0", Value(i));
    add("revindex", Value(n - i));
    add("revindex0", Value(n - i - 1));
    add("first", Value(i == 0));
    add("last", Value(i == n - 1));
    add("length", Value(n));
    add("depth", Value(1));
    add("depth0", Value(0));
    if (i > 0) add("previtem", items[size_t(i - 1)]);
    if (i + 1 < n) add("nextitem", items[size_t(i + 1)]);
    add("cycle", cycle);
    add("changed", changed);
    f->set("loop", Value::object(std::move(loop), false));
    if (exec_in(s.body, f) == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Evaluator::make_macro(std::shared_ptr<MacroDef> m, FramePtr closure) {
  // The macro value is stored in the scope it closes over; a strong reference would make a cycle
  // (a leak per render), so it holds a weak one and the evaluator keeps defining scopes alive
  // until the render ends. A macro value cannot outlive its render.
  if (macro_scopes_.empty() || macro_scopes_.back() != closure) macro_scopes_.push_back(closure);
  std::weak_ptr<Frame> scope = closure;
  return Value::function(m->name, [this, m, scope](CallArgs& args) {
    FramePtr closure_frame = scope.lock();
    if (!closure_frame) fail("macro '{}' called after its render ended", m->name);
    return call_macro(*m, closure_frame, args);
  });
}

Value Evaluator::call_macro(const MacroDef& m, const FramePtr& closure, CallArgs& args) {
  auto f = std::make_shared<Frame>();
  f->parent = closure;
  for (const auto& n : m.undefined) f->set(n, Value::undefined("'" + n + "' is undefined"));
  std::vector<bool> bound(m.params.size(), false);
  List varargs;
  Dict kwargs;
  for (size_t i = 0; i < args.pos.size(); ++i) {
    if (i < m.params.size()) {
      f->set(m.params[i].first, args.pos[i]);
      bound[i] = true;
    } else if (m.uses_varargs) {
      varargs.push_back(args.pos[i]);
    } else {
      fail("macro '{}' takes not more than {} argument(s)", m.name, m.params.size());
    }
  }
  Value caller;
  for (auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < m.params.size() && m.params[i].first != k) ++i;
    if (i < m.params.size()) {
      if (bound[i]) fail("macro '{}' got multiple values for argument '{}'", m.name, k);
      f->set(k, v);
      bound[i] = true;
    } else if (k == "caller" && m.uses_caller) {
      caller = v;
    } else if (m.uses_kwargs) {
      kwargs.set(Value(k), v);
    } else {
      fail("macro '{}' takes no keyword argument '{}'", m.name, k);
    }
  }
  FramePtr saved = frame_;
  frame_ = f;
  try {
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      f->set(m.params[i].first, m.params[i].second
                                    ? eval(*m.params[i].second)
                                    : Value::undefined(fmt::format(
                                          "parameter '{}' was not provided", m.params[i].first)));
    }
  } catch (...) {
    frame_ = saved;
    throw;
  }
  frame_ = saved;
  f->set("varargs", Value::tuple(std::move(varargs)));
  f->set("kwargs", Value::dict(std::move(kwargs)));
  if (!caller.is_undefined()) f->set("caller", caller);
  return Value(capture(m.body, f));
}

}  // namespace lilac::jinja
