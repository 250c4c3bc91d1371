// Conformance cases of cuda::q_gemv / q_gemv_bf16out / q_embed against their CPU twins
// (dequantize_row + cpu::matmul; widen_row) on weights quantized by the CPU quantizer, at the
// model's decode shapes (GDN in_proj, attention qkv, out_proj / o_proj, the 8-bit router, lm_head)
// and awkward ones (one row, rows not a multiple of 16, one group, group counts not a multiple of
// 8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../q4_test_util.h"
#include "conformance.h"
#include "cuda/common.h"
#include "cuda/norm.h"
#include "cuda/q4_linear.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct Shape {
  int rows, cols, bits;
};

void check_shape(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "W [" << s.rows << ", " << s.cols << "] at " << s.bits
                                  << " bits");
  HostQ W(s.rows, s.cols, s.bits, std::sqrt(3.f / float(s.cols)), seed);
  std::vector<float> x = random_floats(size_t(s.cols), 1.f, uint32_t(seed + 1));
  const std::vector<uint16_t> xb = to_bf16_rounding(x);
  const std::vector<float> want = q_twin(W, 0, s.rows, x);
  const std::vector<double> tol = q_gemv_tolerance(W, 0, s.rows, x);
  auto dx = upload_bf16(xb);
  const size_t guard = 37;
  {  // Store
    cuda::DeviceBuffer<float> y(static_cast<size_t>(s.rows) + guard);
    poison(y);
    cuda::q_gemv(W.q(), dx.get(), y.get(), cuda::GemvOut::Store, nullptr);
    std::vector<float> got = download(y);
    EXPECT_TRUE(guard_untouched(got, size_t(s.rows), "q_gemv Store"));
    got.resize(size_t(s.rows));
    EXPECT_TRUE(within(got, want, tol, "q_gemv Store"));
    // Deterministic.
    cuda::q_gemv(W.q(), dx.get(), y.get(), cuda::GemvOut::Store, nullptr);
    std::vector<float> again = download(y);
    again.resize(size_t(s.rows));
    EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * 4))
        << "q_gemv is not deterministic";
  }
  {  // Accumulate into a residual
    std::vector<float> y0 = random_floats(size_t(s.rows), 3.f, uint32_t(seed + 2));
    y0.resize(size_t(s.rows) + guard, 0.f);
    auto y = upload(y0);
    LILAC_CUDA_CHECK(cudaMemset(y.get() + s.rows, 0xff, guard * sizeof(float)));
    cuda::q_gemv(W.q(), dx.get(), y.get(), cuda::GemvOut::Accumulate, nullptr);
    std::vector<float> got = download(y);
    EXPECT_TRUE(guard_untouched(got, size_t(s.rows), "q_gemv Accumulate"));
    got.resize(size_t(s.rows));
    std::vector<float> sum(static_cast<size_t>(s.rows));
    std::vector<double> t2(static_cast<size_t>(s.rows));
    for (size_t r = 0; r < sum.size(); ++r) {
      sum[r] = y0[r] + want[r];
      t2[r] = tol[r] + 2 * kU * std::fabs(double(sum[r]));
    }
    EXPECT_TRUE(within(got, sum, t2, "q_gemv Accumulate"));
  }
  {  // bf16 out
    cuda::DeviceBuffer<cuda::bf16> y(static_cast<size_t>(s.rows) + guard);
    poison(y);
    cuda::q_gemv_bf16out(W.q(), dx.get(), y.get(), nullptr);
    std::vector<uint16_t> raw(y.size());
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), y.get(), y.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(guard_untouched(raw, size_t(s.rows), "q_gemv_bf16out"));
    std::vector<float> got(static_cast<size_t>(s.rows));
    std::vector<double> t3(static_cast<size_t>(s.rows));
    for (size_t r = 0; r < got.size(); ++r) {
      got[r] = bf16_to_f32(raw[r]);
      t3[r] = tol[r] * (1 + 1.0 / 256) + std::fabs(double(want[r])) / 256;
    }
    EXPECT_TRUE(within(got, want, t3, "q_gemv_bf16out"));
  }
}

