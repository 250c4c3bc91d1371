// make_demo_tokenizer: the demo model's tokenizer (models/demo), a 512-id byte-level BPE in the
// Qwen3.5 format, trained on the first 200 KB of tests/data/tokenizer/tok_bench.txt.
//
//   make_demo_tokenizer CORPUS OUT_DIR          writes OUT_DIR/{tokenizer.json,
//                                               tokenizer_config.json, generation_config.json}
//   make_demo_tokenizer --check CORPUS OUT_DIR  exit 1 unless OUT_DIR holds exactly that output
//
// Regenerate: build/ci/make_demo_tokenizer tests/data/tokenizer/tok_bench.txt models/demo
//
// Ids (the demo weights are the tiny-a fixture: vocab 512, eos 511):
//   0..255    the 256 byte tokens, id = byte value
//   256..502  merges, most frequent pair first (ties: the pair whose bytes sort first)
//   503..511  added tokens: <tool_call> </tool_call> <tool_response> </tool_response> <think>
//             </think> <|im_start|> <|endoftext|> (510) <|im_end|> (511, the eos)
// Training pre-tokenizes exactly as the tokenizer will (NFC, the Qwen3.5 regex), so the merges
// are ones the encoder can reach. Output is deterministic: --check runs as a test.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace {

using lilac::fail;
using ojson = nlohmann::ordered_json;

constexpr size_t kCorpusBytes = 200000;
constexpr int32_t kVocab = 512;
struct Special {
  const char* content;
  bool special;
};
// In id order, ending at kVocab - 1. "special" as in the Qwen3 files: only the ChatML markers.
constexpr Special kSpecials[] = {
    {"<tool_call>", false},      {"</tool_call>", false}, {"<tool_response>", false},
    {"</tool_response>", false}, {"<think>", false},      {"</think>", false},
    {"<|im_start|>", true},      {"<|endoftext|>", true}, {"<|im_end|>", true}};
constexpr int32_t kNumSpecials = int32_t(std::size(kSpecials));
constexpr int32_t kFirstSpecial = kVocab - kNumSpecials;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Trained {
  std::vector<std::string> tokens;                  // id -> bytes, ids [0, kFirstSpecial)
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
};

Trained train(std::string corpus) {
  corpus.resize(std::min(corpus.size(), kCorpusBytes));
  corpus.resize(lilac::unicode::complete_utf8_prefix(corpus));
  if (size_t bad = lilac::unicode::first_invalid_utf8(corpus); bad != std::string::npos)
    fail("the corpus is not UTF-8 (byte offset {})", bad);
  corpus = lilac::unicode::nfc(corpus);

  std::map<std::string, int64_t> counts;  // ordered: the training is deterministic
  lilac::tok::RegexSplitter splitter(lilac::tok::kQwen35Regex);
  splitter.split(corpus, [&](std::string_view p) { ++counts[std::string(p)]; });
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [w, n] : counts) {
    words.emplace_back(w.begin(), w.end());
    for (int32_t& c : words.back()) c = int32_t(uint8_t(c));
    freq.push_back(n);
  }

  Trained t;
  for (int b = 0; b < 256; ++b) t.tokens.emplace_back(1, char(b));
  std::unordered_map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) ids[t.tokens[b]] = b;
  while (int32_t(t.tokens.size()) < kFirstSpecial) {
    std::unordered_map<uint64_t, int64_t> pairs;
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i)
        pairs[uint64_t(words[w][i]) << 32 | uint32_t(words[w][i + 1])] += freq[w];
    uint64_t best = 0;
    int64_t best_n = 0;
    for (const auto& [key, n] : pairs) {
      auto bytes = [&](uint64_t k) {
        return std::make_pair(t.tokens[k >> 32], t.tokens[uint32_t(k)]);
      };
      if (n > best_n || (n == best_n && bytes(key) < bytes(best))) {
        best = key;
        best_n = n;
      }
    }
    if (best_n < 2) fail("the corpus is too small: no pair occurs twice");
    int32_t a = int32_t(best >> 32), b = int32_t(uint32_t(best));
    std::string merged = t.tokens[a] + t.tokens[b];
    // The same bytes may already be a token (reached by other pairs): the merge then reuses it.
    auto [it, fresh] = ids.try_emplace(merged, int32_t(t.tokens.size()));
    if (fresh) t.tokens.push_back(merged);
    t.merges.emplace_back(a, b);
    for (auto& w : words) {
      size_t o = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          w[o++] = it->second;
          ++i;
        } else {
          w[o++] = w[i];
        }
      }
      w.resize(o);
    }
  }
  return t;
}

