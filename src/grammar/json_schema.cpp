// JSON Schema -> GBNF (json_schema.h). Rule bodies are GBNF text; GbnfBuilder shares identical
// ones, so every `{"type": "string"}` in a document is one rule.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "grammar/grammar.h"

namespace lilac::grammar {

using json = nlohmann::ordered_json;

namespace {

// Keywords that only annotate: accepted and ignored.
const std::set<std::string> kAnnotations = {"title",
                                            "description",
                                            "$schema",
                                            "$id",
                                            "$comment",
                                            "default",
                                            "examples",
                                            "deprecated",
                                            "readOnly",
                                            "writeOnly",
                                            "$defs",
                                            "definitions",
                                            "format_description",
                                            "discriminator",
                                            "example"};
// Keywords the compiler reads (anything else is a 400 naming it).
const std::set<std::string> kKnown = {"type",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "enum",
                                      "const",
                                      "items",
                                      "prefixItems",
                                      "minItems",
                                      "maxItems",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "minLength",
                                      "maxLength",
                                      "pattern",
                                      "format",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "nullable",
                                      "uniqueItems"};

constexpr int kMaxDepth = 64;
constexpr int kMaxListedItems = 1000;
constexpr int64_t kIntLimit =
    999999999999999;  // 15 digits (exact in a double): the widest integer generated

const char* kStringChar = R"([^"\\\x00-\x1F])";
const char* kRawChar = R"([^\x00-\x1F])";

[[noreturn]] void bad_schema(const std::string& path, const std::string& what) {
  throw SchemaError(fmt::format("response schema at {}: {}", path, what));
}

std::string sub(const std::string& path, const std::string& key) {
  return path + "/" + key;
}

// Integer-valued keyword (minLength ...).
int64_t count_keyword(const json& s, const char* key, const std::string& path) {
  const json& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    bad_schema(path, fmt::format("'{}' must be a non-negative integer", key));
  return v.get<int64_t>();
}

// --- integer ranges ------------------------------------------------------------------------------

// Alternatives (GBNF sequences) for the decimal strings of the integers in [lo, hi], both strings
// of the same length.
void digits_range(const std::string& lo, const std::string& hi, const std::string& prefix,
                  std::vector<std::string>& out) {
  if (lo.empty()) {
    out.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  const auto lit = [](char d) { return std::string("\"") + d + "\""; };
  const auto join = [](const std::string& a, const std::string& b) {
    return a.empty() ? b : a + " " + b;
  };
  if (lo == hi) {
    out.push_back(join(prefix, gbnf_literal(lo)));
    return;
  }
  const size_t rest = lo.size() - 1;
  if (lo[0] == hi[0]) {
    digits_range(lo.substr(1), hi.substr(1), join(prefix, lit(lo[0])), out);
    return;
  }
  const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
  if (!lo_zeros) digits_range(lo.substr(1), std::string(rest, '9'), join(prefix, lit(lo[0])), out);
  const char a = char(lo[0] + (lo_zeros ? 0 : 1)), b = char(hi[0] - (hi_nines ? 0 : 1));
  if (a <= b) {
    std::string seq = join(prefix, fmt::format("[{}-{}]", a, b));
    if (rest) seq += fmt::format(" [0-9]{{{}}}", rest);
    out.push_back(seq);
  }
  if (!hi_nines) digits_range(std::string(rest, '0'), hi.substr(1), join(prefix, lit(hi[0])), out);
}

// GBNF alternatives for the non-negative integers in [lo, hi] (no leading zeros).
std::vector<std::string> nonneg_range(int64_t lo, int64_t hi) {
  std::vector<std::string> out;
  int64_t p = 1;  // 10^(len-1)
  for (int len = 1; len <= 18 && p <= hi; ++len, p *= 10) {
    const int64_t top = p * 10 - 1;
    const int64_t a = std::max(lo, len == 1 ? 0 : p), b = std::min(hi, top);
    if (a <= b) digits_range(std::to_string(a), std::to_string(b), "", out);
  }
  return out;
}

std::string alternatives(const std::vector<std::string>& alts) {
  std::string s;
  for (size_t k = 0; k < alts.size(); ++k) s += (k ? " | " : "") + alts[k];
  return alts.size() > 1 ? "(" + s + ")" : s;
}

}  // namespace

// --- GbnfBuilder ---------------------------------------------------------------------------------

