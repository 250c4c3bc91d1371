// Where the tests find their data (copied into the repo from the HF fixtures) and scratch space.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lilac::test {

// The build-time location, unless LILAC_TEST_DATA overrides it at run time (the GPU machine runs
// binaries built elsewhere, over a copy of the repository at another path).
inline std::string data_root() {
  const char* env = std::getenv("LILAC_TEST_DATA");
  return env && *env ? env : LILAC_TEST_DATA;
}
inline std::string data_path(const std::string& rel) {
  return data_root() + "/" + rel;
}
// The bundled demo model (models/demo), beside the test data in the repository.
inline std::string demo_model_dir() {
  return data_root() + "/../../models/demo";
}

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& rel = "") const {
    return rel.empty() ? path_.string() : (path_ / rel).string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace lilac::test
