// Small hand-made tokenizer.json files: both merge spellings, merge order and ties, added-token
// options, ignore_merges, and every kind of defect refused with a lilac::Error naming the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// GPT-2's byte-to-unicode image of byte b (independent of the implementation's table).
std::string byte_char(int b) {
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int n = 0;
  if (!printable)
    for (int x = 0; x < b; ++x)
      n += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
  std::string s;
  unicode::append_utf8(s, printable ? char32_t(b) : char32_t(256 + n));
  return s;
}

// Byte tokens are ids 0..255 (id = byte); `extra` vocab entries follow from 256.
json mini(const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  return {
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array()},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", merges}}}};
}

class TokenizerFile : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> load(const json& j) {
    std::string path = dir_.str(fmt::format("t{}.json", n_++));
    std::ofstream(path) << j.dump();
    return Tokenizer::from_file(path);
  }
  // The error message a defective file gives (it must name the file).
  std::string error_of(const std::string& text) {
    std::string path = dir_.str(fmt::format("bad{}.json", n_++));
    std::ofstream(path, std::ios::binary) << text;
    try {
      Tokenizer::from_file(path);
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(path));
      return e.what();
    }
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    return "";
  }
  TempDir dir_;
  int n_ = 0;
};

TEST_F(TokenizerFile, MergeSpellingsAgree) {
  std::vector<std::string> extra = {"ab", "abc", byte_char(' ') + "ab"};
  auto strings = load(mini(extra, json::array({"a b", "ab c", byte_char(' ') + " ab"})));
  auto pairs = load(mini(extra, json::array({{"a", "b"}, {"ab", "c"}, {byte_char(' '), "ab"}})));
  for (const char* text : {"abc", " abc", "cab abab", "xyz"}) {
    EXPECT_EQ(strings->encode(text), pairs->encode(text)) << text;
    EXPECT_EQ(strings->decode(strings->encode(text)), text);
  }
  EXPECT_EQ(strings->encode("abc"), std::vector<int32_t>{257});
  EXPECT_EQ(strings->encode(" ab"), std::vector<int32_t>{258});
  // (" ", "ab") ranks after ("ab", "c"): " abc" becomes " " + "abc".
  EXPECT_EQ(strings->encode(" abc"), (std::vector<int32_t>{' ', 257}));
}

TEST_F(TokenizerFile, RankOrderAndLeftmostTies) {
  // "b c" outranks "a b": "abc" -> a + bc.
  auto t = load(mini({"ab", "bc"}, json::array({"b c", "a b"})));
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{'a', 257}));
  // One merge for "aa": "aaa" -> aa + a (the leftmost pair first), "aaaa" -> aa + aa.
  auto u = load(mini({"aa"}, json::array({"a a"})));
  EXPECT_EQ(u->encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(u->encode("aaaa"), (std::vector<int32_t>{256, 256}));
}

