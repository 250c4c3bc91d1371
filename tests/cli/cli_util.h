// Running commands from the CLI tests: a shell command or the `lilac` binary under test, with its
// exit status and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace lilac::test {

struct CommandResult {
  int status = -1;     // the exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr, or stdout alone
};

// Runs `cmd` through the shell; the output is stdout and stderr, or stdout alone.
inline CommandResult run_shell(const std::string& cmd, bool with_stderr = true) {
  FILE* p = popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  CommandResult r;
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// `lilac ARGS` (the binary this build made), stdout and stderr together.
inline CommandResult run_lilac(const std::string& args) {
  return run_shell(std::string(LILAC_BINARY) + " " + args);
}

}  // namespace lilac::test
