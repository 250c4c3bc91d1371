// Chooses and constructs a backend for a loaded model: "cpu", "cuda", or "auto" (cuda when this
// build has it and a GPU is present, else cpu).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/backend.h"
#include "model/synthetic_router.h"

namespace lilac::runtime {

bool cuda_available();
std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device);
// The same, quantizing a float checkpoint at load when `quantize_at_load`
// (WeightsPlan::quantize_at_load) as `lilac quantize` would: in memory for the CPU backend
// (quantize_model_in_memory, which changes `model`), on the GPU at load for the CUDA backend
// (bit-identical codes; `model` unchanged).
std::unique_ptr<Backend> open_backend(Model& model, const std::string& device,
                                      bool quantize_at_load);
// The full-size Qwen3.6-35B-A3B with random weights generated on the device (no file); `weights`
// "bf16" or "q4" (synthetic_weights); `router` uniform or zipf (model/synthetic_router.h).
std::unique_ptr<Backend> open_synthetic_backend(const std::string& device,
                                                const std::string& weights, uint64_t seed,
                                                SyntheticRouter router = SyntheticRouter::Uniform);
// Backend-specific lines for reports (the CUDA backend's per-kernel breakdown); may be empty.
std::vector<std::string> backend_report(Backend& backend);

}  // namespace lilac::runtime
