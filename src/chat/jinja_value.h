// Values of the Jinja engine, with the Python semantics Jinja2 inherits: truthiness, str() and
// repr(), ==/< across int, float and bool, ordered dicts, and Jinja2's default Undefined (prints
// as "", is falsy and iterates as empty, but attribute access, calls and arithmetic on it fail).
//
// Lists and dicts are shared by reference like Python objects; templates cannot mutate them
// (transformers renders in an ImmutableSandboxedEnvironment), except namespace() objects through
// {% set ns.attr = ... %}.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lilac::jinja {

class Value;
using List = std::vector<Value>;
struct Dict;
struct CallArgs;

// A callable value: a global function, a bound method, a macro, loop.cycle.
struct Function {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

class Value {
 public:
  // Array: a Python list; Map: a dict. Object: attribute access only (the loop variable).
  // Namespace: an Object whose attributes {% set ns.x %} may assign. Tuple: an Array that prints
  // as (a, b).
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    Array,
    Tuple,
    Map,
    Object,
    Namespace,
    Function
  };

  Value() = default;  // Undefined
  Value(bool b) : kind_(Kind::Bool), i_(b) {}
  Value(int i) : kind_(Kind::Int), i_(i) {}
  Value(int64_t i) : kind_(Kind::Int), i_(i) {}
  Value(double d) : kind_(Kind::Float), d_(d) {}
  Value(std::string s);
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  static Value undefined(std::string hint = {});
  static Value none();
  static Value list(List items);
  static Value tuple(List items);
  static Value dict(Dict d);
  static Value object(Dict d, bool is_namespace);
  static Value function(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::Array || kind_ == Kind::Tuple; }
  bool is_dict() const { return kind_ == Kind::Map; }
  bool is_object() const { return kind_ == Kind::Object || kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Function; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // Int or Bool
  double as_double() const { return kind_ == Kind::Float ? d_ : double(i_); }
  const std::string& str() const { return *s_; }  // String; the hint of an Undefined
  const List& items() const { return *list_; }
  const Dict& dict() const { return *dict_; }  // Dict, Object, Namespace
  Dict& dict_mut() const { return *dict_; }
  const Function& function() const { return *fn_; }
  bool same_object(const Value& o) const;  // Python `is`
  // Whether `ns` (a Namespace) is this value or inside it (through lists, dicts and namespaces).
  // Assigning such a value to an attribute of `ns` would make a cycle of shared pointers that is
  // never freed, so the evaluator refuses it.
  bool contains_namespace(const Value& ns) const;
  // How deeply containers nest inside this value (0 for scalars). Construction fails beyond
  // kMaxNesting, so printing, comparing and destroying values never recurse without bound.
  int nesting() const;

  bool truthy() const;
  // Python str(); Undefined prints as "".
  std::string to_str() const;
  std::string repr() const;
  const char* type_name() const;  // Python's type name: str, int, dict, NoneType, ...

 private:
  Kind kind_ = Kind::Undefined;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

inline constexpr int kMaxNesting = 512;

// An insertion-ordered mapping with Python key equality (1, 1.0 and True are one key).
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;  // nesting(), kept up to date by set()
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  void set(Value key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

bool equals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0); throws lilac::Error for unorderable types ("'<' not supported").
int compare(const Value& a, const Value& b);
// repr() of a float, CPython style: shortest round-trip digits, exponent outside [1e-4, 1e16).
std::string float_repr(double d);

// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys), which transformers uses for
// its `tojson` filter. indent: nullptr for none, else an Int (spaces) or String.
struct JsonFormat {
  bool ensure_ascii = false;
  const Value* indent = nullptr;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonFormat& f);
std::string json_quote(std::string_view s, bool ensure_ascii);

}  // namespace lilac::jinja
