#include "cli/backends.h"

#include "cpu/cpu_backend.h"
#include "io/quantize.h"
#include "util/error.h"
#ifdef LILAC_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace lilac::cli {

bool cuda_available() {
#ifdef LILAC_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device) {
  // auto: the GPU when there is one and it can run these weights (no 4-bit kernels yet).
  std::string d = device == "auto"
                      ? (cuda_available() && !has_quantized_weights(model.weights) ? "cuda" : "cpu")
                      : device;
  if (d == "cpu") return std::make_unique<cpu::CpuBackend>(model.config, model.weights);
  if (d == "cuda") {
    if (has_quantized_weights(model.weights))
      fail(
          "--device cuda: the CUDA backend has no 4-bit kernels yet (issue 6); run quantized "
          "weights with --device cpu");
#ifdef LILAC_HAVE_CUDA
    if (!cuda_available()) fail("--device cuda: no CUDA device is visible");
    return cuda::make_cuda_backend(model);
#else
    fail(
        "--device cuda: this build of lilac has no CUDA backend (nvcc was not found at build "
        "time)");
#endif
  }
  fail("unknown device '{}' (expected cpu, cuda or auto)", device);
}

}  // namespace lilac::cli

namespace lilac::cli {

std::unique_ptr<Backend> open_synthetic_backend(const std::string& device,
                                                const std::string& weights, uint64_t seed) {
  if (device == "cpu")
    fail("--synthetic needs the cuda device: the full-size model (70 GB) is generated on the GPU");
#ifdef LILAC_HAVE_CUDA
  if (!cuda_available()) fail("--synthetic: no CUDA device is visible");
  return cuda::make_synthetic_backend(weights, seed);
#else
  (void)weights;
  (void)seed;
  fail("--synthetic: this build of lilac has no CUDA backend");
#endif
}

std::vector<std::string> backend_report(Backend& backend) {
#ifdef LILAC_HAVE_CUDA
  if (auto* c = dynamic_cast<cuda::CudaBackend*>(&backend)) return c->kernel_breakdown();
#endif
  (void)backend;
  return {};
}

}  // namespace lilac::cli
