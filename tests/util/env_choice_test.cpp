// env_choice: the A/B switches of the CUDA launchers (LILAC_MOE_DOWN_TILES and the like), host
// only: unset is 0, an allowed spelling its value, anything else an error that names the variable.
#include "util/env_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

constexpr const char* kName = "LILAC_TEST_ENV_CHOICE";

// Sets kName for the scope (nullptr: unset), then removes it.
class ScopedChoice {
 public:
  explicit ScopedChoice(const char* value) {
    if (value)
      setenv(kName, value, 1);
    else
      unsetenv(kName);
  }
  ~ScopedChoice() { unsetenv(kName); }
  ScopedChoice(const ScopedChoice&) = delete;
  ScopedChoice& operator=(const ScopedChoice&) = delete;
};

// The message env_choice fails with for `value`, or "" when it accepts it.
std::string error_for(const char* value) {
  ScopedChoice env(value);
  try {
    env_choice(kName, {1, 2, 4, 8});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EnvChoice, UnsetIsZero) {
  ScopedChoice env(nullptr);
  EXPECT_EQ(env_choice(kName, {1, 2, 4, 8}), 0);
  EXPECT_EQ(env_choice(kName, {4, 5}), 0);
}

TEST(EnvChoice, AllowedValues) {
  for (const int v : {1, 2, 4, 8}) {
    ScopedChoice env(std::to_string(v).c_str());
    EXPECT_EQ(env_choice(kName, {1, 2, 4, 8}), v) << v;
  }
  for (const int v : {4, 5, 6}) {
    ScopedChoice env(std::to_string(v).c_str());
    EXPECT_EQ(env_choice(kName, {4, 5, 6}), v) << v;
  }
  ScopedChoice env("16");  // more than one digit
  EXPECT_EQ(env_choice(kName, {8, 16}), 16);
}

TEST(EnvChoice, OtherValuesFailNamingTheSwitch) {
  EXPECT_EQ(error_for("3"), "LILAC_TEST_ENV_CHOICE=3: expected 1, 2, 4 or 8");
  for (const char* bad : {"", "4x", " 4", "4 ", "+4", "04", "0", "-1", "four"}) {
    const std::string e = error_for(bad);
    EXPECT_THAT(e, HasSubstr(std::string(kName) + "=" + bad + ":")) << "'" << bad << "'";
    EXPECT_THAT(e, HasSubstr("expected 1, 2, 4 or 8")) << "'" << bad << "'";
  }
  ScopedChoice env("6");
  try {
    env_choice(kName, {4, 5});
    ADD_FAILURE() << "6 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "LILAC_TEST_ENV_CHOICE=6: expected 4 or 5");
  }
}

enum class Pick { none, split, head, automatic };

Pick pick() {
  return env_enum(kName, Pick::none,
                  {{"split", Pick::split},
                   {"head", Pick::head},
                   {"auto", Pick::automatic},
                   {"automatic", Pick::automatic}});
}

TEST(EnvEnum, SpellingsMapToTheirValues) {
  {
    ScopedChoice env(nullptr);
    EXPECT_EQ(pick(), Pick::none);
  }
  const std::pair<const char*, Pick> cases[] = {{"split", Pick::split},
                                                {"head", Pick::head},
                                                {"auto", Pick::automatic},
                                                {"automatic", Pick::automatic}};
  for (const auto& [v, want] : cases) {
    ScopedChoice env(v);
    EXPECT_EQ(pick(), want) << v;
  }
}

TEST(EnvEnum, OtherSpellingsFailNamingTheSwitch) {
  for (const char* bad : {"", "Split", "head ", "cluster", "0"}) {
    ScopedChoice env(bad);
    try {
      pick();
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(kName) + "=" + bad + ": expected split, head, auto or automatic");
    }
  }
}

}  // namespace
}  // namespace lilac::test
