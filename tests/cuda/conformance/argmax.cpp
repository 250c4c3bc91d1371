// Conformance cases of cuda::argmax (greedy sampling) against lilac::argmax: the token must be
// EQUAL, ties (lowest id), NaN, -0 / +0, -inf and the padded vocabulary's tail included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "conformance.h"
#include "cuda/sampling.h"
#include "model/sampling.h"

namespace lilac::test {
namespace {

constexpr int kV = 248320, kReal = 248077;  // the model's padded vocabulary and its real ids

// One workspace for every launch of a case: zero-filled once; every launch must leave it so (the
// next launch reads it).
struct ArgmaxRunner {
  std::vector<uint8_t> zero = std::vector<uint8_t>(cuda::argmax_workspace_bytes(kV), 0);
  cuda::DeviceBuffer<uint8_t> ws = upload(zero);
  cuda::DeviceBuffer<int32_t> out = cuda::DeviceBuffer<int32_t>(1);

  void run(const std::vector<float>& x, int offset, int n, const char* what) {
    auto d = upload(x);
    poison(out);
    cuda::argmax(d.get() + offset, n, ws.get(), out.get(), nullptr);
    EXPECT_EQ(download(out)[0], argmax(x.data() + offset, n))
        << what << " (n = " << n << ", offset " << offset << ")";
  }
};

// The model's vocabulary: random logits, then crafted maxima.
void check_vocabulary() {
  ArgmaxRunner r;
  const std::vector<float> base = random_floats(kV, 3.f, 77);
  const float mx = *std::max_element(base.begin(), base.end());
  r.run(base, 0, kReal, "random");
  std::vector<float> x = base;
  x[5000] = x[200000] = x[240000] = mx + 1;
  r.run(x, 0, kReal, "tie at the maximum: lowest id");
  x = base;
  x[kReal - 1] = mx + 2;
  r.run(x, 0, kReal, "maximum at the last real id");
  x = base;
  x[kReal] = x[kV - 1] = mx + 10;
  r.run(x, 0, kReal, "larger values past n_real are ignored");
  x = base;
  const int amax = argmax(base.data(), kReal);
  x[10] = x[size_t(amax)] = std::numeric_limits<float>::quiet_NaN();
  r.run(x, 0, kReal, "NaNs never win");
  r.run(std::vector<float>(kV, 0.25f), 0, kReal, "all equal");
  x.assign(kV, -1.f);
  x[200000] = 0.f;
  x[100000] = -0.f;  // equal to +0: the lower id wins, across blocks too
  r.run(x, 0, kReal, "-0 and +0 tie at the maximum");
  x[100000] = 0.f;
  x[200000] = -0.f;
  r.run(x, 0, kReal, "+0 and -0 tie at the maximum");
  r.run(std::vector<float>(kV, -std::numeric_limits<float>::infinity()), 0, kReal, "all -inf");
}

// n values, aligned and one float off (the scalar path).
void check_small(int n) {
  ArgmaxRunner r;
  std::vector<float> y = random_floats(size_t(n) + 3, 1.f, uint32_t(n));
  r.run(y, 0, n, "small");
  r.run(y, 1, n, "unaligned (scalar path)");
}

LILAC_CONFORMANCE_CASES(argmax) {
  std::vector<OpCase> cases;
  cases.push_back({"argmax", "V248320_n248077_ties_nan_signed_zero_inf", "f32", "lilac::argmax",
                   [] { check_vocabulary(); }});
  for (int n : {1, 5, 1000, 2048, 2049, 4097, 123457})
    cases.push_back({"argmax", "n" + std::to_string(n) + "_aligned_and_offset1", "f32",
                     "lilac::argmax", [n] { check_small(n); }});
  return cases;
}

}  // namespace
}  // namespace lilac::test
