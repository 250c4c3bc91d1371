// Conformance cases of the dense projections over T token rows at once (the batched decode step
// and the short-prompt prefill slabs): gemv_rows (BF16 weights) and q_gemv_rows (4/8-bit), Store
// and Accumulate, each against its CPU twin per token, with a guard past the output that must stay
// untouched (rows past the matrix, tokens past T). Shapes: the model's matrices at 1-64 rows, then
// ones that hit the kernels' edges (q_gemv_rows: K-slices of one group, no cluster, several
// register sets per slice, a short last slice).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "../q4_test_util.h"
#include "conformance.h"
#include "cuda/gemv_rows.h"
#include "cuda/q4_linear.h"

namespace lilac::test {
namespace {

using cuda::DeviceBuffer;

struct RowsCase {
  int rows, cols, bits;  // bits 16: BF16 weights
  int T;
  uint32_t seed;
};

// gemv_rows against an f64 sum of the same bf16 values per token: within f32 rounding of the
// products' magnitudes. Both forms (gemv_rows.h: staged where it applies, and the other), each at
// its own K-slice count; then both at 2 slices, which must agree bit for bit.
void check_gemv_rows(const RowsCase& c) {
  uint32_t seed = c.seed;
  std::vector<float> w = random_floats(size_t(c.rows) * c.cols, 0.05f, ++seed);
  auto dw = upload_bf16(to_bf16_rounding(w));
  std::vector<float> x = random_floats(size_t(c.T) * c.cols, 1.f, ++seed);
  auto dx = upload_bf16(to_bf16_rounding(x));
  const size_t n = size_t(c.T) * c.rows, guard = 29;
  std::vector<float> y0 = random_floats(n, 2.f, ++seed);
  y0.resize(n + guard, 0.f);
  std::vector<double> want(n), tol(n);
  for (int t = 0; t < c.T; ++t)
    for (int r = 0; r < c.rows; ++r) {
      double sum = 0, mag = 0;
      for (int k = 0; k < c.cols; ++k) {
        const double p = double(w[size_t(r) * c.cols + k]) * double(x[size_t(t) * c.cols + k]);
        sum += p;
        mag += std::fabs(p);
      }
      const size_t i = size_t(t) * c.rows + r;
      want[i] = sum;
      tol[i] = 4e-6 * mag + 1e-6;
    }
  // Store and Accumulate in one form at `slices` (0: the launcher's choice); returns Store's bytes.
  auto run_form = [&](bool staged, int slices, bool check) {
    SCOPED_TRACE(std::string(staged ? "staged" : "unstaged") + ", slices " +
                 std::to_string(slices));
    cuda::set_gemv_rows_staged_enabled(staged);
    DeviceBuffer<float> ys(n + guard);
    poison(ys);
    auto ya = upload(y0);
    LILAC_CUDA_CHECK(cudaMemset(ya.get() + n, 0xff, guard * sizeof(float)));
    cuda::gemv_rows(dw.get(), c.rows, c.cols, dx.get(), c.T, ys.get(), cuda::GemvOut::Store,
                    nullptr, slices);
    cuda::gemv_rows(dw.get(), c.rows, c.cols, dx.get(), c.T, ya.get(), cuda::GemvOut::Accumulate,
                    nullptr, slices);
    cuda::set_gemv_rows_staged_enabled(true);
    const auto got_s = download(ys), got_a = download(ya);
    EXPECT_TRUE(guard_untouched(got_s, n, "gemv_rows Store"));
    EXPECT_TRUE(guard_untouched(got_a, n, "gemv_rows Accumulate"));
    if (check) {
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!(std::fabs(got_s[i] - want[i]) <= tol[i])) ++bad;
        if (!(std::fabs(got_a[i] - (double(y0[i]) + want[i])) <= tol[i] + 4e-7 * std::fabs(y0[i])))
          ++bad;
      }
      EXPECT_EQ(bad, 0u) << "elements out of tolerance";
    }
    return got_s;
  };
  run_form(true, 0, true);
  run_form(false, 0, true);
  const auto a = run_form(true, 2, false), b = run_form(false, 2, false);
  // Bytes, not floats: the guard holds NaN poison.
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << "gemv_rows staged and unstaged at 2 slices differ";
}