// q_gemv_rms_staged against rms_norm + q_gemv bit for bit (Store), where the shape runs staged;
// nothing written past the rows; and against the CPU twin.
void check_staged(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "staged W [" << s.rows << ", " << s.cols << "] at " << s.bits
                                  << " bits");
  if (cuda::device_compute_capability() != 90) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  HostQ W(s.rows, s.cols, s.bits, std::sqrt(3.f / float(s.cols)), seed);
  ASSERT_TRUE(cuda::q_gemv_staged_available(W.q()));
  const size_t rows = size_t(s.rows), cols = size_t(s.cols), guard = 37;
  // h with a wide range, a non-trivial scale.
  auto h = upload(random_floats(cols, 5.f, uint32_t(seed + 3)));
  std::vector<float> scale_host = random_floats(cols, 1.f, uint32_t(seed + 4));
  for (float& v : scale_host) v += 1.f;
  auto scale = upload(scale_host);
  const float eps = 1e-6f;
  cuda::DeviceBuffer<cuda::bf16> x(cols);
  cuda::rms_norm(h.get(), scale.get(), x.get(), 1, s.cols, eps, nullptr);
  const std::vector<float> start(rows + guard, -7.f);
  auto y_ref = upload(start);
  auto y_got = upload(start);
  cuda::q_gemv(W.q(), x.get(), y_ref.get(), cuda::GemvOut::Store, nullptr);
  cuda::q_gemv_rms_staged(W.q(), h.get(), scale.get(), eps, y_got.get(), nullptr);
  const std::vector<float> want = download(y_ref), got = download(y_got);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
      << "q_gemv_rms_staged differs from rms_norm + q_gemv, or wrote past its rows";
  // The CPU twin as well, on the x rms_norm produced.
  std::vector<uint16_t> xb(cols);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  LILAC_CUDA_CHECK(cudaMemcpy(xb.data(), x.get(), x.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> xf(cols);
  for (size_t i = 0; i < cols; ++i) xf[i] = bf16_to_f32(xb[i]);
  const std::vector<float> got_rows(got.begin(), got.begin() + std::ptrdiff_t(rows));
  EXPECT_TRUE(within(got_rows, q_twin(W, 0, s.rows, xf), q_gemv_tolerance(W, 0, s.rows, xf),
                     "q_gemv_rms_staged vs the twin"));
}

// On Hopper the decode projections of the real model run staged (the backend's one-row decode
// takes them when available; elsewhere it falls back to q_gemv); lm_head does not.
TEST(Q4GemvStaged, TakesTheDecodeProjectionsOnHopper) {
  LILAC_REQUIRE_GPU();
  if (cuda::device_compute_capability() != 90) GTEST_SKIP() << "not a compute capability 9.0 GPU";
  for (Shape s :
       {Shape{12352, 2048, 4}, Shape{9216, 2048, 4}, Shape{2048, 4096, 4}, Shape{257, 2048, 8}}) {
    HostQ W(s.rows, s.cols, s.bits, 0.1f, 1);
    EXPECT_TRUE(cuda::q_gemv_staged_available(W.q())) << s.rows << " x " << s.cols;
  }
  HostQ lm(248320, 2048, 4, 0.1f, 1);
  EXPECT_FALSE(cuda::q_gemv_staged_available(lm.q()));
}

// The tolerance is meaningful: one code one step off (at the largest |x_k|, the row moves by |s
// x_k|) exceeds twice the bound in most rows, so a single wrong nibble would fail q_gemv's
// comparison.
TEST(Q4Gemv, ToleranceSeesOneWrongCode) {
  LILAC_REQUIRE_GPU();
  HostQ W(64, 2048, 4, std::sqrt(3.f / 2048.f), 9);
  std::vector<float> x = random_floats(2048, 1.f, 10);
  to_bf16_rounding(x);
  const std::vector<double> tol = q_gemv_tolerance(W, 0, 64, x);
  size_t kx = 0;  // the element where a wrong code shows most
  for (size_t k = 0; k < x.size(); ++k)
    if (std::fabs(x[k]) > std::fabs(x[kx])) kx = k;
  int caught = 0;
  for (int r = 0; r < 64; ++r) {
    const double s = bf16_to_f32(W.scales[size_t(r) * 32 + kx / 64]);
    caught += std::fabs(s * x[kx]) > 2 * tol[size_t(r)];
  }
  EXPECT_GT(caught, 32) << "the q_gemv tolerance is too loose to see one wrong code in most rows";
}

void check_q_embed(int bits) {
  HostQ table(300, 2048, bits, 1.f, 33 + uint64_t(bits));
  std::vector<int32_t> ids = {0, 299, 17, 17, 150, 1};
  auto d_ids = upload(ids);
  cuda::DeviceBuffer<float> h(ids.size() * 2048 + 11);
  poison(h);
  cuda::q_embed(d_ids.get(), table.q(), h.get(), int(ids.size()), nullptr);
  std::vector<float> got = download(h);
  EXPECT_TRUE(guard_untouched(got, ids.size() * 2048, "q_embed"));
  for (size_t t = 0; t < ids.size(); ++t) {
    const std::vector<float> want = table.row_f32(ids[t]);
    for (size_t k = 0; k < 2048; ++k)
      ASSERT_EQ(got[t * 2048 + k], want[k])
          << bits << "-bit token " << t << " (row " << ids[t] << ") element " << k;
  }
}

const char* qname(int bits) {
  return bits == 4 ? "q4" : "q8";
}

LILAC_CONFORMANCE_CASES(q4_linear) {
  std::vector<OpCase> cases;
  auto add = [&](const char* role, Shape s, uint64_t seed) {
    cases.push_back({"q_gemv", role + std::to_string(s.rows) + "x" + std::to_string(s.cols),
                     qname(s.bits), "dequantize_row + cpu::matmul",
                     [s, seed] { check_shape(s, seed); }});
  };
  // GDN in_proj, attention qkv, out_proj / o_proj, router + shared gate (8-bit), lm_head.
  add("in_proj_", {12352, 2048, 4}, 100);
  add("qkv_", {9216, 2048, 4}, 101);
  add("out_proj_", {2048, 4096, 4}, 102);
  add("router_", {257, 2048, 8}, 103);
  add("lm_head_", {248320, 2048, 4}, 7);
  // Staged (the norm fused): the decode shapes, and awkward ones that qualify.
  for (Shape s : {Shape{12352, 2048, 4}, Shape{9216, 2048, 4}, Shape{2048, 4096, 4},
                  Shape{257, 2048, 8}, Shape{1, 64, 4}, Shape{17, 128, 8}, Shape{33, 576, 4},
                  Shape{100, 1088, 4}, Shape{2048, 512, 8}})
    cases.push_back({"q_gemv_rms_staged", std::to_string(s.rows) + "x" + std::to_string(s.cols),
                     qname(s.bits), "rms_norm + q_gemv bit for bit; dequantize_row + cpu::matmul",
                     [s] { check_staged(s, 300 + uint64_t(s.rows)); }});
  // One row, rows not a multiple of 16, one group, group counts not a multiple of 8.
  uint64_t seed = 200;
  for (int bits : {4, 8})
    for (Shape s :
         {Shape{1, 64, bits}, Shape{17, 128, bits}, Shape{33, 576, bits}, Shape{100, 4160, bits},
          Shape{392, 128, bits}, Shape{5, 16384, bits}, Shape{2048, 512, bits}})
      add("awkward_", s, seed++);
  // 300 rows of 2048, 6 tokens (repeats, first and last row): exact.
  for (int bits : {4, 8})
    cases.push_back({"q_embed", "V300_T6_H2048", qname(bits), "dequantize_row",
                     [bits] { check_q_embed(bits); }});
  return cases;
}

TEST(Q4Gemv, BadArgumentsThrow) {
  cuda::QMatrix q{reinterpret_cast<const uint32_t*>(uintptr_t(256)),
                  reinterpret_cast<const uint32_t*>(uintptr_t(256)), 16, 100, 4};
  auto* x = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* y = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(cuda::q_gemv(q, x, y, cuda::GemvOut::Store, nullptr), Error);  // cols % 64
  q.cols = 128;
  q.bits = 3;
  EXPECT_THROW(cuda::q_gemv(q, x, y, cuda::GemvOut::Store, nullptr), Error);  // bits
  q.bits = 4;
  EXPECT_THROW(cuda::q_gemv(q, x + 1, y, cuda::GemvOut::Store, nullptr), Error);  // x alignment
}

}  // namespace
}  // namespace lilac::test
