// `lilac tokenize (--tokenizer FILE | --model DIR) [--json] [--decode] [--no-special]
// [--skip-special]`: text on stdin -> ids, or with --decode ids -> text.
//   plain:  stdin is the text; prints the ids space-separated on one line.
//   --json: stdin is a JSON array of strings; prints a JSON array of id arrays.
//   --decode: stdin is ids separated by white space (or, with --json, a JSON array of id arrays,
//           printing a JSON array of strings, ill-formed UTF-8 replaced by U+FFFD).
// --model DIR uses the directory's files and rules (Qwen3.5 regex for model_type qwen3_5*).
// Bad input (not UTF-8, not JSON, an unknown id) is an error naming what is wrong: exit 1.
#include <cctype>
#include <climits>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

using nlohmann::json;

struct TokenizeArgs {
  std::string tokenizer, model;
  bool json = false, decode = false, no_special = false, skip_special = false;
};

std::string read_stdin() {
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) fail("cannot read standard input");
  return s;
}

json parse_json(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("standard input is not valid JSON: {}", e.what());
  }
}

std::vector<int32_t> ids_from_json(const json& arr, size_t index) {
  if (!arr.is_array()) fail("item {} of the input is not an array of ids", index);
  std::vector<int32_t> ids;
  for (const json& v : arr) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      fail("item {} of the input: {} is not a token id", index, v.dump());
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return ids;
}

std::vector<int32_t> ids_from_text(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    std::string word = text.substr(i, j - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < INT32_MIN || v > INT32_MAX)
      fail("\"{}\" at byte {} of the input is not a token id", word, i);
    ids.push_back(int32_t(v));
    i = j;
  }
  return ids;
}

int run_tokenize(const TokenizeArgs& a) {
  if (a.tokenizer.empty() == a.model.empty()) fail("give exactly one of --tokenizer and --model");
  auto tok =
      a.model.empty() ? Tokenizer::from_file(a.tokenizer) : Tokenizer::from_model_dir(a.model);
  std::string input = read_stdin();
  std::string out;
  if (!a.decode && !a.json) {
    auto ids = tok->encode(input, !a.no_special);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += "\n";
  } else if (!a.decode) {
    json in = parse_json(input);
    if (!in.is_array()) fail("with --json, standard input must be a JSON array of strings");
    json result = json::array();
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].is_string()) fail("item {} of the input is not a string", i);
      result.push_back(tok->encode(in[i].get<std::string>(), !a.no_special));
    }
    out = result.dump() + "\n";
  } else if (!a.json) {
    out = tok->decode(ids_from_text(input), a.skip_special);
  } else {
    json in = parse_json(input);
    if (!in.is_array())
      fail("with --json --decode, standard input must be a JSON array of id arrays");
    json result = json::array();
    for (size_t i = 0; i < in.size(); ++i)
      result.push_back(tok->decode(ids_from_json(in[i], i), a.skip_special));
    out = result.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

const Command kTokenize{
    "tokenize", "Text on stdin to token ids (or ids to text with --decode)", [](CLI::App& app) {
      auto args = std::make_shared<TokenizeArgs>();
      auto* t = app.add_option("--tokenizer", args->tokenizer, "tokenizer.json (may be gzipped)");
      auto* m =
          app.add_option("--model", args->model, "Model directory (its tokenizer files and rules)");
      t->excludes(m);
      app.add_flag("--json", args->json, "JSON array in, JSON array out");
      app.add_flag("--decode", args->decode, "Ids in, text out");
      app.add_flag("--no-special", args->no_special,
                   "Encode added/special token strings as plain text");
      app.add_flag("--skip-special", args->skip_special, "Leave special tokens out when decoding");
      return Runner([args] { return run_tokenize(*args); });
    }};

}  // namespace
}  // namespace lilac::cli
