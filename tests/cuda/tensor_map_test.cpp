// tensor_map.h: what it refuses before asking the driver (no GPU needed), and a valid descriptor.
#include "cuda/tensor_map.h"

#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"
#include "util/error.h"

namespace lilac::test {
namespace {

std::string refusal(const void* base, uint32_t box0) {
  try {
    cuda::bf16_tensor_map_3d(base, {256, 64, 2}, {512, 512 * 64}, {box0, 64, 1});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorMap, RefusesAnUnalignedBaseAndAWideBoxByName) {
  alignas(16) static unsigned char buf[64];
  EXPECT_NE(refusal(buf + 8, 64).find("not 16-byte aligned"), std::string::npos);
  EXPECT_NE(refusal(buf, 128).find("exceeds the 128-byte swizzle span"), std::string::npos);
}

TEST(TensorMap, EncodesTheAttentionCacheLayout) {
  LILAC_REQUIRE_GPU();
  cuda::DeviceBuffer<cuda::bf16> cache(size_t(2) * 100 * 256);
  EXPECT_NO_THROW(
      cuda::bf16_tensor_map_3d(cache.get(), {256, 77, 2}, {512, 512 * 100}, {64, 64, 1}));
  // The driver's own refusal is reported with the shape it refused (a stride not a multiple of 16).
  try {
    cuda::bf16_tensor_map_3d(cache.get(), {256, 77, 2}, {520, 520 * 100}, {64, 64, 1});
    ADD_FAILURE() << "a 520-byte row stride was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strides {520"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lilac::test