std::string GbnfBuilder::fresh(const std::string& hint) {
  std::string base;
  for (char c : hint) base += std::isalnum(uint8_t(c)) ? char(std::tolower(c)) : '-';
  if (base.empty() || base.size() > 40) base = base.substr(0, 40) + "r";
  std::string name = base;
  for (int k = 2; names_.count(name) || name == "root"; ++k) name = base + std::to_string(k);
  names_.insert(name);
  return name;
}

std::string GbnfBuilder::add(const std::string& hint, const std::string& body) {
  auto it = by_body_.find(body);
  if (it != by_body_.end()) return it->second;
  const std::string name = fresh(hint);
  rules_[name] = body;
  by_body_[body] = name;
  return name;
}

std::string GbnfBuilder::reserve(const std::string& hint) {
  return fresh(hint);
}

void GbnfBuilder::define(const std::string& name, const std::string& body) {
  rules_[name] = body;
}

std::string GbnfBuilder::text(const std::string& root_body) const {
  std::string t = "root ::= " + root_body + "\n";
  for (const auto& [name, body] : rules_) t += name + " ::= " + body + "\n";
  return t;
}

// --- SchemaCompiler ------------------------------------------------------------------------------

SchemaCompiler::SchemaCompiler(GbnfBuilder& out, const json& document)
    : out_(out), doc_(document) {}

std::string SchemaCompiler::ws() {
  return out_.add("ws", "[ \\t\\n]{0,20}");
}

std::string SchemaCompiler::any_value() {
  if (auto it = refs_.find("any"); it != refs_.end()) return it->second;
  const std::string value = out_.reserve("value");
  refs_["any"] = value;
  const std::string w = ws();
  const std::string str =
      out_.add("string",
               fmt::format(R"("\"" {0}* ("\\" (["\\/bfnrt] | "u" hex4) {0}*)* "\"")", kStringChar));
  out_.add("hex4", "([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2})");
  const std::string num = number_rule(json::object(), "#", false);
  const std::string member =
      out_.add("member", fmt::format("{0} {1} \":\" {1} {2} {1}", str, w, value));
  const std::string obj =
      out_.add("object", fmt::format("\"{{\" {0} ({1} (\",\" {0} {1})*)? \"}}\"", w, member));
  const std::string arr =
      out_.add("array", fmt::format("\"[\" {0} ({1} {0} (\",\" {0} {1} {0})*)? \"]\"", w, value));
  out_.define(value, fmt::format("{} | {} | {} | {} | \"true\" | \"false\" | \"null\"", obj, arr,
                                 str, num));
  return value;
}

const json& SchemaCompiler::resolve(const std::string& ref, const std::string& path) const {
  if (ref.empty() || ref[0] != '#')
    bad_schema(path, fmt::format("$ref '{}' is not supported (only local refs: #/$defs/...)", ref));
  try {
    const std::string pointer = ref.substr(1);
    return pointer.empty() ? doc_ : doc_.at(json::json_pointer(pointer));
  } catch (const std::exception&) {
    bad_schema(path, fmt::format("$ref '{}' does not resolve", ref));
  }
}

std::string SchemaCompiler::ref_rule(const std::string& ref, const std::string& path, bool raw) {
  const std::string key = (raw ? "raw:" : "json:") + ref;
  if (auto it = refs_.find(key); it != refs_.end()) return it->second;
  const json& target = resolve(ref, path);
  const std::string name = out_.reserve(ref.substr(ref.rfind('/') + 1) + "-ref");
  refs_[key] = name;
  out_.define(name, compile(target, ref, raw));
  return name;
}

std::string SchemaCompiler::value(const json& schema, const std::string& path) {
  return compile(schema, path, false);
}

std::string SchemaCompiler::raw_string(const json& schema, const std::string& path) {
  return compile(schema, path, true);
}

std::set<std::string> SchemaCompiler::types(const json& s, const std::string& path) {
  if (++depth_ > kMaxDepth) bad_schema(path, "nested too deeply (or a $ref cycle)");
  std::set<std::string> out;
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};
  if (s.is_boolean() || !s.is_object()) return out;
  if (s.contains("$ref") && s["$ref"].is_string()) return types(resolve(s["$ref"], path), path);
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) out.insert(t.get<std::string>());
    if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) out.insert(x.get<std::string>());
  } else if (s.contains("const") || s.contains("enum")) {
    std::vector<json> vals =
        s.contains("const") ? std::vector<json>{s["const"]} : s["enum"].get<std::vector<json>>();
    for (const auto& v : vals)
      out.insert(v.is_string()           ? "string"
                 : v.is_null()           ? "null"
                 : v.is_boolean()        ? "boolean"
                 : v.is_number_integer() ? "integer"
                 : v.is_number()         ? "number"
                 : v.is_object()         ? "object"
                                         : "array");
  } else {
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k) && s[k].is_array())
        for (const auto& alt : s[k]) {
          auto t = types(alt, path);
          if (t.empty()) return {};
          out.insert(t.begin(), t.end());
        }
  }
  if (s.value("nullable", false) && !out.empty()) out.insert("null");
  return out;
}

