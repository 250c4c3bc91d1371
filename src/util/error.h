// Errors: every failure a user can cause (bad checkpoint, bad request, bad flag) is a lilac::Error
// carrying a message that names the file / tensor / field and what is wrong. Code paths that catch
// it report the message and keep running; nothing user-controlled may abort the process.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lilac {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace lilac
