// Jinja2's built-in filters, with transformers' `tojson` (json.dumps, no HTML escaping, insertion
// order kept, ", " / ": " separators). Each follows the Python implementation in jinja2/filters.py,
// including how it treats Undefined.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace lilac::jinja {

namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, CallArgs&);

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return int64_t(text::cp_length(v.str()));
    case Value::Kind::Array:
    case Value::Kind::Tuple:
      return int64_t(v.items().size());
    case Value::Kind::Map:
      return int64_t(v.dict().entries.size());
    default:
      fail("object of type '{}' has no len()", v.type_name());
  }
}

// Jinja's make_attrgetter: "a.b.0" walks attributes/items, digits meaning an index.
Value attr_path(Evaluator& ev, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return ev.get_item(item, attribute);
  static const std::string dot = ".";
  Value v = item;
  for (const std::string& part : text::split(attribute.str(), &dot, -1)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    v = ev.get_item(v, digits ? Value(int64_t(std::stoll(part))) : Value(part));
  }
  return v;
}

// Sort/unique key: lower-cased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(text::lower(v.str())) : v;
}

// The test (and its arguments) named by select/reject/selectattr/rejectattr's trailing args.
bool apply_select_test(Evaluator& ev, const Value& v, CallArgs& args, size_t first) {
  if (args.pos.size() <= first) return v.truthy();
  if (!args.pos[first].is_string()) fail("test name must be a string");
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + long(first) + 1, args.pos.end());
  rest.kw = args.kw;
  return ev.test(args.pos[first].str(), v, rest);
}

