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

// The 4/8-bit (MLX affine, tiled layout of q4_layout.h) forms of a layer's matrices. Each matrix
// is held in exactly one format: BF16 (the pointer in DeviceLayer, this QMatrix empty) or
// quantized (the pointer null, this QMatrix set); the backend dispatches per matrix.
struct DeviceLayerQ {
  QMatrix in_proj, out_proj;            // GDN
  QMatrix qkv_proj, o_proj;             // attention
  QMatrix router;                       // [E + 1, H], 8-bit in MLX checkpoints
  QMatrix gate_up, down;                // stacks [E * 2I, H], [E * H, I]
  QMatrix shared_gate_up, shared_down;  // [2Is, H], [H, Is]
};

struct DeviceLayer {
  LayerType type = LayerType::GatedDeltaNet;
  const float* input_norm = nullptr;  // [H], 1 + w
  const float* post_norm = nullptr;   // [H], 1 + w
  // Gated DeltaNet
  const bf16* in_proj = nullptr;     // [C + Hv*Dv + 2*Hv, H]: qkv, z, b, a
  const float* conv = nullptr;       // [C, K]
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
  DeviceLayerQ q;                        // the quantized matrices (see DeviceLayerQ)
};

struct DeviceModelQ {
  QMatrix embed, lm_head;  // 4-bit when quantized
};

struct DeviceModel {
  ModelConfig config;
  const bf16* embed = nullptr;        // [V, H]
  const bf16* lm_head = nullptr;      // [V, H]
  const float* final_norm = nullptr;  // [H], 1 + w
  const float* inv_freq = nullptr;    // [R/2] RoPE inverse frequencies
  std::vector<DeviceLayer> layers;
  DeviceModelQ q;                  // quantized embed / lm_head (see DeviceLayerQ)
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

// The quantization rule of `--weights q4` for a device matrix of the plan (its name, e.g.
// "layers.3.router", and input dimension): 0 (bf16) when cols % 64 != 0, 8 for the router
// (mlp.gate + shared_expert_gate), else 4.
int q4_bits_for(const std::string& device_name, int64_t cols);

}  // namespace lilac::cuda
