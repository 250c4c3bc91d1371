// Expression evaluation with Python semantics: names through the scope chain, attribute and item
// lookup as Jinja2 does it, arithmetic and comparisons, calls, filters and tests.
#include "chat/jinja_eval.h"

#include <cmath>

#include "chat/jinja_text.h"

namespace lilac::jinja {

void undefined_error(const Value& v) {
  fail("{}", v.str().empty() ? std::string("value is undefined") : v.str());
}

namespace {

// Python ints do not overflow; ours are int64 and fail loudly instead of wrapping.
int64_t add_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
int64_t sub_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
int64_t mul_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow");
  return r;
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void slice_indices(const Value& a, const Value& b, const Value& c, int64_t n, int64_t& start,
                   int64_t& stop, int64_t& step) {
  auto num = [](const Value& v, const char* what) {
    if (!v.is_int() && !v.is_bool())
      fail("slice {} must be an integer or None, not {}", what, v.type_name());
    return v.as_int();
  };
  bool has_c = !c.is_none() && !c.is_undefined();
  step = has_c ? num(c, "step") : 1;
  if (step == 0) fail("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def, const char* what) {
    if (v.is_none() || v.is_undefined()) return def;
    int64_t x = num(v, what);
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  start = clamp(a, step > 0 ? 0 : n - 1, "start");
  stop = clamp(b, step > 0 ? n : -1, "stop");
}

}  // namespace

Params::Params(const char* fn, CallArgs& args, std::initializer_list<const char*> names)
    : fn_(fn), vals_(names.size()) {
  if (args.pos.size() > names.size())
    fail("{}() takes at most {} argument(s) ({} given)", fn, names.size(), args.pos.size());
  for (size_t i = 0; i < args.pos.size(); ++i) vals_[i] = args.pos[i];
  for (auto& [k, v] : args.kw) {
    size_t i = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++i;
    }
    if (i == names.size()) fail("{}() got an unexpected keyword argument '{}'", fn, k);
    if (i < args.pos.size()) fail("{}() got multiple values for argument '{}'", fn, k);
    vals_[i] = v;
  }
}

int64_t Params::int_or(size_t i, int64_t def) const {
  if (!has(i) || vals_[i].is_none()) return def;
  if (vals_[i].is_int() || vals_[i].is_bool()) return vals_[i].as_int();
  if (vals_[i].is_float()) return int64_t(vals_[i].as_double());
  fail("{}(): expected an integer, got {}", fn_, vals_[i].type_name());
}

std::string Params::str_or(size_t i, const std::string& def) const {
  if (!has(i) || vals_[i].is_none()) return def;
  if (!vals_[i].is_string()) fail("{}(): expected a string, got {}", fn_, vals_[i].type_name());
  return vals_[i].str();
}

void check_size(size_t bytes) {
  if (bytes > kMaxStringBytes) fail("string longer than {} bytes", kMaxStringBytes);
}

Evaluator::Evaluator(const Program& prog, const Value& context)
    : prog_(prog),
      context_(context),
      builtins_(make_builtins()),
      frame_(std::make_shared<Frame>()) {}

std::string Evaluator::run() {
  std::string out;
  out_ = &out;
  for (const auto& n : prog_.undefined)
    frame_->set(n, Value::undefined("'" + n + "' is undefined"));
  try {
    exec_body(prog_.body);
  } catch (const std::bad_alloc&) {
    fail("{}: out of memory while rendering", prog_.name);
  }
  return out;
}

void Evaluator::write(std::string_view s) {
  if (out_->size() + s.size() > kMaxStringBytes)
    fail("output longer than {} bytes", kMaxStringBytes);
  out_->append(s);
}

void Evaluator::count_iterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > kMaxIterations) fail("more than {} loop iterations", kMaxIterations);
}

