// A/B switches in the environment that pick one of a few small integers (a kernel's blocks per
// SM, output tiles per warp, channels per thread): LILAC_MOE_DOWN_TILES=4 and the like. Host code
// only; the CUDA launchers call it from their host side and keep the answer in a function-local
// static (read once per process).
#pragma once

#include <initializer_list>

namespace lilac {

// The value of the environment variable `name`: 0 when it is unset, the value when its text is
// exactly one of `allowed` written in decimal (no sign, spaces or suffix). Any other text, the
// empty string included, fails with a lilac::Error naming the variable, its text and the allowed
// values: "LILAC_MOE_DOWN_TILES=3: expected 1, 2, 4 or 8". `allowed` holds positive values (0
// stands for unset).
int env_choice(const char* name, std::initializer_list<int> allowed);

}  // namespace lilac
