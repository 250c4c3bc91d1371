// The one extension point of `lilac serve`, for the test build of the server (lilac_test_server:
// tests/support/test_server.cpp adds `--scripted FILE`, whose backend answers from a script). The
// production binary registers no hook, so `lilac serve --help` lists no test-only option.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "model/backend.h"
#include "tokenizer/tokenizer.h"

namespace lilac::cli {

struct ServeHook {
  std::string flag;                            // its option, for messages ("--scripted")
  std::function<void(CLI::App&)> add_options;  // declares it on the serve subcommand
  std::function<bool()> given;                 // after parsing: was it given?
  std::function<std::string()> warning;        // the start-up warning when given
  std::function<std::string()> progress_note;  // the loading line when given
  std::function<std::unique_ptr<Backend>(const Model&, const Tokenizer&)> make_backend;
};

// Registers the hook (from a static initializer of the test build; at most one).
void register_serve_hook(ServeHook hook);
// The registered hook, or null.
const ServeHook* serve_hook();

}  // namespace lilac::cli
