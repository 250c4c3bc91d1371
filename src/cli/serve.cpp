// `lilac serve`: the OpenAI-compatible HTTP server (docs/api.md). The model is --model DIR, else
// $LILAC_MODEL, else the newest Qwen3.6-35B-A3B snapshot in the Hugging Face cache, else the
// bundled demo model. Prints "listening on http://HOST:PORT" once the model is ready; SIGINT /
// SIGTERM drain: new requests get 503, running ones get --grace seconds, then are cancelled.
#include <pthread.h>
#include <signal.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "cli/console.h"
#include "cli/serve_hook.h"
#include "model/synthetic_router.h"
#include "runtime/backends.h"
#include "runtime/model_setup.h"
#include "runtime/weights_choice.h"
#include "server/log.h"
#include "server/server.h"
#include "util/error.h"

namespace lilac::cli {

namespace {
std::unique_ptr<ServeHook>& serve_hook_slot() {
  static std::unique_ptr<ServeHook> hook;
  return hook;
}
}  // namespace

void register_serve_hook(ServeHook hook) {
  serve_hook_slot() = std::make_unique<ServeHook>(std::move(hook));
}

const ServeHook* serve_hook() {
  return serve_hook_slot().get();
}

namespace {

struct ServeOptions {
  std::string model, host = "127.0.0.1", api_key, alias, device = "auto", weights = "auto",
                     log_level = "info";
  std::string tokenizer;
  std::string router;                // with --synthetic: uniform (default) or zipf
  std::string chat_template_kwargs;  // JSON object: defaults for every chat request
  std::vector<std::string> cors;
  std::optional<std::string> gdn_state;  // --gdn-state f32 | bf16 (unset: the backend's default)
  int port = 8080, queue = 64, threads = 0, parallel = 0;
  int64_t ctx_size = 0, snapshot_mb = 1024, max_body_mb = 16, step_tokens = 0;
  double grace = 10;
  bool log_json = false, synthetic = false;
  uint64_t seed = 1;
};

// Signals arrive on one thread (sigwait); everything else runs with them blocked.
struct SignalWaiter {
  std::mutex mutex;
  std::condition_variable cv;
  int signal = 0;
  std::atomic<bool> ready{false};  // once true, a signal drains instead of exiting at once
};

int run_serve(const ServeOptions& o) {
  using namespace lilac::server;
  using namespace lilac::runtime;
  const ServeHook* hook = serve_hook();
  const bool hooked = hook && hook->given();
  Log::configure(parse_log_level(o.log_level), o.log_json);
  std::string api_key = o.api_key;
  if (api_key.empty())
    if (const char* k = std::getenv("LILAC_API_KEY"); k && *k) api_key = k;
  if (o.snapshot_mb < 0) fail("--snapshot-mb {} must be >= 0", o.snapshot_mb);
  if (o.max_body_mb < 1) fail("--max-body {} must be at least 1 (MiB)", o.max_body_mb);
  if (o.grace < 0) fail("--grace {} must be >= 0", o.grace);
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    fail("--device {}: expected cuda, cpu or auto", o.device);
  const std::optional<GdnStateFormat> gdn_state = parse_gdn_state_flag(o.gdn_state);

  nlohmann::json template_kwargs = nlohmann::json::object();
  if (!o.chat_template_kwargs.empty()) {
    template_kwargs = nlohmann::json::parse(o.chat_template_kwargs, nullptr, false);
    if (template_kwargs.is_discarded() || !template_kwargs.is_object())
      fail("--chat-template-kwargs must be a JSON object, e.g. '{{\"preserve_thinking\": true}}'");
  }
  if (o.synthetic && (!o.model.empty() || hooked))
    fail("--synthetic serves the random full-size model: no --model{} with it",
         hook ? " or " + hook->flag : "");
  if (!o.synthetic && !o.tokenizer.empty()) fail("--tokenizer goes with --synthetic");
  if (!o.synthetic && !o.router.empty()) fail("--router goes with --synthetic");
  const SyntheticRouter router = parse_synthetic_router(o.router.empty() ? "uniform" : o.router);
  ModelChoice choice;
  if (o.synthetic) {
    if (o.device == "cpu")
      fail("--synthetic needs the cuda device: the full-size model is generated on the GPU");
    synthetic_weights(parse_weights(o.weights));
    choice.dir = "synthetic";
  } else {
    choice = choose_model(o.model);
  }
  if (choice.demo) Log::warn(demo_warning());
  if (hooked) Log::warn(hook->warning());

  // Block SIGINT / SIGTERM before any thread starts, and wait for them on a dedicated thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto waiter = std::make_shared<SignalWaiter>();
  std::thread([waiter, set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (!waiter->ready) {
        Log::info("interrupted while loading; exiting");
        std::fflush(nullptr);
        std::_Exit(0);
      }
      {
        std::lock_guard lock(waiter->mutex);
        if (waiter->signal) {
          Log::warn("second signal: exiting now");
          std::fflush(nullptr);
          std::_Exit(0);
        }
        waiter->signal = sig;
      }
      waiter->cv.notify_all();
    }
  }).detach();

  ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_key = api_key;
  so.cors_origins = o.cors;
  so.max_body = size_t(o.max_body_mb) << 20;
  so.threads = o.threads > 0 ? o.threads : std::max(48, o.queue + 16);
  Server server(so);
  server.bind();
  server.start();
  Log::info("bound; loading the model (GET /health answers 503 until it is ready)",
            {{"host", o.host}, {"port", server.port()}, {"model", choice.dir}});

