#include <atomic>

#include "cuda/common.cuh"
#include "util/device_fault.h"
#include "util/error.h"

namespace lilac::cuda {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  // The sticky errors: the context is corrupt and only a new process recovers.
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      throw DeviceFault(fmt::format("CUDA error {} ({}) at {}:{}: {}", cudaGetErrorName(err),
                                    cudaGetErrorString(err), file, line, expr));
    default:
      break;
  }
  // An ordinary error (bad argument, out of memory) leaves the context usable, but the runtime
  // also records it as the "last error": consume it here, or the next launch check of an
  // unrelated kernel would report it again and fail a request that did nothing wrong.
  cudaGetLastError();
  fail("CUDA error {} ({}) at {}:{}: {}", cudaGetErrorName(err), cudaGetErrorString(err), file,
       line, expr);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int device_compute_capability() {
  static std::atomic<int> known[16];  // 0: not read yet
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 16) fail("cuda: device index {} out of range", dev);
  int cc = known[dev].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cc = major * 10 + minor;
    known[dev].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

}  // namespace lilac::cuda
