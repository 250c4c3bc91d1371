// Exactness against HF `tokenizers` (tests/data/tokenizer/tokenizer-golden.json) and against
// transformers' chat renders (chat-golden-qwen3{5,6}.json).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/unicode.h"
#include "tokenizer_fixtures.h"

namespace lilac::test {
namespace {

using nlohmann::json;

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

void check_variant(const Tokenizer& tok, const char* variant) {
  const json& g = tokenizer_golden();
  const json& strings = g["strings"];
  const json& ids = g["variants"][variant]["ids"];
  ASSERT_EQ(strings.size(), 80u);
  ASSERT_EQ(ids.size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    std::string s = strings[i].get<std::string>();
    std::vector<int32_t> want = ids_of(ids[i]);
    EXPECT_EQ(tok.encode(s), want) << variant << " string " << i << ": " << json(s).dump();
    EXPECT_EQ(tok.decode(want), unicode::nfc(s)) << variant << " string " << i;
  }
}

TEST(TokenizerGolden, Qwen3RegexMatchesHf) {
  check_variant(qwen3_tokenizer(), "qwen3_regex");
}

TEST(TokenizerGolden, Qwen35RegexMatchesHf) {
  check_variant(qwen35_tokenizer(), "qwen35_regex");
}

// The two variants really differ (on the strings with combining marks), so the option is live.
TEST(TokenizerGolden, VariantsDiffer) {
  const json& g = tokenizer_golden();
  int differ = 0;
  for (size_t i = 0; i < g["strings"].size(); ++i) {
    std::string s = g["strings"][i].get<std::string>();
    differ += qwen3_tokenizer().encode(s) != qwen35_tokenizer().encode(s);
  }
  EXPECT_GE(differ, 3);
}

// from_model_dir: model_type qwen3_5* selects the Qwen3.5 regex even though the json carries the
// old one; other model types keep the file's. Also reads a gzipped tokenizer.json by content.
TEST(TokenizerGolden, ModelDirPicksRegexByModelType) {
  const json& g = tokenizer_golden();
  const std::string thai = g["strings"][51].get<std::string>();
  for (const char* type : {"qwen3_5_moe", "qwen3_5", "qwen3"}) {
    TempDir dir;
    std::filesystem::copy_file(qwen3_tokenizer_path(), dir.str("tokenizer.json"));
    std::filesystem::copy_file(data_path("tokenizer/qwen3-tokenizer_config.json"),
                               dir.str("tokenizer_config.json"));
    std::ofstream(dir.str("config.json")) << json{{"model_type", type}}.dump();
    auto tok = Tokenizer::from_model_dir(dir.str());
    const char* variant =
        std::string(type).rfind("qwen3_5", 0) == 0 ? "qwen35_regex" : "qwen3_regex";
    EXPECT_EQ(tok->encode(thai), ids_of(g["variants"][variant]["ids"][51])) << type;
  }
}

// model_type only inside text_config also counts.
TEST(TokenizerGolden, ModelDirReadsTextConfigModelType) {
  const json& g = tokenizer_golden();
  TempDir dir;
  std::filesystem::copy_file(qwen3_tokenizer_path(), dir.str("tokenizer.json"));
  std::ofstream(dir.str("config.json")) << R"({"text_config": {"model_type": "qwen3_5_moe_text"}})";
  auto tok = Tokenizer::from_model_dir(dir.str());
  EXPECT_EQ(tok->encode(g["strings"][52].get<std::string>()),
            ids_of(g["variants"]["qwen35_regex"]["ids"][52]));
}

void check_chat(const char* file) {
  json chat = tok::read_json_file(data_path(std::string("tokenizer/") + file));
  ASSERT_GE(chat["cases"].size(), 15u);
  for (const json& c : chat["cases"]) {
    std::string text = c["rendered"].get<std::string>();
    // The ids were made with qwen3-tokenizer.json as is (Qwen3's regex).
    EXPECT_EQ(qwen3_tokenizer().encode(text, true), ids_of(c["ids"])) << file << ": " << c["name"];
    EXPECT_EQ(qwen3_tokenizer().decode(ids_of(c["ids"])), text) << c["name"];
  }
}

TEST(TokenizerGolden, ChatRendersQwen36) {
  check_chat("chat-golden-qwen36.json");
}
TEST(TokenizerGolden, ChatRendersQwen35) {
  check_chat("chat-golden-qwen35.json");
}

}  // namespace
}  // namespace lilac::test
