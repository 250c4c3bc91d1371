// Chooses and constructs a backend for a loaded model: "cpu", "cuda", or "auto" (cuda when this
// build has it and a GPU is present, else cpu).
#pragma once

#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "model/backend.h"

namespace lilac::cli {

bool cuda_available();
std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device);

}  // namespace lilac::cli
