// Shared, load-once tokenizers for the tokenizer tests (loading the 151k-token fixture takes a
// few hundred ms; the tokenizer is immutable and thread-safe, so sharing is sound).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "../test_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_file.h"

namespace lilac::test {

inline std::string qwen3_tokenizer_path() {
  return data_path("tokenizer/qwen3-tokenizer.json.gz");
}

// The fixture as is (Qwen3's regex).
inline const Tokenizer& qwen3_tokenizer() {
  static const auto tok = [] {
    TokenizerFiles files;
    files.tokenizer_json = qwen3_tokenizer_path();
    files.tokenizer_config = data_path("tokenizer/qwen3-tokenizer_config.json");
    return Tokenizer::from_files(files);
  }();
  return *tok;
}

// The fixture with the Qwen3.5/3.6 regex (the fixtures' `qwen35_regex` variant).
inline const Tokenizer& qwen35_tokenizer() {
  static const auto tok = [] {
    TokenizerFiles files;
    files.tokenizer_json = qwen3_tokenizer_path();
    files.tokenizer_config = data_path("tokenizer/qwen3-tokenizer_config.json");
    files.options.force_qwen35_regex = true;
    return Tokenizer::from_files(files);
  }();
  return *tok;
}

inline const nlohmann::json& tokenizer_golden() {
  static const nlohmann::json j = tok::read_json_file(data_path("tokenizer/tokenizer-golden.json"));
  return j;
}

// The fixture's added tokens (content -> id), read from the file itself.
inline const std::vector<std::pair<std::string, int32_t>>& qwen3_added_tokens() {
  static const auto added = [] {
    std::vector<std::pair<std::string, int32_t>> out;
    auto f = tok::parse_tokenizer_json(tok::read_file_maybe_gz(qwen3_tokenizer_path()), "fixture");
    for (const auto& a : f.rest["added_tokens"])
      out.emplace_back(a["content"].get<std::string>(), a["id"].get<int32_t>());
    return out;
  }();
  return added;
}

}  // namespace lilac::test
