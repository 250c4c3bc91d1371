// The real Qwen3.6-35B-A3B text config (docs/model.md section 1), for the synthetic full-size model
// the bench and the GPU tests build when no checkpoint is at hand.
#pragma once

#include "model/config.h"

namespace lilac {

ModelConfig qwen36_35b_a3b_config();
// Number of real token ids (the tokenizer's size); the vocab is padded to 248320.
inline constexpr int32_t kQwen36RealTokens = 248077;

}  // namespace lilac