TEST_F(TokenizerFile, IgnoreMerges) {
  json j = mini({"ac"}, json::array());
  EXPECT_EQ(load(j)->encode("ac"), (std::vector<int32_t>{'a', 'c'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j)->encode("ac"), std::vector<int32_t>{256});
}

TEST_F(TokenizerFile, AddedTokenOptions) {
  json j = mini({}, json::array());
  j["added_tokens"] = json::array(
      {{{"id", 300}, {"content", "<L>"}, {"special", true}, {"lstrip", true}},
       {{"id", 301}, {"content", "<R>"}, {"special", true}, {"rstrip", true}},
       {{"id", 302}, {"content", "\xC3\xA9!"}, {"special", false}, {"normalized", true}},
       {{"id", 303}, {"content", "<"}, {"special", false}, {"normalized", false}},
       {{"id", 304}, {"content", "<LL>"}, {"special", false}, {"normalized", false}}});
  auto t = load(j);
  EXPECT_EQ(t->size(), 305);
  EXPECT_EQ(t->encode("x \xE3\x80\x80 <L>y"), (std::vector<int32_t>{'x', 300, 'y'}));
  EXPECT_EQ(t->encode("x<R> \n y"), (std::vector<int32_t>{'x', 301, 'y'}));
  // normalized: matched after NFC, so the decomposed spelling counts too.
  EXPECT_EQ(t->encode("e\xCC\x81!"), std::vector<int32_t>{302});
  // Longest match at the leftmost position.
  EXPECT_EQ(t->encode("<LL><L"), (std::vector<int32_t>{304, 303, 'L'}));
  // Ids between the vocab and the added tokens exist but decode to nothing.
  EXPECT_EQ(t->decode(std::vector<int32_t>{280}), "");
}

TEST_F(TokenizerFile, GzipIsReadByContent) {
  // The fixture is gzipped; covered by every golden test. Corrupt gzip is an error here.
  std::string gz = "\x1F\x8B\x08\x00garbage-not-deflate";
  EXPECT_THAT(error_of(gz), HasSubstr("gzip"));
  EXPECT_THAT(error_of(std::string("\x1F\x8B", 2)), HasSubstr("gzip"));
}

TEST_F(TokenizerFile, DefectsAreErrors) {
  json good = mini({"ab"}, json::array({"a b"}));
  EXPECT_EQ(load(good)->encode("ab"), std::vector<int32_t>{256});
  auto with = [&](auto edit) {
    json j = good;
    edit(j);
    return error_of(j.dump());
  };
  EXPECT_THAT(error_of(""), HasSubstr("invalid JSON"));
  EXPECT_THAT(error_of(good.dump().substr(0, 500)), HasSubstr("invalid JSON"));
  EXPECT_THAT(error_of("[1, 2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(with([](json& j) { j["model"].erase("vocab"); }), HasSubstr("vocab"));
  EXPECT_THAT(with([](json& j) { j["model"].erase("merges"); }), HasSubstr("merges"));
  EXPECT_THAT(with([](json& j) { j["model"]["merges"] = json::array({"a b c"}); }),
              HasSubstr("merges[0]"));
  EXPECT_THAT(with([](json& j) { j["model"]["merges"] = json::array({"a"}); }),
              HasSubstr("merges[0]"));
  EXPECT_THAT(with([](json& j) { j["model"]["merges"] = json::array({json::array({"a"})}); }),
              HasSubstr("merges[0]"));
  EXPECT_THAT(with([](json& j) { j["model"]["merges"] = json::array({"a q"}); }),
              HasSubstr("not in the vocab"));
  EXPECT_THAT(with([](json& j) { j["model"]["merges"] = json::array({1}); }), HasSubstr("merges"));
  EXPECT_THAT(with([](json& j) { j["model"]["vocab"]["zz"] = "x"; }), HasSubstr("vocab"));
  EXPECT_THAT(with([](json& j) { j["model"]["vocab"]["zz"] = -4; }), HasSubstr("negative"));
  EXPECT_THAT(with([](json& j) { j["model"]["vocab"]["zz"] = 1.5; }), HasSubstr("vocab"));
  EXPECT_THAT(with([](json& j) { j["model"]["vocab"]["zz"] = 3; }), HasSubstr("used twice"));
  EXPECT_THAT(with([](json& j) { j["model"]["vocab"]["zz"] = 1 << 30; }), HasSubstr("too large"));
  EXPECT_THAT(with([](json& j) { j["model"]["type"] = "WordPiece"; }), HasSubstr("model type"));
  EXPECT_THAT(with([](json& j) { j["model"] = 5; }), HasSubstr("model type"));
  EXPECT_THAT(with([](json& j) { j["model"]["byte_fallback"] = true; }),
              HasSubstr("byte_fallback"));
  EXPECT_THAT(with([](json& j) { j["model"]["unk_token"] = "?"; }), HasSubstr("unk_token"));
  EXPECT_THAT(with([](json& j) {
                j["normalizer"] = {{"type", "Lowercase"}};
              }),
              HasSubstr("normalizer"));
  EXPECT_THAT(with([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), HasSubstr("decoder"));
  EXPECT_THAT(with([](json& j) {
                j["pre_tokenizer"] = {{"type", "Whitespace"}};
              }),
              HasSubstr("pre_tokenizer"));
  EXPECT_THAT(with([](json& j) { j["pre_tokenizer"] = nullptr; }), HasSubstr("ByteLevel"));
  EXPECT_THAT(with([](json& j) {
                j["pre_tokenizer"] = {
                    {"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}},
                      {{"type", "ByteLevel"}, {"use_regex", false}}}}};
              }),
              HasSubstr("does not compile"));
  EXPECT_THAT(with([](json& j) {
                j["pre_tokenizer"] = {
                    {"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}},
                      {{"type", "ByteLevel"}, {"use_regex", false}}}}};
              }),
              HasSubstr("Isolated"));
  EXPECT_THAT(with([](json& j) { j["added_tokens"] = 5; }), HasSubstr("added_tokens"));
  EXPECT_THAT(with([](json& j) {
                j["added_tokens"] = {{{"id", "x"}, {"content", "<a>"}}};
              }),
              HasSubstr("added_tokens"));
  EXPECT_THAT(with([](json& j) {
                j["added_tokens"] = {{{"id", 400}, {"content", "<a>"}, {"single_word", true}}};
              }),
              HasSubstr("single_word"));
  EXPECT_THAT(with([](json& j) {
                j["added_tokens"] = {{{"id", 400}, {"content", 3}}};
              }),
              HasSubstr("added_tokens"));
  EXPECT_THAT(with([](json& j) { j["normalizer"] = 7; }), HasSubstr("normalizer"));
}

}  // namespace
}  // namespace lilac::test
