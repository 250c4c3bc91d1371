// Helpers for the GPU tests (label gpu): the GPU requirement and the one element-wise comparison
// with the CPU twin (within), naming the first and worst element. Random data, host<->device
// copies and poisoned outputs are in twins/host_data.h (no GoogleTest: the kernel lab uses them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "cuda/device_model.h"
#include "model/qwen36.h"
#include "twins/host_data.h"
#include "util/half.h"

namespace lilac::test {

// The real model's widths with its first 8 layers: the full-width synthetic model the backend
// tests can afford, random weights from `seed` (4-bit when q4).
inline std::shared_ptr<cuda::DeviceModel> synthetic_eight_layers(uint32_t seed, bool q4 = false) {
  ModelConfig cfg = qwen36_35b_a3b_config();
  cfg.layers = 8;
  cfg.layer_types.resize(8);
  return std::shared_ptr<cuda::DeviceModel>(cuda::synthetic_device_model(cfg, seed, q4));
}

// T prompt ids spread over the real vocabulary (a multiplicative hash of the position, plus
// `salt`): a prompt that routes like text, not like one repeated token.
inline std::vector<int32_t> spread_prompt(int T, uint32_t salt = 0) {
  std::vector<int32_t> prompt(static_cast<size_t>(T));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = int32_t((i * 2654435761u + salt) % kQwen36RealTokens);
  return prompt;
}

// A GPU test that finds no GPU fails: a run that was meant to test the kernels must not report
// success without running them. LILAC_ALLOW_NO_GPU=1 in the environment excludes them explicitly
// (they are then skipped, and the run says so).
#define LILAC_REQUIRE_GPU()                                                                     \
  do {                                                                                          \
    if (::lilac::cuda::device_count() == 0) {                                                   \
      const char* allow = std::getenv("LILAC_ALLOW_NO_GPU");                                    \
      if (allow && std::string(allow) == "1") GTEST_SKIP() << "no CUDA device (allowed)";       \
      FAIL() << "no CUDA device: GPU tests need one (LILAC_ALLOW_NO_GPU=1 to skip explicitly)"; \
    }                                                                                           \
  } while (0)

// ---- the one comparison of GPU results with the CPU twin
// ----------------------------------------- within(...): every element within its tolerance (NaN,
// e.g. an unwritten poisoned element, fails); on failure it reports the count, the first and the
// worst offender (largest error / tolerance), each with its position, the GPU value, the CPU value
// and the tolerance. Three forms of one check: element functions (the general one: large outputs
// compared in place, positions named by `where`, e.g. "row 5, col 17"), a tolerance per element,
// and atol + rtol * |want|.
inline ::testing::AssertionResult within(size_t n, const std::function<double(size_t)>& got,
                                         const std::function<double(size_t)>& want,
                                         const std::function<double(size_t)>& tol,
                                         const std::function<std::string(size_t)>& where,
                                         const std::string& what) {
  size_t bad = 0, first = 0, worst = 0;
  double worst_ratio = -1;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(got(i) - want(i));
    if (!(err <= tol(i))) {
      if (bad++ == 0) first = i;
      const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / tol(i);
      if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": " << bad << " of " << n << " elements out of tolerance; first at "
     << where(first) << ": gpu " << got(first) << " vs cpu " << want(first) << " (tol "
     << tol(first) << "); worst at " << where(worst) << ": gpu " << got(worst) << " vs cpu "
     << want(worst) << " (tol " << tol(worst) << ")";
  return ::testing::AssertionFailure() << os.str();
}

inline ::testing::AssertionResult within(const std::vector<float>& got,
                                         const std::vector<float>& want,
                                         const std::vector<double>& tol, const std::string& what) {
  if (got.size() != want.size() || tol.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": sizes " << got.size() << ", " << want.size() << ", " << tol.size();
  return within(
      got.size(), [&](size_t i) { return double(got[i]); },
      [&](size_t i) { return double(want[i]); }, [&](size_t i) { return tol[i]; },
      [](size_t i) { return "[" + std::to_string(i) + "]"; }, what);
}

inline ::testing::AssertionResult within(const std::vector<float>& got,
                                         const std::vector<float>& want, double atol, double rtol,
                                         const std::string& what) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = atol + rtol * std::fabs(double(want[i]));
  return within(got, want, tol, what);
}

// How many elements of two equally long vectors differ in their bytes (0: the same bits).
inline size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  return n;
}

// The name the backend-level tests (cuda_backend_test, q4_backend_test, batch_kernels_test) call;
// the same check as within(got, want, atol, rtol, what). New code calls within.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, double atol,
                                            double rtol, const std::string& what) {
  return within(got, want, atol, rtol, what);
}

}  // namespace lilac::test
