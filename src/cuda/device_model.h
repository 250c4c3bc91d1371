// The model's weights on the GPU, in the layouts of docs/cuda-design.md: one arena allocation,
// fused projection matrices, stacked experts, f32 norm scales. Built from a loaded checkpoint
// (upload) or generated on the device (synthetic full-size model for benchmarks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/config.h"

namespace lilac::cuda {

using bf16 = __nv_bfloat16;

struct DeviceLayer {
  LayerType type = LayerType::GatedDeltaNet;
  const float* input_norm = nullptr;  // [H], 1 + w
  const float* post_norm = nullptr;   // [H], 1 + w
  // Gated DeltaNet
  const bf16* in_proj = nullptr;  // [C + Hv*Dv + 2*Hv, H]: qkv, z, b, a
  const float* conv = nullptr;    // [C, K]
  const float* neg_exp_A = nullptr;  // [Hv]
  const float* dt_bias = nullptr;    // [Hv]
  const float* gdn_norm = nullptr;   // [Dv], plain w
  const bf16* out_proj = nullptr;    // [H, Hv*Dv]
  // Full attention
  const bf16* qkv_proj = nullptr;  // [heads*2*hd + 2*kv*hd, H]: q+gate (per head), k, v
  const float* q_norm = nullptr;   // [hd], 1 + w
  const float* k_norm = nullptr;   // [hd], 1 + w
  const bf16* o_proj = nullptr;    // [H, heads*hd]
  // Mixture of experts
  const bf16* router = nullptr;          // [E + 1, H]: router rows, then shared_expert_gate
  const bf16* gate_up = nullptr;         // [E, 2I, H]
  const bf16* down = nullptr;            // [E, H, I]
  const bf16* shared_gate_up = nullptr;  // [2Is, H]
  const bf16* shared_down = nullptr;     // [H, Is]
};

struct DeviceModel {
  ModelConfig config;
  const bf16* embed = nullptr;       // [V, H]
  const bf16* lm_head = nullptr;     // [V, H]
  const float* final_norm = nullptr;  // [H], 1 + w
  const float* inv_freq = nullptr;    // [R/2] RoPE inverse frequencies
  std::vector<DeviceLayer> layers;
  size_t bytes = 0;  // device memory held
  std::string source;  // "checkpoint DIR" or "synthetic (seed N)"

  DeviceModel() = default;
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;
  ~DeviceModel();
  void* arena = nullptr;            // all weights
  std::vector<void*> owned;         // small separate allocations (inv_freq)
};

// Copies a loaded checkpoint's weights to the GPU (converting F16/F32 matrices to bf16).
std::unique_ptr<DeviceModel> upload_model(const Model& model);

// A model of `config`'s shapes with synthetic weights made on the GPU (synthetic.h's values).
std::unique_ptr<DeviceModel> synthetic_device_model(const ModelConfig& config, uint64_t seed);

// The same synthetic weights on the host for the first `layers` layers (and embed, lm_head, final
// norm): a ModelWeights the CPU backend can run, for GPU-vs-CPU checks at full size.
struct HostSyntheticModel {
  ModelConfig config;  // config with num_hidden_layers = layers
  ModelWeights weights;
  std::vector<std::vector<uint16_t>> bf16_storage;
};
std::unique_ptr<HostSyntheticModel> synthetic_host_model(const ModelConfig& config, uint64_t seed, int64_t layers);

}  // namespace lilac::cuda
