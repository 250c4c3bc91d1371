// lilac: one binary, subcommands (see `lilac --help`).
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "util/error.h"
#include "util/version.h"

namespace lilac::cli {

Command::Command(std::string n, std::string d, std::function<Runner(CLI::App&)> s)
    : name(std::move(n)), description(std::move(d)), setup(std::move(s)) {
  registry().push_back(this);
}

std::vector<const Command*>& registry() {
  static std::vector<const Command*> commands;
  return commands;
}

}  // namespace lilac::cli

int main(int argc, char** argv) {
  using namespace lilac::cli;
  CLI::App app{"lilac: an inference engine for Qwen3.6-35B-A3B"};
  app.set_version_flag("--version",
                       std::string("lilac ") + lilac::version() + " (" + lilac::git_commit() + ")");
  app.require_subcommand(1);
  std::map<CLI::App*, Runner> runners;
  auto commands = registry();
  std::sort(commands.begin(), commands.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const Command* c : commands) {
    CLI::App* sub = app.add_subcommand(c->name, c->description);
    runners[sub] = c->setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const lilac::Error& e) {
      std::fprintf(stderr, "lilac %s: error: %s\n", sub->get_name().c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lilac %s: internal error: %s\n", sub->get_name().c_str(), e.what());
      return 2;
    }
  }
  return 0;
}
