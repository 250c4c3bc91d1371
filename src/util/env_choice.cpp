#include "util/env_choice.h"

#include <cstdlib>
#include <string>

#include "util/error.h"

namespace lilac {

int env_choice(const char* name, std::initializer_list<int> allowed) {
  const char* v = std::getenv(name);
  if (!v) return 0;
  const std::string s(v);
  std::string expected;  // "1, 2, 4 or 8"
  size_t i = 0;
  for (const int a : allowed) {
    if (s == std::to_string(a)) return a;
    if (i > 0) expected += i + 1 == allowed.size() ? " or " : ", ";
    expected += std::to_string(a);
    ++i;
  }
  fail("{}={}: expected {}", name, s, expected);
}

int env_spelling(const char* name, const char* const* names, size_t n) {
  const char* v = std::getenv(name);
  if (!v) return -1;
  const std::string s(v);
  std::string expected;  // "split, head, auto or automatic"
  for (size_t i = 0; i < n; ++i) {
    if (s == names[i]) return int(i);
    if (i > 0) expected += i + 1 == n ? " or " : ", ";
    expected += names[i];
  }
  fail("{}={}: expected {}", name, s, expected);
}

}  // namespace lilac
