#include "runtime/backends.h"

#include "cpu/cpu_backend.h"
#include "io/quantize.h"
#include "model/weight_rows.h"
#include "util/error.h"
#ifdef LILAC_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace lilac::runtime {

bool cuda_available() {
#ifdef LILAC_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

namespace {

std::string resolve_device(const std::string& device) {
  if (device == "auto") return cuda_available() ? "cuda" : "cpu";
  return device;
}

std::unique_ptr<Backend> open_cuda(const Model& model, bool quantize) {
#ifdef LILAC_HAVE_CUDA
  if (!cuda_available()) fail("--device cuda: no CUDA device is visible");
  return cuda::make_cuda_backend(model.config, model.weights, model.checkpoint->dir(), quantize,
                                 cuda::CudaOptions::from_environment());
#else
  (void)model;
  (void)quantize;
  fail(
      "--device cuda: this build of lilac has no CUDA backend (nvcc was not found at build "
      "time)");
#endif
}

}  // namespace

std::unique_ptr<Backend> open_backend(Model& model, const std::string& device,
                                      bool quantize_at_load) {
  if (!quantize_at_load || has_quantized_weights(model.weights)) return open_backend(model, device);
  const std::string d = resolve_device(device);
  if (d == "cuda") return open_cuda(model, /*quantize=*/true);
  if (d != "cpu") fail("unknown device '{}' (expected cpu, cuda or auto)", device);
  quantize_model_in_memory(model);
  return std::make_unique<cpu::CpuBackend>(model.config, model.weights);
}

std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device) {
  // auto: the GPU when there is one (BF16 or MLX 4/8-bit weights alike).
  const std::string d = resolve_device(device);
  if (d == "cpu") return std::make_unique<cpu::CpuBackend>(model.config, model.weights);
  if (d == "cuda") return open_cuda(model, /*quantize=*/false);
  fail("unknown device '{}' (expected cpu, cuda or auto)", device);
}

}  // namespace lilac::runtime

namespace lilac::runtime {

std::unique_ptr<Backend> open_synthetic_backend(const std::string& device,
                                                const std::string& weights, uint64_t seed,
                                                SyntheticRouter router) {
  if (device == "cpu")
    fail("--synthetic needs the cuda device: the full-size model (70 GB) is generated on the GPU");
#ifdef LILAC_HAVE_CUDA
  if (!cuda_available()) fail("--synthetic: no CUDA device is visible");
  return cuda::make_synthetic_backend(weights, seed, router, cuda::CudaOptions::from_environment());
#else
  (void)weights;
  (void)seed;
  (void)router;
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

}  // namespace lilac::runtime
