// Shared, load-once tokenizers for the tokenizer tests (loading the 151k-token fixture takes a
// few hundred ms; the tokenizer is immutable and thread-safe, so sharing is sound).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace lilac::test