Value Evaluator::lookup(const std::string& name) const {
  for (const Frame* f = frame_.get(); f; f = f->parent.get())
    if (const Value* v = f->find(name)) return *v;
  if (const Value* v = context_.dict().find(name)) return *v;
  if (const Value* v = builtins_.dict().find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

// ---- expressions -------------------------------------------------------------------------------

Value Evaluator::eval(const Expr& e) {
  DepthGuard g(depth_);
  try {
    return eval_inner(e);
  } catch (const LocatedError&) {
    throw;
  } catch (const RaisedError& err) {
    throw LocatedError(fmt::format("{} (raised by {} line {})", err.what(), prog_.name, e.line));
  } catch (const Error& err) {
    throw LocatedError(fmt::format("{}:{}:{}: {}", prog_.name, e.line, e.col, err.what()));
  }
}

CallArgs Evaluator::eval_args(const std::vector<Arg>& args) {
  CallArgs out;
  for (const Arg& a : args) {
    if (a.name.empty())
      out.pos.push_back(eval(*a.value));
    else
      out.kw.emplace_back(a.name, eval(*a.value));
  }
  return out;
}

Value Evaluator::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Const:
      return e.value;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::ListLit:
    case ExprKind::Tuple: {
      List items;
      for (const auto& x : e.sub) items.push_back(eval(*x));
      return e.kind == ExprKind::ListLit ? Value::list(std::move(items))
                                         : Value::tuple(std::move(items));
    }
    case ExprKind::DictLit: {
      Dict d;
      for (size_t k = 0; k + 1 < e.sub.size(); k += 2) {
        Value key = eval(*e.sub[k]);
        if (key.is_list() || key.is_dict() || key.is_undefined())
          fail("unhashable type: '{}'", key.type_name());
        d.set(std::move(key), eval(*e.sub[k + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::Attr:
      return get_attr(eval(*e.sub[0]), e.name);
    case ExprKind::Item: {
      Value obj = eval(*e.sub[0]);
      return get_item(obj, eval(*e.sub[1]));
    }
    case ExprKind::Slice:
      return eval_slice(e);
    case ExprKind::Call: {
      Value fn = eval(*e.sub[0]);
      CallArgs args = eval_args(e.args);
      return call(fn, args);
    }
    case ExprKind::Filter:
      return apply_filter_chain(e, nullptr);
    case ExprKind::Test: {
      Value v = eval(*e.sub[0]);
      CallArgs args = eval_args(e.args);
      return Value(test(e.name, v, args));
    }
    case ExprKind::Not:
      return Value(!eval(*e.sub[0]).truthy());
    case ExprKind::Neg:
    case ExprKind::Pos: {
      Value v = eval(*e.sub[0]);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number())
        fail("bad operand type for unary {}: '{}'", e.kind == ExprKind::Neg ? '-' : '+',
             v.type_name());
      if (e.kind == ExprKind::Pos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      return Value(sub_i(0, v.as_int()));
    }
    case ExprKind::Binary:
      return eval_binary(e);
    case ExprKind::Compare:
      return Value(eval_compare(e));
    case ExprKind::And: {
      Value a = eval(*e.sub[0]);
      return a.truthy() ? eval(*e.sub[1]) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.sub[0]);
      return a.truthy() ? a : eval(*e.sub[1]);
    }
    case ExprKind::Cond:
      if (eval(*e.sub[1]).truthy()) return eval(*e.sub[0]);
      return e.sub[2] ? eval(*e.sub[2])
                      : Value::undefined(
                            "the inline if-expression evaluated to false and no else section was "
                            "defined");
  }
  return Value();
}

Value Evaluator::apply_filter_chain(const Expr& e, const Value* block_operand) {
  // A chain a|f|g nests as Filter(g, Filter(f, a)); in {% filter %} and {% set x | f %} blocks
  // the innermost operand slot is empty and the block's output stands in for it.
  Value v;
  if (!e.sub[0])
    v = *block_operand;
  else if (block_operand)
    v = apply_filter_chain(*e.sub[0], block_operand);
  else
    v = eval(*e.sub[0]);
  CallArgs args = eval_args(e.args);
  return filter(e.name, v, args);
}

Value Evaluator::eval_slice(const Expr& e) {
  Value obj = eval(*e.sub[0]);
  Value parts[3];
  for (int k = 0; k < 3; ++k)
    if (e.sub[k + 1]) parts[k] = eval(*e.sub[k + 1]);
  if (obj.is_undefined()) undefined_error(obj);
  // Jinja2 compiles a slice to a plain Python subscript, so unlike x[i] it raises on other types.
  if (obj.is_dict()) fail("unhashable type: 'slice'");
  if (!obj.is_list() && !obj.is_string()) fail("'{}' object is not subscriptable", obj.type_name());
  std::vector<size_t> off;
  int64_t n;
  if (obj.is_string()) {
    off = text::cp_offsets(obj.str());
    n = int64_t(off.size()) - 1;
  } else {
    n = int64_t(obj.items().size());
  }
  int64_t start, stop, step;
  slice_indices(parts[0], parts[1], parts[2], n, start, stop, step);
  if (obj.is_string()) {
    const std::string& s = obj.str();
    if (step == 1)
      return Value(
          s.substr(off[size_t(start)], start < stop ? off[size_t(stop)] - off[size_t(start)] : 0));
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      out.append(s, off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]);
    return Value(std::move(out));
  }
  List items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    items.push_back(obj.items()[size_t(i)]);
  return obj.kind() == Value::Kind::Tuple ? Value::tuple(std::move(items))
                                          : Value::list(std::move(items));
}

Value Evaluator::eval_binary(const Expr& e) {
  Value a = eval(*e.sub[0]);
  Value b = eval(*e.sub[1]);
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = a.to_str(), t = b.to_str();
    check_size(s.size() + t.size());
    return Value(s + t);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto bad = [&]() -> Value {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  };
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value(add_i(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && a.kind() == b.kind()) {
      if (a.items().size() + b.items().size() > kMaxListItems)
        fail("list longer than {} items", kMaxListItems);
      List items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return a.kind() == Value::Kind::Tuple ? Value::tuple(std::move(items))
                                            : Value::list(std::move(items));
    }
    return bad();
  }
  if (op == "-") {
    if (ints) return Value(sub_i(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() - b.as_double());
    return bad();
  }
  if (op == "*") {
    if (ints) return Value(mul_i(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() * b.as_double());
    const Value& seq = a.is_number() ? b : a;
    const Value& cnt = a.is_number() ? a : b;
    if (cnt.is_float() || !cnt.is_number() || !(seq.is_string() || seq.is_list())) return bad();
    int64_t n = std::max<int64_t>(0, cnt.as_int());
    if (seq.is_string()) {
      if (n > 0 && seq.str().size() > kMaxStringBytes / size_t(n)) check_size(kMaxStringBytes + 1);
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.str();
      return Value(std::move(out));
    }
    if (n > 0 && seq.items().size() > kMaxListItems / size_t(n))
      fail("list longer than {} items", kMaxListItems);
    List items;
    for (int64_t k = 0; k < n; ++k)
      items.insert(items.end(), seq.items().begin(), seq.items().end());
    return seq.kind() == Value::Kind::Tuple ? Value::tuple(std::move(items))
                                            : Value::list(std::move(items));
  }
  if (op == "/") {
    if (!nums) return bad();
    if (b.as_double() == 0) fail("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
    if (!nums) return bad();
    if (b.as_double() == 0) fail("integer division or modulo by zero");
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) fail("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    double x = a.as_double(), y = b.as_double();
    if (op == "//") return Value(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (op == "**") {
    if (!nums) return bad();
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), acc = 1;
      while (exp > 0) {
        if (exp & 1) acc = mul_i(acc, base);
        exp >>= 1;
        if (exp) base = mul_i(base, base);
      }
      return Value(acc);
    }
    if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  fail("unknown operator {}", op);
}

static bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!item.is_string())
        fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::Array:
    case Value::Kind::Tuple:
      for (const Value& x : container.items())
        if (equals(x, item)) return true;
      return false;
    case Value::Kind::Map:
      return container.dict().find(item) != nullptr;
    case Value::Kind::Undefined:
      return false;
    default:
      fail("argument of type '{}' is not iterable", container.type_name());
  }
}

bool Evaluator::eval_compare(const Expr& e) {
  Value left = eval(*e.sub[0]);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.sub[k + 1]);
    const std::string& op = e.ops[k];
    bool ok;
    if (op == "==")
      ok = equals(left, right);
    else if (op == "!=")
      ok = !equals(left, right);
    else if (op == "in")
      ok = contains(right, left);
    else if (op == "notin")
      ok = !contains(right, left);
    else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      int c = compare(left, right);
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return false;
    left = std::move(right);
  }
  return true;
}

Value Evaluator::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_string() || obj.is_list() || obj.is_dict()) {
    Value m = get_method(*this, obj, name);
    if (!m.is_undefined()) return m;
  }
  if (obj.is_dict() || obj.is_object()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  }
  return Value::undefined(
      fmt::format("'{}' has no attribute '{}'",
                  obj.is_none() ? "None" : std::string(obj.type_name()) + " object", name));
}

