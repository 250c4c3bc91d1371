// Replays every committed fuzz input (fuzz/corpus/<target>/: the seeds; fuzz/regressions/
// <target>/: inputs that once crashed a target) through the fuzz targets' code, in every build,
// so a fixed finding stays fixed without clang or libFuzzer. Under the asan preset this is the
// same check the fuzzer makes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "../../fuzz/fuzz_targets.h"

namespace lilac::test {
namespace {

namespace fs = std::filesystem;

size_t replay(const std::string& target, const std::function<void(const uint8_t*, size_t)>& f) {
  size_t n = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(LILAC_SOURCE_DIR) / "fuzz" / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().filename().string().front() == '.') continue;
      std::ifstream in(e.path(), std::ios::binary);
      const std::string bytes{std::istreambuf_iterator<char>(in), {}};
      SCOPED_TRACE(e.path().string());
      f(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++n;
    }
  }
  return n;
}

TEST(FuzzCorpus, Safetensors) {
  EXPECT_GT(replay("safetensors", fuzz::safetensors), 0u);
}
TEST(FuzzCorpus, ModelConfig) {
  EXPECT_GT(replay("model_config", fuzz::model_config), 0u);
}
TEST(FuzzCorpus, Request) {
  EXPECT_GT(replay("request", fuzz::request), 0u);
}
TEST(FuzzCorpus, Tokenizer) {
  EXPECT_GT(replay("tokenizer", fuzz::tokenizer), 0u);
}
TEST(FuzzCorpus, Jinja) {
  EXPECT_GT(replay("jinja", fuzz::jinja), 0u);
}

}  // namespace
}  // namespace lilac::test