Value select_common(Evaluator& ev, const Value& v, CallArgs& args, bool by_attr, bool keep) {
  List out;
  List items = ev.iterate(v);
  ev.count_iterations(int64_t(items.size()));
  if (by_attr && args.pos.empty()) fail("selectattr/rejectattr need an attribute name");
  for (const Value& x : items) {
    Value subject = by_attr ? attr_path(ev, x, args.pos[0]) : x;
    if (apply_select_test(ev, subject, args, by_attr ? 1 : 0) == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  Params p("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat f;
  f.ensure_ascii = p.bool_or(0, false);
  if (p.has(1) && !p[1].is_none()) {
    f.indent = &p[1];
    f.item_sep = std::string(1, ',');  // (not = ","; GCC 12 reports a bogus -Wrestrict)
  }
  if (p.has(2) && !p[2].is_none()) {
    const Value& sep = p[2];
    if (!sep.is_list() || sep.items().size() != 2 || !sep.items()[0].is_string() ||
        !sep.items()[1].is_string())
      fail("tojson: separators must be a pair of strings");
    f.item_sep = sep.items()[0].str();
    f.key_sep = sep.items()[1].str();
  }
  f.sort_keys = p.bool_or(3, false);
  return Value(to_json(v, f));
}

Value f_length(Evaluator&, const Value& v, CallArgs& a) {
  Params("length", a, {});
  return Value(py_len(v));
}

Value f_first(Evaluator& ev, const Value& v, CallArgs& a) {
  Params("first", a, {});
  List items = ev.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Evaluator& ev, const Value& v, CallArgs& a) {
  Params("last", a, {});
  List items = ev.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_join(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("join", a, {"d", "attribute"});
  std::string sep = p.has(0) ? p[0].to_str() : "";
  std::string out;
  bool first = true;
  for (const Value& x : ev.iterate(v)) {
    std::string s = p.has(1) && !p[1].is_none() ? attr_path(ev, x, p[1]).to_str() : x.to_str();
    check_size(out.size() + sep.size() + s.size());
    if (!first) out += sep;
    first = false;
    out += s;
  }
  return Value(std::move(out));
}

Value f_trim(Evaluator&, const Value& v, CallArgs& a) {
  Params p("trim", a, {"chars"});
  std::string chars = p.has(0) && !p[0].is_none() ? p[0].to_str() : "";
  return Value(text::strip(v.to_str(), p.has(0) && !p[0].is_none() ? &chars : nullptr, true, true));
}

Value f_upper(Evaluator&, const Value& v, CallArgs& a) {
  Params("upper", a, {});
  return Value(text::upper(v.to_str()));
}
Value f_lower(Evaluator&, const Value& v, CallArgs& a) {
  Params("lower", a, {});
  return Value(text::lower(v.to_str()));
}
Value f_capitalize(Evaluator&, const Value& v, CallArgs& a) {
  Params("capitalize", a, {});
  return Value(text::capitalize(v.to_str()));
}

Value f_title(Evaluator&, const Value& v, CallArgs& a) {
  // Jinja's title: words begin after whitespace or one of -({[< ; each word is capitalized.
  Params("title", a, {});
  std::string s = v.to_str(), out;
  bool boundary = true;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    uint32_t c = text::next_cp(s, j);
    bool sep = text::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    std::string ch = s.substr(i, j - i);
    out += sep ? ch : boundary ? text::upper(ch) : text::lower(ch);
    boundary = sep;
    i = j;
  }
  return Value(std::move(out));
}

Value f_replace(Evaluator&, const Value& v, CallArgs& a) {
  Params p("replace", a, {"old", "new", "count"});
  std::string s = v.to_str(), old = p[0].to_str(), repl = p[1].to_str();
  int64_t count = p.int_or(2, -1);
  int64_t hits = old.empty() ? int64_t(text::cp_length(s)) + 1 : text::count(s, old);
  if (count >= 0) hits = std::min(hits, count);
  if (repl.size() > old.size()) check_size(s.size() + size_t(hits) * (repl.size() - old.size()));
  return Value(text::replace(s, old, repl, count));
}

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  Params p("default", a, {"default_value", "boolean"});
  bool use_default = v.is_undefined() || (p.bool_or(1, false) && !v.truthy());
  return use_default ? (p.has(0) ? p[0] : Value("")) : v;
}

Value f_list(Evaluator& ev, const Value& v, CallArgs& a) {
  Params("list", a, {});
  return Value::list(ev.iterate(v));
}

Value f_items(Evaluator&, const Value& v, CallArgs& a) {
  Params("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict().entries) out.push_back(Value::tuple({k, x}));
  return Value::list(std::move(out));
}

Value f_string(Evaluator&, const Value& v, CallArgs& a) {
  Params("string", a, {});
  return v.is_string() ? v : Value(v.to_str());
}

Value f_safe(Evaluator&, const Value& v, CallArgs& a) {
  Params("safe", a, {});
  return v.is_string() ? v : Value(v.to_str());
}

Value f_escape(Evaluator&, const Value& v, CallArgs& a) {
  Params("escape", a, {});
  return Value(html_escape(v.to_str()));
}

bool parse_int(std::string s, int base, int64_t& out) {
  s = text::strip(s, nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(s.c_str(), &end, base);
  if (errno || *end) return false;
  out = r;
  return true;
}

bool parse_float(const std::string& str, double& out) {
  std::string s = text::strip(str, nullptr, true, true);
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return *end == 0;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  Params p("int", a, {"default", "base"});
  Value def = p.has(0) ? p[0] : Value(0);
  int64_t r = 0;
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value(int64_t(d));
  }
  if (!v.is_string()) return def;
  if (parse_int(v.str(), int(p.int_or(1, 10)), r)) return Value(r);
  double d;
  if (parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
    return Value(int64_t(d));
  return def;
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  Params p("float", a, {"default"});
  if (v.is_number()) return Value(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.str(), d)) return Value(d);
  return p.has(0) ? p[0] : Value(0.0);
}

Value f_abs(Evaluator&, const Value& v, CallArgs& a) {
  Params("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (!v.is_number()) fail("bad operand type for abs(): '{}'", v.type_name());
  if (v.as_int() == INT64_MIN) fail("integer overflow");
  return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  Params p("round", a, {"precision", "method"});
  int64_t prec = p.int_or(0, 0);
  std::string method = p.str_or(1, "common");
  if (!v.is_number()) fail("round: expected a number, got {}", v.type_name());
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (method == "common" && !v.is_float()) return Value(v.as_int());  // round(int, n) stays an int
  double x = v.as_double(), scale = std::pow(10.0, double(prec));
  if (method == "ceil") return Value(std::ceil(x * scale) / scale);
  if (method == "floor") return Value(std::floor(x * scale) / scale);
  if (!std::isfinite(x)) return Value(x);
  if (prec >= 0) {
    // printf rounds the exact binary value half-to-even, as CPython's round() does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(std::min<int64_t>(prec, 300)), x);
    return Value(std::strtod(buf, nullptr));
  }
  double factor = std::pow(10.0, double(-prec));
  return Value(std::nearbyint(x / factor) * factor);
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  List items = ev.iterate(v);
  ev.count_iterations(int64_t(items.size()));
  List out;
  const Value* attribute = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, x] : a.kw) {
    if (k == "attribute")
      attribute = &x;
    else if (k == "default")
      def = &x;
  }
  if (attribute) {
    for (const Value& x : items) {
      Value r = attr_path(ev, x, *attribute);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty() || !a.pos[0].is_string()) fail("map: expected a filter name or attribute=");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& x : items) {
    CallArgs copy = rest;
    out.push_back(ev.filter(a.pos[0].str(), x, copy));
  }
  return Value::list(std::move(out));
}

Value f_select(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_common(ev, v, a, false, true);
}
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_common(ev, v, a, false, false);
}
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_common(ev, v, a, true, true);
}
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_common(ev, v, a, true, false);
}

