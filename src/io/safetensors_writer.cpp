#include "io/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace lilac {

using nlohmann::json;

uint64_t PlannedTensor::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

ShardedWriter::ShardedWriter(std::string dir, std::vector<PlannedTensor> plan,
                             uint64_t max_shard_bytes)
    : dir_(std::move(dir)), plan_(std::move(plan)) {
  std::set<std::string> seen;
  uint64_t in_shard = 0;
  size_t shards = 0;
  for (const auto& t : plan_) {
    if (!seen.insert(t.name).second) fail("{}: tensor '{}' planned twice", dir_, t.name);
    // mlx-lm's make_shards, except that it never leaves an empty shard in front of a tensor
    // larger than the limit.
    if (shards == 0 || (in_shard > 0 && in_shard + t.nbytes() > max_shard_bytes)) {
      ++shards;
      in_shard = 0;
    }
    in_shard += t.nbytes();
    total_ += t.nbytes();
    shard_of_.push_back(shards - 1);
  }
  for (size_t s = 0; s < std::max<size_t>(shards, 1); ++s)
    shard_files_.push_back(shards <= 1
                               ? "model.safetensors"
                               : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards));
  if (plan_.empty()) open_shard(0);
}

ShardedWriter::~ShardedWriter() {
  if (file_) std::fclose(file_);
}

void ShardedWriter::open_shard(size_t s) {
  close_shard();
  json header = json::object();
  header["__metadata__"] = {{"format", "mlx"}};
  uint64_t offset = 0;
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (shard_of_[i] != s) continue;
    const auto& t = plan_[i];
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';  // data starts 8-byte aligned
  const std::string path = (std::filesystem::path(dir_) / shard_files_[s]).string();
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, file_) != 8 ||
      std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    fail("{}: write failed: {}", path, std::strerror(errno));
  open_ = s;
}

void ShardedWriter::close_shard() {
  if (!file_) return;
  const std::string path = (std::filesystem::path(dir_) / shard_files_[open_]).string();
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) fail("{}: write failed: {}", path, std::strerror(errno));
}

void ShardedWriter::write(const std::string& name, std::span<const uint8_t> bytes) {
  if (next_ >= plan_.size()) fail("{}: tensor '{}' written after the last planned one", dir_, name);
  const auto& t = plan_[next_];
  if (t.name != name) fail("{}: tensor '{}' written where '{}' was planned", dir_, name, t.name);
  if (bytes.size() != t.nbytes())
    fail("{}: tensor '{}' has {} bytes, its plan {}", dir_, name, bytes.size(), t.nbytes());
  if (open_ != shard_of_[next_]) open_shard(shard_of_[next_]);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size())
    fail("{}/{}: write failed: {}", dir_, shard_files_[open_], std::strerror(errno));
  written_ += bytes.size();
  ++next_;
}

void ShardedWriter::finish(int64_t total_parameters) {
  if (next_ != plan_.size())
    fail("{}: {} of {} planned tensors were written", dir_, next_, plan_.size());
  close_shard();
  json index;
  index["metadata"] = {{"total_size", total_}, {"total_parameters", total_parameters}};
  json map = json::object();  // nlohmann's object keeps keys sorted, as mlx-lm sorts weight_map
  for (size_t i = 0; i < plan_.size(); ++i) map[plan_[i].name] = shard_files_[shard_of_[i]];
  index["weight_map"] = map;
  const std::string path = (std::filesystem::path(dir_) / "model.safetensors.index.json").string();
  std::ofstream out(path);
  out << index.dump(4) << "\n";
  if (!out) fail("{}: write failed", path);
}

}  // namespace lilac
