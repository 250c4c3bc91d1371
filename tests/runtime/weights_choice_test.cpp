// --weights: one vocabulary and one set of messages for serve, run, chat, bench and logits.
#include "runtime/weights_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "../test_data.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using runtime::WeightsChoice;
using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WeightsChoice, ParsesTheOneVocabulary) {
  EXPECT_EQ(runtime::parse_weights("auto"), WeightsChoice::Auto);
  EXPECT_EQ(runtime::parse_weights("bf16"), WeightsChoice::BF16);
  EXPECT_EQ(runtime::parse_weights("fp8"), WeightsChoice::FP8);
  EXPECT_EQ(runtime::parse_weights("q4"), WeightsChoice::Q4);
  EXPECT_EQ(error_of([] { runtime::parse_weights("Q4"); }),
            "--weights Q4: expected auto, bf16, fp8 or q4");
  EXPECT_EQ(error_of([] { runtime::parse_weights(""); }),
            "--weights : expected auto, bf16, fp8 or q4");
}

TEST(WeightsChoice, PlansAgainstTheCheckpoint) {
  auto bf16 = load_model(data_path("tiny-a"));
  auto as_is = runtime::plan_weights(WeightsChoice::Auto, *bf16);
  EXPECT_FALSE(as_is.quantize_at_load);
  EXPECT_FALSE(as_is.four_bit);
  EXPECT_EQ(as_is.description, "bf16");
  EXPECT_FALSE(runtime::plan_weights(WeightsChoice::BF16, *bf16).quantize_at_load);
  auto q4 = runtime::plan_weights(WeightsChoice::Q4, *bf16);
  EXPECT_TRUE(q4.quantize_at_load);
  EXPECT_TRUE(q4.four_bit);
  EXPECT_EQ(q4.description, "bf16 quantized to 4-bit at load");
  EXPECT_THAT(error_of([&] { runtime::plan_weights(WeightsChoice::FP8, *bf16); }),
              HasSubstr("--weights fp8: the checkpoint in "));
}

TEST(WeightsChoice, SyntheticIsBf16OrQ4) {
  EXPECT_EQ(runtime::synthetic_weights(WeightsChoice::Auto), "bf16");
  EXPECT_EQ(runtime::synthetic_weights(WeightsChoice::BF16), "bf16");
  EXPECT_EQ(runtime::synthetic_weights(WeightsChoice::Q4), "q4");
  EXPECT_EQ(error_of([] { runtime::synthetic_weights(WeightsChoice::FP8); }),
            "--weights fp8: the synthetic model is bf16 or q4");
}

}  // namespace
}  // namespace lilac::test
