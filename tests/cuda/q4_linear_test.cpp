// cuda::q_gemv / q_gemv_bf16out / q_embed against their CPU twins (cpu::dequantize_row +
// cpu::matmul; cpu::widen_row) on weights quantized by the CPU quantizer, at the model's decode
// shapes (GDN in_proj, attention qkv, out_proj / o_proj, the 8-bit router, lm_head) and awkward
// ones (one row, rows not a multiple of 16, one group, group counts not a multiple of 8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/moe_decode.h"
#include "cuda/norm.h"
#include "cuda/q4_linear.h"
#include "q4_test_util.h"
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

TEST(Q4Gemv, ModelShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 100;
  // GDN in_proj, attention qkv, out_proj / o_proj, router + shared gate (8-bit).
  for (Shape s :
       {Shape{12352, 2048, 4}, Shape{9216, 2048, 4}, Shape{2048, 4096, 4}, Shape{257, 2048, 8}})
    check_shape(s, seed++);
}

TEST(Q4Gemv, LmHead) {
  LILAC_REQUIRE_GPU();
  check_shape(Shape{248320, 2048, 4}, 7);
}

TEST(Q4Gemv, AwkwardShapes) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 200;
  for (int bits : {4, 8})
    for (Shape s :
         {Shape{1, 64, bits}, Shape{17, 128, bits}, Shape{33, 576, bits}, Shape{100, 4160, bits},
          Shape{392, 128, bits}, Shape{5, 16384, bits}, Shape{2048, 512, bits}})
      check_shape(s, seed++);
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

// q_gemv_rms (the input norm fused) against the unfused GPU path rms_norm + q_gemv: equal bit for
// bit (same plan, same order; the norm computed as rms_norm computes it), both ways of storing.
TEST(Q4Gemv, RmsFusedEqualsNormThenGemv) {
  LILAC_REQUIRE_GPU();
  uint64_t seed = 300;
  for (Shape s : {Shape{12352, 2048, 4}, Shape{9216, 2048, 4}, Shape{392, 128, 4},
                  Shape{17, 576, 8}, Shape{33, 4160, 4}, Shape{5, 16384, 8}}) {
    SCOPED_TRACE(testing::Message()
                 << "W [" << s.rows << ", " << s.cols << "] at " << s.bits << " bits");
    HostQ W(s.rows, s.cols, s.bits, std::sqrt(3.f / float(s.cols)), seed++);
    std::vector<float> h = random_floats(size_t(s.cols), 2.f, uint32_t(seed++));
    std::vector<float> scale = random_floats(size_t(s.cols), 0.1f, uint32_t(seed++));
    for (auto& v : scale) v += 1.f;
    auto dh = upload(h);
    auto ds = upload(scale);
    const float eps = 1e-6f;
    cuda::DeviceBuffer<cuda::bf16> x(static_cast<size_t>(s.cols));
    cuda::rms_norm(dh.get(), ds.get(), x.get(), 1, s.cols, eps, nullptr);
    for (auto mode : {cuda::GemvOut::Store, cuda::GemvOut::Accumulate}) {
      std::vector<float> y0 = random_floats(size_t(s.rows) + 9, 1.f, uint32_t(seed++));
      auto y1 = upload(y0);
      auto y2 = upload(y0);
      cuda::q_gemv(W.q(), x.get(), y1.get(), mode, nullptr);
      cuda::q_gemv_rms(W.q(), dh.get(), ds.get(), eps, y2.get(), mode, nullptr);
      const std::vector<float> a = download(y1), b = download(y2);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
          << "q_gemv_rms differs from rms_norm + q_gemv ("
          << (mode == cuda::GemvOut::Store ? "Store" : "Accumulate") << ")";
    }
  }
}

