// Helpers of the 4-bit GPU tests. The host matrix (HostQ), the CPU twin of q_gemv (q_twin) and its
// error bound (q_gemv_tolerance) are in twins/q4_twin.h (no GoogleTest: the kernel lab uses them);
// this header adds the GoogleTest-based helpers the 4-bit tests use with them.
#pragma once

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kernel_check.h"
#include "prefill_test_util.h"
#include "twins/q4_twin.h"