std::string SchemaCompiler::compile(const json& s, const std::string& path, bool raw) {
  if (++depth_ > kMaxDepth) bad_schema(path, "nested too deeply");
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};
  if (s.is_boolean()) {
    if (!s.get<bool>()) bad_schema(path, "the schema 'false' matches nothing");
    if (raw) return string_rule(json::object(), path, true);
    return any_value();
  }
  if (!s.is_object()) bad_schema(path, "a schema must be an object or a boolean");
  for (const auto& [k, v] : s.items())
    if (!kKnown.count(k) && !kAnnotations.count(k))
      bad_schema(path, fmt::format("the keyword '{}' is not supported", k));

  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) bad_schema(path, "'$ref' must be a string");
    for (const auto& [k, v] : s.items())
      if (k != "$ref" && !kAnnotations.count(k))
        bad_schema(path, fmt::format("'{}' beside '$ref' is not supported", k));
    return ref_rule(s["$ref"].get<std::string>(), path, raw);
  }
  if (s.contains("allOf")) {
    const json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1 || s.size() != 1)
      bad_schema(path, "'allOf' is supported only with a single schema and nothing beside it");
    return compile(all[0], sub(path, "allOf/0"), raw);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    const json& alts = s[key];
    if (!alts.is_array() || alts.empty())
      bad_schema(path, fmt::format("'{}' must be a non-empty array", key));
    for (const auto& [k, v] : s.items())
      if (k != key && !kAnnotations.count(k) && k != "nullable")
        bad_schema(path, fmt::format("'{}' beside '{}' is not supported", k, key));
    if (std::string(key) == "oneOf") {
      // Exactly one branch must match: accepted when the branches' types cannot overlap.
      std::set<std::string> seen;
      for (size_t i = 0; i < alts.size(); ++i) {
        auto t = types(alts[i], sub(path, fmt::format("oneOf/{}", i)));
        if (t.count("integer") || t.count("number")) t.insert({"integer", "number"});
        for (const auto& x : t)
          if (t.empty() || !seen.insert(x).second)
            bad_schema(path,
                       "'oneOf' whose branches may overlap (the same JSON type) is not "
                       "supported: use 'anyOf'");
        if (t.empty())
          bad_schema(path, "'oneOf' with an untyped branch is not supported: use 'anyOf'");
      }
    }
    std::vector<std::string> rules;
    for (size_t i = 0; i < alts.size(); ++i)
      rules.push_back(compile(alts[i], sub(path, fmt::format("{}/{}", key, i)), raw));
    if (s.value("nullable", false)) rules.push_back(raw ? "\"null\"" : "\"null\"");
    return out_.add("alt", alternatives(rules));
  }
  if (s.contains("const") || s.contains("enum")) {
    std::vector<json> vals;
    if (s.contains("const")) vals.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        bad_schema(path, "'enum' must be a non-empty array");
      if (s.contains("const")) bad_schema(path, "'const' together with 'enum' is not supported");
      vals = s["enum"].get<std::vector<json>>();
    }
    std::vector<std::string> alts;
    for (const auto& v : vals) {
      if (raw && !v.is_string() && !v.is_null())
        bad_schema(path, "a non-string enum value in a string parameter");
      std::string text = raw && v.is_string() ? v.get<std::string>() : v.dump();
      if (raw && text.find_first_of("\n<") != std::string::npos)
        bad_schema(path, "an enum value with a newline or '<' cannot be a tool-call value");
      alts.push_back(text.empty() ? "\"\"" : gbnf_literal(text));
    }
    if (s.value("nullable", false)) alts.push_back("\"null\"");
    return out_.add("enum", alternatives(alts));
  }
  // Types: explicit, or what the keywords imply, or any value.
  std::vector<std::string> types_list;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string())
      types_list.push_back(t.get<std::string>());
    else if (t.is_array() && !t.empty())
      for (const auto& x : t) {
        if (!x.is_string()) bad_schema(path, "'type' must be a string or an array of strings");
        types_list.push_back(x.get<std::string>());
      }
    else
      bad_schema(path, "'type' must be a string or a non-empty array of strings");
  } else {
    auto any_of = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (any_of({"properties", "required", "additionalProperties"})) types_list.push_back("object");
    if (any_of({"items", "prefixItems", "minItems", "maxItems"})) types_list.push_back("array");
    if (any_of({"minLength", "maxLength", "pattern", "format"})) types_list.push_back("string");
    if (any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}))
      types_list.push_back("number");
    if (types_list.empty()) {
      if (raw) return string_rule(json::object(), path, true);
      return any_value();
    }
  }
  if (s.value("nullable", false)) types_list.push_back("null");
  std::vector<std::string> rules;
  for (const auto& t : types_list) rules.push_back(typed(s, t, path, raw));
  return rules.size() == 1 ? rules[0] : out_.add("alt", alternatives(rules));
}