  LoadOptions lo;
  lo.device = o.device;
  lo.weights = o.weights;
  lo.context_size = o.ctx_size;
  lo.queue_capacity = o.queue;
  lo.parallel = o.parallel;
  lo.step_tokens = o.step_tokens;
  lo.snapshot_bytes = size_t(o.snapshot_mb) << 20;
  lo.gdn_state = gdn_state;
  if (hooked) {
    lo.replace_backend = hook->make_backend;
    lo.replace_backend_note = hook->progress_note();
  }
  lo.progress = [](const std::string& line) { Log::info(line); };
  std::unique_ptr<LoadedModel> lm;
  if (o.synthetic) {
    const std::string weights = synthetic_weights(parse_weights(o.weights));
    lo.weights = weights;
    Log::info(std::string("synthetic model router: ") + synthetic_router_name(router));
    lm = load_synthetic_for_serving(lo, o.tokenizer, [&] {
      return open_synthetic_backend(o.device == "auto" ? "cuda" : o.device, weights, o.seed, router,
                                    gdn_state);
    });
  } else {
    lm = load_for_serving(choice, lo);
  }

  if (Log::enabled(LogLevel::Debug))  // every step: what it carried and how long it took
    lm->engine->set_step_observer([](const StepRecord& r) {
      Log::debug("step", {{"decode_rows", r.decode_rows},
                          {"prompt_pieces", r.prompt_pieces},
                          {"prompt_tokens", r.prompt_tokens},
                          {"takers", r.takers},
                          {"ms", std::round(r.seconds * 1e5) / 100},
                          {"gap_ms", std::round(r.gap_seconds * 1e5) / 100}});
    });

  ServingModel sm;
  sm.engine = lm->engine.get();
  sm.tokenizer = lm->tokenizer.get();
  sm.chat_template = lm->chat_template.get();
  sm.defaults = lm->defaults;
  sm.model_id = !o.alias.empty() ? o.alias
                : o.synthetic    ? "synthetic-qwen3.6-35b-a3b"
                                 : default_model_id(choice.dir, choice.demo);
  sm.context_size = lm->engine->options().context_size;
  sm.chat_template_kwargs = template_kwargs;
  server.set_model(sm);
  waiter->ready = true;
  const std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  Log::info("serving", {{"model", sm.model_id},
                        {"context", sm.context_size},
                        {"parallel", lm->engine->options().parallel},
                        {"auth", api_key.empty() ? "off" : "on"}});
  std::printf("listening on http://%s:%d\n", host.c_str(), server.port());
  std::fflush(stdout);

