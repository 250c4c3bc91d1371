// Reading an HF tokenizer.json fast: the 150k-250k entry vocab and merges are streamed by a SAX
// handler straight into vectors (a DOM of them costs 3x the parse time); the rest of the file,
// a few KB, becomes an ordinary nlohmann::json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace lilac::tok {

// The whole file; gzip data (magic 1f 8b) is inflated transparently. Throws lilac::Error naming
// the path.
std::string read_file_maybe_gz(const std::string& path);

struct TokenizerFile {
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab, in file order
  // model.merges: "a b" strings (split at the one space) or ["a", "b"] pairs.
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;
  nlohmann::json rest;  // the document without model.vocab / model.merges
};

// Parses tokenizer.json text; `name` (the path) is used in error messages.
TokenizerFile parse_tokenizer_json(const std::string& text, const std::string& name);

// Reads a small JSON file (tokenizer_config.json, ...). Throws lilac::Error naming the path.
nlohmann::json read_json_file(const std::string& path);

}  // namespace lilac::tok