std::string SchemaCompiler::typed(const json& s, const std::string& type, const std::string& path,
                                  bool raw) {
  if (type == "null") return out_.add("null", "\"null\"");
  if (raw && type != "string")
    bad_schema(path, fmt::format("type '{}' in a raw string value", type));
  if (type == "string") return string_rule(s, path, raw);
  if (type == "boolean") return out_.add("boolean", "\"true\" | \"false\"");
  if (type == "integer") return number_rule(s, path, true);
  if (type == "number") return number_rule(s, path, false);
  if (type == "object") return object_rule(s, path);
  if (type == "array") return array_rule(s, path);
  bad_schema(path, fmt::format("unknown type '{}'", type));
}

std::string SchemaCompiler::string_rule(const json& s, const std::string& path, bool raw) {
  const char* q = raw ? "" : "\"\\\"\" ";
  const char* qe = raw ? "" : " \"\\\"\"";
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  const int kinds = int(has_len) + int(s.contains("pattern")) + int(s.contains("format"));
  if (kinds > 1)
    bad_schema(path,
               "combining two of minLength/maxLength, 'pattern' and 'format' is not supported");
  const std::string ch = raw ? kRawChar : kStringChar;
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) bad_schema(path, "'pattern' must be a string");
    try {
      return out_.add("pattern", q + regex_to_gbnf(s["pattern"].get<std::string>(), !raw) + qe);
    } catch (const SchemaError& e) {
      bad_schema(path, e.what());
    }
  }
  if (s.contains("format")) {
    if (!s["format"].is_string()) bad_schema(path, "'format' must be a string");
    const std::string f = s["format"].get<std::string>();
    const std::string d2 = "[0-9]{2}";
    const std::string date =
        "[0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
        "[01]) | "
        "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
        "\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))";
    const std::string hour = "([01] [0-9] | \"2\" [0-3])";
    const std::string time =
        hour + " \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] " + hour +
        " \":\" [0-5] [0-9])";
    std::string body;
    if (f == "date")
      body = date;
    else if (f == "time")
      body = time;
    else if (f == "date-time")
      body = date + " \"T\" " + time;
    else if (f == "uuid")
      body = "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
    else if (f == "email")
      body = "[a-z0-9]{1,16} (\".\" [a-z0-9]{1,16})? \"@\" [a-z0-9]{1,16} \".\" [a-z]{2,6}";
    else
      bad_schema(path, fmt::format("the string format '{}' is not supported", f));
    return out_.add(f, q + ("(" + body + ")") + qe);
  }
  if (has_len) {
    const int64_t lo = s.contains("minLength") ? count_keyword(s, "minLength", path) : 0;
    const int64_t hi = s.contains("maxLength") ? count_keyword(s, "maxLength", path) : -1;
    if (hi >= 0 && hi < lo) bad_schema(path, "'maxLength' is below 'minLength'");
    if (lo > 100000 || hi > 100000)
      bad_schema(path, "string length bounds above 100000 are not supported");
    const std::string rep = hi < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi);
    return out_.add("string", q + ch + rep + qe);
  }
  if (raw) return out_.add("raw-string", ch + "*");
  out_.add("hex4", "([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2})");
  return out_.add("string", fmt::format(R"("\"" {0}* ("\\" (["\\/bfnrt] | "u" hex4) {0}*)* "\"")",
                                        kStringChar));
}

std::string SchemaCompiler::number_rule(const json& s, const std::string& path, bool integer) {
  if (s.contains("multipleOf")) bad_schema(path, "'multipleOf' is not supported");
  // Bounds, rounded inwards to integers (a number keeps its fraction within them).
  double lo = -double(kIntLimit), hi = double(kIntLimit);
  bool bounded = false;
  auto num = [&](const char* k) {
    if (!s[k].is_number()) bad_schema(path, fmt::format("'{}' must be a number", k));
    bounded = true;
    return s[k].get<double>();
  };
  if (s.contains("minimum")) lo = std::max(lo, std::ceil(num("minimum")));
  if (s.contains("maximum")) hi = std::min(hi, std::floor(num("maximum")));
  if (s.contains("exclusiveMinimum")) {
    if (s["exclusiveMinimum"].is_boolean())
      bad_schema(path, "boolean 'exclusiveMinimum' (draft 4) is not supported");
    lo = std::max(lo, std::floor(num("exclusiveMinimum")) + 1);
  }
  if (s.contains("exclusiveMaximum")) {
    if (s["exclusiveMaximum"].is_boolean())
      bad_schema(path, "boolean 'exclusiveMaximum' (draft 4) is not supported");
    hi = std::min(hi, std::ceil(num("exclusiveMaximum")) - 1);
  }
  lo = std::max(lo, -double(kIntLimit));
  hi = std::min(hi, double(kIntLimit));
  if (lo > hi)
    bad_schema(path, integer
                         ? "no integer lies within the bounds"
                         : "the bounds hold no integer (bounds are rounded inwards to integers)");
  const std::string frac = "(\".\" [0-9]{1,16})?";
  if (!bounded) {
    const std::string i = "\"-\"? (\"0\" | [1-9] [0-9]{0,14})";
    if (integer) return out_.add("integer", i);
    return out_.add("number", i + " " + frac + " ([eE] [-+]? [0-9]{1,2})?");
  }
  const auto a = int64_t(lo), b = int64_t(hi);
  std::vector<std::string> alts;
  // Values x in [c, e] (c >= 0) written without sign: integers, or for numbers also any fraction
  // below e, and e itself only with zeros after the point.
  auto magnitude = [&](int64_t c, int64_t e) {
    std::vector<std::string> parts;
    if (integer) return alternatives(nonneg_range(c, e));
    if (c < e) parts.push_back(alternatives(nonneg_range(c, e - 1)) + " " + frac);
    parts.push_back(gbnf_literal(std::to_string(e)) + " (\".\" [0]{1,16})?");
    return alternatives(parts);
  };
  if (b >= 0) alts.push_back(magnitude(std::max<int64_t>(a, 0), b));
  if (a < 0) alts.push_back("\"-\" " + magnitude(b < 0 ? -b : (integer ? 1 : 0), -a));
  return out_.add(integer ? "integer" : "number", alternatives(alts));
}

std::string SchemaCompiler::object_rule(const json& s, const std::string& path) {
  const std::string w = ws();
  const json props = s.contains("properties") ? s["properties"] : json::object();
  if (!props.is_object()) bad_schema(path, "'properties' must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) bad_schema(path, "'required' must be an array");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) bad_schema(path, "'required' must hold strings");
      if (!props.contains(r.get<std::string>()))
        bad_schema(path, fmt::format("required property '{}' is not in 'properties'",
                                     r.get<std::string>()));
      required.insert(r.get<std::string>());
    }
  }
  const json extra = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
  if (props.empty()) {
    if (extra.is_boolean() && !extra.get<bool>())
      return out_.add("empty-object", "\"{\" " + w + " \"}\"");
    // A map: any keys, each value valid against additionalProperties.
    const std::string str = compile(json{{"type", "string"}}, path, false);
    const std::string val = compile(extra, sub(path, "additionalProperties"), false);
    const std::string member =
        out_.add("member", fmt::format("{0} {1} \":\" {1} {2} {1}", str, w, val));
    return out_.add("map", fmt::format("\"{{\" {0} ({1} (\",\" {0} {1})*)? \"}}\"", w, member));
  }
  // Properties in declaration order; required ones always, optional ones may be left out. The
  // rule for "properties i.. with / without one written before" handles the commas.
  std::vector<std::pair<std::string, std::string>> kv;  // (key, rule for `"key": value ws`)
  for (const auto& [k, v] : props.items()) {
    const std::string value = compile(v, sub(path, "properties/" + k), false);
    kv.push_back({k, out_.add("kv", fmt::format("{} {} \":\" {} {} {}",
                                                gbnf_literal(json(k).dump()), w, w, value, w))});
  }
  std::map<std::pair<size_t, bool>, std::string> memo;
  std::function<std::string(size_t, bool)> rest = [&](size_t i, bool first) -> std::string {
    if (i == kv.size()) return "";
    if (auto it = memo.find({i, first}); it != memo.end()) return it->second;
    const std::string sep = first ? "" : "\",\" " + w + " ";
    const std::string after = rest(i + 1, false);
    std::string body = sep + kv[i].second + (after.empty() ? "" : " " + after);
    if (!required.count(kv[i].first)) {
      const std::string skip = rest(i + 1, first);
      body = "(" + body + ") | " + (skip.empty() ? "\"\"" : skip);
    }
    return memo[{i, first}] = out_.add("props", body);
  };
  const std::string members = rest(0, true);
  return out_.add("object", "\"{\" " + w + " " + members + " \"}\"");
}

