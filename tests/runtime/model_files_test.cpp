// The text files a model directory holds besides config.json and the shards (the tokenizer, the
// chat template, generation_config.json): a FIFO or a link to /dev/zero in their place is a clear
// error at once, never a hang (issue 10, item 8, beyond the files the issue named); a gzipped
// tokenizer that inflates without bound is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "../error_within.h"
#include "../test_data.h"
#include "chat/chat_template.h"
#include "runtime/model_setup.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace lilac::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Replaces `path` by a FIFO or a link to /dev/zero.
void make_special(const std::string& path, const std::string& kind) {
  std::error_code ec;
  fs::remove(path, ec);
  if (kind == "fifo")
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  else
    fs::create_symlink("/dev/zero", path);
}

TEST(ModelFiles, TokenizerAsFifoOrDevZeroIsRefused) {
  for (const std::string kind : {"fifo", "devzero"}) {
    TempDir tmp;
    const std::string file = tmp.str("tokenizer.json");
    make_special(file, kind);
    EXPECT_THAT(error_within_seconds([&] { Tokenizer::from_file(file); }),
                HasSubstr("not a regular file"))
        << kind;
  }
}

TEST(ModelFiles, ChatTemplateAndGenerationConfigAsFifoOrDevZeroAreRefused) {
  for (const std::string kind : {"fifo", "devzero"}) {
    for (const std::string name : {"chat_template.jinja", "generation_config.json"}) {
      TempDir tmp;
      const std::string dir = tmp.str("model");
      fs::create_directories(dir);
      make_special(dir + "/" + name, kind);
      const std::string what = error_within_seconds([&] {
        if (name == "chat_template.jinja")
          ChatTemplate::from_model_dir(dir);
        else
          runtime::load_generation_defaults(dir);
      });
      EXPECT_THAT(what, HasSubstr("not a regular file")) << kind << " " << name;
    }
  }
}

TEST(ModelFiles, GzipTokenizerThatInflatesWithoutBoundIsRefused) {
  // 80 MiB of zeros gzip to ~80 KB; the reader stops at its 64 MiB bound.
  TempDir tmp;
  const std::string file = tmp.str("tokenizer.json.gz");
  gzFile gz = gzopen(file.c_str(), "wb1");
  ASSERT_NE(gz, nullptr);
  const std::string zeros(size_t(1) << 20, '\0');
  for (int i = 0; i < 80; ++i)
    ASSERT_EQ(gzwrite(gz, zeros.data(), unsigned(zeros.size())), int(zeros.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
  EXPECT_THAT(error_within_seconds([&] { Tokenizer::from_file(file); }),
              HasSubstr("inflates to more than 64 MiB"));
}

}  // namespace
}  // namespace lilac::test
