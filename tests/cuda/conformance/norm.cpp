// Conformance cases of cuda::rms_norm and cuda::embed against their CPU twins (cpu::rms_norm,
// widen_row), and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "conformance.h"
#include "cpu/linear.h"
#include "cpu/norm.h"
#include "cuda/norm.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct NormCase {
  int T, H;
};

// Tolerance: the twin computes mean(h^2) in double, the kernel in f32 (a per-thread sum of
// <= H/256 terms and a 256-way tree: relative error < ~2e-6 at H = 2048) and rsqrtf (2 ulp), so
// the two f32 values before rounding differ by < 1e-5 relative; the kernel then rounds to bf16
// (half an ulp: 2^-8 relative). So |gpu - cpu| <= (2^-8 + 1e-5) |cpu| against the unrounded twin.
void check_rms_norm(NormCase c) {
  std::vector<float> h = random_floats(size_t(c.T) * c.H, 1.f, 11 + c.H);
  for (int t = 0; t < c.T; ++t) {  // rows of very different scales: the norm removes them
    const float s = t % 3 == 0 ? 1.f : t % 3 == 1 ? 300.f : 1e-3f;
    for (int i = 0; i < c.H; ++i) h[size_t(t) * c.H + i] *= s;
  }
  std::vector<float> scale = random_floats(size_t(c.H), 0.1f, 5);
  for (auto& v : scale) v += 1.f;
  const float eps = 1e-6f;
  std::vector<float> want(size_t(c.T) * c.H);
  for (int t = 0; t < c.T; ++t)
    cpu::rms_norm(&h[size_t(t) * c.H], scale.data(), c.H, eps, &want[size_t(t) * c.H]);

  auto dh = upload(h);
  auto ds = upload(scale);
  cuda::DeviceBuffer<cuda::bf16> out(size_t(c.T) * c.H + 64);  // + a guard band
  poison(out);
  cuda::rms_norm(dh.get(), ds.get(), out.get(), c.T, c.H, eps, nullptr);
  std::vector<float> got = download_bf16_as_f32(out);
  std::vector<uint16_t> raw(out.size());
  LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(guard_untouched(raw, size_t(c.T) * c.H, "rms_norm"));
  got.resize(want.size());
  EXPECT_TRUE(within(got, want, 1e-30, 1.0 / 256 + 1e-5, "rms_norm"));
}

void check_embed(int H) {
  const int V = 1000, T = 6;
  std::vector<uint16_t> table = random_bf16(size_t(V) * H, 2.f, uint64_t(H));
  const std::vector<int32_t> ids = {0, 999, 17, 17, 512, 3};
  std::vector<float> want(size_t(T) * H);
  for (int t = 0; t < T; ++t)
    widen_row(&table[size_t(ids[size_t(t)]) * H], DType::BF16, H, &want[size_t(t) * H]);
  auto dtab = upload_bf16(table);
  auto dids = upload(ids);
  cuda::DeviceBuffer<float> h(size_t(T) * H + 16);
  poison(h);
  cuda::embed(dids.get(), dtab.get(), h.get(), T, H, nullptr);
  std::vector<float> got = download(h);
  EXPECT_TRUE(guard_untouched(got, size_t(T) * H, "embed"));
  got.resize(want.size());
  EXPECT_TRUE(within(got, want, 0.0, 0.0, "embed"));
}

// H % 4 == 0 takes the float4 path; the others the scalar one.
LILAC_CONFORMANCE_CASES(norm) {
  std::vector<OpCase> cases;
  for (NormCase c : {NormCase{1, 2048}, NormCase{5, 2048}, NormCase{3, 8}, NormCase{2, 1},
                     NormCase{7, 1000}, NormCase{4, 1003}, NormCase{1, 2050}, NormCase{17, 128}})
    cases.push_back({"rms_norm", "T" + std::to_string(c.T) + "_H" + std::to_string(c.H), "f32",
                     "cpu::rms_norm", [c] { check_rms_norm(c); }});
  // 1000 rows of H, 6 tokens (repeats, first and last row): exact.
  for (int H : {2048, 1003, 8, 24})
    cases.push_back(
        {"embed", "V1000_T6_H" + std::to_string(H), "bf16", "widen_row", [H] { check_embed(H); }});
  return cases;
}

TEST(CudaNorm, BadShapesThrowBeforeLaunching) {
  EXPECT_THROW(cuda::rms_norm(nullptr, nullptr, nullptr, 0, 2048, 1e-6f, nullptr), Error);
  EXPECT_THROW(cuda::embed(nullptr, nullptr, nullptr, 1, 0, nullptr), Error);
}

}  // namespace
}  // namespace lilac::test