Value f_unique(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("unique", a, {"case_sensitive", "attribute"});
  bool cs = p.bool_or(0, false);
  List out, seen;
  for (const Value& x : ev.iterate(v)) {
    Value key = sort_key(p.has(1) && !p[1].is_none() ? attr_path(ev, x, p[1]) : x, cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); }))
      continue;
    ev.count_iterations(int64_t(seen.size()));
    seen.push_back(key);
    out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_sort(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool rev = p.bool_or(0, false), cs = p.bool_or(1, false);
  List items = ev.iterate(v);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i)
    keyed.emplace_back(
        sort_key(p.has(2) && !p[2].is_none() ? attr_path(ev, items[i], p[2]) : items[i], cs), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  List out;
  for (const auto& [k, i] : keyed) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("dictsort: expected a mapping, got {}", v.type_name());
  bool cs = p.bool_or(0, false), rev = p.bool_or(2, false);
  std::string by = p.str_or(1, "key");
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  std::vector<std::pair<Value, Value>> items = v.dict().entries;
  size_t idx = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    Value kx = sort_key(idx ? x.second : x.first, cs), ky = sort_key(idx ? y.second : y.first, cs);
    return rev ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  List out;
  for (auto& [k, x] : items) out.push_back(Value::tuple({k, x}));
  return Value::list(std::move(out));
}

Value f_reverse(Evaluator& ev, const Value& v, CallArgs& a) {
  Params("reverse", a, {});
  if (v.is_string()) {
    std::vector<size_t> off = text::cp_offsets(v.str());
    std::string out;
    for (size_t k = off.size() - 1; k > 0; --k)
      out.append(v.str(), off[k - 1], off[k] - off[k - 1]);
    return Value(std::move(out));
  }
  List items = ev.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_indent(Evaluator&, const Value& v, CallArgs& a) {
  Params p("indent", a, {"width", "first", "blank"});
  std::string ind = p.has(0) && p[0].is_string()
                        ? p[0].str()
                        : std::string(size_t(std::clamp<int64_t>(p.int_or(0, 4), 0, 1024)), ' ');
  bool first = p.bool_or(1, false), blank = p.bool_or(2, false);
  // Jinja2 appends "\n" to the value itself, which only a str supports.
  if (v.is_undefined()) fail("{}", v.str().empty() ? "value is undefined" : v.str());
  if (!v.is_string()) fail("unsupported operand type(s) for +=: '{}' and 'str'", v.type_name());
  std::string s =
      v.to_str() + "\n";  // Jinja appends a newline so splitlines keeps a trailing empty line
  std::vector<std::string> lines = text::splitlines(s, false);
  check_size(s.size() + (lines.size() + 1) * ind.size());
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    if (k && (blank || !lines[k].empty())) out += ind;
    out += lines[k];
  }
  return Value(first ? ind + out : out);
}

Value f_wordcount(Evaluator&, const Value& v, CallArgs& a) {
  Params("wordcount", a, {});
  std::string s = v.to_str();
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    bool w = text::is_word_char(text::next_cp(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Evaluator&, const Value& v, CallArgs& a) {
  Params p("center", a, {"width"});
  int64_t width = std::min<int64_t>(p.int_or(0, 80), int64_t(kMaxStringBytes));
  return Value(text::center(v.to_str(), width));
}

Value f_striptags(Evaluator&, const Value& v, CallArgs& a) {
  // markupsafe: drop <!-- comments --> and <tags>, collapse whitespace, unescape entities.
  Params("striptags", a, {});
  std::string s = v.to_str(), noTags;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i + 4);
      if (e != std::string::npos) {
        i = e + 3;
        continue;
      }
    }
    if (s[i] == '<') {
      size_t e = s.find('>', i + 1);
      if (e != std::string::npos) {
        i = e + 1;
        continue;
      }
    }
    noTags += s[i++];
  }
  std::string joined;
  for (const std::string& w : text::split(noTags, nullptr, -1))
    joined += (joined.empty() ? "" : " ") + w;
  static const std::pair<const char*, const char*> kEntities[] = {
      {"&amp;", "&"},  {"&lt;", "<"},  {"&gt;", ">"},   {"&quot;", "\""},
      {"&#34;", "\""}, {"&#39;", "'"}, {"&apos;", "'"}, {"&nbsp;", "\xC2\xA0"}};
  std::string out;
  for (size_t i = 0; i < joined.size();) {
    bool hit = false;
    for (const auto& [ent, rep] : kEntities) {
      size_t n = std::char_traits<char>::length(ent);
      if (joined.compare(i, n, ent) == 0) {
        out += rep;
        i += n;
        hit = true;
        break;
      }
    }
    if (!hit) out += joined[i++];
  }
  return Value(std::move(out));
}

