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

#ifdef LILAC_HAVE_CUDA
// The backend's options from the environment, the state format overridden by --gdn-state.
cuda::CudaOptions cuda_options(std::optional<GdnStateFormat> gdn_state) {
  cuda::CudaOptions o = cuda::CudaOptions::from_environment();
  if (gdn_state) o.gdn_state = *gdn_state;
  return o;
}
#endif

std::unique_ptr<Backend> make_cpu(const Model& model, std::optional<GdnStateFormat> gdn_state) {
  auto b = std::make_unique<cpu::CpuBackend>(model.config, model.weights);
  if (gdn_state) b->set_gdn_state_format(*gdn_state);
  return b;
}

std::unique_ptr<Backend> open_cuda(const Model& model, bool quantize,
                                   std::optional<GdnStateFormat> gdn_state) {
#ifdef LILAC_HAVE_CUDA
  if (!cuda_available()) fail("--device cuda: no CUDA device is visible");
  return cuda::make_cuda_backend(model.config, model.weights, model.checkpoint->dir(), quantize,
                                 cuda_options(gdn_state));
#else
  (void)model;
  (void)quantize;
  (void)gdn_state;
  fail(
      "--device cuda: this build of lilac has no CUDA backend (nvcc was not found at build "
      "time)");
#endif
}

}  // namespace

std::unique_ptr<Backend> open_backend(Model& model, const std::string& device,
                                      bool quantize_at_load,
                                      std::optional<GdnStateFormat> gdn_state) {
  if (!quantize_at_load || has_quantized_weights(model.weights))
    return open_backend(static_cast<const Model&>(model), device, gdn_state);
  const std::string d = resolve_device(device);
  if (d == "cuda") return open_cuda(model, /*quantize=*/true, gdn_state);
  if (d != "cpu") fail("unknown device '{}' (expected cpu, cuda or auto)", device);
  quantize_model_in_memory(model);
  return make_cpu(model, gdn_state);
}

std::unique_ptr<Backend> open_backend(const Model& model, const std::string& device,
                                      std::optional<GdnStateFormat> gdn_state) {
  // auto: the GPU when there is one (BF16 or MLX 4/8-bit weights alike).
  const std::string d = resolve_device(device);
  if (d == "cpu") return make_cpu(model, gdn_state);
  if (d == "cuda") return open_cuda(model, /*quantize=*/false, gdn_state);
  fail("unknown device '{}' (expected cpu, cuda or auto)", device);
}

std::optional<GdnStateFormat> parse_gdn_state_flag(const std::optional<std::string>& flag) {
  if (!flag) return std::nullopt;
  try {
    return parse_gdn_state_format(*flag);
  } catch (const Error& e) {
    fail("--gdn-state {}: {}", *flag, e.what());
  }
}

GdnStateFormat gdn_state_format(const Backend& backend) {
  if (auto* c = dynamic_cast<const cpu::CpuBackend*>(&backend)) return c->gdn_state_format();
#ifdef LILAC_HAVE_CUDA
  if (auto* c = dynamic_cast<const cuda::CudaBackend*>(&backend)) return c->options().gdn_state;
#endif
  return GdnStateFormat::f32;
}

}  // namespace lilac::runtime

namespace lilac::runtime {

std::unique_ptr<Backend> open_synthetic_backend(const std::string& device,
                                                const std::string& weights, uint64_t seed,
                                                SyntheticRouter router,
                                                std::optional<GdnStateFormat> gdn_state) {
  if (device == "cpu")
    fail("--synthetic needs the cuda device: the full-size model (70 GB) is generated on the GPU");
#ifdef LILAC_HAVE_CUDA
  if (!cuda_available()) fail("--synthetic: no CUDA device is visible");
  return cuda::make_synthetic_backend(weights, seed, router, cuda_options(gdn_state));
#else
  (void)weights;
  (void)seed;
  (void)router;
  (void)gdn_state;
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
