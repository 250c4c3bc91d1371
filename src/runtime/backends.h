// Chooses and constructs a backend for a loaded model: "cpu", "cuda", or "auto" (cuda when this
// build has it and a GPU is present, else cpu).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/backend.h"
#include "model/state_format.h"
#include "model/synthetic_router.h"

namespace lilac::runtime {

bool cuda_available();
// `gdn_state` (--gdn-state): how the Gated DeltaNet recurrent state is kept between calls
// (model/state_format.h); unset: the backend's default (f32; on cuda LILAC_GDN_STATE, read by
// CudaOptions::from_environment, else f32).
std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device,
                                      std::optional<GdnStateFormat> gdn_state = std::nullopt);
// The same, quantizing a float checkpoint at load when `quantize_at_load`
// (WeightsPlan::quantize_at_load) as `lilac quantize` would: in memory for the CPU backend
// (quantize_model_in_memory, which changes `model`), on the GPU at load for the CUDA backend
// (bit-identical codes; `model` unchanged).
std::unique_ptr<Backend> open_backend(Model& model, const std::string& device,
                                      bool quantize_at_load,
                                      std::optional<GdnStateFormat> gdn_state = std::nullopt);
// The full-size Qwen3.6-35B-A3B with random weights generated on the device (no file); `weights`
// "bf16" or "q4" (synthetic_weights); `router` uniform or zipf (model/synthetic_router.h).
std::unique_ptr<Backend> open_synthetic_backend(
    const std::string& device, const std::string& weights, uint64_t seed,
    SyntheticRouter router = SyntheticRouter::Uniform,
    std::optional<GdnStateFormat> gdn_state = std::nullopt);
// The --gdn-state flag of serve, run, chat and bench: not given (nullopt: the backend's default)
// or f32 / bf16; anything else throws lilac::Error naming the flag and the value.
std::optional<GdnStateFormat> parse_gdn_state_flag(const std::optional<std::string>& flag);
// The state format `backend` runs with (for reports: the bench JSON's "gdn_state"): the CPU and
// CUDA backends' own setting, f32 for any other backend.
GdnStateFormat gdn_state_format(const Backend& backend);
// Backend-specific lines for reports (the CUDA backend's per-kernel breakdown); may be empty.
std::vector<std::string> backend_report(Backend& backend);

}  // namespace lilac::runtime
