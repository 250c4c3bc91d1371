// lilac_test_server: the lilac binary (every subcommand, the same code) plus one test-only option,
// `serve --scripted FILE`: the answers come from a JSON script (support/scripted_backend.h) instead
// of the model, so the client tests (tests/clients) can force tool calls and reasoning through the
// real server. The production `lilac` has no such option.
#include "cli/serve_hook.h"
#include "support/scripted_backend.h"

namespace lilac::test {
namespace {

std::string& script_file() {
  static std::string file;
  return file;
}

[[maybe_unused]] const bool kRegistered = [] {
  cli::ServeHook h;
  h.flag = "--scripted";
  h.add_options = [](CLI::App& app) {
    app.add_option("--scripted", script_file(),
                   "TEST-ONLY: answers come from a JSON script (see "
                   "tests/support/scripted_backend.h), no model runs");
  };
  h.given = [] { return !script_file().empty(); };
  h.warning = [] {
    return "TEST-ONLY --scripted: answers come from " + script_file() + ", not from a model";
  };
  h.progress_note = [] {
    return "TEST-ONLY: scripted backend from " + script_file() +
           " (no model runs; outputs come from the script)";
  };
  h.make_backend = [](const Model& model, const Tokenizer& tokenizer) -> std::unique_ptr<Backend> {
    return std::make_unique<server::ScriptedBackend>(
        model.config, tokenizer, server::ScriptedBackend::load_script(script_file(), tokenizer));
  };
  cli::register_serve_hook(std::move(h));
  return true;
}();

}  // namespace
}  // namespace lilac::test
