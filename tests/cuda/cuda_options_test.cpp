// CudaOptions (host only: no GPU needed). The defaults are what a backend made by
// make_cuda_backend / make_synthetic_backend runs unless its caller says otherwise; the environment
// switches are read by CudaOptions::from_environment alone, which only the runtime (cli, server)
// calls.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/launch.h"
#include "util/error.h"

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
    EXPECT_EQ(o.pdl, defaults.pdl);
    EXPECT_EQ(o.small_moe_max_tokens, defaults.small_moe_max_tokens);
    EXPECT_EQ(o.small_moe_prefill_max_tokens, defaults.small_moe_prefill_max_tokens);
  }
  ScopedEnv graphs("LILAC_CUDA_GRAPHS", "0"), grouped("LILAC_BATCH_GROUPED_MOE", "12"),
      small("LILAC_SMALL_MOE_MAX", "0"), prefill("LILAC_SMALL_MOE_PREFILL_MAX", "-5"),
      pdl("LILAC_PDL", "0");
  const cuda::CudaOptions o = cuda::CudaOptions::from_environment();
  EXPECT_FALSE(o.use_graphs);
  EXPECT_FALSE(o.pdl);
  EXPECT_EQ(o.batch_grouped_moe_min_rows, 12);
  EXPECT_EQ(o.small_moe_max_tokens, 0);
  EXPECT_EQ(o.small_moe_prefill_max_tokens, 0);  // negative: clamped to "never"
  // The defaults do not move with the environment.
  EXPECT_TRUE(cuda::CudaOptions{}.use_graphs);
  EXPECT_TRUE(cuda::CudaOptions{}.pdl);
  EXPECT_EQ(cuda::CudaOptions{}.small_moe_max_tokens, defaults.small_moe_max_tokens);
}

// Sets the switch `name` to each spelling in `ok` and checks the field it sets, then to `bad`,
// which from_environment must refuse.
template <class T>
void expect_spellings(const char* name, T cuda::CudaOptions::*field,
                      std::initializer_list<std::pair<const char*, T>> ok, const char* bad) {
  for (const auto& [v, want] : ok) {
    ScopedEnv env(name, v);
    EXPECT_EQ(cuda::CudaOptions::from_environment().*field, want) << name << "=" << v;
  }
  ScopedEnv env(name, bad);
  EXPECT_THROW(cuda::CudaOptions::from_environment(), Error) << name << "=" << bad;
}

// The A/B switches that pick a kernel or a threshold: each spelling they accept, the clamp of a
// row threshold, and a clear error for a value they do not know (rather than a silent default).
TEST(CudaOptions, FromEnvironmentReadsTheKernelChoices) {
  const cuda::CudaOptions defaults;
  EXPECT_EQ(defaults.q4_wgmma_min_rows, 2);
  EXPECT_EQ(defaults.gdn_batch_kernel, cuda::GdnBatchKernel::automatic);
  EXPECT_EQ(defaults.small_moe_kernel, cuda::MoeSmallKernel::automatic);
  {
    ScopedEnv min("LILAC_Q4_WGMMA_MIN", "17");
    EXPECT_EQ(cuda::CudaOptions::from_environment().q4_wgmma_min_rows, 17);
  }
  {
    ScopedEnv min("LILAC_Q4_WGMMA_MIN", "0");  // at least one row
    EXPECT_EQ(cuda::CudaOptions::from_environment().q4_wgmma_min_rows, 1);
  }
  expect_spellings("LILAC_GDN_BATCH_KERNEL", &cuda::CudaOptions::gdn_batch_kernel,
                   {{"split", cuda::GdnBatchKernel::split},
                    {"head", cuda::GdnBatchKernel::head},
                    {"auto", cuda::GdnBatchKernel::automatic},
                    {"automatic", cuda::GdnBatchKernel::automatic}},
                   "cluster");
  expect_spellings("LILAC_SMALL_MOE_KERNEL", &cuda::CudaOptions::small_moe_kernel,
                   {{"registers", cuda::MoeSmallKernel::registers},
                    {"streamed", cuda::MoeSmallKernel::streamed},
                    {"chained", cuda::MoeSmallKernel::chained},
                    {"auto", cuda::MoeSmallKernel::automatic}},
                   "Registers");
  EXPECT_EQ(defaults.prompt_moe, cuda::PromptMoe::automatic);
  expect_spellings("LILAC_PROMPT_MOE", &cuda::CudaOptions::prompt_moe,
                   {{"small", cuda::PromptMoe::small},
                    {"tile128", cuda::PromptMoe::tile128},
                    {"rows64", cuda::PromptMoe::rows64},
                    {"rows32", cuda::PromptMoe::rows32},
                    {"auto", cuda::PromptMoe::automatic}},
                   "rows16");
}

// The form of a prompt chunk's 4-bit experts: the measured rule by T (s21 runs 9-10), and a forced
// form wherever it exists (small only up to the small-M kernels' bound).
TEST(CudaOptions, PromptMoeForm) {
  using cuda::PromptMoe;
  const PromptMoe a = PromptMoe::automatic;
  EXPECT_EQ(cuda::prompt_moe_form(a, 64, 512), PromptMoe::small);
  EXPECT_EQ(cuda::prompt_moe_form(a, 143, 512), PromptMoe::small);
  EXPECT_EQ(cuda::prompt_moe_form(a, 144, 512), PromptMoe::rows32);
  EXPECT_EQ(cuda::prompt_moe_form(a, 512, 512), PromptMoe::rows32);
  EXPECT_EQ(cuda::prompt_moe_form(a, 896, 512), PromptMoe::rows32);
  EXPECT_EQ(cuda::prompt_moe_form(a, 897, 512), PromptMoe::rows64);
  EXPECT_EQ(cuda::prompt_moe_form(a, 4096, 512), PromptMoe::rows64);
  EXPECT_EQ(cuda::prompt_moe_form(a, 100, 0), PromptMoe::rows32);  // small-M kernels off
  EXPECT_EQ(cuda::prompt_moe_form(PromptMoe::small, 300, 512), PromptMoe::small);
  EXPECT_EQ(cuda::prompt_moe_form(PromptMoe::small, 600, 512), PromptMoe::tile128);
  EXPECT_EQ(cuda::prompt_moe_form(PromptMoe::tile128, 300, 512), PromptMoe::tile128);
  EXPECT_EQ(cuda::prompt_moe_form(PromptMoe::rows64, 100, 512), PromptMoe::rows64);
}

TEST(CudaOptions, PdlOffSpellings) {
  for (const char* off : {"0", "off"}) {
    ScopedEnv pdl("LILAC_PDL", off);
    EXPECT_FALSE(cuda::CudaOptions::from_environment().pdl) << off;
  }
  ScopedEnv pdl("LILAC_PDL", "1");
  EXPECT_TRUE(cuda::CudaOptions::from_environment().pdl);
}

// The launch settings of launch.h are not read from the environment (only CudaOptions are, by the
// runtime): the L2 prefetch hints (a measured loser, kept for benchmarks) stay off whatever
// LILAC_L2_PREFETCH says. Host only: the setting is read without a device.
TEST(CudaOptions, LaunchSettingsIgnoreTheEnvironment) {
  ScopedEnv prefetch("LILAC_L2_PREFETCH", "1");
  EXPECT_FALSE(cuda::l2_prefetch_enabled());
  cuda::set_l2_prefetch_enabled(true);  // the setter still works (benchmarks compare both ways)
  EXPECT_TRUE(cuda::l2_prefetch_enabled());
  cuda::set_l2_prefetch_enabled(false);
}

}  // namespace
}  // namespace lilac::test
