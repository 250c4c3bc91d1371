// A sticky CUDA error (an illegal address here) must surface as lilac::DeviceFault, which the
// engine and /health treat as fatal (their side is tested on the CPU: tests/engine, tests/server);
// an ordinary CUDA error stays a plain lilac::Error. The faulting launch runs in a death-test child
// process, re-executed from scratch ("threadsafe" style): the fault ruins the CUDA context of the
// process that takes it, and this process still has the other GPU tests to run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "cuda/common.h"
#include "cuda/position.h"
#include "cuda_test_util.h"
#include "util/device_fault.h"

namespace lilac::test {
namespace {

// Exit codes of the child: which exception the CUDA check threw.
constexpr int kDeviceFault = 42, kPlainError = 43, kNothing = 44;

[[noreturn]] void sync_and_classify(cudaStream_t s) {
  try {
    LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (const DeviceFault&) {
    std::_Exit(kDeviceFault);
  } catch (const Error&) {
    std::_Exit(kPlainError);
  }
  std::_Exit(kNothing);
}

TEST(DeviceFault, IllegalAddressIsADeviceFault) {
  LILAC_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        cudaStream_t s;
        if (cudaStreamCreate(&s) != cudaSuccess) std::_Exit(1);
        // advance_position's kernel adds to *d_pos: a wild pointer is an illegal address.
        cuda::advance_position(reinterpret_cast<int32_t*>(uintptr_t{0x100}), 1, s);
        sync_and_classify(s);
      },
      testing::ExitedWithCode(kDeviceFault), "");
}

TEST(DeviceFault, OrdinaryCudaErrorIsNotFatal) {
  LILAC_REQUIRE_GPU();
  try {
    LILAC_CUDA_CHECK(cudaSetDevice(1 << 20));  // cudaErrorInvalidDevice: nothing is corrupt
    FAIL() << "no error";
  } catch (const DeviceFault&) {
    FAIL() << "an invalid device number is not a device fault";
  } catch (const Error&) {
  }
  LILAC_CUDA_CHECK(cudaSetDevice(0));
  // The error was consumed when it was reported: a later launch check does not see it again.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace lilac::test
