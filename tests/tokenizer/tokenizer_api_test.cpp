// The Tokenizer / StreamDecoder contract on the Qwen3 fixture: added tokens, special ids, eos,
// streaming of split characters, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tokenizer/unicode.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

int32_t id_of(const Tokenizer& tok, const std::string& s) {
  auto id = tok.token_id(s);
  EXPECT_TRUE(id.has_value()) << s;
  return id.value_or(-1);
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(TokenizerApi, SizesAndIdsComeFromTheFile) {
  const Tokenizer& tok = qwen3_tokenizer();
  int32_t max_id = 0;
  for (const auto& [content, id] : qwen3_added_tokens()) {
    EXPECT_EQ(id_of(tok, content), id);
    EXPECT_EQ(tok.token_bytes(id), content);
    max_id = std::max(max_id, id);
  }
  EXPECT_EQ(tok.size(), max_id + 1);
  EXPECT_TRUE(tok.is_special(id_of(tok, "<|im_end|>")));
  EXPECT_TRUE(tok.is_special(id_of(tok, "<|endoftext|>")));
  EXPECT_FALSE(tok.is_special(id_of(tok, "<think>")));  // "special": false in the file
  // Vocab tokens are named by their bytes, not the file's byte-level spelling.
  std::vector<int32_t> hello = tok.encode(" hello");
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(tok.token_id(" hello"), hello[0]);
  EXPECT_EQ(tok.token_bytes(hello[0]), " hello");
  EXPECT_FALSE(tok.is_special(hello[0]));
  EXPECT_FALSE(tok.token_id("\xC4\xA0hello").has_value());
  EXPECT_FALSE(tok.is_special(-1));
  EXPECT_FALSE(tok.is_special(tok.size()));
}

TEST(TokenizerApi, AddedTokensInsideText) {
  const Tokenizer& tok = qwen3_tokenizer();
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  int32_t start = id_of(tok, "<|im_start|>"), end = id_of(tok, "<|im_end|>");
  EXPECT_EQ(tok.encode(text, true), concat({{start}, tok.encode("user\nhi", false), {end}}));
  // As plain text the markers are ordinary characters: no added ids, same text back.
  std::vector<int32_t> plain = tok.encode(text, false);
  EXPECT_THAT(plain, ::testing::Not(::testing::Contains(start)));
  EXPECT_THAT(plain, ::testing::Not(::testing::Contains(end)));
  EXPECT_GT(plain.size(), 6u);
  EXPECT_EQ(tok.decode(plain), text);
  // Non-special added tokens (<think>) are matched with parse_special and not without.
  int32_t think = id_of(tok, "<think>");
  EXPECT_EQ(tok.encode("<think>\n", true), concat({{think}, tok.encode("\n")}));
  EXPECT_THAT(tok.encode("<think>\n", false), ::testing::Not(::testing::Contains(think)));
  // Back to back, and a prefix that is not a token.
  EXPECT_EQ(tok.encode("<|im_end|><|im_end|>"), (std::vector<int32_t>{end, end}));
  EXPECT_EQ(tok.encode("<|im_end"), tok.encode("<|im_end", false));
}

TEST(TokenizerApi, DecodeSkipsSpecialOnRequest) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<int32_t> ids = tok.encode("<|im_start|>assistant\n<think>\nok</think><|im_end|>");
  EXPECT_EQ(tok.decode(ids), "<|im_start|>assistant\n<think>\nok</think><|im_end|>");
  EXPECT_EQ(tok.decode(ids, true), "assistant\n<think>\nok</think>");
}

