// Bounded JSON parsing for everything that reads JSON from outside (request bodies, config.json,
// safetensors headers, tokenizer files). nlohmann-json parses iteratively, but copying, dumping
// and destroying a value recurse once per nesting level, so a body nested 100,000 levels deep
// overflows the stack later, far from the parser. parse_json refuses such input while parsing:
// it counts the depth of the open arrays / objects and stops at `max_depth`, before the value
// exists. It also names the field where a problem is (`tools[0].function.parameters`), so a
// number out of double's range (1e309) is reported against its field.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "util/error.h"

namespace lilac {

// Deep enough for any real JSON schema or config; shallow enough that every recursive walk over
// a parsed value (copy, dump, Jinja conversion) stays far from the stack limit.
inline constexpr size_t kMaxJsonDepth = 128;

struct JsonLimits {
  size_t max_depth = kMaxJsonDepth;
  bool reject_duplicate_keys = false;  // a key twice in one object is an error (else last wins)
};

// A parse failure: what is wrong, and where (`field`: a path like "a.b[2]", empty at the top).
class JsonParseError : public Error {
 public:
  JsonParseError(const std::string& message, std::string field_)
      : Error(message), field(std::move(field_)) {}
  std::string field;
};

// Parses a whole JSON text; throws JsonParseError on malformed JSON, nesting deeper than
// `limits.max_depth`, a number outside double's range, or (when asked) a duplicate key.
nlohmann::json parse_json(std::string_view text, const JsonLimits& limits = {});

}  // namespace lilac
