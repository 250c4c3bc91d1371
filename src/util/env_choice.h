// A/B switches in the environment that pick one of a few small integers (a kernel's blocks per
// SM, output tiles per warp, channels per thread: LILAC_MOE_DOWN_TILES=4 and the like) or one of
// a few named choices (LILAC_PROMPT_MOE=rows32). Host code only; the CUDA launchers call
// env_choice from their host side and keep the answer in a function-local static (read once per
// process), CudaOptions::from_environment reads the named ones.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

namespace lilac {

// The value of the environment variable `name`: 0 when it is unset, the value when its text is
// exactly one of `allowed` written in decimal (no sign, spaces or suffix). Any other text, the
// empty string included, fails with a lilac::Error naming the variable, its text and the allowed
// values: "LILAC_MOE_DOWN_TILES=3: expected 1, 2, 4 or 8". `allowed` holds positive values (0
// stands for unset).
int env_choice(const char* name, std::initializer_list<int> allowed);

// The index in names[0, n) of the environment variable's text; -1 when it is unset. Any other
// text fails with a lilac::Error naming the variable, its text and the spellings:
// "LILAC_PROMPT_MOE=rows16: expected small, tile128, rows64, rows32, auto or automatic".
int env_spelling(const char* name, const char* const* names, size_t n);

// The value paired with the environment variable's spelling, `unset` when it is unset; other
// text fails as env_spelling says.
template <class T>
T env_enum(const char* name, T unset, std::initializer_list<std::pair<const char*, T>> spellings) {
  std::vector<const char*> names;
  for (const auto& s : spellings) names.push_back(s.first);
  const int i = env_spelling(name, names.data(), names.size());
  return i < 0 ? unset : (spellings.begin() + i)->second;
}

}  // namespace lilac