Value f_truncate(Evaluator&, const Value& v, CallArgs& a) {
  Params p("truncate", a, {"length", "killwords", "end", "leeway"});
  std::string end = p.str_or(2, "...");
  int64_t length = p.int_or(0, 255), leeway = p.int_or(3, 5);
  int64_t end_len = int64_t(text::cp_length(end));
  if (length < end_len) fail("expected length >= {}, got {}", end_len, length);
  // Python's len() and slicing on the value itself: only a short sequence passes unchanged.
  if (!v.is_string()) {
    if (!v.is_undefined() && py_len(v) <= length + leeway) return v;
    fail("truncate: expected a string, got {}", v.type_name());
  }
  std::string s = v.str();
  if (int64_t(text::cp_length(s)) <= length + leeway) return Value(s);
  std::vector<size_t> off = text::cp_offsets(s);
  std::string head = s.substr(0, off[size_t(length - end_len)]);
  if (p.bool_or(1, false)) return Value(head + end);
  std::string sp = " ";
  return Value(text::rsplit(head, &sp, 1)[0] + end);
}

Value f_sum(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("sum", a, {"attribute", "start"});
  Value total = p.has(1) ? p[1] : Value(0);
  for (const Value& x : ev.iterate(v)) {
    Value y = p.has(0) && !p[0].is_none() ? attr_path(ev, x, p[0]) : x;
    if (!total.is_number() || !y.is_number())
      fail("unsupported operand type(s) for +: '{}' and '{}'", total.type_name(), y.type_name());
    int64_t r;
    if (!total.is_float() && !y.is_float() &&
        !__builtin_add_overflow(total.as_int(), y.as_int(), &r))
      total = Value(r);
    else
      total = Value(total.as_double() + y.as_double());
  }
  return total;
}

Value min_max(Evaluator& ev, const Value& v, CallArgs& a, bool want_max) {
  Params p(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  bool cs = p.bool_or(0, false);
  Value best, best_key;
  for (const Value& x : ev.iterate(v)) {
    Value key = sort_key(p.has(1) && !p[1].is_none() ? attr_path(ev, x, p[1]) : x, cs);
    if (best.is_undefined() ||
        (want_max ? compare(key, best_key) > 0 : compare(key, best_key) < 0)) {
      best = x;
      best_key = key;
    }
  }
  return best.is_undefined()
             ? Value::undefined(want_max ? "No aggregated item, sequence was empty."
                                         : "No aggregated item, sequence was empty.")
             : best;
}
Value f_min(Evaluator& ev, const Value& v, CallArgs& a) {
  return min_max(ev, v, a, false);
}
Value f_max(Evaluator& ev, const Value& v, CallArgs& a) {
  return min_max(ev, v, a, true);
}

Value f_batch(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("batch", a, {"linecount", "fill_with"});
  int64_t n = p.int_or(0, 1);
  if (n <= 0) fail("batch: linecount must be positive");
  List out, cur;
  for (const Value& x : ev.iterate(v)) {
    cur.push_back(x);
    if (int64_t(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (p.has(1) && !p[1].is_none())
      while (int64_t(cur.size()) < n) cur.push_back(p[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_attr(Evaluator& ev, const Value& v, CallArgs& a) {
  Params p("attr", a, {"name"});
  std::string name = p.str_or(0, "");
  if (v.is_object()) return ev.get_attr(v, name);
  if (v.is_undefined()) return ev.get_attr(v, name);
  Value m = get_method(ev, v, name);
  return m.is_undefined() ? Value::undefined(fmt::format("'{}' object has no attribute '{}'",
                                                         v.type_name(), name))
                          : m;
}

Value f_format(Evaluator&, const Value& v, CallArgs& a) {
  if (!a.kw.empty() && !a.pos.empty())
    fail("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Dict d;
    for (auto& [k, x] : a.kw) d.set(Value(k), x);
    return Value(percent_format(v.to_str(), Value::dict(std::move(d))));
  }
  return Value(percent_format(v.to_str(), Value::tuple(a.pos)));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> m = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"striptags", f_striptags},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return m;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filters().count(name) != 0;
}

Value run_filter(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  return filters().at(name)(ev, v, args);
}

}  // namespace lilac::jinja
