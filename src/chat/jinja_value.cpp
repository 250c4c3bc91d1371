#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "chat/jinja_text.h"
#include "util/error.h"

namespace lilac::jinja {

namespace {

// Printing and comparing recurse through containers; values nest at most kMaxNesting deep, but a
// namespace can contain itself, so these walks carry their own bound.
constexpr int kMaxWalkDepth = kMaxNesting + 64;

void check_walk(int depth) {
  if (depth > kMaxWalkDepth) fail("value nested too deeply (or contains itself)");
}

int check_nesting(int depth) {
  if (depth > kMaxNesting) fail("value nested more than {} levels deep", kMaxNesting);
  return depth;
}

}  // namespace

Value::Value(std::string s)
    : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::Array;
  int depth = 0;
  for (const Value& x : items) depth = std::max(depth, x.nesting());
  v.i_ = check_nesting(depth + 1);
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Tuple;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::Map;
  int depth = 0;
  for (const auto& [k, x] : d.entries) depth = std::max(depth, x.nesting());
  d.depth = check_nesting(depth + 1);
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::object(Dict d, bool is_namespace) {
  Value v = dict(std::move(d));
  v.kind_ = is_namespace ? Kind::Namespace : Kind::Object;
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<const Function>(Function{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  struct Rec {
    static Value conv(const nlohmann::ordered_json& j, int depth) {
      if (depth > kMaxNesting) fail("JSON nested more than {} levels deep", kMaxNesting);
      switch (j.type()) {
        case nlohmann::json::value_t::null:
          return Value::none();
        case nlohmann::json::value_t::boolean:
          return Value(j.get<bool>());
        case nlohmann::json::value_t::number_integer:
          return Value(j.get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
          uint64_t u = j.get<uint64_t>();
          // Python ints are unbounded; above int64 the value is kept as the nearest double.
          return u <= uint64_t(INT64_MAX) ? Value(int64_t(u)) : Value(double(u));
        }
        case nlohmann::json::value_t::number_float:
          return Value(j.get<double>());
        case nlohmann::json::value_t::string:
          return Value(j.get_ref<const std::string&>());
        case nlohmann::json::value_t::array: {
          List items;
          items.reserve(j.size());
          for (const auto& x : j) items.push_back(conv(x, depth + 1));
          return Value::list(std::move(items));
        }
        case nlohmann::json::value_t::object: {
          Dict d;
          d.entries.reserve(j.size());
          for (auto it = j.begin(); it != j.end(); ++it)
            d.entries.emplace_back(Value(it.key()), conv(it.value(), depth + 1));
          return Value::dict(std::move(d));
        }
        default:
          return Value::none();
      }
    }
  };
  return Rec::conv(j, 1);
}

bool Value::contains_namespace(const Value& ns) const {
  if (kind_ == Kind::Namespace && dict_ == ns.dict_) return true;
  if (is_list()) {
    for (const Value& v : *list_)
      if (v.contains_namespace(ns)) return true;
  } else if (dict_) {
    for (const auto& [k, v] : dict_->entries)
      if (v.contains_namespace(ns)) return true;
  }
  return false;
}

bool Value::same_object(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::Bool:
    case Kind::Int:
      return i_ == o.i_;
    case Kind::Float:
      return d_ == o.d_;
    case Kind::String:
      return s_ == o.s_ || *s_ == *o.s_;
    case Kind::Array:
    case Kind::Tuple:
      return list_ == o.list_;
    case Kind::Function:
      return fn_ == o.fn_;
    default:
      return dict_ == o.dict_;
  }
}

int Value::nesting() const {
  switch (kind_) {
    case Kind::Array:
    case Kind::Tuple:
      return int(i_);
    case Kind::Map:
    case Kind::Object:
    case Kind::Namespace:
      return dict_->depth;
    default:
      return 0;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return d_ != 0;
    case Kind::String:
      return !s_->empty();
    case Kind::Array:
    case Kind::Tuple:
      return !list_->empty();
    case Kind::Map:
      return !dict_->entries.empty();
    default:
      return true;
  }
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Array:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Map:
      return "dict";
    case Kind::Object:
      return "LoopContext";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Function:
      return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]D[.DDD]e[+-]XX, shortest round-trip digits
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::stoi(sci.substr(e + 1));
  int decpt = exp10 + 1;  // digits d1d2... mean 0.d1d2... * 10^decpt
  std::string out = neg ? "-" : "";
  int n = int(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(size_t(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(size_t(decpt - n), '0') + ".0";
  } else {
    out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
  }
  return out;
}

namespace {

std::string repr_at(const Value& v, int depth);

std::string str_at(const Value& v, int depth) {
  check_walk(depth);
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.as_int());
    case Value::Kind::Float:
      return float_repr(v.as_double());
    case Value::Kind::String:
      return v.str();
    case Value::Kind::Array:
    case Value::Kind::Tuple: {
      bool tuple = v.kind() == Value::Kind::Tuple;
      std::string out = tuple ? "(" : "[";
      for (size_t k = 0; k < v.items().size(); ++k) {
        if (k) out += ", ";
        out += repr_at(v.items()[k], depth + 1);
      }
      if (tuple && v.items().size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Value::Kind::Map:
    case Value::Kind::Namespace: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_at(k, depth + 1) + ": " + repr_at(x, depth + 1);
      }
      out += "}";
      return v.is_dict() ? out : "<Namespace " + out + ">";
    }
    case Value::Kind::Object:
      return "<LoopContext>";
    case Value::Kind::Function:
      return "<function " + v.function().name + ">";
  }
  return "";
}

std::string repr_at(const Value& v, int depth) {
  if (v.is_string()) return text::py_repr(v.str());
  if (v.is_undefined()) return "Undefined";
  return str_at(v, depth);
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_walk(depth);
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      return a.str() == b.str();
    case K::Array:
    case K::Tuple: {
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equals_at(x[k], y[k], depth + 1)) return false;
      return true;
    }
    case K::Map: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.find(k);
        if (!w || !equals_at(v, *w, depth + 1)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

int compare_at(const Value& a, const Value& b, int depth) {
  check_walk(depth);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // byte order of UTF-8 is code point order
    return c < 0 ? -1 : c > 0;
  }
  if (a.kind() == b.kind() && a.is_list()) {
    const List &x = a.items(), &y = b.items();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equals_at(x[k], y[k], depth + 1)) return compare_at(x[k], y[k], depth + 1);
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

}  // namespace

std::string Value::to_str() const {
  return str_at(*this, 0);
}
std::string Value::repr() const {
  return repr_at(*this, 0);
}
bool equals(const Value& a, const Value& b) {
  return equals_at(a, b, 0);
}
int compare(const Value& a, const Value& b) {
  return compare_at(a, b, 0);
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value v) {
  depth = std::max(depth, check_nesting(v.nesting() + 1));
  for (auto& [k, x] : entries)
    if (equals(k, key)) {
      x = std::move(v);
      return;
    }
  entries.emplace_back(std::move(key), std::move(v));
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && ensure_ascii) {
      uint32_t cp = text::next_cp(s, i);
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                      0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

namespace {

void json_at(const Value& v, const JsonFormat& f, const std::string* ind, int level,
             std::string& out) {
  check_walk(level);
  auto newline = [&](int lvl) {
    if (!ind) return;
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *ind;
  };
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      double d = v.as_double();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                             : float_repr(d);
      return;
    }
    case Value::Kind::String:
      out += json_quote(v.str(), f.ensure_ascii);
      return;
    case Value::Kind::Array:
    case Value::Kind::Tuple: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.items().size(); ++k) {
        if (k) out += f.item_sep;
        newline(level + 1);
        json_at(v.items()[k], f, ind, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Map: {
      if (v.dict().entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, x] : v.dict().entries) {
        std::string key;
        if (k.is_string())
          key = k.str();
        else if (k.is_none())
          key = "null";
        else if (k.is_bool())
          key = k.as_bool() ? "true" : "false";
        else if (k.is_int() || k.is_float())
          key = k.is_int() ? std::to_string(k.as_int()) : float_repr(k.as_double());
        else
          fail("keys must be str, int, float, bool or None, not {}", k.type_name());
        items.emplace_back(std::move(key), &x);
      }
      if (f.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto& a, auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += f.item_sep;
        newline(level + 1);
        out += json_quote(items[k].first, f.ensure_ascii);
        out += f.key_sep;
        json_at(*items[k].second, f, ind, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& f) {
  std::string ind;
  const std::string* indp = nullptr;
  if (f.indent && !f.indent->is_none() && !f.indent->is_undefined()) {
    if (f.indent->is_string())
      ind = f.indent->str();
    else if (f.indent->is_int())
      ind = std::string(size_t(std::max<int64_t>(0, std::min<int64_t>(f.indent->as_int(), 1024))),
                        ' ');
    else
      fail("tojson: indent must be an integer or a string");
    indp = &ind;
  }
  std::string out;
  json_at(v, f, indp, 0, out);
  return out;
}

}  // namespace lilac::jinja
