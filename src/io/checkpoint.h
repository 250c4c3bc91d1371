// A checkpoint directory: config.json plus one model.safetensors or the shards listed by
// model.safetensors.index.json. Opening validates each file (see safetensors.h) and the shard set;
// binding (load_weights) matches tensor names and shapes against the config and collects every
// problem, so `lilac inspect` can list them all and loading can refuse with all of them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace lilac {

enum class WeightFormat { BF16, FP8, MLX4 };
enum class ExpertLayout { Fused, PerExpert, Mixed, Stacked };
std::string format_name(WeightFormat f);
std::string layout_name(ExpertLayout l);

struct CheckpointTensor {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  const uint8_t* data() const { return file->data(*info); }
};

class Checkpoint {
 public:
  // Opens every shard; throws lilac::Error on a fatal defect (missing shard, a tensor in two
  // shards, a broken file, an index that disagrees with the shards).
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Tensors by their original name (including skipped vision tensors).
  const std::map<std::string, CheckpointTensor>& tensors() const { return tensors_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  WeightFormat format() const;
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, CheckpointTensor> tensors_;
};

struct LoadReport {
  std::vector<std::string> problems;  // each names the tensor and what is wrong
  std::vector<std::string> notes;     // non-fatal observations (skipped vision tensors, ...)
  ExpertLayout layout = ExpertLayout::Fused;
  int64_t tensors_used = 0;
  int64_t parameters = 0;    // language-model parameters bound (MTP included)
  uint64_t bytes = 0;        // bytes of the bound tensors
  std::string quantization;  // quantized checkpoints: scheme, bits, overrides, bits per weight
};

// Maps a checkpoint tensor name to the text model's canonical name ("layers.3.mlp.gate.weight",
// "lm_head.weight", "mtp.fc.weight"), or "" for tensors outside the text model (vision).
std::string canonical_tensor_name(const std::string& name);

// Binds checkpoint tensors to ModelWeights (BF16/F16/F32 checkpoints here, MLX affine quantized
// ones in checkpoint_mlx.cpp). Problems are collected in `report`; the returned weights are only
// usable when report.problems is empty.
ModelWeights bind_weights(const Checkpoint& ckpt, const ModelConfig& cfg, LoadReport& report);

// A loaded model: config, the open checkpoint (owning the mappings the weights point into), and
// the bound weights. load_model throws lilac::Error listing every problem when any is found.
struct Model {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  ModelWeights weights;
  LoadReport report;
  // Buffers the weights point into besides the mapped files (in-memory quantization).
  std::vector<std::vector<uint8_t>> owned;
};
std::unique_ptr<Model> load_model(const std::string& dir);

}  // namespace lilac
