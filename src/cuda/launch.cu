// The PDL switch of launch.h: the process-wide setting and the per-kernel check that the machine
// code running on this device contains griddepcontrol.wait (compiled for sm_90 or newer: the
// compute_80 PTX of our fat binary, JIT-compiled on a newer GPU, has no wait and must not overlap).
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "cuda/common.cuh"
#include "cuda/launch.h"

namespace lilac::cuda {
namespace {

bool device_supports_pdl() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 9;
}

// On unless a caller turns it off (the CUDA backend applies CudaOptions::pdl; benchmarks and tests
// switch it with ScopedPdl). Nothing here reads the environment.
std::atomic<int>& setting() {
  static std::atomic<int> s{1};
  return s;
}

// Off: measured slower (docs/kernels.md); benchmarks turn it on to compare.
std::atomic<int>& prefetch_setting() {
  static std::atomic<int> s{0};
  return s;
}

// Kernel -> whether its running machine code has the wait; guarded by registry_mutex().
std::unordered_map<const void*, bool>& registry() {
  static std::unordered_map<const void*, bool> known;
  return known;
}

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

bool pdl_enabled() {
  static const bool supported = device_supports_pdl();
  return supported && setting().load(std::memory_order_relaxed) != 0;
}

void set_pdl_enabled(bool on) {
  setting().store(on ? 1 : 0, std::memory_order_relaxed);
}

bool l2_prefetch_enabled() {
  return prefetch_setting().load(std::memory_order_relaxed) != 0;
}
void set_l2_prefetch_enabled(bool on) {
  prefetch_setting().store(on ? 1 : 0, std::memory_order_relaxed);
}

ScopedPdl::ScopedPdl(bool on) : saved_(setting().exchange(on ? 1 : 0)) {}
ScopedPdl::~ScopedPdl() {
  setting().store(saved_);
}

bool pdl_for(const void* kernel, cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || !pdl_enabled()) return false;
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& known = registry();
  auto it = known.find(kernel);
  if (it != known.end()) return it->second;
  cudaFuncAttributes a{};
  LILAC_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  // ptxVersion: the virtual architecture the running code was compiled from (90 for our sm_90a
  // machine code, 80 when the driver JIT-compiles the compute_80 PTX).
  const bool ok = a.ptxVersion >= 90;
  known.emplace(kernel, ok);
  return ok;
}

void pdl_kernel_counts(int* with_wait, int* without) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  *with_wait = *without = 0;
  for (const auto& entry : registry()) (entry.second ? *with_wait : *without) += 1;
}

}  // namespace lilac::cuda
