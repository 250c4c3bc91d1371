// A failure of the device itself, not of one request: a sticky CUDA error (an illegal address, a
// launch failure) leaves the context unusable, so every later step would fail too. The CUDA error
// check throws it for those errors (src/cuda/common.cu); the engine stops taking work when a step
// throws it, and /health reports it (503) so that a supervisor restarts the process.
#pragma once

#include <string>

#include "util/error.h"

namespace lilac {

class DeviceFault : public Error {
 public:
  explicit DeviceFault(const std::string& what) : Error(what) {}
};

}  // namespace lilac
