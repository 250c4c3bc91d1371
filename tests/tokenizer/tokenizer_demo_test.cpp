// The demo model's tokenizer (models/demo, made by tools/make_demo_tokenizer.cpp) fits the demo
// weights (the tiny-a fixture: vocab 512, eos 511) and works as a chat tokenizer.
#include <gtest/gtest.h>

#include <random>

#include "../test_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_file.h"
#include "tokenizer/unicode.h"

namespace lilac::test {
namespace {

const Tokenizer& demo() {
  static const auto tok = Tokenizer::from_model_dir(std::string(LILAC_SOURCE_DIR) + "/models/demo");
  return *tok;
}

TEST(TokenizerDemo, FitsTheDemoWeights) {
  nlohmann::json cfg = tok::read_json_file(data_path("tiny-a/config.json"));
  int32_t vocab = cfg["text_config"]["vocab_size"].get<int32_t>();
  int32_t eos = cfg["text_config"]["eos_token_id"].get<int32_t>();
  EXPECT_EQ(demo().size(), vocab);
  EXPECT_EQ(demo().token_id("<|im_end|>"), eos);
  EXPECT_EQ(demo().token_id("<|endoftext|>"), eos - 1);
  EXPECT_EQ(demo().eos_ids(), (std::vector<int32_t>{eos, eos - 1}));
  for (const char* s : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"})
    EXPECT_TRUE(demo().is_special(*demo().token_id(s))) << s;
  for (const char* s : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                        "</tool_response>"}) {
    auto id = demo().token_id(s);
    ASSERT_TRUE(id.has_value()) << s;
    EXPECT_GE(*id, vocab - 9);
    EXPECT_EQ(demo().encode(s), std::vector<int32_t>{*id});
  }
  for (int b = 0; b < 256; ++b) EXPECT_EQ(demo().token_id(std::string(1, char(b))), b);
}

TEST(TokenizerDemo, EncodesChat) {
  const Tokenizer& t = demo();
  std::string text =
      "<|im_start|>user\nWhat is the license?<|im_end|>\n<|im_start|>assistant\n<think>\n";
  std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids.front(), *t.token_id("<|im_start|>"));
  EXPECT_EQ(ids.back(), t.encode("\n").back());
  EXPECT_EQ(ids[ids.size() - 2], *t.token_id("<think>"));
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode(ids, true), "user\nWhat is the license?\nassistant\n<think>\n");
  // Merges are in use: common English takes fewer ids than bytes.
  std::string english = " the license of the program";
  EXPECT_LT(t.encode(english).size(), english.size() / 2);
}

TEST(TokenizerDemo, RandomTextRoundTripsWithinVocab) {
  std::mt19937_64 rng(7);
  const std::u32string pool =
      U"abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .,;:!?'\"()[]{}<>|\n\r\t\u00A0\u3000"
      U"\u00E9\u0301\u0308\u4E2D\u6587\u0416\u03A9\U0001F600\u200D\U0001F469\u180E";
  for (int i = 0; i < 500; ++i) {
    std::string s;
    for (int n = int(rng() % 60); n > 0; --n) unicode::append_utf8(s, pool[rng() % pool.size()]);
    std::vector<int32_t> ids = demo().encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < demo().size()) << id;
    ASSERT_EQ(demo().decode(ids), unicode::nfc(s));
  }
}

}  // namespace
}  // namespace lilac::test
