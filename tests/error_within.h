// The error a call throws, which must come within seconds: the special-file checks answer at once
// where reading a FIFO used to block forever (tests/io/hardening_test.cpp,
// tests/server/model_files_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "util/error.h"

namespace lilac::test {

// Runs `f` and returns the lilac::Error it threw ("(no error)" if none); fails the test when it
// took 5 s or more.
template <typename F>
std::string error_within_seconds(F f) {
  const auto start = std::chrono::steady_clock::now();
  std::string what = "(no error)";
  try {
    f();
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  return what;
}

}  // namespace lilac::test