TEST(TokenizerApi, EosIds) {
  // tokenizer_config's eos_token when there is no generation_config.
  EXPECT_EQ(qwen3_tokenizer().eos_ids(),
            std::vector<int32_t>{id_of(qwen3_tokenizer(), "<|im_end|>")});
  TempDir dir;
  std::filesystem::copy_file(qwen3_tokenizer_path(), dir.str("tokenizer.json"));
  std::filesystem::copy_file(data_path("tokenizer/qwen3-tokenizer_config.json"),
                             dir.str("tokenizer_config.json"));
  std::ofstream(dir.str("generation_config.json")) << R"({"eos_token_id": [151645, 151643]})";
  auto tok = Tokenizer::from_model_dir(dir.str());
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{151645, 151643}));
  std::ofstream(dir.str("generation_config.json")) << R"({"eos_token_id": 7})";
  EXPECT_EQ(Tokenizer::from_model_dir(dir.str())->eos_ids(), std::vector<int32_t>{7});
  std::ofstream(dir.str("generation_config.json")) << R"({"eos_token_id": "x"})";
  EXPECT_THROW(Tokenizer::from_model_dir(dir.str()), Error);
  // No tokenizer_config, no generation_config: no eos.
  EXPECT_TRUE(Tokenizer::from_file(qwen3_tokenizer_path())->eos_ids().empty());
}

TEST(TokenizerApi, Errors) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<int32_t> bad = {1, tok.size()};
  EXPECT_THROW(tok.decode(bad), Error);
  std::vector<int32_t> negative = {-1};
  EXPECT_THROW(tok.decode(negative), Error);
  EXPECT_THROW(tok.token_bytes(tok.size()), Error);
  try {
    tok.encode("ok so far \xC3\x28 then");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("byte offset 10"));
  }
  StreamDecoder d(tok, false);
  EXPECT_THROW(d.push(-3), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  TempDir dir;
  EXPECT_THROW(Tokenizer::from_model_dir(dir.str()), Error);
}

// A character cut across byte tokens comes out only once complete.
TEST(TokenizerApi, StreamWaitsForCompleteCharacters) {
  const Tokenizer& tok = qwen3_tokenizer();
  auto byte = [&](unsigned char b) { return id_of(tok, std::string(1, char(b))); };
  StreamDecoder d(tok, false);
  EXPECT_EQ(d.push(byte('a')), "a");
  EXPECT_EQ(d.push(byte(0xF0)), "");
  EXPECT_EQ(d.push(byte(0x9F)), "");
  EXPECT_EQ(d.push(byte(0x98)), "");
  EXPECT_EQ(d.push(byte(0x80)), "\xF0\x9F\x98\x80");
  // Bytes that can never complete come out at once as U+FFFD.
  EXPECT_EQ(d.push(byte(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte(0xE2)), "");
  EXPECT_EQ(d.push(byte('A')),
            "\xEF\xBF\xBD"
            "A");
  // An unfinished tail is flushed as one U+FFFD.
  EXPECT_EQ(d.push(byte(0xF0)), "");
  EXPECT_EQ(d.push(byte(0x9F)), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
  // Special tokens rendered or skipped.
  StreamDecoder keep(tok, false), skip(tok, true);
  int32_t end = id_of(tok, "<|im_end|>");
  EXPECT_EQ(keep.push(end), "<|im_end|>");
  EXPECT_EQ(skip.push(end), "");
}

// Real multi-token characters (private-use code points: no vocab has them whole), streamed.
TEST(TokenizerApi, StreamRealIds) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::string text = "ok \xF3\xB0\x80\x80\xF3\xB0\x80\x81 done \xF0\x9F\x98\x80";
  std::vector<int32_t> ids = tok.encode(text);
  StreamDecoder d(tok, false);
  std::string out;
  int empty_pushes = 0;
  for (int32_t id : ids) {
    std::string part = d.push(id);
    empty_pushes += part.empty();
    out += part;
  }
  EXPECT_EQ(out + d.flush(), text);
  // A character cut across ids: some push must have returned nothing.
  EXPECT_GT(empty_pushes, 0);
}

// One tokenizer shared by threads (the server's case): the shared piece cache must not mix
// results up. Each thread checks every golden string many times over.
TEST(TokenizerApi, ConcurrentEncodeAgrees) {
  const Tokenizer& tok = qwen35_tokenizer();
  const nlohmann::json& g = tokenizer_golden();
  std::vector<std::string> strings;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < g["strings"].size(); ++i) {
    strings.push_back(g["strings"][i].get<std::string>());
    want.push_back(g["variants"]["qwen35_regex"]["ids"][i].get<std::vector<int32_t>>());
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t k = 0; k < strings.size(); ++k) {
          size_t i = (k * 7 + size_t(t) * 13 + size_t(round)) % strings.size();
          if (tok.encode(strings[i]) != want[i]) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace lilac::test
