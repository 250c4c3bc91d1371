// `lilac bench`: the protocol of docs/benchmarking.md on a checkpoint or on a synthetic full-size
// model.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "bench/bench.h"
#include "cli/command.h"
#include "io/checkpoint.h"
#include "model/qwen36.h"
#include "model/synthetic_router.h"
#include "runtime/backends.h"
#include "runtime/model_setup.h"
#include "runtime/weights_choice.h"
#include "util/error.h"
#include "util/version.h"

namespace lilac::cli {
namespace {

struct BenchCliOptions {
  std::string model, device = "auto", weights = "auto", json_out, lengths, concurrency;
  std::string sampling = "default";
  std::string router;                    // synthetic only: uniform (default) or zipf
  std::optional<std::string> gdn_state;  // --gdn-state f32 | bf16 (unset: the backend's default)
  int64_t prompt_tokens = 1024;
  bool synthetic = false;
  int rounds = 3, decode = 64;
  int64_t prefill_chunk = 0;
  uint64_t seed = 1;
};

std::vector<int64_t> parse_lengths(const std::string& s, const char* flag = "--lengths") {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long x = std::stoll(item, &used);
      if (used != item.size() || x <= 0) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      fail("{}: '{}' is not a positive integer", flag, item);
    }
  }
  return v;
}

int run_bench_cli(const BenchCliOptions& o) {
  if (o.synthetic == !o.model.empty()) fail("give exactly one of --model DIR or --synthetic");
  if (o.rounds < 1 || o.decode < 1) fail("--rounds and --decode must be >= 1");
  if (!o.synthetic && !o.router.empty()) fail("--router goes with --synthetic");
  const SyntheticRouter router = parse_synthetic_router(o.router.empty() ? "uniform" : o.router);
  const std::optional<GdnStateFormat> gdn_flag = runtime::parse_gdn_state_flag(o.gdn_state);
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::string model_name;
  std::string weights;  // "bf16" or "q4": what the backend multiplies (the JSON's "weights")
  const runtime::WeightsChoice choice = runtime::parse_weights(o.weights);
  BenchOptions bo;
  if (o.sampling != "default" && o.sampling != "off")
    fail("--sampling {}: default or off", o.sampling);
  // Sampled decode is timed with the model's own defaults: a checkpoint's generation_config.json
  // (as the server samples when a request sets nothing); for the synthetic model the model card's
  // thinking-mode defaults (docs/model.md section 9), which switch the penalties on.
  SamplingParams sampled;
  std::string sampling_source;
  if (o.synthetic) {
    sampled.temperature = 1.0f;
    sampled.top_p = 0.95f;
    sampled.top_k = 20;
    sampled.min_p = 0.0f;
    sampled.presence_penalty = 1.5f;
    sampling_source = "the model card's thinking-mode defaults";
  } else {
    sampled = runtime::load_generation_defaults(o.model);
    sampling_source = o.model + "/generation_config.json";
  }
  sampled.seed = o.seed;
  if (o.sampling == "default" && !sampled.greedy()) bo.sampled = sampled;
  if (o.synthetic) {
    weights = runtime::synthetic_weights(choice);
    backend = runtime::open_synthetic_backend(o.device, weights, o.seed, router, gdn_flag);
    model_name = router == SyntheticRouter::Zipf
                     ? "synthetic Qwen3.6-35B-A3B (random weights, zipf router: router rows "
                       "scaled by (expert rank + 1)^-0.25, Zipf-like skewed routing)"
                     : "synthetic Qwen3.6-35B-A3B (random weights, random router: near-uniform "
                       "routing)";
    bo.n_real_tokens = kQwen36RealTokens;
  } else {
    model = load_model(o.model);
    // q4 on a float checkpoint quantizes it as `lilac quantize` would (in memory on the CPU, on
    // the GPU at load for cuda); a quantized checkpoint runs as it is.
    const runtime::WeightsPlan plan = runtime::plan_weights(choice, *model);
    weights = plan.four_bit ? "q4" : "bf16";
    backend = runtime::open_backend(*model, o.device, plan.quantize_at_load, gdn_flag);
    model_name = o.model;
  }
  // --concurrency alone runs only the concurrency sweep; with --lengths, both.
  if (!o.lengths.empty())
    bo.lengths = parse_lengths(o.lengths);
  else if (!o.concurrency.empty())
    bo.lengths.clear();
  ConcurrencyOptions co;
  co.levels.clear();
  for (int64_t n : o.concurrency.empty() ? std::vector<int64_t>{}
                                         : parse_lengths(o.concurrency, "--concurrency")) {
    if (n > 4096) fail("--concurrency {}: at most 4096 sequences", n);
    co.levels.push_back(int(n));
  }
  if (o.prompt_tokens < 1) fail("--prompt-tokens must be >= 1");
  co.prompt_tokens = o.prompt_tokens;
  co.decode_steps = o.decode;
  co.n_real_tokens = bo.n_real_tokens;
  bo.rounds = o.rounds;
  bo.decode_steps = o.decode;
  bo.prefill_chunk = o.prefill_chunk;
  bo.bytes_per_weight = weights == "q4" ? 4.5 / 8 : 2.0;
  bo.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  // The state format the backend runs with: the flag, else its default (on cuda
  // LILAC_GDN_STATE can set it).
  const char* gdn_state = gdn_state_format_name(runtime::gdn_state_format(*backend));
  bo.state_bytes_per_value = runtime::gdn_state_format(*backend) == GdnStateFormat::bf16 ? 2 : 4;
  std::fprintf(stderr, "bench: %s on %s, %s weights, Gated DeltaNet state %s\n", model_name.c_str(),
               backend->device_description().c_str(), weights.c_str(), gdn_state);
  if (bo.sampled)
    std::fprintf(stderr,
                 "sampled decode: temperature %.2f, top_p %.2f, top_k %d, min_p %.2f, presence "
                 "penalty %.2f, seed %llu (%s)\n",
                 double(sampled.temperature), double(sampled.top_p), sampled.top_k,
                 double(sampled.min_p), double(sampled.presence_penalty),
                 static_cast<unsigned long long>(sampled.seed), sampling_source.c_str());
  co.progress = bo.progress;
  auto rows = run_bench(*backend, bo);
  if (o.synthetic) std::printf("router: %s\n", synthetic_router_name(router));
  if (!rows.empty()) std::printf("%s", bench_table(rows).c_str());
  auto crows = run_concurrency_bench(*backend, co);
  if (!crows.empty()) std::printf("%s", concurrency_table(crows).c_str());
  for (const auto& line : runtime::backend_report(*backend)) std::printf("%s\n", line.c_str());
  if (!o.json_out.empty()) {
    nlohmann::json header = {{"engine", std::string("lilac ") + version()},
                             {"commit", git_commit()},
                             {"gpu", backend->device_description()},
                             {"device", backend->name()},
                             {"weights", weights},
                             {"gdn_state", gdn_state},
                             {"model", model_name},
                             {"rounds", o.rounds},
                             {"decode_steps", o.decode},
                             {"bytes_per_weight", bo.bytes_per_weight},
                             {"copy_bandwidth_bytes_s", bo.copy_bandwidth},
                             {"matmul_flops_s", bo.matmul_rate}};
    if (!crows.empty()) header["prompt_tokens"] = o.prompt_tokens;
    if (o.synthetic) header["router"] = synthetic_router_name(router);
    if (bo.sampled)
      header["sampling"] = {{"temperature", sampled.temperature},
                            {"top_p", sampled.top_p},
                            {"top_k", sampled.top_k},
                            {"min_p", sampled.min_p},
                            {"presence_penalty", sampled.presence_penalty},
                            {"frequency_penalty", sampled.frequency_penalty},
                            {"repetition_penalty", sampled.repetition_penalty},
                            {"seed", sampled.seed},
                            {"source", sampling_source}};
    auto j = bench_json(rows, header);
    j["concurrency_results"] = concurrency_json(crows);
    j["breakdown"] = runtime::backend_report(*backend);
    std::ofstream out(o.json_out);
    out << j.dump(2) << "\n";
    if (!out) fail("{}: cannot write", o.json_out);
  }
  return 0;
}

