// Everything `serve`, `run` and `chat` need before the first request: which model directory to
// use (--model, LILAC_MODEL, the Hugging Face cache, the bundled demo model), the loaded weights,
// backend, tokenizer, chat template, sampling defaults, and the engine.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/backend.h"
#include "model/sampling.h"
#include "model/state_format.h"
#include "tokenizer/tokenizer.h"

namespace lilac::runtime {

// Where a model directory came from (for the start-up message).
enum class ModelSource { Flag, Env, HfCache, Demo };

struct ModelChoice {
  std::string dir;
  ModelSource source = ModelSource::Flag;
  bool demo = false;  // the bundled demo model (random weights)
};

// The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
std::string hf_hub_cache();
// The newest snapshot (by modification time) with a config.json among the Qwen3.6-35B-A3B repos
// (Qwen/Qwen3.6-35B-A3B, Qwen/Qwen3.6-35B-A3B-FP8, mlx-community/Qwen3.6-35B-A3B-4bit); "" if none.
std::string find_hf_snapshot(const std::string& hub_dir);
// The bundled demo model's directory ("" if not found): next to the binary's source tree
// (build/<preset>/lilac -> models/demo), an install prefix (bin/lilac -> share/lilac/models/demo),
// or the source directory this binary was built from.
std::string find_demo_model();
// --model, else LILAC_MODEL, else the HF cache, else the demo model. Throws lilac::Error when
// nothing is found.
ModelChoice choose_model(const std::string& flag);
// True when `dir` is (a copy of) the demo model: models/demo or a directory with DEMO.md.
bool is_demo_model(const std::string& dir);

// Sampling defaults from DIR/generation_config.json (temperature, top_p, top_k, min_p,
// presence/frequency/repetition penalties; do_sample false -> greedy); SamplingParams' own
// defaults for what it lacks.
SamplingParams load_generation_defaults(const std::string& dir);

struct LoadOptions {
  std::string device = "auto";   // cpu | cuda | auto
  std::string weights = "auto";  // --weights (runtime/weights_choice.h)
  int64_t context_size = 0;      // 0: min(32768, max_position_embeddings)
  int queue_capacity = 64;
  int parallel = 0;         // sequence slots (0: 16 on cuda, 4 on the cpu)
  int64_t step_tokens = 0;  // tokens per batched step (0: the engine's default)
  size_t snapshot_bytes = size_t(1) << 30;
  // --gdn-state: how the Gated DeltaNet recurrent state is kept between calls
  // (model/state_format.h); unset: the backend's default (runtime::open_backend).
  std::optional<GdnStateFormat> gdn_state;
  // Replaces the model's backend when set (the test build of the server: its scripted backend,
  // tests/support); `replace_backend_note` is the progress line that says so.
  std::function<std::unique_ptr<Backend>(const Model&, const Tokenizer&)> replace_backend;
  std::string replace_backend_note;
  std::function<void(const std::string&)> progress;  // log lines while loading
};

// A loaded model with its engine. Members are declared in destruction-safe order.
struct LoadedModel {
  ModelChoice choice;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  SamplingParams defaults;
  std::unique_ptr<Engine> engine;
  std::string description;  // "DIR on cpu: 16 threads"
  ~LoadedModel();
};

// Loads everything and warms the engine up. The backend: options.replace_backend when set, else
// `open_backend` (the two-argument form: runtime::open_backend, runtime/backends.h, with
// options.gdn_state), which may change `model` when it quantizes at load (the CPU backend
// quantizes its weights in memory).
using BackendFactory = std::function<std::unique_ptr<Backend>(Model&, const std::string& device,
                                                              bool quantize_at_load)>;
std::unique_ptr<LoadedModel> load_for_serving(const ModelChoice& choice, const LoadOptions& options,
                                              const BackendFactory& open_backend);
std::unique_ptr<LoadedModel> load_for_serving(const ModelChoice& choice,
                                              const LoadOptions& options);

// The full-size model with random weights (no checkpoint; `lilac serve --synthetic`): the backend
// from `make_backend`, the tokenizer from `tokenizer_file` (a tokenizer.json, possibly gzipped;
// "": the Qwen3 tokenizer of the source tree's tests/data when present), the built-in Qwen3.6
// chat template, greedy defaults.
std::unique_ptr<LoadedModel> load_synthetic_for_serving(
    const LoadOptions& options, const std::string& tokenizer_file,
    const std::function<std::unique_ptr<Backend>()>& make_backend);

// The default number of slots for a backend: 16 on cuda, 4 elsewhere.
int default_parallel(const Backend& backend);
// The default token budget of a batched step: 4096 on cuda (prompt pieces of several sequences
// run as one prefill chunk of up to 4096 tokens there: docs/batching.md), the engine's 2048
// elsewhere.
int64_t default_step_tokens(const Backend& backend);

}  // namespace lilac::runtime
