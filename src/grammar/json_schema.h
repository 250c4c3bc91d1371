// JSON Schema -> GBNF (grammar.h), for structured output. The supported subset and its
// approximations are listed in docs/api.md ("Structured output"); anything outside it throws
// SchemaError naming the keyword and where it is, never a silently looser grammar.
//
// Every approximation narrows: a value the grammar produces always validates against the schema
// (strings with a length bound take no escapes, numbers have at most 16 digits before and after the
// point, objects list their properties in declaration order and no others, a `pattern` matches the
// whole string), so what the model is made to write is valid, not every valid value is reachable.
// Schemas are ordered_json: properties keep the order the request declared them in.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "util/error.h"

namespace lilac::grammar {

class SchemaError : public Error {
 public:
  explicit SchemaError(const std::string& what) : Error(what) {}
};

// Collects GBNF rules; identical bodies share one rule.
class GbnfBuilder {
 public:
  // A rule with this body (an existing one when the body was seen), by name.
  std::string add(const std::string& hint, const std::string& body);
  // A name to refer to before its body is known (recursive $refs); define() gives the body.
  std::string reserve(const std::string& hint);
  void define(const std::string& name, const std::string& body);
  // The grammar: `root ::= root_body` and every rule.
  std::string text(const std::string& root_body) const;

 private:
  std::string fresh(const std::string& hint);
  std::map<std::string, std::string> rules_;    // name -> body
  std::map<std::string, std::string> by_body_;  // body -> name
  std::set<std::string> names_;
};

// Compiles the schemas of one document ($refs resolve against it).
class SchemaCompiler {
 public:
  SchemaCompiler(GbnfBuilder& out, const nlohmann::ordered_json& document);
  // A rule name for the JSON text of a value valid against `schema`; `path` names it in errors
  // (a JSON pointer, "#/properties/x").
  std::string value(const nlohmann::ordered_json& schema, const std::string& path);
  // A rule name for the raw text (no quotes, no escapes, no newline) of a string valid against
  // `schema` (a tool call's string parameter), or of JSON null when the schema allows it.
  std::string raw_string(const nlohmann::ordered_json& schema, const std::string& path);
  // The JSON types (string, number, integer, boolean, null, object, array) `schema` allows;
  // empty when any.
  std::set<std::string> types(const nlohmann::ordered_json& schema, const std::string& path);

 private:
  std::string compile(const nlohmann::ordered_json& schema, const std::string& path, bool raw);
  std::string typed(const nlohmann::ordered_json& s, const std::string& type,
                    const std::string& path, bool raw);
  std::string string_rule(const nlohmann::ordered_json& s, const std::string& path, bool raw);
  std::string number_rule(const nlohmann::ordered_json& s, const std::string& path, bool integer);
  std::string object_rule(const nlohmann::ordered_json& s, const std::string& path);
  std::string array_rule(const nlohmann::ordered_json& s, const std::string& path);
  std::string ref_rule(const std::string& ref, const std::string& path, bool raw);
  const nlohmann::ordered_json& resolve(const std::string& ref, const std::string& path) const;
  std::string any_value();
  std::string ws();

  GbnfBuilder& out_;
  const nlohmann::ordered_json& doc_;
  std::map<std::string, std::string> refs_;  // "(raw|json):pointer" -> rule name
  int depth_ = 0;
};

// The whole grammar for a response_format json_schema, and for json_object (any JSON object).
std::string json_schema_grammar(const nlohmann::ordered_json& schema);
std::string json_object_grammar();

// A JSON-schema `pattern` (an ECMAScript regex subset) as a GBNF expression for the string's
// contents: JSON-escaped characters when `json`, else raw. Throws SchemaError on what it lacks
// (backreferences, lookaround, word boundaries, ...).
std::string regex_to_gbnf(const std::string& pattern, bool json);

}  // namespace lilac::grammar
