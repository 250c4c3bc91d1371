// Options and loading shared by the terminal commands `run` and `chat` (defined in run.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cli/console.h"
#include "runtime/model_setup.h"

namespace lilac::cli {

struct GenOptions {
  std::string model, device = "auto", weights = "auto", system;
  int64_t ctx_size = 0, max_tokens = 0;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::optional<std::string> gdn_state;  // --gdn-state f32 | bf16 (unset: the backend's default)
  bool no_think = false, hide_reasoning = false, raw = false, quiet = false;
};

void add_gen_options(CLI::App& app, GenOptions& o);
// Chooses and loads the model, with progress on stderr and the demo model's warning.
std::unique_ptr<runtime::LoadedModel> load_for_terminal(const GenOptions& o);
// The sampling and template options a turn uses.
TurnOptions turn_options(const GenOptions& o, const runtime::LoadedModel& m);

}  // namespace lilac::cli
