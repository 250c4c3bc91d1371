// `lilac quantize --model IN --out OUT`: a BF16 (hub or per-expert layout) or FP8 checkpoint to an
// MLX-compatible affine 4-bit one (src/io/quantize.h). Progress goes to stderr: a bar redrawn in
// place on a terminal, one plain line per finished layer otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "io/quantize.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

struct QuantizeArgs {
  std::string model, out;
  double max_shard_mb = 5 * 1024;  // mlx-lm's 5 GB shards
};

class ProgressReporter {
 public:
  ProgressReporter() : tty_(::isatty(::fileno(stderr)) != 0), start_(Clock::now()) {}

  void operator()(const QuantizeProgress& p) {
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const double frac = p.total_bytes ? double(p.done_bytes) / double(p.total_bytes) : 1.0;
    std::string where =
        p.layer >= 0 ? fmt::format("layer {}/{}", p.layer + 1, p.layers) : "embeddings / head";
    if (tty_) {
      if (p.done_bytes != p.total_bytes && secs - last_draw_ < 0.1) return;
      last_draw_ = secs;
      constexpr int kWidth = 30;
      const int filled = int(frac * kWidth);
      const double eta = frac > 0 ? secs * (1 - frac) / frac : 0;
      std::fprintf(stderr, "\r[%s%s] %3.0f%%  %-18s %7.2f / %.2f GB  %4.0fs left  ",
                   std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(kWidth - filled), ' ').c_str(), 100 * frac, where.c_str(),
                   double(p.done_bytes) / 1e9, double(p.total_bytes) / 1e9, eta);
      if (p.done_bytes == p.total_bytes) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    } else {
      if (p.layer != last_layer_ && last_layer_ >= 0)
        std::fprintf(stderr, "quantize: layer %lld/%lld done, %.2f / %.2f GB written (%.1fs)\n",
                     (long long)last_layer_ + 1, (long long)p.layers, double(p.done_bytes) / 1e9,
                     double(p.total_bytes) / 1e9, secs);
      if (p.done_bytes == p.total_bytes)
        std::fprintf(stderr, "quantize: all %.2f GB written (%.1fs)\n", double(p.total_bytes) / 1e9,
                     secs);
      last_layer_ = p.layer;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool tty_;
  Clock::time_point start_;
  double last_draw_ = -1;
  int64_t last_layer_ = -1;
};

int run_quantize(const QuantizeArgs& a) {
  if (!(a.max_shard_mb > 0)) fail("--max-shard-mb must be positive");
  QuantizeOptions o;
  o.input = a.model;
  o.output = a.out;
  o.max_shard_bytes = uint64_t(a.max_shard_mb * 1024 * 1024);
  ProgressReporter progress;
  o.progress = [&](const QuantizeProgress& p) { progress(p); };
  const auto t0 = std::chrono::steady_clock::now();
  QuantizeSummary s = quantize_checkpoint(o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("input:    %s (%s, experts %s), %.3f GB\n", a.model.c_str(),
              format_name(s.input_format).c_str(), s.input_layout.c_str(),
              double(s.input_bytes) / 1e9);
  std::printf("output:   %s: %lld tensors in %zu shard%s, %.3f GB\n", a.out.c_str(),
              (long long)s.tensors, s.shards, s.shards == 1 ? "" : "s",
              double(s.output_bytes) / 1e9);
  std::printf(
      "format:   mlx affine, group size 64, 4-bit, %d 8-bit overrides (router, "
      "shared_expert_gate)\n",
      s.overrides);
  std::printf(
      "weights:  %.3f M of %.3f M parameters quantized, %.3f bits per quantized weight\n",
      double(s.quantized_weights) / 1e6, double(s.parameters) / 1e6,
      s.quantized_weights ? 8.0 * double(s.quantized_bytes) / double(s.quantized_weights) : 0.0);
  for (const auto& n : s.notes) std::printf("note:     %s\n", n.c_str());
  std::string copied;
  for (const auto& f : s.copied_files) copied += (copied.empty() ? "" : ", ") + f;
  std::printf("copied:   %s\n", copied.empty() ? "(nothing)" : copied.c_str());
  std::printf("time:     %.1f s\n", secs);
  return 0;
}

const Command kQuantize{
    "quantize", "Convert a BF16 or FP8 checkpoint to an MLX-compatible affine 4-bit one",
    [](CLI::App& app) {
      auto a = std::make_shared<QuantizeArgs>();
      app.add_option("--model", a->model,
                     "Input model directory (BF16 hub / per-expert layout, or FP8)")
          ->required();
      app.add_option("--out", a->out, "Output directory (created; must not exist or be empty)")
          ->required();
      app.add_option("--max-shard-mb", a->max_shard_mb, "Largest shard in MiB (mlx-lm: 5 GiB)")
          ->default_val(5 * 1024);
      return Runner([a] { return run_quantize(*a); });
    }};

}  // namespace
}  // namespace lilac::cli