ojson added_entry(int32_t id, const Special& s) {
  return {{"id", id},        {"content", s.content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false},  {"special", s.special}};
}

std::map<std::string, std::string> render(const Trained& t) {
  const auto& bl = lilac::tok::byte_level();
  ojson byte_level = {{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", false},
                      {"use_regex", false}};
  ojson vocab = ojson::object();
  for (size_t id = 0; id < t.tokens.size(); ++id) vocab[bl.to_chars(t.tokens[id])] = id;
  ojson merges = ojson::array();
  for (auto [a, b] : t.merges)
    merges.push_back({bl.to_chars(t.tokens[a]), bl.to_chars(t.tokens[b])});
  ojson added = ojson::array(), decoder_map = ojson::object();
  for (int32_t i = 0; i < kNumSpecials; ++i) {
    added.push_back(added_entry(kFirstSpecial + i, kSpecials[i]));
    ojson e = added.back();
    e.erase("id");
    decoder_map[std::to_string(kFirstSpecial + i)] = e;
  }
  ojson tok = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", {{"type", "NFC"}}},
               {"pre_tokenizer",
                {{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "Split"},
                    {"pattern", {{"Regex", lilac::tok::kQwen35Regex}}},
                    {"behavior", "Isolated"},
                    {"invert", false}},
                   byte_level}}}},
               {"post_processor", byte_level},
               {"decoder", byte_level},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", false},
                 {"vocab", vocab},
                 {"merges", merges}}}};
  ojson config = {{"add_bos_token", false},
                  {"add_prefix_space", false},
                  {"added_tokens_decoder", decoder_map},
                  {"bos_token", nullptr},
                  {"clean_up_tokenization_spaces", false},
                  {"eos_token", "<|im_end|>"},
                  {"errors", "replace"},
                  {"model_max_length", 262144},
                  {"pad_token", "<|endoftext|>"},
                  {"split_special_tokens", false},
                  {"tokenizer_class", "Qwen2Tokenizer"},
                  {"unk_token", nullptr}};
  ojson gen = {{"eos_token_id", {kVocab - 1, kVocab - 2}}, {"pad_token_id", kVocab - 2}};
  auto text = [](const ojson& j) { return j.dump(2, ' ', false) + "\n"; };
  return {{"tokenizer.json", text(tok)},
          {"tokenizer_config.json", text(config)},
          {"generation_config.json", text(gen)}};
}

int run(int argc, char** argv) {
  bool check = argc == 4 && std::string(argv[1]) == "--check";
  if (argc != 3 && !check) {
    std::fprintf(stderr, "usage: make_demo_tokenizer [--check] CORPUS OUT_DIR\n");
    return 2;
  }
  std::string corpus = argv[argc - 2], out = argv[argc - 1];
  auto files = render(train(read_all(corpus)));
  int bad = 0;
  for (const auto& [name, text] : files) {
    std::string path = out + "/" + name;
    if (check) {
      std::ifstream f(path, std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      if (!f || ss.str() != text) {
        std::fprintf(stderr, "%s differs from what make_demo_tokenizer generates\n", path.c_str());
        ++bad;
      }
    } else {
      std::ofstream f(path, std::ios::binary);
      f << text;
      if (!f) fail("{}: cannot write", path);
    }
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const lilac::Error& e) {
    std::fprintf(stderr, "make_demo_tokenizer: %s\n", e.what());
    return 1;
  }
}