// q_gemv_rows against the CPU twin per token (the q_gemv bound: same arithmetic per (row, group),
// f32 sums in another order) at tokens 0, T / 2 and T - 1.
void check_q_gemv_rows(const RowsCase& c) {
  uint64_t seed = c.seed;
  HostQ W(c.rows, c.cols, c.bits, std::sqrt(3.f / float(c.cols)), ++seed);
  std::vector<float> x = random_floats(size_t(c.T) * c.cols, 1.f, uint32_t(++seed));
  auto dx = upload_bf16(to_bf16_rounding(x));
  const size_t n = size_t(c.T) * c.rows, guard = 41;
  std::vector<float> y0 = random_floats(n, 3.f, uint32_t(++seed));
  y0.resize(n + guard, 0.f);
  DeviceBuffer<float> ys(n + guard);
  poison(ys);
  auto ya = upload(y0);
  LILAC_CUDA_CHECK(cudaMemset(ya.get() + n, 0xff, guard * sizeof(float)));
  cuda::q_gemv_rows(W.q(), dx.get(), c.T, ys.get(), cuda::GemvOut::Store, nullptr);
  cuda::q_gemv_rows(W.q(), dx.get(), c.T, ya.get(), cuda::GemvOut::Accumulate, nullptr);
  const auto got_s = download(ys), got_a = download(ya);
  EXPECT_TRUE(guard_untouched(got_s, n, "q_gemv_rows Store"));
  EXPECT_TRUE(guard_untouched(got_a, n, "q_gemv_rows Accumulate"));
  std::set<int> tokens = {0, c.T / 2, c.T - 1};
  if (c.T > 64) tokens.insert({63, 64, c.T - 65});  // slab edges
  for (int t : tokens) {
    const std::vector<float> xt(x.begin() + ptrdiff_t(t) * c.cols,
                                x.begin() + ptrdiff_t(t + 1) * c.cols);
    const std::vector<float> want = q_twin(W, 0, c.rows, xt);
    const std::vector<double> tol = q_gemv_tolerance(W, 0, c.rows, xt);
    const std::vector<float> gs(got_s.begin() + ptrdiff_t(t) * c.rows,
                                got_s.begin() + ptrdiff_t(t + 1) * c.rows);
    EXPECT_TRUE(within(gs, want, tol, "q_gemv_rows Store, token " + std::to_string(t)));
    std::vector<float> sum(static_cast<size_t>(c.rows)), ga(sum.size());
    std::vector<double> t2(sum.size());
    for (size_t r = 0; r < sum.size(); ++r) {
      sum[r] = y0[size_t(t) * c.rows + r] + want[r];
      t2[r] = tol[r] + 2 * kU * std::fabs(double(sum[r]));
      ga[r] = got_a[size_t(t) * c.rows + r];
    }
    EXPECT_TRUE(within(ga, sum, t2, "q_gemv_rows Accumulate, token " + std::to_string(t)));
  }
}

std::string shape_name(const char* role, int rows, int cols, int T) {
  return std::string(role) + std::to_string(rows) + "x" + std::to_string(cols) + "_T" +
         std::to_string(T);
}

LILAC_CONFORMANCE_CASES(rows) {
  std::vector<OpCase> cases;
  struct Shape {
    const char* role;
    int rows, cols, bits;
    std::vector<int> T;
  };
  // BF16: out_proj, the router, an awkward one, in_proj; 40 x 4096 at 24 tokens: 16-warp blocks
  // (3 tiles, 16 K-slices) with 4 token chunks and a partial last tile; 50 x 320: 4 slices of
  // 2, 2, 1 and 0 of its 5 steps.
  const std::vector<Shape> bf16 = {{"out_proj_", 2048, 4096, 16, {1, 16, 64}},
                                   {"router_", 257, 2048, 16, {2, 33}},
                                   {"awkward_", 100, 192, 16, {1, 5, 8, 17, 64}},
                                   {"awkward_", 40, 4096, 16, {24}},
                                   {"awkward_", 50, 320, 16, {3}},
                                   {"in_proj_", 12352, 2048, 16, {9}}};
  uint32_t seed = 700;
  for (const Shape& s : bf16)
    for (int T : s.T) {
      const RowsCase c{s.rows, s.cols, s.bits, T, seed += 4};
      cases.push_back({"gemv_rows", shape_name(s.role, s.rows, s.cols, T), "bf16", "f64 sum",
                       [c] { check_gemv_rows(c); }});
    }
  // 4/8-bit: the model's shapes (in_proj, out_proj at 8 K-slices, the 8-bit router at 8 slices of
  // 4 groups; prompt chunks in slabs of 16 (130 tokens), 32 (256, 300) and 64 (512, 1,000) tokens
  // on a 132-SM GPU), then 3 groups (3 slices of 1), 1 group (no cluster), 12 groups of 8 bits (3
  // slices of 4), 64 groups of 8 bits (8 slices of two register sets), 65 groups of 4 bits (8
  // slices of 9: a second set per slice, a short last slice).
  const std::vector<Shape> quant = {
      {"in_proj_", 12352, 2048, 4, {1, 9, 64}},
      {"out_proj_", 2048, 4096, 4, {3, 16, 64}},
      {"router_", 257, 2048, 8, {2, 33, 64, 256, 130, 300, 512, 1000}},
      {"awkward_", 100, 192, 4, {1, 5, 8, 17, 64, 65}},
      {"awkward_", 16, 64, 8, {1, 64}},
      {"awkward_", 48, 768, 8, {7, 40}},
      {"awkward_", 24, 4096, 8, {5, 64}},
      {"awkward_", 40, 4160, 4, {8, 63}}};
  seed = 900;
  for (const Shape& s : quant)
    for (int T : s.T) {
      const RowsCase c{s.rows, s.cols, s.bits, T, seed += 4};
      cases.push_back({"q_gemv_rows", shape_name(s.role, s.rows, s.cols, T),
                       s.bits == 4 ? "q4" : "q8", "dequantize_row + cpu::matmul",
                       [c] { check_q_gemv_rows(c); }});
    }
  return cases;
}

}  // namespace
}  // namespace lilac::test