Value Evaluator::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = int64_t(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[size_t(i)];
    } else {
      std::vector<size_t> off = text::cp_offsets(obj.str());
      int64_t n = int64_t(off.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n)
        return Value(obj.str().substr(off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]));
    }
    return Value::undefined(
        fmt::format("'{} object' has no element {}", obj.type_name(), key.as_int()));
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(key)) return *v;
  }
  if (key.is_string()) {
    if (obj.is_object()) {
      if (const Value* v = obj.dict().find(key.str())) return *v;
    } else if (obj.is_string() || obj.is_list() || obj.is_dict()) {
      Value m = get_method(*this, obj, key.str());
      if (!m.is_undefined()) return m;
    }
  }
  return Value::undefined(
      fmt::format("'{}' has no attribute {}",
                  obj.is_none() ? "None" : std::string(obj.type_name()) + " object", key.repr()));
}

Value Evaluator::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) undefined_error(fn);
  if (!fn.is_callable()) fail("'{}' object is not callable", fn.type_name());
  return fn.function().fn(args);
}

Value Evaluator::filter(const std::string& name, const Value& operand, CallArgs& args) {
  if (!has_filter(name)) fail("no filter named '{}'", name);
  return run_filter(*this, name, operand, args);
}

bool Evaluator::test(const std::string& name, const Value& operand, CallArgs& args) {
  if (!has_test(name)) fail("no test named '{}'", name);
  return run_test(*this, name, operand, args);
}

List Evaluator::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::Array:
    case Value::Kind::Tuple:
      return v.items();
    case Value::Kind::Map: {
      List keys;
      for (const auto& [k, x] : v.dict().entries) keys.push_back(k);
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t j = i;
        text::next_cp(s, j);
        chars.emplace_back(s.substr(i, j - i));
        i = j;
      }
      return chars;
    }
    default:
      fail("'{}' object is not iterable", v.type_name());
  }
}

}  // namespace lilac::jinja
