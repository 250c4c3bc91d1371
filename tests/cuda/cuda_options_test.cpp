// CudaOptions (host only: no GPU needed). The defaults are what a backend made by
// make_cuda_backend / make_synthetic_backend runs unless its caller says otherwise; the environment
// switches are read by CudaOptions::from_environment alone, which only the runtime (cli, server)
// calls.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/cuda_backend.h"

namespace lilac::test {
namespace {

// Sets an environment variable for the scope, then removes it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(CudaOptions, FromEnvironmentReadsTheSwitches) {
  const cuda::CudaOptions defaults;
  {
    const cuda::CudaOptions o = cuda::CudaOptions::from_environment();
    EXPECT_EQ(o.use_graphs, defaults.use_graphs);
    EXPECT_EQ(o.small_moe_max_tokens, defaults.small_moe_max_tokens);
    EXPECT_EQ(o.small_moe_prefill_max_tokens, defaults.small_moe_prefill_max_tokens);
  }
  ScopedEnv graphs("LILAC_CUDA_GRAPHS", "0"), grouped("LILAC_BATCH_GROUPED_MOE", "12"),
      small("LILAC_SMALL_MOE_MAX", "0"), prefill("LILAC_SMALL_MOE_PREFILL_MAX", "-5"),
      attention("LILAC_ATTN_DECODE", "split");
  const cuda::CudaOptions o = cuda::CudaOptions::from_environment();
  EXPECT_FALSE(o.use_graphs);
  EXPECT_EQ(o.batch_grouped_moe_min_rows, 12);
  EXPECT_EQ(o.small_moe_max_tokens, 0);
  EXPECT_EQ(o.small_moe_prefill_max_tokens, 0);  // negative: clamped to "never"
  EXPECT_FALSE(o.fused_attention_decode);
  // The defaults do not move with the environment.
  EXPECT_TRUE(cuda::CudaOptions{}.use_graphs);
  EXPECT_EQ(cuda::CudaOptions{}.small_moe_max_tokens, defaults.small_moe_max_tokens);
}

}  // namespace
}  // namespace lilac::test