const Command kBench{
    "bench", "Benchmark prefill and decode over context lengths (docs/benchmarking.md)",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchCliOptions>();
      app.add_option("--model", o->model, "Model directory");
      app.add_flag("--synthetic", o->synthetic,
                   "Full-size model with random weights made on the GPU");
      app.add_option("--device", o->device, "cuda, cpu or auto")->default_val("auto");
      app.add_option("--weights", o->weights,
                     "auto, bf16, fp8 or q4 (the checkpoint's format; q4 on a BF16 or FP8 "
                     "checkpoint quantizes at load; the synthetic model: bf16 or q4)")
          ->default_val("auto");
      app.add_option("--gdn-state", o->gdn_state,
                     "How the Gated DeltaNet recurrent state is kept between steps: f32 (the "
                     "default; as the references) or bf16 (rounded each time it is stored)");
      app.add_option("--lengths", o->lengths, "Comma-separated context lengths (default: the ten)");
      app.add_option("--concurrency", o->concurrency,
                     "Comma-separated sequence counts: N prompts of --prompt-tokens ids, then "
                     "--decode batched decode steps over all N (alone: only this sweep)");
      app.add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for --concurrency")
          ->default_val(1024);
      app.add_option("--rounds", o->rounds, "Timed rounds per length (median)")->default_val(3);
      app.add_option("--decode", o->decode, "Decode steps per round")->default_val(64);
      app.add_option("--prefill-chunk", o->prefill_chunk, "Prefill in chunks of this many tokens");
      app.add_option("--sampling", o->sampling,
                     "default: after the greedy steps of each round, time as many sampled steps "
                     "with the model's default sampling (generation_config.json; the synthetic "
                     "model: temperature 1.0, top_p 0.95, top_k 20, presence_penalty 1.5); off")
          ->default_val("default");
      app.add_option("--seed", o->seed, "Seed of the synthetic weights")->default_val(1);
      app.add_option("--router", o->router,
                     "With --synthetic: uniform (random router rows, near-uniform routing; the "
                     "default) or zipf (rows scaled by expert rank: Zipf-like skewed routing)");
      app.add_option("--json", o->json_out, "Write results as JSON here");
      return Runner([o] { return run_bench_cli(*o); });
    }};

}  // namespace
}  // namespace lilac::cli
