// Python methods of str, list and dict as Jinja templates call them (`content.startswith(...)`,
// `message.get('x')`, `'{}'.format(x)`), and the template globals: Jinja2's range, namespace,
// dict and joiner, plus raise_exception and strftime_now, which transformers adds.
// Methods that mutate are refused, as transformers' ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <ctime>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace lilac::jinja {

namespace {

// The sandbox blocks ranges longer than this (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

std::string need_str(const Value& v, const char* fn) {
  if (!v.is_string()) fail("{}() argument must be str, not {}", fn, v.type_name());
  return v.str();
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  auto one = [&](const Value& x) {
    std::string a = need_str(x, fn);
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0
                                           : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (affix.kind() == Value::Kind::Tuple || affix.is_list())
    return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

bool all_cps(const std::string& s, bool (*pred)(uint32_t)) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!pred(text::next_cp(s, i))) return false;
  return true;
}

Value str_method(Evaluator& ev, const std::string& s, const std::string& name, CallArgs& a) {
  auto opt_str = [&](const Params& p, size_t i, std::string& holder) -> const std::string* {
    if (!p.has(i) || p[i].is_none()) return nullptr;
    holder = need_str(p[i], name.c_str());
    return &holder;
  };
  std::string h;
  if (name == "startswith" || name == "endswith") {
    Params p(name.c_str(), a, {"prefix", "start", "end"});
    std::string sub = s;
    if (p.has(1) || p.has(2)) {
      std::vector<size_t> off = text::cp_offsets(s);
      int64_t n = int64_t(off.size()) - 1, b = p.int_or(1, 0), e = p.int_or(2, n);
      if (b < 0) b = std::max<int64_t>(0, b + n);
      if (e < 0) e = std::max<int64_t>(0, e + n);
      b = std::min(b, n);
      e = std::min(e, n);
      sub = b <= e ? s.substr(off[size_t(b)], off[size_t(e)] - off[size_t(b)]) : "";
    }
    return Value(affix_match(sub, p[0], name == "startswith", name.c_str()));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(name.c_str(), a, {"chars"});
    return Value(text::strip(s, opt_str(p, 0, h), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Params p(name.c_str(), a, {"sep", "maxsplit"});
    std::vector<std::string> parts = name == "split"
                                         ? text::split(s, opt_str(p, 0, h), p.int_or(1, -1))
                                         : text::rsplit(s, opt_str(p, 0, h), p.int_or(1, -1));
    List out(parts.begin(), parts.end());
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    Params p("splitlines", a, {"keepends"});
    std::vector<std::string> parts = text::splitlines(s, p.bool_or(0, false));
    return Value::list(List(parts.begin(), parts.end()));
  }
  if (name == "replace") {
    Params p("replace", a, {"old", "new", "count"});
    std::string old = need_str(p[0], "replace"), repl = need_str(p[1], "replace");
    int64_t count = p.int_or(2, -1);
    int64_t hits = old.empty() ? int64_t(text::cp_length(s)) + 1 : text::count(s, old);
    if (count >= 0) hits = std::min(hits, count);
    if (repl.size() > old.size()) check_size(s.size() + size_t(hits) * (repl.size() - old.size()));
    return Value(text::replace(s, old, repl, count));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "casefold") {
    Params(name.c_str(), a, {});
    if (name == "upper") return Value(text::upper(s));
    if (name == "title") return Value(text::py_title(s));
    if (name == "capitalize") return Value(text::capitalize(s));
    return Value(text::lower(s));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    Params p(name.c_str(), a, {"sub"});
    int64_t r = text::find(s, need_str(p[0], name.c_str()), name[0] == 'r');
    if (r < 0 && (name == "index" || name == "rindex")) fail("substring not found");
    return Value(r);
  }
  if (name == "count") {
    Params p("count", a, {"sub"});
    return Value(text::count(s, need_str(p[0], "count")));
  }
  if (name == "join") {
    Params p("join", a, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& x : ev.iterate(p[0])) {
      if (!x.is_string()) fail("sequence item: expected str instance, {} found", x.type_name());
      check_size(out.size() + s.size() + x.str().size());
      if (!first) out += s;
      first = false;
      out += x.str();
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(str_format(ev, s, a));
  if (name == "center" || name == "ljust" || name == "rjust") {
    Params p(name.c_str(), a, {"width", "fillchar"});
    int64_t width = std::min<int64_t>(p.int_or(0, 0), int64_t(kMaxStringBytes));
    std::string fill = p.has(1) ? need_str(p[1], name.c_str()) : " ";
    if (text::cp_length(fill) != 1) fail("The fill character must be exactly one character long");
    if (name == "center") return Value(text::center(s, width, fill));
    std::string pad;
    for (int64_t k = int64_t(text::cp_length(s)); k < width; ++k) pad += fill;
    return Value(name == "ljust" ? s + pad : pad + s);
  }
  if (name == "zfill") {
    Params p("zfill", a, {"width"});
    int64_t width = std::min<int64_t>(p.int_or(0, 0), int64_t(kMaxStringBytes));
    int64_t len = int64_t(text::cp_length(s));
    if (len >= width) return Value(s);
    bool signed_ = !s.empty() && (s[0] == '-' || s[0] == '+');
    std::string zeros(size_t(width - len), '0');
    return Value(signed_ ? s.substr(0, 1) + zeros + s.substr(1) : zeros + s);
  }
  if (name == "partition" || name == "rpartition") {
    Params p(name.c_str(), a, {"sep"});
    std::string sep = need_str(p[0], name.c_str());
    if (sep.empty()) fail("empty separator");
    size_t k = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (k == std::string::npos)
      return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                 : Value::tuple({Value(""), Value(""), Value(s)});
    return Value::tuple({Value(s.substr(0, k)), Value(sep), Value(s.substr(k + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Params p(name.c_str(), a, {"affix"});
    std::string x = need_str(p[0], name.c_str());
    if (name == "removeprefix")
      return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    return Value(x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0
                     ? s.substr(0, s.size() - x.size())
                     : s);
  }
  Params(name.c_str(), a, {});
  if (name == "isspace") return Value(all_cps(s, text::is_space));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return Value(all_cps(s, [](uint32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha")
    return Value(all_cps(s, [](uint32_t c) {
      return text::is_word_char(c) && !(c >= '0' && c <= '9') && c != '_';
    }));
  if (name == "isalnum")
    return Value(all_cps(s, [](uint32_t c) { return text::is_word_char(c) && c != '_'; }));
  if (name == "islower") return Value(text::is_lower(s));
  if (name == "isupper") return Value(text::is_upper(s));
  fail("'str' object has no method '{}'", name);
}

bool is_str_method(const std::string& n) {
  static const char* const kNames[] = {
      "startswith",   "endswith", "strip",   "lstrip",    "rstrip",    "split",      "rsplit",
      "splitlines",   "replace",  "upper",   "lower",     "title",     "capitalize", "casefold",
      "find",         "rfind",    "index",   "rindex",    "count",     "join",       "format",
      "center",       "ljust",    "rjust",   "zfill",     "partition", "rpartition", "removeprefix",
      "removesuffix", "isspace",  "isdigit", "isdecimal", "isnumeric", "isalpha",    "isalnum",
      "islower",      "isupper"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
}

bool is_mutator(const Value& obj, const std::string& n) {
  static const char* const kList[] = {"append", "extend", "insert", "pop",
                                      "remove", "clear",  "sort",   "reverse"};
  static const char* const kDict[] = {"update", "pop", "popitem", "clear", "setdefault"};
  if (obj.is_list() && obj.kind() == Value::Kind::Array)
    return std::any_of(std::begin(kList), std::end(kList), [&](const char* k) { return n == k; });
  if (obj.is_dict())
    return std::any_of(std::begin(kDict), std::end(kDict), [&](const char* k) { return n == k; });
  return false;
}

Value dict_from_args(CallArgs& a, const char* fn) {
  Dict d;
  if (a.pos.size() > 1) fail("{} expected at most 1 positional argument, got {}", fn, a.pos.size());
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict() || src.is_object()) {
      for (const auto& [k, v] : src.dict().entries) d.set(k, v);
    } else if (src.is_list()) {
      for (const Value& kv : src.items()) {
        if (!kv.is_list() || kv.items().size() != 2)
          fail("{}: sequence elements must be pairs", fn);
        d.set(kv.items()[0], kv.items()[1]);
      }
    } else {
      fail("{}: cannot convert {} to a mapping", fn, src.type_name());
    }
  }
  for (auto& [k, v] : a.kw) d.set(Value(k), v);
  return Value::dict(std::move(d));
}

}  // namespace

Value get_method(Evaluator& ev, const Value& obj, const std::string& name) {
  const std::string qual = std::string(obj.type_name()) + "." + name;
  if (is_mutator(obj, name))
    return Value::function(qual, [name, type = std::string(obj.type_name())](CallArgs&) -> Value {
      fail("access to attribute '{}' of '{}' object is unsafe (templates cannot modify data)", name,
           type);
    });
  if (obj.is_string()) {
    if (!is_str_method(name)) return Value();
    return Value::function(
        qual, [&ev, obj, name](CallArgs& a) { return str_method(ev, obj.str(), name, a); });
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count")
      return Value::function(qual, [obj, name](CallArgs& a) {
        Params p(name.c_str(), a, {"value"});
        int64_t n = 0;
        for (size_t i = 0; i < obj.items().size(); ++i) {
          if (!equals(obj.items()[i], p[0])) continue;
          if (name == "index") return Value(int64_t(i));
          ++n;
        }
        if (name == "index") fail("{} is not in list", p[0].repr());
        return Value(n);
      });
    if (name == "copy")
      return Value::function(qual, [obj](CallArgs& a) {
        Params("copy", a, {});
        return Value::list(obj.items());
      });
    return Value();
  }
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values" || name == "copy")
      return Value::function(qual, [obj, name](CallArgs& a) {
        Params(name.c_str(), a, {});
        if (name == "copy") return Value::dict(obj.dict());
        List out;
        for (const auto& [k, v] : obj.dict().entries)
          out.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
        return Value::list(std::move(out));
      });
    if (name == "get")
      return Value::function(qual, [obj](CallArgs& a) {
        Params p("get", a, {"key", "default"});
        const Value* v = obj.dict().find(p[0]);
        return v ? *v : p.has(1) ? p[1] : Value::none();
      });
  }
  return Value();
}

Value make_builtins() {
  Dict g;
  g.set(Value("range"), Value::function("range", [](CallArgs& a) {
          if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3)
            fail("range expected 1 to 3 integer arguments");
          for (const Value& x : a.pos)
            if (!x.is_int() && !x.is_bool())
              fail("'{}' object cannot be interpreted as an integer", x.type_name());
          int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
          int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
          int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
          if (step == 0) fail("range() arg 3 must not be zero");
          // Count before materialising: the bound applies to the range, not to what is built.
          uint64_t n = 0;
          if (step > 0 && start < stop)
            n = (uint64_t(stop) - uint64_t(start) - 1) / uint64_t(step) + 1;
          if (step < 0 && start > stop)
            n = (uint64_t(start) - uint64_t(stop) - 1) / (uint64_t(-(step + 1)) + 1) + 1;
          if (n > uint64_t(kMaxRange))
            fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
          List out;
          for (int64_t k = 0; k < int64_t(n); ++k) out.push_back(Value(start + k * step));
          return Value::list(std::move(out));
        }));
  g.set(Value("namespace"), Value::function("namespace", [](CallArgs& a) {
          Value d = dict_from_args(a, "namespace");
          return Value::object(d.dict(), true);
        }));
  g.set(Value("dict"),
        Value::function("dict", [](CallArgs& a) { return dict_from_args(a, "dict"); }));
  g.set(Value("joiner"), Value::function("joiner", [](CallArgs& a) {
          Params p("joiner", a, {"sep"});
          auto used = std::make_shared<bool>(false);
          std::string sep = p.str_or(0, ", ");
          return Value::function("joiner", [used, sep](CallArgs&) {
            bool first = !*used;
            *used = true;
            return Value(first ? std::string() : sep);
          });
        }));
  g.set(Value("raise_exception"), Value::function("raise_exception", [](CallArgs& a) -> Value {
          Params p("raise_exception", a, {"message"});
          throw RaisedError(p[0].to_str());
        }));
  g.set(Value("strftime_now"), Value::function("strftime_now", [](CallArgs& a) {
          Params p("strftime_now", a, {"format"});
          std::string fmt = need_str(p[0], "strftime_now");
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[1024];
          size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          if (n == 0 && !fmt.empty())
            fail("strftime_now: format produces no output or is too long");
          return Value(std::string(buf, n));
        }));
  return Value::dict(std::move(g));
}

}  // namespace lilac::jinja
