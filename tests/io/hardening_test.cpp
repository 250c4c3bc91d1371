// Checkpoints and configs that must be refused with a clear lilac::Error (issue 10, item 8):
// values outside sane ranges before anything is allocated from them, wrong types, duplicate keys
// inside a safetensors entry, special files (FIFO, /dev/zero) and over-long shard names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../error_within.h"
#include "../test_data.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace lilac::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

json tiny_config() {
  std::ifstream in(data_path("tiny-a/config.json"));
  return json::parse(in);
}

// The error parse_model_config gives after `edit` changes tiny-a's text_config.
std::string config_error(const std::function<void(json&)>& edit) {
  json j = tiny_config();
  edit(j["text_config"]);
  try {
    parse_model_config(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigRanges, TinyConfigStillLoads) {
  EXPECT_EQ(config_error([](json&) {}), "(no error)");
}

TEST(ConfigRanges, HugeSizesAreRefusedNamingTheFieldAndRange) {
  // Before: 1e9 hidden / layers ran `inspect` for minutes at GBs; >= 2^31 overflowed.
  for (const char* key : {"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                          "moe_intermediate_size", "num_experts", "linear_key_head_dim"}) {
    for (int64_t v : {int64_t(1000000000), int64_t(1) << 31, int64_t(1) << 40}) {
      const std::string e = config_error([&](json& t) { t[key] = v; });
      EXPECT_THAT(e, AllOf(HasSubstr(key), HasSubstr("must be an integer from 1 to")))
          << key << "=" << v;
    }
  }
  EXPECT_THAT(config_error([](json& t) { t["hidden_size"] = 1e9; }),
              AllOf(HasSubstr("hidden_size"), HasSubstr("integer")));
  EXPECT_THAT(config_error([](json& t) { t["max_position_embeddings"] = int64_t(1) << 40; }),
              HasSubstr("max_position_embeddings"));
  EXPECT_THAT(config_error([](json& t) { t["num_hidden_layers"] = -3; }),
              HasSubstr("num_hidden_layers"));
}

TEST(ConfigRanges, NormEpsAndRopeThetaMustBePositiveFiniteNumbers) {
  // Before: these loaded and gave all-NaN logits, and "x" silently became the default.
  for (json bad : {json(-1), json(0), json("x"), json(2.0)})
    EXPECT_THAT(config_error([&](json& t) { t["rms_norm_eps"] = bad; }), HasSubstr("rms_norm_eps"))
        << bad.dump();
  for (json bad : {json(0), json(-10000), json("1e7"), json(1e300)})
    EXPECT_THAT(config_error([&](json& t) {
                  if (t.contains("rope_parameters")) t["rope_parameters"]["rope_theta"] = bad;
                  t["rope_theta"] = bad;
                }),
                HasSubstr("rope_theta"))
        << bad.dump();
}

TEST(ConfigRanges, EosTokenIdsMustBeTokenIds) {
  for (json bad : {json(-1), json(512), json(1 << 30), json(1.5), json("2"), json({1, -1})})
    EXPECT_THAT(config_error([&](json& t) { t["eos_token_id"] = bad; }), HasSubstr("eos_token_id"))
        << bad.dump();
  EXPECT_EQ(config_error([](json& t) { t["eos_token_id"] = json::array({1, 511}); }), "(no error)");
}

TEST(ConfigRanges, DeepJsonIsAnErrorNotACrash) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_THROW(parse_model_config(deep, "config.json"), Error);
  json j = tiny_config();
  std::string text = j.dump();
  text.insert(text.size() - 1, ",\"deep\":" + deep);
  EXPECT_THROW(parse_model_config(text, "config.json"), Error);
}

TEST(SafetensorsHeader, DuplicateKeysInsideAnEntryAreRefused) {
  TempDir dir;
  const std::string path = dir.str("t.safetensors");
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"dtype":"I32"}})";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
    out << header << std::string(4, '\0');
  }
  try {
    SafetensorsFile::open(path);
    FAIL() << "accepted a header entry with \"dtype\" twice";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("dtype"), HasSubstr("twice")));
  }
}

TEST(SpecialFiles, FifoAndDeviceFilesAreRefused) {
  TempDir dir;
  const std::string fifo = dir.str("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_within_seconds([&] { read_small_file(fifo); }), HasSubstr("FIFO"));
  EXPECT_THAT(error_within_seconds([&] { MappedFile m(fifo); }), HasSubstr("FIFO"));
  EXPECT_THAT(error_within_seconds([&] { MappedFile m("/dev/zero"); }),
              HasSubstr("character device"));
  EXPECT_THAT(error_within_seconds([&] { read_small_file("/dev/zero"); }),
              HasSubstr("not a regular file"));
}

TEST(SpecialFiles, ConfigJsonAsFifoOrDevZeroLinkIsRefused) {
  for (const char* kind : {"fifo", "devzero"}) {
    TempDir tmp;
    const std::string dir = tmp.str("model");
    fs::copy(data_path("tiny-a"), dir, fs::copy_options::recursive);
    fs::remove(dir + "/config.json");
    if (std::string(kind) == "fifo")
      ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0600), 0);
    else
      fs::create_symlink("/dev/zero", dir + "/config.json");
    EXPECT_THAT(error_within_seconds([&] { load_model_config(dir); }),
                HasSubstr("not a regular file"))
        << kind;
  }
}

TEST(SpecialFiles, ShardAsDevZeroLinkOrFifoIsRefused) {
  for (const char* kind : {"fifo", "devzero"}) {
    TempDir tmp;
    const std::string dir = tmp.str("model");
    fs::copy(data_path("tiny-a"), dir, fs::copy_options::recursive);
    const std::string shard = dir + "/model-00002-of-00002.safetensors";
    fs::remove(shard);
    if (std::string(kind) == "fifo")
      ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
    else
      fs::create_symlink("/dev/zero", shard);
    EXPECT_THAT(error_within_seconds([&] { load_model(dir); }), HasSubstr("not a regular file"))
        << kind;
  }
}

TEST(ShardNames, AnOverLongShardNameIsAClearError) {
  // Before: a filesystem_error escaped (exit 2) from fs::exists on a 5,000-character name.
  TempDir tmp;
  const std::string dir = tmp.str("model");
  fs::copy(data_path("tiny-a"), dir, fs::copy_options::recursive);
  fs::permissions(dir + "/model.safetensors.index.json", fs::perms::owner_write,
                  fs::perm_options::add);
  json index;
  {
    std::ifstream in(dir + "/model.safetensors.index.json");
    index = json::parse(in);
  }
  index["weight_map"].begin().value() = std::string(5000, 'x') + ".safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  std::string what;
  try {
    load_model(dir);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_THAT(what, AllOf(HasSubstr("index.json"), HasSubstr("at most 255")));
}

}  // namespace
}  // namespace lilac::test