std::string SchemaCompiler::array_rule(const json& s, const std::string& path) {
  if (s.contains("uniqueItems") && s["uniqueItems"] == true)
    bad_schema(path, "'uniqueItems': true is not supported");
  const std::string w = ws();
  std::vector<json> prefix;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) bad_schema(path, "'prefixItems' must be an array");
    prefix = s["prefixItems"].get<std::vector<json>>();
  }
  json items = s.contains("items") ? s["items"] : json(true);
  if (items.is_array())
    bad_schema(path, "'items' as an array (draft 4 tuples) is not supported: use 'prefixItems'");
  const bool no_more = items.is_boolean() && !items.get<bool>();
  int64_t lo = s.contains("minItems") ? count_keyword(s, "minItems", path) : 0;
  int64_t hi = s.contains("maxItems") ? count_keyword(s, "maxItems", path) : -1;
  if (no_more) hi = hi < 0 ? int64_t(prefix.size()) : std::min<int64_t>(hi, int64_t(prefix.size()));
  if (hi >= 0 && hi < lo)
    bad_schema(path, "'minItems' cannot be met (maxItems or the tuple length is lower)");
  if (std::max(lo, hi) > kMaxListedItems)
    bad_schema(path, "minItems / maxItems above 1000 are not supported");
  std::vector<std::string> elem;  // rule per listed position
  for (size_t k = 0; k < prefix.size(); ++k)
    elem.push_back(compile(prefix[k], sub(path, fmt::format("prefixItems/{}", k)), false));
  std::string item;
  if (!no_more) item = compile(items, sub(path, "items"), false);
  const std::string sep = "\",\" " + w + " ";
  // From position k on (k elements written): rules nest, one per position up to where the tail
  // repeats freely.
  std::string next;  // the rule for position k + 1
  const int64_t listed = hi >= 0 ? hi : std::max<int64_t>(lo, int64_t(prefix.size()));
  if (hi < 0) next = out_.add("items", "(" + sep + item + " " + w + ")*");
  for (int64_t k = listed - 1; k >= 0; --k) {
    const std::string& e = k < int64_t(prefix.size()) ? elem[size_t(k)] : item;
    std::string body = (k ? sep : "") + e + " " + w + (next.empty() ? "" : " " + next);
    if (k >= lo) body = "(" + body + ")?";
    next = out_.add("items", body);
  }
  if (listed == 0 && hi < 0) {  // no position listed: all free
    next = out_.add("items", "(" + item + " " + w + " (" + sep + item + " " + w + ")*)?");
  }
  return out_.add("array", "\"[\" " + w + (next.empty() ? "" : " " + next) + " \"]\"");
}

std::string json_schema_grammar(const json& schema) {
  GbnfBuilder b;
  SchemaCompiler c(b, schema);
  try {
    const std::string root = c.value(schema, "#");
    return b.text(root);
  } catch (const json::exception& e) {  // a keyword of the wrong JSON type
    throw SchemaError(std::string("response schema: malformed: ") + e.what());
  }
}

std::string json_object_grammar() {
  return json_schema_grammar(json{{"type", "object"}});
}

}  // namespace lilac::grammar
