// The largest elementwise difference of two float arrays, for the tests that compare logits,
// hidden states or recurrent states against a reference (tests/cpu).
#pragma once

#include <cmath>
#include <cstddef>
#include <utility>

namespace lilac::test {

// Max |a - b| over n values and the index of the worst one (for the failure message). A NaN on
// either side counts as the worst difference.
inline std::pair<double, size_t> max_abs_diff(const float* a, const float* b, size_t n) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) worst = d, at = i;
  }
  return {worst, at};
}

}  // namespace lilac::test
