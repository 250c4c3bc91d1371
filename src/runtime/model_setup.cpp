#include "runtime/model_setup.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/backends.h"
#include "runtime/weights_choice.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/mapped_file.h"

namespace fs = std::filesystem;

namespace lilac::runtime {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : "";
}

bool has_config(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec);
}

std::string self_exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "" : p.parent_path().string();
}

}  // namespace

std::string hf_hub_cache() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return (fs::path(v) / "hub").string();
  if (auto v = env("HOME"); !v.empty())
    return (fs::path(v) / ".cache" / "huggingface" / "hub").string();
  return "";
}

std::string find_hf_snapshot(const std::string& hub_dir) {
  if (hub_dir.empty()) return "";
  static const char* kRepos[] = {"models--Qwen--Qwen3.6-35B-A3B",
                                 "models--Qwen--Qwen3.6-35B-A3B-FP8",
                                 "models--mlx-community--Qwen3.6-35B-A3B-4bit"};
  std::string best;
  fs::file_time_type best_time{};
  std::error_code ec;
  for (const char* repo : kRepos) {
    fs::path snaps = fs::path(hub_dir) / repo / "snapshots";
    if (!fs::is_directory(snaps, ec)) continue;
    for (const auto& e : fs::directory_iterator(snaps, ec)) {
      if (!e.is_directory(ec) || !has_config(e.path())) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (ec) continue;
      if (best.empty() || t > best_time) best = e.path().string(), best_time = t;
    }
  }
  return best;
}

std::string find_demo_model() {
  std::vector<fs::path> candidates;
  if (auto exe = self_exe_dir(); !exe.empty()) {
    candidates.push_back(fs::path(exe) / ".." / ".." / "models" / "demo");  // build/<preset>/lilac
    candidates.push_back(fs::path(exe) / ".." / "share" / "lilac" / "models" /
                         "demo");  // <prefix>/bin
    candidates.push_back(fs::path(exe) / "models" / "demo");
  }
#ifdef LILAC_SOURCE_DIR
  candidates.push_back(fs::path(LILAC_SOURCE_DIR) / "models" / "demo");
#endif
  for (const auto& c : candidates)
    if (has_config(c)) {
      std::error_code ec;
      auto canon = fs::canonical(c, ec);
      return ec ? c.string() : canon.string();
    }
  return "";
}

bool is_demo_model(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "DEMO.md", ec);
}

ModelChoice choose_model(const std::string& flag) {
  ModelChoice c;
  if (!flag.empty()) {
    c.dir = flag;
    c.source = ModelSource::Flag;
  } else if (auto e = env("LILAC_MODEL"); !e.empty()) {
    c.dir = e;
    c.source = ModelSource::Env;
  } else if (auto s = find_hf_snapshot(hf_hub_cache()); !s.empty()) {
    c.dir = s;
    c.source = ModelSource::HfCache;
  } else if (auto d = find_demo_model(); !d.empty()) {
    c.dir = d;
    c.source = ModelSource::Demo;
  } else {
    fail(
        "no model: give --model DIR (or set LILAC_MODEL); no Qwen3.6-35B-A3B snapshot is in the "
        "Hugging Face "
        "cache ({}) and the bundled demo model (models/demo) was not found",
        hf_hub_cache());
  }
  if (!has_config(c.dir)) fail("{}: not a model directory (no config.json)", c.dir);
  c.demo = is_demo_model(c.dir);
  return c;
}

SamplingParams load_generation_defaults(const std::string& dir) {
  SamplingParams p;
  const fs::path file = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) return p;
  nlohmann::json j;
  try {  // a regular file only (a FIFO is an error, not a hang), bounded nesting
    j = parse_json(read_small_file(file.string()));
  } catch (const Error& e) {
    fail("{}/generation_config.json: {}", dir, e.what());
  }
  if (!j.is_object()) fail("{}/generation_config.json: not a JSON object", dir);
  auto num = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) fail("{}/generation_config.json: {} is not a number", dir, key);
    field = j[key].get<std::remove_reference_t<decltype(field)>>();
  };
  num("temperature", p.temperature);
  num("top_p", p.top_p);
  num("top_k", p.top_k);
  num("min_p", p.min_p);
  num("presence_penalty", p.presence_penalty);
  num("frequency_penalty", p.frequency_penalty);
  num("repetition_penalty", p.repetition_penalty);
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>())
    p.temperature = 0;
  return p;
}

namespace {

// The engine over a loaded backend: slots, queue, snapshots; then the warm-up.
void start_engine(LoadedModel& lm, const LoadOptions& o, int64_t context,
                  const std::string& format_name, std::chrono::steady_clock::time_point t0) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (context < 16) fail("--ctx-size {} is too small (at least 16)", context);
  if (o.queue_capacity < 1) fail("--queue {} must be at least 1", o.queue_capacity);
  if (o.parallel < 0) fail("--parallel {} must be at least 1", o.parallel);
  if (o.step_tokens < 0) fail("--step-tokens {} must be at least 1", o.step_tokens);
  EngineOptions eo;
  eo.context_size = context;
  eo.queue_capacity = o.queue_capacity;
  eo.parallel = o.parallel > 0 ? o.parallel : default_parallel(*lm.backend);
  eo.step_token_budget = o.step_tokens > 0 ? o.step_tokens : default_step_tokens(*lm.backend);
  eo.snapshot_budget = o.snapshot_bytes;
  if (const GdnStateFormat f = gdn_state_format(*lm.backend); f != GdnStateFormat::f32)
    say(fmt::format("Gated DeltaNet recurrent state kept in {} between steps",
                    gdn_state_format_name(f)));
  say(fmt::format("allocating {} sequence slots of {} tokens", eo.parallel, eo.context_size));
  lm.engine = std::make_unique<Engine>(*lm.backend, *lm.tokenizer, eo);
  const SlotMemory& m = lm.engine->slot_memory();
  say(
      fmt::format("slots: {} x {:.1f} MiB ({:.1f} KiB of KV cache per token + {:.1f} MiB of "
                  "recurrent state) = {:.1f} MiB",
                  eo.parallel, double(m.per_slot) / (1 << 20), double(m.kv_per_token) / 1024,
                  double(m.fixed) / (1 << 20), double(m.total) / (1 << 20)));
  say(fmt::format("warming up (and preparing batches of up to {} sequences)", eo.parallel));
  const auto w0 = std::chrono::steady_clock::now();
  lm.engine->warm_up();
  say(fmt::format(
      "warmed up in {:.0f} ms",
      1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count()));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lm.description = fmt::format("{} ({}, {}) on {}", lm.choice.dir, lm.backend->config().summary(),
                               format_name, lm.backend->device_description());
  say(fmt::format("model ready in {:.1f} s: {}", secs, lm.description));
}

}  // namespace

