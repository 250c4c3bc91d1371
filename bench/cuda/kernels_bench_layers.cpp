// Whole decode layers, as the decode step runs them: the full-size synthetic model (distinct
// random weights per layer, uniform router) on the CUDA backend, a sequence at `context` tokens,
// and CudaBackend::decode_layer (the code the backend's decode step runs for each layer; nothing
// of the launch sequence is copied here) captured in CUDA graphs: one graph of all 30 Gated
// DeltaNet layers and one of all 10 attention layers, each layer with its own weights as in a
// step, with PDL and the L2 prefetch hints on and off. Each replay advances the layers' states but
// not the position (the attention layers rewrite the key and value at the same position), so
// every replay does the same work.
#include "kernels_bench_layers.h"

#include <cstdio>
#include <functional>
#include <vector>

#include "bench_timing.h"
#include "cuda/cuda_backend.h"
#include "cuda/launch.h"

namespace lilac::bench {
namespace {

// staged: CudaOptions::staged_first_projection (4/8-bit weights; BF16 ones do not use it).
struct Mode {
  const char* name;
  bool pdl, prefetch, staged;
};
constexpr int kModeCount = 4;
constexpr Mode kModes[kModeCount] = {{"PDL", true, false, true},
                                     {"PDL+prefetch", true, true, true},
                                     {"neither", false, false, true},
                                     {"PDL unstaged", true, false, false}};

void one_format(const std::string& weights, int context, int runs) {
  auto backend = cuda::make_synthetic_backend(weights, 1);
  const ModelConfig& c = backend->config();
  auto seq = backend->new_sequence(context + 64);
  // A prompt of context - 1 tokens, then one decode step: the caches, states and the residual row
  // as after a real step.
  std::vector<int32_t> ids(size_t(std::max(1, context - 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(1 + (i * 7919) % 100000);
  backend->forward(*seq, ids, {}, false);
  const int32_t next = 4242;
  backend->forward(*seq, std::span<const int32_t>(&next, 1), {}, false);
  std::vector<int64_t> gdn, attn;
  for (int64_t li = 0; li < c.layers; ++li)
    (c.layer_types[size_t(li)] == LayerType::GatedDeltaNet ? gdn : attn).push_back(li);
  cudaStream_t s = backend->stream();

  std::printf(
      "\n== decode layers, %s weights, context %d (graphs of CudaBackend::decode_layer; "
      "us per layer)\n%-34s",
      weights.c_str(), int(seq->position()), "layer kind");
  for (const Mode& m : kModes) std::printf(" %17s", m.name);
  std::printf("\n");
  auto all = [&](const std::vector<int64_t>& layers) {
    std::vector<double> t;
    const bool saved = cuda::l2_prefetch_enabled();
    const cuda::CudaOptions saved_options = backend->options();
    for (const Mode& m : kModes) {
      cuda::ScopedPdl p(m.pdl);
      cuda::set_l2_prefetch_enabled(m.prefetch);
      cuda::CudaOptions o = saved_options;
      o.staged_first_projection = m.staged;
      o.pdl = m.pdl;
      backend->set_options(o);
      const double sec = median_graph_replay_seconds(s, runs, [&] {
        for (int64_t li : layers) backend->decode_layer(*seq, li);
      });
      t.push_back(sec / double(layers.size()));
    }
    cuda::set_l2_prefetch_enabled(saved);
    backend->set_options(saved_options);
    return t;
  };
  auto row = [&](const std::string& name, const std::vector<double>& t) {
    std::printf("%-34s", name.c_str());
    for (double v : t) std::printf(" %14.2f us", v * 1e6);
    std::printf("\n");
    std::fflush(stdout);
  };
  std::vector<double> tg, ta;
  if (!gdn.empty()) {
    tg = all(gdn);
    row("Gated DeltaNet layer (" + std::to_string(gdn.size()) + " in the graph)", tg);
  }
  if (!attn.empty()) {
    ta = all(attn);
    row("attention layer (" + std::to_string(attn.size()) + " in the graph)", ta);
  }
  std::printf("%-34s", "the layers of one decode step");
  for (size_t m = 0; m < size_t(kModeCount); ++m)
    std::printf(" %14.1f us", 1e6 * ((tg.empty() ? 0 : tg[m] * double(gdn.size())) +
                                     (ta.empty() ? 0 : ta[m] * double(attn.size()))));
  std::printf(
      "\n(embed, lm_head and sampling not included: `lilac bench --synthetic` has the step)\n");
}

}  // namespace

void bench_decode_layers(const std::string& weights, int context, int runs) {
  for (const char* w : {"bf16", "q4"})
    if (weights == "both" || weights == w) one_format(w, context, runs);
  int with_wait = 0, without = 0;
  cuda::pdl_kernel_counts(&with_wait, &without);
  std::printf("PDL: %s; %d kernels launched with it, %d refused (machine code without the wait)\n",
              cuda::pdl_enabled() ? "available" : "not available on this device", with_wait,
              without);
}

}  // namespace lilac::bench
