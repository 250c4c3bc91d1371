// The Gated DeltaNet state format's names (model/state_format.h): f32 and bf16 parse and name
// themselves; anything else is an Error that names the value.
#include "model/state_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

TEST(GdnStateFormat, ParsesAndNamesBothFormats) {
  EXPECT_EQ(parse_gdn_state_format("f32"), GdnStateFormat::f32);
  EXPECT_EQ(parse_gdn_state_format("bf16"), GdnStateFormat::bf16);
  for (GdnStateFormat f : {GdnStateFormat::f32, GdnStateFormat::bf16})
    EXPECT_EQ(parse_gdn_state_format(gdn_state_format_name(f)), f);
  EXPECT_STREQ(gdn_state_format_name(GdnStateFormat::f32), "f32");
  EXPECT_STREQ(gdn_state_format_name(GdnStateFormat::bf16), "bf16");
}

TEST(GdnStateFormat, RefusesAnythingElseNamingTheValue) {
  for (const std::string bad : {"fp8", "", "F32", "bfloat16", "f16", " bf16"}) {
    try {
      parse_gdn_state_format(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("'" + bad + "'"));
      EXPECT_THAT(e.what(), HasSubstr("expected f32 or bf16"));
    }
  }
}

}  // namespace
}  // namespace lilac::test
