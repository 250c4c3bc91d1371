// A checkpoint written tensor by tensor without holding it in memory: the list of tensors (names,
// dtypes, shapes) is known first, split into shards, and each shard's header is written before
// its data, which then arrives one tensor at a time in plan order. The layout follows mlx-lm's
// save_model (mlx_lm/utils.py): a new shard starts when the next tensor would take the current
// one past max_shard_bytes; one shard is `model.safetensors`, more are
// `model-0000N-of-0000M.safetensors`; `model.safetensors.index.json` holds
// {"metadata": {"total_size", "total_parameters"}, "weight_map": {name: shard}} sorted by name;
// every shard's metadata is {"format": "mlx"}.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "model/dtype.h"

namespace lilac {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

class ShardedWriter {
 public:
  // `dir` must exist. Throws lilac::Error on a duplicate name or an I/O error.
  ShardedWriter(std::string dir, std::vector<PlannedTensor> plan, uint64_t max_shard_bytes);
  ~ShardedWriter();
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;

  // Writes the next tensor of the plan; `name` and the byte count must match it.
  void write(const std::string& name, std::span<const uint8_t> bytes);
  // After the last tensor: closes the last shard and writes the index.
  void finish(int64_t total_parameters);

  size_t shard_count() const { return shard_files_.size(); }
  const std::vector<std::string>& shard_files() const { return shard_files_; }
  uint64_t total_bytes() const { return total_; }
  uint64_t bytes_written() const { return written_; }

 private:
  void open_shard(size_t s);
  void close_shard();

  std::string dir_;
  std::vector<PlannedTensor> plan_;
  std::vector<size_t> shard_of_;          // plan index -> shard
  std::vector<std::string> shard_files_;  // shard -> file name
  size_t next_ = 0;                       // next plan index to write
  size_t open_ = SIZE_MAX;                // shard currently open
  std::FILE* file_ = nullptr;
  uint64_t total_ = 0, written_ = 0;
};

}  // namespace lilac
