// The rotary embedding's frequencies, computed once on the host: the CPU backend applies them
// (cpu/attention), the CUDA backend uploads them (cuda/device_model.cpp), so both rotate by the
// same f32 values.
#pragma once

#include <cstdint>
#include <vector>

namespace lilac {

// inv_freq[j] = theta^(-2j/R) for j < R/2 (R = rotary dim) in f32, optionally rounded to bf16
// (see ModelConfig::rope_inv_freq_bf16).
std::vector<float> rope_inv_freq(float theta, int64_t rotary_dim, bool bf16_rounding = false);

}  // namespace lilac
