// Subcommands register themselves: each src/cli/<name>.cpp defines a static Command, so adding
// a command touches no shared file. setup() declares options on the CLI11 subcommand and returns
// the function that runs it (its return value is the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace lilac::cli {

using Runner = std::function<int()>;

struct Command {
  std::string name;
  std::string description;
  std::function<Runner(CLI::App&)> setup;

  Command(std::string n, std::string d, std::function<Runner(CLI::App&)> s);
};

std::vector<const Command*>& registry();

}  // namespace lilac::cli