LoadedModel::~LoadedModel() {
  if (engine) engine->shutdown();
  engine.reset();  // joins the worker before the backend goes away
}

std::unique_ptr<LoadedModel> load_for_serving(const ModelChoice& choice, const LoadOptions& o,
                                              const BackendFactory& backend_factory) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const WeightsChoice weights = parse_weights(o.weights);
  auto lm = std::make_unique<LoadedModel>();
  lm->choice = choice;
  const auto t0 = std::chrono::steady_clock::now();
  say("loading tokenizer and chat template from " + choice.dir);
  lm->tokenizer = Tokenizer::from_model_dir(choice.dir);
  lm->chat_template = ChatTemplate::from_model_dir(choice.dir);
  lm->defaults = load_generation_defaults(choice.dir);
  say("loading weights from " + choice.dir);
  lm->model = load_model(choice.dir);
  // --weights q4 on a BF16 or FP8 checkpoint: quantized at load (MLX affine 4-bit, 8-bit
  // routers, as `lilac quantize` writes it; on the GPU when the backend is CUDA). Any other
  // mismatch is refused: lilac does not dequantize a 4-bit checkpoint.
  const WeightsPlan plan = plan_weights(weights, *lm->model);
  std::string fmt_name = format_name(lm->model->checkpoint->format());
  if (o.replace_backend) {
    say(o.replace_backend_note);
    lm->backend = o.replace_backend(*lm->model, *lm->tokenizer);
  } else {
    say("starting the " + o.device + " backend" +
        (plan.quantize_at_load ? " (quantizing the " + fmt_name + " weights to 4-bit at load)"
                               : ""));
    lm->backend = backend_factory(*lm->model, o.device, plan.quantize_at_load);
    fmt_name = plan.description;
  }
  const int64_t max_pos = lm->model->config.max_position_embeddings;
  const int64_t context =
      o.context_size > 0 ? o.context_size : std::min<int64_t>(32768, max_pos > 0 ? max_pos : 32768);
  if (max_pos > 0 && context > max_pos)
    fail("--ctx-size {} is larger than the model's max_position_embeddings ({})", context, max_pos);
  start_engine(*lm, o, context, fmt_name, t0);
  return lm;
}

std::unique_ptr<LoadedModel> load_for_serving(const ModelChoice& choice, const LoadOptions& o) {
  return load_for_serving(choice, o,
                          [&o](Model& m, const std::string& device, bool quantize_at_load) {
                            return runtime::open_backend(m, device, quantize_at_load, o.gdn_state);
                          });
}

int default_parallel(const Backend& backend) {
  return backend.name() == "cuda" ? 16 : 4;
}

// Measured (H200, 4-bit synthetic model, 16 HTTP clients x 1,024-token prompts, s5 run 2):
// 2048 -> 4096 tokens per step: TTFT p99 782 -> 628 ms, output 2,049 -> 2,111 tok/s, ITL p99
// 13.6 -> 11.1 ms (fewer steps carry a prompt piece).
int64_t default_step_tokens(const Backend& backend) {
  return backend.name() == "cuda" ? 4096 : EngineOptions{}.step_token_budget;
}

std::unique_ptr<LoadedModel> load_synthetic_for_serving(
    const LoadOptions& o, const std::string& tokenizer_file,
    const std::function<std::unique_ptr<Backend>()>& make_backend) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  auto lm = std::make_unique<LoadedModel>();
  lm->choice.dir = "synthetic";
  const auto t0 = std::chrono::steady_clock::now();
  std::string tok = tokenizer_file;
#ifdef LILAC_SOURCE_DIR
  if (tok.empty()) {
    const fs::path bundled =
        fs::path(LILAC_SOURCE_DIR) / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz";
    std::error_code ec;
    if (fs::is_regular_file(bundled, ec)) tok = bundled.string();
  }
#endif
  if (tok.empty())
    fail(
        "--synthetic: give --tokenizer FILE (a tokenizer.json, e.g. the Qwen3 one in "
        "tests/data/tokenizer/qwen3-tokenizer.json.gz)");
  say("loading the tokenizer from " + tok);
  TokenizerOptions to;
  to.force_qwen35_regex = true;
  lm->tokenizer = Tokenizer::from_file(tok, to);
  lm->chat_template = ChatTemplate::builtin_qwen36();
  lm->defaults.temperature = 0;
  say("generating the synthetic full-size model (random weights) on the device");
  lm->backend = make_backend();
  start_engine(*lm, o, o.context_size > 0 ? o.context_size : 32768, "synthetic " + o.weights, t0);
  return lm;
}

}  // namespace lilac::runtime
