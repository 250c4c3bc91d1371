// Helpers of the prefill GEMM and MoE GPU tests: fast reproducible random bf16 data, row norms for
// tolerances and the dot-product tolerance of a GEMM (twins/gemm_twin.h, shared with the kernel
// lab; the comparison is within(), cuda_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include "twins/gemm_twin.h"
#include "twins/host_data.h"
