#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "../test_data.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::test {

TEST(Half, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 lies halfway between two bf16 values (1 and 1 + 2^-7): ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Half, F16Conversions) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {0, 1, 3, 4, 5, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, NestedCallsRunSerially) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  pool.parallel_for(6, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](size_t b2, size_t e2) { total += int(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 60);
}

}  // namespace lilac::test
