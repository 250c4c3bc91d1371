// Jinja evaluator: renders a Program against a context, with Jinja2's scoping (a for loop and a
// macro call open a scope, if does not; set writes the innermost scope; macros see the scope they
// were defined in) and transformers' globals (raise_exception, strftime_now). Internal to the
// engine: filters, tests and methods (jinja_filters.cpp, jinja_methods.cpp) plug in here.
//
// Bounds (a template is code; a bad one must fail, not exhaust the stack or memory):
// kMaxEvalDepth nested evaluations (macro recursion included), kMaxIterations loop iterations per
// render, kMaxStringBytes per string and for the output, kMaxListItems per list.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "util/error.h"

namespace lilac::jinja {

inline constexpr int kMaxEvalDepth = 1500;
inline constexpr int64_t kMaxIterations = 5'000'000;
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;
inline constexpr size_t kMaxListItems = size_t(1) << 20;

// raise_exception(msg) from the template: its message is the user-facing error.
struct RaisedError : Error {
  using Error::Error;
};
// An error already prefixed with the template name and position.
struct LocatedError : Error {
  using Error::Error;
};

// Python-style argument binding for built-in filters, tests and functions:
// Params p("replace", args, {"old", "new", "count"}) accepts positional then keyword arguments
// and rejects extra or unknown ones.
class Params {
 public:
  Params(const char* fn, CallArgs& args, std::initializer_list<const char*> names);
  const Value& operator[](size_t i) const { return vals_[i]; }
  bool has(size_t i) const { return !vals_[i].is_undefined(); }
  int64_t int_or(size_t i, int64_t def) const;
  bool bool_or(size_t i, bool def) const { return has(i) ? vals_[i].truthy() : def; }
  std::string str_or(size_t i, const std::string& def) const;

 private:
  const char* fn_;
  std::vector<Value> vals_;
};

// The error for using an Undefined where a value is needed (its hint says which name).
[[noreturn]] void undefined_error(const Value& v);

class Evaluator {
 public:
  Evaluator(const Program& prog, const Value& context);
  std::string run();

  Value call(const Value& fn, CallArgs& args);
  Value filter(const std::string& name, const Value& operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  // Items a for loop (or a filter) iterates: list items, dict keys, string characters; an
  // undefined value iterates as empty.
  List iterate(const Value& v);
  void count_iterations(int64_t n);
  // Attribute / item lookup with Jinja2's rules (methods of str/list/dict come first for `.`).
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);

 private:
  // One scope: its own names (few, so a vector) and the enclosing scope.
  struct Frame;
  using FramePtr = std::shared_ptr<Frame>;
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    FramePtr parent;
    const Value* find(const std::string& n) const {
      for (const auto& [k, v] : vars)
        if (k == n) return &v;
      return nullptr;
    }
    void set(const std::string& n, Value v) {
      for (auto& [k, x] : vars)
        if (k == n) {
          x = std::move(v);
          return;
        }
      vars.emplace_back(n, std::move(v));
    }
  };
  // Bounds eval()/exec() nesting (kMaxEvalDepth).
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& depth) : d(depth) {
      if (++d > kMaxEvalDepth) fail("maximum recursion depth exceeded");
    }
    ~DepthGuard() { --d; }
  };
  enum class Flow { Normal, Break, Continue };

  const Program& prog_;
  Value context_;
  Value builtins_;
  FramePtr frame_;
  std::vector<FramePtr> macro_scopes_;  // scopes macros were defined in (see make_macro)
  std::string* out_ = nullptr;
  int depth_ = 0;
  int64_t iterations_ = 0;

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_binary(const Expr& e);
  bool eval_compare(const Expr& e);
  CallArgs eval_args(const std::vector<Arg>& args);
  Value eval_slice(const Expr& e);
  Value apply_filter_chain(const Expr& chain, const Value* block_operand);
  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_inner(const Stmt& s);
  Flow exec_for(const Stmt& s);
  // A scope below the current one, with `undefined` bound to Undefined (see jinja_scopes.cpp).
  FramePtr new_frame(const std::vector<std::string>& undefined);
  Flow exec_in(const Body& body, FramePtr frame);
  std::string capture(const Body& body, FramePtr frame);
  Value lookup(const std::string& name) const;
  void assign(const Target& t, const Value& v);
  void bind(Frame& f, const Target& t, const Value& v);
  Value make_macro(std::shared_ptr<MacroDef> m, FramePtr closure);
  Value call_macro(const MacroDef& m, const FramePtr& closure, CallArgs& args);
  void write(std::string_view s);
};

// jinja_filters.cpp, jinja_tests.cpp
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value run_filter(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);
bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);

// jinja_format.cpp
// Python's % operator on a str (also the `format` filter).
std::string percent_format(const std::string& fmt, const Value& args);
// Python's str.format.
std::string str_format(Evaluator& ev, const std::string& fmt, CallArgs& args);

// jinja_methods.cpp
// The bound method `obj.name` of a str, list or dict, or Undefined when there is none.
Value get_method(Evaluator& ev, const Value& obj, const std::string& name);
// range, namespace, dict, raise_exception, strftime_now.
Value make_builtins();
// A string result checked against kMaxStringBytes.
void check_size(size_t bytes);

}  // namespace lilac::jinja
