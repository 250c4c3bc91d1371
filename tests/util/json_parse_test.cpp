// parse_json: the depth limit, the field path in errors, duplicate keys (issue 10, item 1).
#include "util/json_parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

TEST(JsonParse, DepthLimitAndFieldNames) {
  EXPECT_NO_THROW(parse_json(std::string(100, '[') + std::string(100, ']')));
  try {
    parse_json(R"({"a": {"b": [1, )" + std::string(300, '[') + std::string(300, ']') + "]}}");
    FAIL();
  } catch (const JsonParseError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("nested deeper than"));
    EXPECT_EQ(e.field.substr(0, 9), "a.b[1][0]");
    EXPECT_LT(e.field.size(), 40u);
  }
  try {
    parse_json(R"({"x": [1, 2, {"t": 1e309}]})");
    FAIL();
  } catch (const JsonParseError& e) {
    EXPECT_EQ(e.field, "x[2].t");
  }
  try {
    parse_json(R"({"x": [1, 2, -1e309]})");
    FAIL();
  } catch (const JsonParseError& e) {
    EXPECT_EQ(e.field, "x[2]");
  }
  EXPECT_THROW(parse_json(R"({"k": 1, "k": 2})", JsonLimits{.reject_duplicate_keys = true}),
               JsonParseError);
  EXPECT_EQ(parse_json(R"({"k": 1, "k": 2})")["k"], 2);
}

TEST(JsonParse, HundredThousandLevelsIsAnErrorNotAStackOverflow) {
  EXPECT_THROW(parse_json(std::string(100000, '[') + std::string(100000, ']')), JsonParseError);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}');
  EXPECT_THROW(parse_json(objects), JsonParseError);
}

}  // namespace
}  // namespace lilac::test
