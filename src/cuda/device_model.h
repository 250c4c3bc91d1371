// The model's weights on the GPU, in the layouts of docs/cuda-design.md: one arena allocation,
// fused projection matrices, stacked experts, f32 norm scales. Built from a loaded checkpoint
// (upload) or generated on the device (synthetic full-size model for benchmarks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/q4_layout.h"
#include "model/config.h"
#include "model/synthetic_router.h"
#include "model/weights.h"

namespace lilac::cuda {

using bf16 = __nv_bfloat16;

// How a device matrix is stored: the tag every use of a DeviceMatrix dispatches on.
enum class DeviceFormat : uint8_t {
  Bf16,    // `dense`: bf16 [rows, cols], row-major
  Affine,  // `q`: MLX affine 4/8-bit codes, scales and biases in the tiled layout of q4_layout.h
};

// A tagged reference to one device weight matrix: `format` says which member holds it (the other
// is empty). The backend calls the BF16 launcher or the q4_* one with the same contract.
struct DeviceMatrix {
  DeviceFormat format = DeviceFormat::Bf16;
  const bf16* dense = nullptr;  // format == Bf16
  QMatrix q;                    // format == Affine
  bool affine() const { return format == DeviceFormat::Affine; }
};

struct DeviceLayer {
  LayerType type = LayerType::GatedDeltaNet;
  const float* input_norm = nullptr;  // [H], 1 + w
  const float* post_norm = nullptr;   // [H], 1 + w
  // Gated DeltaNet
  DeviceMatrix in_proj;              // [C + Hv*Dv + 2*Hv, H]: qkv, z, b, a
  const float* conv = nullptr;       // [C, K]
  const float* neg_exp_A = nullptr;  // [Hv]
  const float* dt_bias = nullptr;    // [Hv]
  const float* gdn_norm = nullptr;   // [Dv], plain w
  DeviceMatrix out_proj;             // [H, Hv*Dv]
  // Full attention
  DeviceMatrix qkv_proj;          // [heads*2*hd + 2*kv*hd, H]: q+gate (per head), k, v
  const float* q_norm = nullptr;  // [hd], 1 + w
  const float* k_norm = nullptr;  // [hd], 1 + w
  DeviceMatrix o_proj;            // [H, heads*hd]
  // Mixture of experts
  DeviceMatrix router;          // [E + 1, H]: router rows, then shared_expert_gate (8-bit in MLX)
  DeviceMatrix gate_up;         // [E, 2I, H] (stacked [E * 2I, H])
  DeviceMatrix down;            // [E, H, I] (stacked [E * H, I])
  DeviceMatrix shared_gate_up;  // [2Is, H]
  DeviceMatrix shared_down;     // [H, Is]
};

struct DeviceModel {
  ModelConfig config;
  DeviceMatrix embed;                 // [V, H]
  DeviceMatrix lm_head;               // [V, H]
  const float* final_norm = nullptr;  // [H], 1 + w
  const float* inv_freq = nullptr;    // [R/2] RoPE inverse frequencies
  std::vector<DeviceLayer> layers;
  int64_t quantized_matrices = 0;  // how many device matrices are 4/8-bit
  size_t bytes = 0;                // device memory held
  std::string source;              // "checkpoint DIR" or "synthetic (seed N)"

  DeviceModel() = default;
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;
  ~DeviceModel();
  void* arena = nullptr;     // all weights
  std::vector<void*> owned;  // small separate allocations (inv_freq)
};

// Copies a loaded checkpoint's weights to the GPU (converting F16/F32 matrices to bf16).
// Quantized (MLX affine) matrices stay quantized: their codes, scales and biases are repacked
// into the tiled layout on the device (fused projections must have parts of one bit width, group
// size 64). With `quantize` (`--weights q4` on a float checkpoint) every matrix is quantized on
// the GPU at load exactly as quantize_model_in_memory does on the CPU (bit-identical codes:
// cuda::quantize_mlx): 4 bits, 8 for the router and shared_expert_gate, bf16 where the input
// dimension is not a multiple of 64; the norm multipliers, conv taps, dt_bias and GDN norm are
// rounded to bf16 as MLX stores them.
// `checkpoint_dir` names the weights' source in messages and DeviceModel::source.
std::unique_ptr<DeviceModel> upload_model(const ModelConfig& config, const ModelWeights& weights,
                                          const std::string& checkpoint_dir, bool quantize = false);

// A model of `config`'s shapes with synthetic weights made on the GPU (synthetic.h's values).
// q4: the same bf16 values quantized on the device with the `quantize` rules above (the vectors
// stay f32). router: zipf scales the router rows by expert rank (model/synthetic_router.h).
std::unique_ptr<DeviceModel> synthetic_device_model(
    const ModelConfig& config, uint64_t seed, bool q4 = false,
    SyntheticRouter router = SyntheticRouter::Uniform);

// The same synthetic weights on the host for the first `layers` layers (and embed, lm_head, final
// norm): a ModelWeights the CPU backend can run, for GPU-vs-CPU checks at full size.
// q4: the matrices quantized on the host with mlx_quantize_row (the same codes as the device's).
struct HostSyntheticModel {
  ModelConfig config;  // config with num_hidden_layers = layers
  ModelWeights weights;
  std::vector<std::vector<uint16_t>> bf16_storage;  // bf16 matrices, or scales and biases
  std::vector<std::vector<uint32_t>> code_storage;  // MLX codes (q4)
};
std::unique_ptr<HostSyntheticModel> synthetic_host_model(
    const ModelConfig& config, uint64_t seed, int64_t layers, bool q4 = false,
    SyntheticRouter router = SyntheticRouter::Uniform);

}  // namespace lilac::cuda
