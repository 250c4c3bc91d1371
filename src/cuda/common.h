// Host-side CUDA helpers, safe to include from host C++ (g++) and from .cu files: error
// checking, device buffers. Device-side helpers are in common.cuh.
// Every launcher in src/cuda takes a cudaStream_t and never synchronises (decode steps are
// captured into one CUDA graph), and checks cudaGetLastError() after its launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace lilac::cuda {

using bf16 = __nv_bfloat16;

// Throws lilac::Error "CUDA error <name> (<string>) at <file>:<line>: <expr>".
[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line);

#define LILAC_CUDA_CHECK(expr)                                         \
  do {                                                                 \
    cudaError_t lilac_err_ = (expr);                                   \
    if (lilac_err_ != cudaSuccess)                                     \
      ::lilac::cuda::fail_cuda(lilac_err_, #expr, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: catches bad launch configurations at once (not async faults).
#define LILAC_CUDA_LAUNCHED() LILAC_CUDA_CHECK(cudaGetLastError())

int device_count();

// The current device's compute capability as major * 10 + minor (90 on Hopper), read once per
// device (the launchers ask at every call to pick a kernel).
int device_compute_capability();

inline int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// An owning device allocation of n elements of T (cudaMalloc, or the stream-ordered pool; never
// managed memory).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        pooled_(std::exchange(o.pooled_, false)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
      pooled_ = std::exchange(o.pooled_, false);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void resize(size_t n) {
    release();
    if (n) LILAC_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    n_ = n;
  }
  // As resize, from the device's stream-ordered pool (cudaMallocAsync, ordered on `s`): ~us when
  // the pool holds freed memory, where cudaMalloc takes ~50-100 us and cudaFree synchronises the
  // device. Freed with cudaFreeAsync on the legacy stream when the buffer goes: the owner must not
  // let it go while a kernel may still use it (sequence states go between steps).
  void resize_pooled(size_t n, cudaStream_t s) {
    release();
    if (n) LILAC_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), n * sizeof(T), s));
    n_ = n;
    pooled_ = n > 0;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void release() {
    if (ptr_ && pooled_)
      cudaFreeAsync(ptr_, nullptr);
    else if (ptr_)
      cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = 0;
    pooled_ = false;
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
  bool pooled_ = false;
};

}  // namespace lilac::cuda
