#include "server/structured_output.h"

#include <list>
#include <map>
#include <mutex>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "server/api_error.h"
#include "server/request.h"

namespace lilac::server {

using json = nlohmann::ordered_json;

namespace {

// One Vocabulary per tokenizer (the byte strings of every id; special tokens empty, so never
// allowed by a grammar; the eos ids end a complete grammar).
std::shared_ptr<const grammar::Vocabulary> vocabulary(const Tokenizer& tok) {
  static std::mutex mutex;
  static std::map<const Tokenizer*, std::shared_ptr<const grammar::Vocabulary>> cache;
  std::lock_guard lock(mutex);
  auto& v = cache[&tok];
  if (v && v->size() == tok.size()) return v;
  std::vector<std::string> bytes(size_t(tok.size()));
  for (int32_t id = 0; id < tok.size(); ++id)
    if (!tok.is_special(id)) bytes[size_t(id)] = tok.token_bytes(id);
  for (int32_t id : tok.eos_ids())
    if (id >= 0 && id < tok.size()) bytes[size_t(id)].clear();
  v = std::make_shared<const grammar::Vocabulary>(std::move(bytes), tok.eos_ids());
  return v;
}

// Compiled grammars with their mask caches, the most recently used kept.
std::shared_ptr<grammar::GrammarIndex> compiled(const std::string& gbnf,
                                                std::shared_ptr<const grammar::Vocabulary> vocab) {
  constexpr size_t kKeep = 64;
  static std::mutex mutex;
  using Entry = std::pair<std::pair<std::string, const grammar::Vocabulary*>,
                          std::shared_ptr<grammar::GrammarIndex>>;
  static std::list<Entry> lru;
  const auto key = std::make_pair(gbnf, vocab.get());
  {
    std::lock_guard lock(mutex);
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->first == key) {
        lru.splice(lru.begin(), lru, it);
        return it->second;
      }
  }
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf));
  auto index = std::make_shared<grammar::GrammarIndex>(std::move(g), std::move(vocab));
  std::lock_guard lock(mutex);
  lru.emplace_front(key, index);
  if (lru.size() > kKeep) lru.pop_back();
  return index;
}

std::string compile_schema(const json& schema, const std::string& param) {
  try {
    return grammar::json_schema_grammar(schema);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error", param);
  }
}

}  // namespace

std::optional<std::string> response_format_grammar(const json& body) {
  if (!body.contains("response_format") || body["response_format"].is_null()) return std::nullopt;
  const json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad_field("response_format", "'response_format' must be an object with a 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") return grammar::json_object_grammar();
  if (type != "json_schema")
    bad_field("response_format.type",
              "'response_format.type' must be text, json_object or json_schema; got '{}'", type);
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    bad_field("response_format.json_schema", "'response_format.json_schema' must be an object");
  const json& js = rf["json_schema"];
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
    bad_field("response_format.json_schema.strict", "'strict' must be true or false");
  if (!js.contains("schema") || js["schema"].is_null())  // OpenAI: no schema, any JSON
    return grammar::json_object_grammar();
  if (!js["schema"].is_object() && !js["schema"].is_boolean())
    bad_field("response_format.json_schema.schema", "'schema' must be a JSON schema object");
  return compile_schema(js["schema"], "response_format.json_schema.schema");
}

