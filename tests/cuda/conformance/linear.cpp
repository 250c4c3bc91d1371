// Conformance cases of cuda::gemv / gemv_bf16out / gemv_rms against cpu::matmul on the same
// bf16-rounded inputs, at the model's decode shapes (GDN in_proj, attention qkv, out_proj /
// o_proj, router, MTP fc, lm_head) and awkward ones; and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "conformance.h"
#include "cpu/linear.h"
#include "cpu/norm.h"
#include "cuda/linear.h"
#include "cuda/norm.h"
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

std::string dims(Shape s) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

LILAC_CONFORMANCE_CASES(linear) {
  std::vector<OpCase> cases;
  auto gemv = [&](const char* role, Shape s, uint64_t seed) {
    cases.push_back(
        {"gemv", role + dims(s), "bf16", "cpu::matmul", [s, seed] { check_shape(s, seed); }});
  };
  auto gemv_rms = [&](const char* role, Shape s, uint64_t seed, float h_scale) {
    cases.push_back({"gemv_rms", role + dims(s), "bf16", "cuda::rms_norm + gemv, cpu::matmul",
                     [s, seed, h_scale] { check_rms_shape(s, seed, h_scale); }});
  };
  // The model's decode shapes: GDN in_proj, attention qkv, GDN out_proj / attention o_proj,
  // router (E + 1 rows: 256 experts and the shared expert's gate), MTP fc; lm_head.
  gemv("in_proj_", {12352, 2048}, 100);
  gemv("qkv_", {9216, 2048}, 101);
  gemv("out_proj_", {2048, 4096}, 102);
  gemv("router_", {257, 2048}, 103);
  gemv("mtp_fc_", {2048, 4096}, 104);
  gemv("lm_head_", {248320, 2048}, 7);
  // rows 1, 3, 33, 1000; cols 8 (one chunk), 24, 4104 (a tail step), 512 / 1024 (R = 4 / 2),
  // 16384 (the largest: 8 splits), 2056 (R = 1 with a 1-chunk tail per lane).
  uint64_t seed = 200;
  for (Shape s : {Shape{1, 8}, Shape{3, 24}, Shape{33, 4104}, Shape{1000, 2048}, Shape{1, 2048},
                  Shape{31, 512}, Shape{7, 1024}, Shape{1000, 8}, Shape{65, 16384},
                  Shape{129, 2056}, Shape{5, 200}})
    gemv("awkward_", s, seed++);
  // gemv_rms: GDN in_proj, attention qkv (input norm; the router's shape is moe_router's case),
  // |h| ~ 1, 300 and 1e-3; lm_head.
  gemv_rms("in_proj_", {12352, 2048}, 300, 1.f);
  gemv_rms("qkv_", {9216, 2048}, 301, 1.f);
  gemv_rms("in_proj_h300_", {12352, 2048}, 302, 300.f);
  gemv_rms("qkv_h1e-3_", {9216, 2048}, 303, 1e-3f);
  gemv_rms("lm_head_", {248320, 2048}, 9, 2.f);
  // cols 8 (one chunk), 24, 4104 (a tail step, 2 norm chunks for some threads), 16384 (160 KB of
  // shared memory: the opt-in path; 8 norm chunks per thread), 2056, 1024 / 512 (R = 2 / 4).
  seed = 400;
  for (Shape s : {Shape{1, 8}, Shape{3, 24}, Shape{33, 4104}, Shape{1000, 2048}, Shape{1, 2048},
                  Shape{31, 512}, Shape{7, 1024}, Shape{65, 16384}, Shape{129, 2056}, Shape{5, 200},
                  Shape{2048, 4096}})
    gemv_rms("awkward_", s, seed++, 1.f);
  return cases;
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
