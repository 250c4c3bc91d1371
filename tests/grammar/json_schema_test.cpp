#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include "grammar_test.h"

namespace lilac::grammar {
namespace {

using json = nlohmann::ordered_json;

bool valid(const json& schema, const std::string& text) {
  return test::matches(json_schema_grammar(schema), text);
}

std::string error_of(const json& schema) {
  try {
    json_schema_grammar(schema);
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "no error";
}

TEST(JsonSchema, ObjectPropertiesInOrderRequiredAndOptional) {
  const json s = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["b"]})");
  EXPECT_TRUE(valid(s, R"({"b":"x"})"));
  EXPECT_TRUE(valid(s, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(valid(s, R"({ "a": -12, "b": "", "c": false })"));
  EXPECT_TRUE(valid(s, "{\n  \"b\": \"x\",\n  \"c\": true\n}"));
  EXPECT_FALSE(valid(s, R"({"a":1})"));          // b is required
  EXPECT_FALSE(valid(s, R"({"b":"x","a":1})"));  // declaration order
  EXPECT_FALSE(valid(s, R"({"b":"x","d":1})"));  // no other properties
  EXPECT_FALSE(valid(s, R"({,"b":"x"})"));
  EXPECT_FALSE(valid(s, R"({"b":"x",})"));
}

TEST(JsonSchema, StringsEscapesLengthsFormatsAndPatterns) {
  EXPECT_TRUE(valid({{"type", "string"}}, R"("a\"b\\c\n\u00e9 é")"));
  EXPECT_FALSE(valid({{"type", "string"}}, R"("\ud800")"));  // a lone surrogate escape
  EXPECT_FALSE(valid({{"type", "string"}}, "\"a\nb\""));     // a raw control character
  const json len = {{"type", "string"}, {"minLength", 2}, {"maxLength", 3}};
  EXPECT_TRUE(valid(len, R"("éé")"));
  EXPECT_TRUE(valid(len, R"("abc")"));
  EXPECT_FALSE(valid(len, R"("a")"));
  EXPECT_FALSE(valid(len, R"("abcd")"));
  const json date = {{"type", "string"}, {"format", "date"}};
  EXPECT_TRUE(valid(date, R"("2024-02-28")"));
  EXPECT_TRUE(valid(date, R"("1999-12-31")"));
  EXPECT_FALSE(valid(date, R"("2024-02-30")"));
  EXPECT_FALSE(valid(date, R"("2024-04-31")"));
  EXPECT_FALSE(valid(date, R"("2024-13-01")"));
  EXPECT_TRUE(valid({{"format", "date-time"}}, R"("2024-01-02T23:59:59.5+01:00")"));
  EXPECT_TRUE(valid({{"format", "time"}}, R"("00:00:00Z")"));
  EXPECT_FALSE(valid({{"format", "time"}}, R"("24:00:00Z")"));
  EXPECT_TRUE(valid({{"format", "uuid"}}, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(valid({{"format", "email"}}, R"("a.b@c.org")"));
  EXPECT_FALSE(valid({{"format", "email"}}, R"("a@b")"));
  const json pat = {{"type", "string"}, {"pattern", R"(^(foo|ba[rz])-\d{2,3}$)"}};
  EXPECT_TRUE(valid(pat, R"("foo-12")"));
  EXPECT_TRUE(valid(pat, R"("baz-123")"));
  EXPECT_FALSE(valid(pat, R"("bar-1")"));
  EXPECT_FALSE(valid(pat, R"("qux-12")"));
  // Characters JSON must escape are produced escaped.
  EXPECT_TRUE(valid({{"pattern", R"(^a"[\\x]$)"}}, R"("a\"\\")"));
  EXPECT_TRUE(valid({{"pattern", R"(^a"[\\x]$)"}}, R"("a\"x")"));
  EXPECT_FALSE(valid({{"pattern", R"(^a"[\\x]$)"}}, R"("a"x")"));
}

TEST(JsonSchema, IntegerAndNumberBounds) {
  const json i = {{"type", "integer"}, {"minimum", -15}, {"maximum", 120}};
  for (int v = -20; v <= 130; ++v)
    EXPECT_EQ(valid(i, std::to_string(v)), v >= -15 && v <= 120) << v;
  EXPECT_FALSE(valid(i, "007"));
  EXPECT_FALSE(valid(i, "-0"));
  const json e = {{"type", "integer"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 1000}};
  EXPECT_FALSE(valid(e, "0"));
  EXPECT_TRUE(valid(e, "1"));
  EXPECT_TRUE(valid(e, "999"));
  EXPECT_FALSE(valid(e, "1000"));
  const json n = {{"type", "number"}, {"minimum", -2.5}, {"maximum", 3}};
  EXPECT_TRUE(valid(n, "-2"));
  EXPECT_TRUE(valid(n, "-1.75"));
  EXPECT_TRUE(valid(n, "2.999"));
  EXPECT_TRUE(valid(n, "3.00"));
  EXPECT_FALSE(valid(n, "3.01"));
  EXPECT_FALSE(valid(n, "-2.5"));  // rounded inwards: from -2
  EXPECT_FALSE(valid(n, "-3"));
  EXPECT_TRUE(valid({{"type", "number"}}, "-0.5e+10"));
  EXPECT_FALSE(valid({{"type", "number"}}, "1e999"));  // Infinity as a double
  EXPECT_FALSE(valid({{"type", "number"}}, "1."));
  EXPECT_FALSE(valid({{"type", "number"}}, "1234567890123456"));  // past 15 digits
  EXPECT_EQ(error_of({{"type", "integer"}, {"minimum", 5}, {"maximum", 4}}).find("bounds") !=
                std::string::npos,
            true);
}

TEST(JsonSchema, ArraysTuplesAndBounds) {
  const json a = {
      {"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}, {"maxItems", 3}};
  EXPECT_FALSE(valid(a, "[]"));
  EXPECT_TRUE(valid(a, "[1]"));
  EXPECT_TRUE(valid(a, "[1, 2 ,3]"));
  EXPECT_FALSE(valid(a, "[1,2,3,4]"));
  EXPECT_TRUE(valid({{"type", "array"}}, R"([1, "x", [null], {"k": true}])"));
  const json t = json::parse(
      R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false, "minItems": 1})");
  EXPECT_TRUE(valid(t, R"(["a"])"));
  EXPECT_TRUE(valid(t, R"(["a", 2])"));
  EXPECT_FALSE(valid(t, R"(["a", 2, 3])"));
  EXPECT_FALSE(valid(t, R"([2])"));
  const json tail = json::parse(R"({"prefixItems": [{"const": 0}], "items": {"type": "boolean"}})");
  EXPECT_TRUE(valid(tail, "[0,true,false,true]"));
  EXPECT_FALSE(valid(tail, "[true]"));
}

TEST(JsonSchema, EnumsConstsUnionsRefsAndNullable) {
  EXPECT_TRUE(valid({{"enum", {"a", 1, nullptr, {{"k", "v"}}}}}, R"({"k":"v"})"));
  EXPECT_FALSE(valid({{"enum", {"a", 1}}}, R"("b")"));
  EXPECT_TRUE(valid({{"const", "x\"y"}}, R"("x\"y")"));
  const json u =
      json::parse(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
  EXPECT_TRUE(valid(u, "5"));
  EXPECT_TRUE(valid(u, R"("z")"));
  EXPECT_FALSE(valid(u, "true"));
  EXPECT_TRUE(valid({{"type", {"string", "null"}}}, "null"));
  EXPECT_TRUE(valid({{"type", "integer"}, {"nullable", true}}, "null"));
  const json tree = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(valid(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(valid(tree, R"({"v":1,"kids":[{}]})"));
}

TEST(JsonSchema, UnsupportedFeaturesNameThemselves) {
  EXPECT_NE(error_of({{"type", "string"}, {"format", "hostname"}}).find("'hostname'"),
            std::string::npos);
  EXPECT_NE(error_of({{"not", {{"type", "string"}}}}).find("'not'"), std::string::npos);
  EXPECT_NE(error_of({{"type", "object"}, {"properties", {{"a", {{"minProperties", 1}}}}}})
                .find("#/properties/a"),
            std::string::npos);
  EXPECT_NE(error_of({{"type", "array"}, {"uniqueItems", true}}).find("uniqueItems"),
            std::string::npos);
  EXPECT_NE(error_of({{"pattern", "(?=x)x"}}).find("lookaround"), std::string::npos);
  EXPECT_NE(error_of({{"pattern", "\\bx"}}).find("word boundaries"), std::string::npos);
  EXPECT_NE(error_of({{"$ref", "other.json#/x"}}).find("only local refs"), std::string::npos);
  EXPECT_NE(error_of({{"$ref", "#/$defs/missing"}}).find("does not resolve"), std::string::npos);
  EXPECT_NE(
      error_of(json::parse(R"({"oneOf": [{"type": "string"}, {"type": "string"}]})")).find("anyOf"),
      std::string::npos);
  EXPECT_NE(error_of({{"type", "string"}, {"maxLength", 3}, {"pattern", "a"}}).find("combining"),
            std::string::npos);
  EXPECT_NE(error_of({{"enum", 3}}).find("enum"), std::string::npos);
}

TEST(JsonSchema, JsonObjectGrammarIsAnyObject) {
  const std::string g = json_object_grammar();
  EXPECT_TRUE(test::matches(g, R"({"a": [1, 2.5e-3, "x", {"b": null}], "c": {}})"));
  EXPECT_FALSE(test::matches(g, R"([1])"));
  EXPECT_FALSE(test::matches(g, R"({"a": 1)"));
}

}  // namespace
}  // namespace lilac::grammar
