#include "cuda/common.cuh"
#include "util/error.h"

namespace lilac::cuda {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
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

}  // namespace lilac::cuda
