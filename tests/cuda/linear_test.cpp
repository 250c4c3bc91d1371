// cuda::gemv / gemv_bf16out against cpu::matmul on the same bf16-rounded inputs, at the model's
// decode shapes (GDN in_proj, attention qkv, out_proj / o_proj, router, lm_head) and awkward ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <cstring>

#include "cpu/linear.h"
#include "cpu/norm.h"
#include "cuda/linear.h"
#include "cuda/norm.h"
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

// gemv_rms (the input norm fused into the GEMV's prologue) against the unfused GPU path rms_norm +
// gemv: equal bit for bit (same norm order, same GEMV plan), in Store and Accumulate modes; and
// against the twin: cpu::matmul on the x that rms_norm produced (rms_norm itself is held to
// cpu::rms_norm by norm_test). h rows of very different scales (the norm removes them).
void check_rms_shape(Shape s, uint64_t seed, float h_scale) {
  SCOPED_TRACE(testing::Message() << "gemv_rms W [" << s.rows << ", " << s.cols << "], |h| ~ "
                                  << h_scale);
  std::vector<uint16_t> w = random_bf16(size_t(s.rows) * s.cols, 0.05f, seed);
  std::vector<float> h = random_floats(size_t(s.cols), h_scale, uint32_t(seed + 1));
  std::vector<float> scale = random_floats(size_t(s.cols), 0.1f, uint32_t(seed + 2));
  for (auto& v : scale) v += 1.f;
  const float eps = 1e-6f;
  auto dw = upload_bf16(w);
  auto dh = upload(h);
  auto ds = upload(scale);
  const size_t guard = 37;

  // The unfused path: x = rms_norm(h), y = W x.
  cuda::DeviceBuffer<cuda::bf16> dx(static_cast<size_t>(s.cols));
  cuda::rms_norm(dh.get(), ds.get(), dx.get(), 1, s.cols, eps, nullptr);
  cuda::DeviceBuffer<float> y1(size_t(s.rows) + guard), y2(size_t(s.rows) + guard);
  poison(y1);
  poison(y2);
  cuda::gemv(dw.get(), s.rows, s.cols, dx.get(), y1.get(), cuda::GemvOut::Store, nullptr);
  cuda::gemv_rms(dw.get(), s.rows, s.cols, dh.get(), ds.get(), eps, y2.get(), cuda::GemvOut::Store,
                 nullptr);
  std::vector<float> unfused = download(y1), fused = download(y2);
  EXPECT_TRUE(guard_untouched(fused, size_t(s.rows), "gemv_rms Store"));
  for (size_t r = 0; r < size_t(s.rows); ++r)
    if (std::memcmp(&fused[r], &unfused[r], 4) != 0) {
      ADD_FAILURE() << "gemv_rms Store differs from rms_norm + gemv at row " << r << ": "
                    << fused[r] << " vs " << unfused[r];
      break;
    }

  // The twin, on the GPU's normalised x.
  std::vector<float> x = download_bf16_as_f32(dx);
  std::vector<float> want(size_t(s.rows));
  cpu::matmul(bf16_matrix(w.data(), s.rows, s.cols), x.data(), 1, s.cols, want.data(), s.rows,
              ThreadPool::global());
  fused.resize(size_t(s.rows));
  EXPECT_TRUE(
      within(fused, want, dot_tolerance(s.cols, rms_bf16(w) * rms(x)), 0.0, "gemv_rms vs twin"));

  // Accumulate into a residual: again equal to the unfused path bit for bit.
  std::vector<float> y0 = random_floats(size_t(s.rows), 3.f, uint32_t(seed + 3));
  y0.resize(size_t(s.rows) + guard, 0.f);
  auto a1 = upload(y0), a2 = upload(y0);
  LILAC_CUDA_CHECK(cudaMemset(a2.get() + s.rows, 0xff, guard * sizeof(float)));
  cuda::gemv(dw.get(), s.rows, s.cols, dx.get(), a1.get(), cuda::GemvOut::Accumulate, nullptr);
  cuda::gemv_rms(dw.get(), s.rows, s.cols, dh.get(), ds.get(), eps, a2.get(),
                 cuda::GemvOut::Accumulate, nullptr);
  std::vector<float> acc1 = download(a1), acc2 = download(a2);
  EXPECT_TRUE(guard_untouched(acc2, size_t(s.rows), "gemv_rms Accumulate"));
  EXPECT_EQ(0, std::memcmp(acc1.data(), acc2.data(), size_t(s.rows) * 4))
      << "gemv_rms Accumulate differs from rms_norm + gemv";
}

TEST(CudaGemv, RmsFusedModelShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 300;
  // GDN in_proj, attention qkv (input norm); the router's shape is moe_router's test.
  for (Shape s : {Shape{12352, 2048}, Shape{9216, 2048}}) check_rms_shape(s, seed++, 1.f);
  check_rms_shape(Shape{12352, 2048}, seed++, 300.f);
  check_rms_shape(Shape{9216, 2048}, seed++, 1e-3f);
}

TEST(CudaGemv, RmsFusedLmHead) {
  LILAC_REQUIRE_GPU();
  check_rms_shape(Shape{248320, 2048}, 9, 2.f);
}

TEST(CudaGemv, RmsFusedAwkwardShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 400;
  // cols 8 (one chunk), 24, 4104 (a tail step, 2 norm chunks for some threads), 16384 (160 KB of
  // shared memory: the opt-in path; 8 norm chunks per thread), 2056, 1024 / 512 (R = 2 / 4).
  for (Shape s : {Shape{1, 8}, Shape{3, 24}, Shape{33, 4104}, Shape{1000, 2048}, Shape{1, 2048},
                  Shape{31, 512}, Shape{7, 1024}, Shape{65, 16384}, Shape{129, 2056}, Shape{5, 200},
                  Shape{2048, 4096}})
    check_rms_shape(s, seed++, 1.f);
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
  EXPECT_THROW(cuda::gemv_rms(p, 4, 16, y + 1, y, 1e-6f, y, cuda::GemvOut::Store, nullptr),
               Error);  // h misaligned
  EXPECT_THROW(cuda::gemv_rms(p, 4, 16, y, y + 2, 1e-6f, y, cuda::GemvOut::Store, nullptr),
               Error);  // scale misaligned
  EXPECT_THROW(cuda::gemv_rms(p, 4, 20, y, y, 1e-6f, y, cuda::GemvOut::Store, nullptr),
               Error);  // cols % 8
}

}  // namespace
}  // namespace lilac::test