// q_moe_router (post norm + router q_gemv + top-k, one launch) against rms_norm + q_gemv +
// router_topk: logits, ids, weights and the normalised x equal bit for bit, the workspace counter
// back at zero after each launch (the second launch reuses it).
TEST(Q4Gemv, MoeRouterFusedEqualsUnfused) {
  LILAC_REQUIRE_GPU();
  struct Case {
    int E, H, k, bits;
  };
  std::vector<uint8_t> zero(cuda::moe_router_workspace_bytes(), 0);
  auto ws = upload(zero);
  for (Case c : {Case{256, 2048, 8, 8}, Case{256, 2048, 8, 4}, Case{16, 128, 4, 8},
                 Case{5, 64, 5, 4}, Case{64, 4096, 32, 8}}) {
    SCOPED_TRACE(testing::Message()
                 << "E=" << c.E << " H=" << c.H << " k=" << c.k << " at " << c.bits << " bits");
    const int rows = c.E + 1;
    const uint64_t seed = uint64_t(c.E * 31 + c.H + c.k + c.bits);
    HostQ W(rows, c.H, c.bits, 0.05f, seed);
    std::vector<float> h = random_floats(size_t(c.H), 2.f, uint32_t(seed + 1));
    std::vector<float> scale = random_floats(size_t(c.H), 0.1f, uint32_t(seed + 2));
    for (auto& v : scale) v += 1.f;
    const float eps = 1e-6f;
    auto dh = upload(h);
    auto ds = upload(scale);

    cuda::DeviceBuffer<cuda::bf16> x1(static_cast<size_t>(c.H));
    cuda::DeviceBuffer<float> l1(static_cast<size_t>(rows));
    cuda::DeviceBuffer<int32_t> i1(static_cast<size_t>(c.k));
    cuda::DeviceBuffer<float> w1(static_cast<size_t>(c.k));
    cuda::rms_norm(dh.get(), ds.get(), x1.get(), 1, c.H, eps, nullptr);
    cuda::q_gemv(W.q(), x1.get(), l1.get(), cuda::GemvOut::Store, nullptr);
    cuda::router_topk(l1.get(), rows, 1, c.E, c.k, i1.get(), w1.get(), nullptr);
    const std::vector<float> logits1 = download(l1), wt1 = download(w1);
    const std::vector<int32_t> idx1 = download(i1);
    std::vector<uint16_t> xb1(static_cast<size_t>(c.H));
    LILAC_CUDA_CHECK(cudaMemcpy(xb1.data(), x1.get(), xb1.size() * 2, cudaMemcpyDeviceToHost));

    for (int launch = 0; launch < 2; ++launch) {
      SCOPED_TRACE(testing::Message() << "launch " << launch);
      const size_t guard = 16;
      cuda::DeviceBuffer<cuda::bf16> x2(size_t(c.H) + guard);
      cuda::DeviceBuffer<float> l2(size_t(rows) + guard);
      cuda::DeviceBuffer<int32_t> i2(size_t(c.k) + guard);
      cuda::DeviceBuffer<float> w2(size_t(c.k) + guard);
      poison(x2);
      poison(l2);
      poison(i2);
      poison(w2);
      cuda::q_moe_router(W.q(), c.E, dh.get(), ds.get(), eps, c.k, l2.get(), i2.get(), w2.get(),
                         x2.get(), ws.get(), nullptr);
      std::vector<float> logits2 = download(l2), wt2 = download(w2);
      std::vector<int32_t> idx2 = download(i2);
      std::vector<uint16_t> xb2(x2.size());
      LILAC_CUDA_CHECK(cudaMemcpy(xb2.data(), x2.get(), x2.bytes(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(guard_untouched(logits2, size_t(rows), "q_moe_router logits"));
      EXPECT_TRUE(guard_untouched(idx2, size_t(c.k), "q_moe_router idx"));
      EXPECT_TRUE(guard_untouched(wt2, size_t(c.k), "q_moe_router w"));
      EXPECT_TRUE(guard_untouched(xb2, size_t(c.H), "q_moe_router x_out"));
      EXPECT_EQ(0, std::memcmp(logits2.data(), logits1.data(), size_t(rows) * 4))
          << "logits differ from rms_norm + q_gemv";
      idx2.resize(size_t(c.k));
      wt2.resize(size_t(c.k));
      EXPECT_EQ(idx2, idx1) << "ids differ from router_topk";
      EXPECT_EQ(0, std::memcmp(wt2.data(), wt1.data(), size_t(c.k) * 4))
          << "weights differ from router_topk";
      EXPECT_EQ(0, std::memcmp(xb2.data(), xb1.data(), size_t(c.H) * 2))
          << "x_out differs from rms_norm";
      EXPECT_EQ(download(ws), zero) << "the workspace counter was not left at zero";
    }
  }
}

TEST(Q4Embed, ExactRows) {
  LILAC_REQUIRE_GPU();
  for (int bits : {4, 8}) {
    HostQ table(300, 2048, bits, 1.f, 33 + bits);
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
