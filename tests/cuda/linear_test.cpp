// cuda::gemv / gemv_bf16out against cpu::matmul on the same bf16-rounded inputs, at the model's
// decode shapes (GDN in_proj, attention qkv, out_proj / o_proj, router, lm_head) and awkward ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/linear.h"
#include "cuda/linear.h"
#include "cuda_test_util.h"
#include "kernel_check.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace lilac::test {
namespace {

struct Shape {
  int rows, cols;
};

// Runs the three output modes on one shape and compares with the twin. Tolerances: the products
// w x are exact in f32 on both sides (bf16 x bf16), so only the summation order differs:
// dot_tolerance (kernel_check.h) with term rms = rms(w) rms(x); Accumulate adds y0 (one more
// rounding of |y0 + s|: 2u relative); the bf16 store rounds by at most 2^-8 relative.
void check_shape(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "W [" << s.rows << ", " << s.cols << "]");
  std::vector<uint16_t> w = random_bf16(size_t(s.rows) * s.cols, 0.05f, seed);
  std::vector<float> x = random_floats(size_t(s.cols), 1.f, uint32_t(seed + 1));
  std::vector<uint16_t> xb = to_bf16_rounding(x);  // x now holds exactly what the GPU reads
  std::vector<float> want(size_t(s.rows));
  cpu::matmul(bf16_matrix(w.data(), s.rows, s.cols), x.data(), 1, s.cols, want.data(), s.rows,
              ThreadPool::global());
  const double atol = dot_tolerance(s.cols, rms_bf16(w) * rms(x));

  auto dw = upload_bf16(w);
  auto dx = upload_bf16(xb);
  const size_t guard = 37;
  {  // Store
    cuda::DeviceBuffer<float> y(size_t(s.rows) + guard);
    poison(y);
    cuda::gemv(dw.get(), s.rows, s.cols, dx.get(), y.get(), cuda::GemvOut::Store, nullptr);
    std::vector<float> got = download(y);
    EXPECT_TRUE(guard_untouched(got, size_t(s.rows), "gemv Store"));
    got.resize(size_t(s.rows));
    EXPECT_TRUE(within(got, want, atol, 0.0, "gemv Store"));
  }
  {  // Accumulate into a residual
    std::vector<float> y0 = random_floats(size_t(s.rows), 3.f, uint32_t(seed + 2));
    y0.resize(size_t(s.rows) + guard, 0.f);
    auto y = upload(y0);
    LILAC_CUDA_CHECK(cudaMemset(y.get() + s.rows, 0xff, guard * sizeof(float)));
    cuda::gemv(dw.get(), s.rows, s.cols, dx.get(), y.get(), cuda::GemvOut::Accumulate, nullptr);
    std::vector<float> got = download(y);
    EXPECT_TRUE(guard_untouched(got, size_t(s.rows), "gemv Accumulate"));
    got.resize(size_t(s.rows));
    std::vector<float> sum(size_t(s.rows));
    for (size_t r = 0; r < sum.size(); ++r) sum[r] = y0[r] + want[r];
    EXPECT_TRUE(within(got, sum, atol, 2 * kU, "gemv Accumulate"));
  }
  {  // bf16 out
    cuda::DeviceBuffer<cuda::bf16> y(size_t(s.rows) + guard);
    poison(y);
    cuda::gemv_bf16out(dw.get(), s.rows, s.cols, dx.get(), y.get(), nullptr);
    std::vector<float> got = download_bf16_as_f32(y);
    std::vector<uint16_t> raw(y.size());
    LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), y.get(), y.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(guard_untouched(raw, size_t(s.rows), "gemv_bf16out"));
    got.resize(size_t(s.rows));
    EXPECT_TRUE(within(got, want, atol * (1 + 1.0 / 256), 1.0 / 256, "gemv_bf16out"));
  }
}

TEST(CudaGemv, ModelShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 100;
  // GDN in_proj, attention qkv, GDN out_proj / attention o_proj, router (E + 1 rows), MTP fc.
  for (Shape s : {Shape{12352, 2048}, Shape{9216, 2048}, Shape{2048, 4096}, Shape{257, 2048},
                  Shape{2048, 4096}})
    check_shape(s, seed++);
}

TEST(CudaGemv, LmHead) {
  LILAC_REQUIRE_GPU();
  check_shape(Shape{248320, 2048}, 7);
}

TEST(CudaGemv, AwkwardShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 200;
  // rows 1, 3, 33, 1000; cols 8 (one chunk), 24, 4104 (a tail step), 512 / 1024 (R = 4 / 2),
  // 16384 (the largest: 8 splits), 2056 (R = 1 with a 1-chunk tail per lane).
  for (Shape s : {Shape{1, 8}, Shape{3, 24}, Shape{33, 4104}, Shape{1000, 2048}, Shape{1, 2048},
                  Shape{31, 512}, Shape{7, 1024}, Shape{1000, 8}, Shape{65, 16384},
                  Shape{129, 2056}, Shape{5, 200}})
    check_shape(s, seed++);
}

TEST(CudaGemv, BadArgumentsThrowBeforeLaunching) {
  auto* p = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* y = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(cuda::gemv(p, 4, 12, p, y, cuda::GemvOut::Store, nullptr), Error);  // cols % 8
  EXPECT_THROW(cuda::gemv(p, 0, 16, p, y, cuda::GemvOut::Store, nullptr), Error);  // rows
  EXPECT_THROW(cuda::gemv(p, 4, 32768, p, y, cuda::GemvOut::Store, nullptr),
               Error);  // cols too large
  EXPECT_THROW(cuda::gemv(p + 1, 4, 16, p, y, cuda::GemvOut::Store, nullptr),
               Error);  // W misaligned
  EXPECT_THROW(cuda::gemv(nullptr, 4, 16, p, y, cuda::GemvOut::Store, nullptr), Error);
  EXPECT_THROW(cuda::gemv_bf16out(p, 4, 16, p + 4, reinterpret_cast<cuda::bf16*>(y), nullptr),
               Error);  // x misaligned
}

}  // namespace
}  // namespace lilac::test