std::string tool_call_grammar(const json& tools, bool parallel) {
  grammar::GbnfBuilder b;
  std::vector<std::string> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    const std::string param = fmt::format("tools[{}].function.parameters", i);
    if (name.find_first_of("<>\n") != std::string::npos)
      bad_field(fmt::format("tools[{}].function.name", i),
                "a forced tool call needs a function name without '<', '>' or newlines");
    const json params = fn.contains("parameters") ? fn["parameters"] : json::object();
    std::string body = grammar::gbnf_literal("<tool_call>\n<function=" + name + ">\n");
    try {
      grammar::SchemaCompiler c(b, params);
      if (params.contains("type") && params["type"] != "object")
        throw grammar::SchemaError("tool parameters must be an object schema");
      for (const char* k : {"anyOf", "oneOf", "allOf", "$ref", "patternProperties"})
        if (params.contains(k))
          throw grammar::SchemaError(
              fmt::format("'{}' at the top of tool parameters is not supported", k));
      std::set<std::string> required;
      if (params.contains("required"))
        for (const auto& r : params["required"]) required.insert(r.get<std::string>());
      const json props = params.contains("properties") ? params["properties"] : json::object();
      for (const auto& r : required)
        if (!props.contains(r))
          throw grammar::SchemaError(
              fmt::format("required parameter '{}' is not in 'properties'", r));
      // Parameters in declaration order: `<parameter=KEY>\nVALUE\n</parameter>\n`; a string
      // value raw (as the template writes it), any other JSON.
      for (const auto& [key, schema] : props.items()) {
        if (key.find_first_of("<>\n") != std::string::npos)
          throw grammar::SchemaError(
              fmt::format("parameter name '{}' cannot appear in a tool call", key));
        const std::string path = "#/properties/" + key;
        const auto types = c.types(schema, path);
        const bool raw = !types.empty() && types.count("string") &&
                         std::all_of(types.begin(), types.end(), [](const std::string& t) {
                           return t == "string" || t == "null";
                         });
        const std::string value = raw ? c.raw_string(schema, path) : c.value(schema, path);
        const std::string item =
            b.add("param", grammar::gbnf_literal("<parameter=" + key + ">\n") + " " + value + " " +
                               grammar::gbnf_literal("\n</parameter>\n"));
        body += ' ';
        body += required.count(key) ? item : "(" + item + ")?";
      }
    } catch (const grammar::SchemaError& e) {
      bad_field(param, "{}", e.what());
    } catch (const json::exception& e) {
      bad_field(param, "malformed tool parameters: {}", e.what());
    }
    body += ' ';
    body += grammar::gbnf_literal("</function>\n</tool_call>");
    calls.push_back(b.add("call", body));
  }
  std::string one;
  for (size_t k = 0; k < calls.size(); ++k) {
    if (k) one += " | ";
    one += calls[k];
  }
  const std::string call = b.add("tool-call", one);
  return b.text(parallel ? call + " (\"\\n\" " + call + ")*" : call);
}

std::shared_ptr<TokenConstraint> grammar_constraint(const std::string& gbnf, const Tokenizer& tok,
                                                    bool open_after_think) {
  int32_t open_after = -1;
  std::string text = gbnf;
  if (open_after_think) {
    auto id = tok.token_id("</think>");
    if (id) open_after = *id;
    // After </think> the model writes a blank line before its answer (as the template renders
    // it): up to two newlines may come first. The start rule is the first line (GbnfBuilder).
    const std::string head = "root ::= ";
    const size_t eol = text.find('\n');
    if (id && text.rfind(head, 0) == 0 && eol != std::string::npos)
      text = head + "[\\n]{0,2} (" + text.substr(head.size(), eol - head.size()) + ")" +
             text.substr(eol);
  }
  std::shared_ptr<grammar::GrammarIndex> index;
  try {
    index = compiled(text, vocabulary(tok));
  } catch (const Error& e) {
    throw ApiError(400, std::string("the requested output format cannot be compiled: ") + e.what());
  }
  return std::make_shared<grammar::GrammarConstraint>(std::move(index), open_after);
}

std::shared_ptr<TokenConstraint> chat_constraint(const std::string& body, const ChatRequest& r,
                                                 const Tokenizer& tok, bool thinking) {
  // Parsed again, ordered: schemas keep their properties' declaration order.
  const json b = json::parse(body, nullptr, false);
  if (b.is_discarded()) return nullptr;  // parse_chat_request already answered 400
  auto format = response_format_grammar(b);
  const bool forced_call =
      r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named;
  if (format && forced_call)
    bad_field(
        "response_format",
        "'response_format' together with a forced tool call ('tool_choice') is not supported");
  if (forced_call) {
    json tools = json::array();  // r.tools (validated, after tool_choice), in declared order
    for (const auto& t : b["tools"])
      if (r.tool_choice == ToolChoice::Required ||
          (t.contains("function") && t["function"].value("name", "") == r.forced_tool))
        tools.push_back(t);
    return grammar_constraint(tool_call_grammar(tools, r.parallel_tool_calls), tok, thinking);
  }
  if (format) return grammar_constraint(*format, tok, thinking);
  return nullptr;
}

std::shared_ptr<TokenConstraint> completion_constraint(const std::string& body,
                                                       const Tokenizer& tok) {
  const json b = json::parse(body, nullptr, false);
  if (b.is_discarded()) return nullptr;
  auto format = response_format_grammar(b);
  return format ? grammar_constraint(*format, tok, false) : nullptr;
}

}  // namespace lilac::server