  int sig;
  {
    std::unique_lock lock(waiter->mutex);
    waiter->cv.wait(lock, [&] { return waiter->signal != 0; });
    sig = waiter->signal;
  }
  Log::info(fmt::format("{}: shutting down (new requests get 503; {} s for running ones)",
                        sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace),
            {{"in_flight", server.in_flight()}});
  server.drain();
  if (!server.wait_idle(o.grace)) {
    Log::warn("grace period over: cancelling the requests still running",
              {{"in_flight", server.in_flight()}});
    lm->engine->shutdown();
    server.wait_idle(5);
  }
  lm->engine->shutdown();
  server.stop();
  lm.reset();
  Log::info("stopped");
  return 0;
}

const Command kServe{
    "serve", "Serve the model over an OpenAI-compatible HTTP API", [](CLI::App& app) {
      auto o = std::make_shared<ServeOptions>();
      app.add_option(
          "--model", o->model,
          "Model directory (else $LILAC_MODEL, the Hugging Face cache, the bundled demo model)");
      app.add_option("--host", o->host, "Address to listen on")->capture_default_str();
      app.add_option("--port", o->port, "TCP port (0: any free port)")->capture_default_str();
      app.add_option(
          "--api-key", o->api_key,
          "Require 'Authorization: Bearer KEY' (else $LILAC_API_KEY; /health stays open)");
      app.add_option("--ctx-size", o->ctx_size,
                     "Tokens per request, prompt + answer (default: min(32768, the model's))");
      app.add_option("--alias", o->alias, "The model id the API reports");
      app.add_option("--device", o->device, "cuda, cpu or auto (cuda when a GPU is present)")
          ->capture_default_str();
      app.add_option("--weights", o->weights,
                     "Weight format to serve: auto, bf16, fp8 or q4 (the checkpoint's format; q4 "
                     "on a BF16 or FP8 checkpoint quantizes at load)")
          ->capture_default_str();
      app.add_option("--cors-origin", o->cors, "Allowed CORS origin (repeatable; '*' for any)");
      app.add_option("--log-level", o->log_level, "debug, info, warn, error or off")
          ->capture_default_str();
      app.add_flag("--log-json", o->log_json, "Log JSON lines");
      app.add_option("--queue", o->queue,
                     "Requests that may wait beyond the running ones (then 429)")
          ->capture_default_str();
      app.add_option("--parallel", o->parallel,
                     "Sequences in flight at once (continuous batching; default: 16 on cuda, 4 "
                     "on the cpu); each slot holds --ctx-size tokens of KV cache");
      app.add_option("--step-tokens", o->step_tokens,
                     "Most tokens in one batched step: decode tokens plus prompt pieces "
                     "(default: 4096 on cuda, 2048 on the cpu)");
      app.add_option(
          "--gdn-state", o->gdn_state,
          "How the Gated DeltaNet recurrent state is kept between steps: f32 (the default; as "
          "the references) or bf16 (rounded each time it is stored: half the memory "
          "and the bytes a batched decode step moves)");
      app.add_flag("--synthetic", o->synthetic,
                   "Serve the full-size model with random weights made on the GPU (benchmarks; "
                   "prompts as token ids via /v1/completions or through --tokenizer)");
      app.add_option("--tokenizer", o->tokenizer,
                     "With --synthetic: a tokenizer.json (may be gzipped; default: the source "
                     "tree's tests/data/tokenizer/qwen3-tokenizer.json.gz)");
      app.add_option("--seed", o->seed, "With --synthetic: the seed of the random weights")
          ->capture_default_str();
      app.add_option("--router", o->router,
                     "With --synthetic: uniform (near-uniform routing; the default) or zipf "
                     "(router rows scaled by expert rank: Zipf-like skewed routing)");
      app.add_option("--snapshot-mb", o->snapshot_mb,
                     "Memory for prompt-reuse snapshots (MiB; 0: off)")
          ->capture_default_str();
      app.add_option("--max-body", o->max_body_mb, "Largest request body (MiB; then 413)")
          ->capture_default_str();
      app.add_option("--grace", o->grace, "Seconds running requests get at shutdown")
          ->capture_default_str();
      app.add_option(
          "--http-threads", o->threads,
          "Connections served at once, a thread each (default and minimum: 512; at the cap the "
          "longest-idle connection is closed)");
      app.add_option("--chat-template-kwargs", o->chat_template_kwargs,
                     "Default chat_template_kwargs for every chat request, a JSON object (e.g. "
                     "'{\"preserve_thinking\": true}'); a request's own keys win");
      if (const ServeHook* hook = serve_hook()) hook->add_options(app);
      return Runner([o] { return run_serve(*o); });
    }};

}  // namespace
}  // namespace lilac::cli
