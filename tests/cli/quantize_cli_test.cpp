// `lilac quantize`, and `lilac inspect` / `lilac logits` on its output, end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "../test_data.h"
#include "cli_util.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CliQuantize, QuantizesInspectsAndRuns) {
  TempDir t;
  const std::string out = t.str("q4"), ref = data_path("tiny-a/reference.safetensors");
  auto q = run_lilac("quantize --model " + data_path("tiny-a-per-expert") + " --out " + out +
                     " --max-shard-mb 0.5");
  ASSERT_EQ(q.status, 0) << q.output;
  EXPECT_THAT(q.output,
              AllOf(HasSubstr("per-expert"), HasSubstr("in 3 shards"),
                    HasSubstr("8 8-bit overrides"), HasSubstr("4.516 bits per quantized weight"),
                    HasSubstr("copied:   generation_config.json")));
  // Not a terminal: plain progress lines, no carriage returns.
  EXPECT_THAT(q.output, AllOf(HasSubstr("quantize: layer 4/4 done"), Not(HasSubstr("\r"))));
  EXPECT_TRUE(std::filesystem::exists(out + "/model-00003-of-00003.safetensors"));

  auto i = run_lilac("inspect --model " + out);
  EXPECT_EQ(i.status, 0) << i.output;
  EXPECT_THAT(i.output,
              AllOf(HasSubstr("format:   mlx-4bit"), HasSubstr("experts:  stacked (switch_mlp)"),
                    HasSubstr("quant:    mlx affine, group size 64, 4-bit default; 8 overrides"),
                    HasSubstr("status:   OK")));

  // Teacher-forced against the BF16 reference; and --weights q4 in memory gives the same file.
  auto l = run_lilac("logits --model " + out + " --prompt-from " + ref +
                     " --decode 16 --rope-freq-bf16 --teacher-force --atol 100 --compare " + ref +
                     " --out " + t.str("a.st"));
  EXPECT_EQ(l.status, 0) << l.output;
  EXPECT_THAT(l.output,
              AllOf(HasSubstr("top-1 agreement"), HasSubstr("decode_ids       16/16 identical")));
  auto m = run_lilac("logits --model " + data_path("tiny-a") + " --weights q4 --prompt-from " +
                     ref + " --decode 16 --rope-freq-bf16 --teacher-force --compare " + ref +
                     " --atol 100 --out " + t.str("b.st"));
  EXPECT_EQ(m.status, 0) << m.output;
  auto same = run_lilac("logits --model " + out + " --prompt-from " + ref +
                        " --decode 16 --rope-freq-bf16 --teacher-force --atol 0 --compare " +
                        t.str("b.st"));
  EXPECT_EQ(same.status, 0) << same.output;

  auto bf = run_lilac("logits --model " + out + " --weights bf16 --prompt-ids 1,2");
  EXPECT_EQ(bf.status, 1);
  EXPECT_THAT(bf.output, HasSubstr("holds mlx-4bit weights"));
  // The CUDA backend runs MLX 4-bit checkpoints (tests/cuda/q4_backend_test.cpp); without a GPU
  // (CI) or without nvcc at build time it says why it cannot.
  auto cuda = run_lilac("logits --model " + out + " --prompt-ids 1,2 --device cuda");
  if (cuda.status != 0) {
    EXPECT_THAT(cuda.output, AnyOf(HasSubstr("no CUDA device"), HasSubstr("no CUDA backend")));
  }
}

TEST(CliQuantize, Refusals) {
  TempDir t;
  auto bad = run_lilac("quantize --model " + data_path("tiny-a") + " --out " + data_path("tiny-a"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output, HasSubstr("not an empty directory"));
  auto missing = run_lilac("quantize --model " + t.str("nothing") + " --out " + t.str("o"));
  EXPECT_EQ(missing.status, 1);
  auto noargs = run_lilac("quantize --model " + data_path("tiny-a"));
  EXPECT_NE(noargs.status, 0);
  auto force = run_lilac("logits --model " + data_path("tiny-a") +
                         " --prompt-ids 1,2 --decode 2 --teacher-force");
  EXPECT_EQ(force.status, 1);
  EXPECT_THAT(force.output, HasSubstr("--teacher-force needs --compare"));
  auto weights =
      run_lilac("logits --model " + data_path("tiny-a") + " --prompt-ids 1,2 --weights q3");
  EXPECT_EQ(weights.status, 1);
  EXPECT_THAT(weights.output, HasSubstr("--weights q3: expected auto, bf16, fp8 or q4"));
}

}  // namespace
}  // namespace lilac::test
