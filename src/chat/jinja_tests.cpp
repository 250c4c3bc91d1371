// Jinja2's built-in tests (`x is defined`, `x is divisibleby 3`, ...), following jinja2/tests.py:
// note that, as there, Undefined is iterable and a sequence, and bool is a number.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace lilac::jinja {

namespace {

using TestFn = bool (*)(Evaluator&, const Value&, CallArgs&);

const Value& one_arg(const char* name, CallArgs& a) {
  if (a.pos.size() != 1 || !a.kw.empty()) fail("test '{}' takes exactly one argument", name);
  return a.pos[0];
}
void no_args(const char* name, CallArgs& a) {
  if (!a.pos.empty() || !a.kw.empty()) fail("test '{}' takes no arguments", name);
}

#define LILAC_TEST0(fn, name, expr)                  \
  bool fn(Evaluator&, const Value& v, CallArgs& a) { \
    no_args(name, a);                                \
    return (expr);                                   \
  }
LILAC_TEST0(t_defined, "defined", !v.is_undefined())
LILAC_TEST0(t_undefined, "undefined", v.is_undefined())
LILAC_TEST0(t_none, "none", v.is_none())
LILAC_TEST0(t_string, "string", v.is_string())
LILAC_TEST0(t_number, "number", v.is_number())
LILAC_TEST0(t_integer, "integer", v.is_int())
LILAC_TEST0(t_float, "float", v.is_float())
LILAC_TEST0(t_mapping, "mapping", v.is_dict())
LILAC_TEST0(t_boolean, "boolean", v.is_bool())
LILAC_TEST0(t_true, "true", v.is_bool() && v.as_bool())
LILAC_TEST0(t_false, "false", v.is_bool() && !v.as_bool())
LILAC_TEST0(t_callable, "callable", v.is_callable())
LILAC_TEST0(t_escaped, "escaped", ((void)v, false))
// Jinja2's Undefined defines __iter__, __len__ and __getitem__, so it is iterable and a sequence.
LILAC_TEST0(t_iterable, "iterable", v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())
LILAC_TEST0(t_sequence, "sequence", v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())
LILAC_TEST0(t_lower, "lower", text::is_lower(v.to_str()))
LILAC_TEST0(t_upper, "upper", text::is_upper(v.to_str()))
#undef LILAC_TEST0

int64_t int_operand(const Value& v, const char* test) {
  if (!v.is_number()) fail("test '{}' needs a number, got {}", test, v.type_name());
  if (v.is_float()) {
    double d = v.as_double();
    if (d != std::floor(d)) return 1;  // not an integer: neither even nor divisible
    return int64_t(std::fmod(d, 4.0e18));
  }
  return v.as_int();
}
bool t_even(Evaluator&, const Value& v, CallArgs& a) {
  no_args("even", a);
  return int_operand(v, "even") % 2 == 0;
}
bool t_odd(Evaluator&, const Value& v, CallArgs& a) {
  no_args("odd", a);
  return int_operand(v, "odd") % 2 != 0;
}
bool t_divisibleby(Evaluator&, const Value& v, CallArgs& a) {
  const Value& n = one_arg("divisibleby", a);
  int64_t d = int_operand(n, "divisibleby");
  if (d == 0) fail("integer division or modulo by zero");
  return int_operand(v, "divisibleby") % d == 0;
}
bool t_eq(Evaluator&, const Value& v, CallArgs& a) {
  return equals(v, one_arg("eq", a));
}
bool t_ne(Evaluator&, const Value& v, CallArgs& a) {
  return !equals(v, one_arg("ne", a));
}
bool t_lt(Evaluator&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("lt", a)) < 0;
}
bool t_le(Evaluator&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("le", a)) <= 0;
}
bool t_gt(Evaluator&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("gt", a)) > 0;
}
bool t_ge(Evaluator&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("ge", a)) >= 0;
}
bool t_sameas(Evaluator&, const Value& v, CallArgs& a) {
  return v.same_object(one_arg("sameas", a));
}
bool t_in(Evaluator&, const Value& v, CallArgs& a) {
  const Value& seq = one_arg("in", a);
  if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
  if (seq.is_dict()) return seq.dict().find(v) != nullptr;
  if (seq.is_list())
    return std::any_of(seq.items().begin(), seq.items().end(),
                       [&](const Value& x) { return equals(x, v); });
  if (seq.is_undefined()) return false;
  fail("argument of type '{}' is not iterable", seq.type_name());
}
bool t_filter(Evaluator&, const Value& v, CallArgs& a) {
  no_args("filter", a);
  return v.is_string() && has_filter(v.str());
}
bool t_test(Evaluator&, const Value& v, CallArgs& a) {
  no_args("test", a);
  return v.is_string() && has_test(v.str());
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> m = {
      {"boolean", t_boolean}, {"callable", t_callable},
      {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq},           {"equalto", t_eq},
      {"==", t_eq},           {"escaped", t_escaped},
      {"even", t_even},       {"false", t_false},
      {"filter", t_filter},   {"float", t_float},
      {"ge", t_ge},           {">=", t_ge},
      {"gt", t_gt},           {">", t_gt},
      {"greaterthan", t_gt},  {"in", t_in},
      {"integer", t_integer}, {"iterable", t_iterable},
      {"le", t_le},           {"<=", t_le},
      {"lessthan", t_lt},     {"lower", t_lower},
      {"lt", t_lt},           {"<", t_lt},
      {"mapping", t_mapping}, {"ne", t_ne},
      {"!=", t_ne},           {"none", t_none},
      {"number", t_number},   {"odd", t_odd},
      {"sameas", t_sameas},   {"sequence", t_sequence},
      {"string", t_string},   {"test", t_test},
      {"true", t_true},       {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return m;
}

}  // namespace

bool has_test(const std::string& name) {
  return tests().count(name) != 0;
}

bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  return tests().at(name)(ev, v, args);
}

}  // namespace lilac::jinja
