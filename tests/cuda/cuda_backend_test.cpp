// The assembled CUDA backend (label gpu): the tiny-a fixture against HF's logits, the CUDA backend
// against the CPU backend on the full-size synthetic model's first layers, and determinism.
#include "cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "cuda/sampling.h"
#include "cuda_test_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/qwen36.h"
#include "model/sampling.h"
#include "router_tie.h"
#include "util/error.h"

namespace lilac::test {
namespace {

// ||a - b|| / ||b|| and max |a - b|.
std::pair<double, double> rel_and_max(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
    mx = std::isnan(d) ? INFINITY : std::max(mx, std::fabs(d));
  }
  return {std::sqrt(num / std::max(den, 1e-30)), mx};
}

int32_t argmax(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

// Both checkpoint layouts; both recurrent-state formats (model/state_format.h): the bf16 state
// keeps the same greedy ids and the same tolerance against the f32 references on tiny-a.
TEST(CudaBackend, TinyAMatchesTheHFFixture) {
  LILAC_REQUIRE_GPU();
  for (const GdnStateFormat fmt : {GdnStateFormat::f32, GdnStateFormat::bf16})
    for (const char* dir : {"tiny-a", "tiny-a-per-expert"}) {
      SCOPED_TRACE(std::string("state ") + gdn_state_format_name(fmt));
      auto model = load_model(data_path(dir));
      model->config.rope_inv_freq_bf16 = true;  // as the fixture (docs/model-notes.md)
      cuda::CudaOptions options;
      options.gdn_state = fmt;
      auto backend = cuda::make_cuda_backend(model->config, model->weights,
                                             model->checkpoint->dir(), false, options);
      auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
      auto prompt = read_i32(*ref, "prompt_ids");
      auto want_prefill = read_f32(*ref, "prefill_logits");
      auto want_ids = read_i32(*ref, "decode_ids");
      auto want_decode = read_f32(*ref, "decode_logits");
      const int64_t V = model->config.vocab;
      auto seq = backend->new_sequence(64);
      std::vector<float> logits(prompt.size() * size_t(V));
      backend->forward(*seq, prompt, logits, true);
      // bf16 activations: about 5e-2 absolute on logits of scale ~4 (docs/model.md section 10).
      EXPECT_TRUE(all_close(logits, want_prefill, 5e-2, 0, std::string(dir) + " prefill_logits"));
      int32_t next = argmax(&logits[(prompt.size() - 1) * size_t(V)], V);
      std::vector<float> step(static_cast<size_t>(V));
      for (size_t j = 0; j < want_ids.size(); ++j) {
        ASSERT_EQ(next, want_ids[j]) << dir << ": greedy id differs at decode step " << j;
        backend->forward(*seq, std::span(&next, 1), step, false);
        std::vector<float> want(want_decode.begin() + j * V, want_decode.begin() + (j + 1) * V);
        EXPECT_TRUE(
            all_close(step, want, 5e-2, 0, std::string(dir) + " decode step " + std::to_string(j)));
        next = argmax(step.data(), V);
      }
    }
}

// The bf16 state format against the CPU backend's twin of it (its recurrent state rounded to bf16
// after each call), prompt then 8 greedy steps; the states the backend reports are bf16 values;
// a sequence's state bytes shrink by the recurrent state's half; set_options cannot switch it.
TEST(CudaBackend, TinyABf16StateMatchesTheCpuTwin) {
  LILAC_REQUIRE_GPU();
  auto model = load_model(data_path("tiny-a"));
  model->config.rope_inv_freq_bf16 = true;
  cuda::CudaOptions options;
  options.gdn_state = GdnStateFormat::bf16;
  auto gpu = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir(), false,
                                     options);
  auto gpu32 = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  cpu::CpuBackend cpu(model->config, model->weights);
  cpu.set_gdn_state_format(GdnStateFormat::bf16);
  auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
  auto prompt = read_i32(*ref, "prompt_ids");
  const int64_t V = model->config.vocab;
  auto gs = gpu->new_sequence(64), cs = cpu.new_sequence(64), g32 = gpu32->new_sequence(64);
  std::vector<float> gl(prompt.size() * size_t(V)), cl(gl.size());
  gpu->forward(*gs, prompt, gl, true);
  cpu.forward(*cs, prompt, cl, true);
  EXPECT_TRUE(all_close(gl, cl, 5e-2, 0, "bf16 state: prompt logits vs the CPU twin"));
  int32_t next = argmax(&gl[(prompt.size() - 1) * size_t(V)], V);
  std::vector<float> g(static_cast<size_t>(V)), c(g.size());
  for (int j = 0; j < 8; ++j) {
    gpu->forward(*gs, std::span(&next, 1), g, false);
    cpu.forward(*cs, std::span(&next, 1), c, false);
    EXPECT_TRUE(all_close(g, c, 5e-2, 0, "bf16 state: decode step " + std::to_string(j)));
    EXPECT_EQ(argmax(g.data(), V), argmax(c.data(), V)) << "greedy id at step " << j;
    next = argmax(g.data(), V);
  }
  for (int64_t layer = 0; layer < model->config.layers; ++layer) {
    if (model->config.layer_types[size_t(layer)] != LayerType::GatedDeltaNet) continue;
    const auto rec = gpu->gdn_state(*gs, layer).second;
    size_t not_bf16 = 0;
    for (float x : rec) not_bf16 += round_to_bf16(x) != x;
    EXPECT_EQ(not_bf16, 0u) << "layer " << layer;
  }
  const size_t rec_f32 = size_t(model->config.count_layers(LayerType::GatedDeltaNet)) *
                         size_t(model->config.gdn_value_heads * model->config.gdn_key_dim *
                                model->config.gdn_value_dim) *
                         4;
  EXPECT_EQ(gpu32->state_bytes(*g32) - gpu->state_bytes(*gs), rec_f32 / 2);
  cuda::CudaOptions o = gpu->options();
  o.gdn_state = GdnStateFormat::f32;
  EXPECT_THROW(gpu->set_options(o), lilac::Error);
}

TEST(CudaBackend, ChunkedPrefillAndGraphedDecodeAgree) {
  LILAC_REQUIRE_GPU();
  auto model = load_model(data_path("tiny-a"));
  auto backend = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
  auto prompt = read_i32(*ref, "prompt_ids");
  const size_t V = size_t(model->config.vocab);
  auto whole = backend->new_sequence(64);
  std::vector<float> a(prompt.size() * V), b(prompt.size() * V);
  backend->forward(*whole, prompt, a, true);
  // The same prompt as 13 + 27 tokens, then one at a time (decode graph): bf16 rounding differs
  // only through reduction order.
  auto split = backend->new_sequence(64);
  backend->forward(*split, std::span(prompt).first(13), std::span(b).first(13 * V), true);
  backend->forward(*split, std::span(prompt).subspan(13), std::span(b).subspan(13 * V), true);
  EXPECT_TRUE(all_close(b, a, 2e-2, 0, "13 + 27"));
  auto ones = backend->new_sequence(64);
  for (size_t t = 0; t < prompt.size(); ++t)
    backend->forward(*ones, std::span(prompt).subspan(t, 1), std::span(b).subspan(t * V, V), false);
  EXPECT_TRUE(all_close(b, a, 2e-2, 0, "40 x 1"));
  // A clone continues exactly like its source (same kernels, same inputs: bitwise).
  auto c = backend->clone(*ones);
  // A compact snapshot (capacity = its position, as the prompt cache stores them) restored with
  // room to grow continues identically too.
  auto compact = backend->clone_with_capacity(*ones, ones->position());
  EXPECT_LT(backend->state_bytes(*compact), backend->state_bytes(*ones));
  auto restored = backend->clone_with_capacity(*compact, 64);
  std::vector<float> x(V), y(V), z(V);
  int32_t tok = 7;
  backend->forward(*ones, std::span(&tok, 1), x, false);
  backend->forward(*c, std::span(&tok, 1), y, false);
  backend->forward(*restored, std::span(&tok, 1), z, false);
  EXPECT_EQ(x, y);
  EXPECT_EQ(x, z);
}

TEST(CudaBackend, DeviceSamplingMatchesTheCpuSamplerOnTheSameLogits) {
  LILAC_REQUIRE_GPU();
  auto model = load_model(data_path("tiny-a"));
  auto backend = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  const size_t V = size_t(model->config.vocab);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.seed = 11;
  auto seq = backend->new_sequence(64);
  auto probe = backend->new_sequence(64);
  backend->begin_sampling(*seq, {}, p);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  std::vector<float> logits(V);
  // The probe sequence gives the logits the sampler sees at each step.
  backend->forward(*probe, ids, logits, false);
  StepResult r = backend->step(*seq, ids, 0);
  EXPECT_EQ(r.token, sample_token(logits.data(), int32_t(V), p, nullptr, 0).token);
  for (uint64_t i = 1; i < 20; ++i) {
    int32_t t = r.token;
    backend->forward(*probe, std::span(&t, 1), logits, false);
    r = backend->step(*seq, std::span(&t, 1), i);
    EXPECT_EQ(r.token, sample_token(logits.data(), int32_t(V), p, nullptr, i).token)
        << "step " << i;
  }
}

// The decode step takes the sampler's small top_k path for top_k in [1, 32] and the general path
// otherwise, each in its own decode graph: one sequence serves requests with top_k 20, 0, 20 (the
// engine reuses a slot's sequence across requests), and every token equals the CPU sampler's on
// the same logits, penalties included. A graph keyed only by "sampling" would replay the small
// path's launches for top_k = 0 (no new general capture, and its tokens would leave the contract).
TEST(CudaBackend, DecodeKeysItsGraphBySamplerPath) {
  LILAC_REQUIRE_GPU();
  auto model = load_model(data_path("tiny-a"));
  auto backend = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  const size_t V = size_t(model->config.vocab);
  auto seq = backend->new_sequence(128);
  auto probe = backend->new_sequence(128);
  std::vector<float> logits(V);
  int32_t next = 3;
  auto request = [&](int top_k, uint64_t seed, int steps) {
    SamplingParams p;  // the model's thinking defaults, top_k varied
    p.temperature = 1.f;
    p.top_k = top_k;
    p.top_p = 0.95f;
    p.presence_penalty = 1.5f;
    p.top_logprobs = 2;
    p.seed = seed;
    backend->begin_sampling(*seq, {}, p);
    PenaltyState pen;
    pen.reset(int32_t(V));
    for (int i = 0; i < steps; ++i) {  // one token per step: the decode graph
      backend->forward(*probe, std::span(&next, 1), logits, false);
      const StepResult r = backend->step(*seq, std::span(&next, 1), uint64_t(i));
      const SampleResult want = sample_token(logits.data(), int32_t(V), p, &pen, uint64_t(i));
      ASSERT_EQ(r.token, want.token) << "top_k " << top_k << ", step " << i;
      ASSERT_EQ(r.top.size(), want.top.size());
      pen.add_output(want.token);
      next = r.token;
    }
  };
  const cuda::SamplerLaunchCounts c0 = cuda::sampler_launch_counts();
  request(20, 1, 12);
  const cuda::SamplerLaunchCounts c1 = cuda::sampler_launch_counts();
  EXPECT_EQ(c1.small_top_k, c0.small_top_k + 1);  // captured once, then replayed
  EXPECT_EQ(c1.general, c0.general);
  request(0, 2, 12);
  const cuda::SamplerLaunchCounts c2 = cuda::sampler_launch_counts();
  EXPECT_EQ(c2.general, c1.general + 1);  // its own graph
  EXPECT_EQ(c2.small_top_k, c1.small_top_k);
  request(20, 3, 12);
  request(50, 4, 6);  // past kSmallTopK: the general path's graph again
  const cuda::SamplerLaunchCounts c3 = cuda::sampler_launch_counts();
  EXPECT_EQ(c3.small_top_k, c2.small_top_k);
  EXPECT_EQ(c3.general, c2.general);
}

// The full-size architecture with synthetic weights, truncated to its first four layers (three
// Gated DeltaNet, one attention): the CUDA backend against the CPU backend on the same numbers,
// layer by layer. Each CPU layer starts from the GPU's residual stream (teacher forcing): with
// random routers a top-k choice can have a tiny margin, and without forcing one flipped expert in
// an early layer would make every later comparison meaningless. The CPU rounds activations to
// bf16 where the GPU stores them, so both compute the same function.
TEST(CudaBackend, SyntheticFullSizeFirstLayersMatchTheCpu) {
  LILAC_REQUIRE_GPU();
  ModelConfig cfg = qwen36_35b_a3b_config();
  const int64_t layers = 4;
  const uint64_t seed = 5;
  auto host = cuda::synthetic_host_model(cfg, seed, layers);
  cpu::CpuBackend cpu_backend(host->config, host->weights);
  cpu_backend.set_bf16_activations(true);
  cuda::CudaBackend gpu_backend(
      std::shared_ptr<cuda::DeviceModel>(cuda::synthetic_device_model(host->config, seed)),
      cuda::CudaOptions{});
  std::vector<int32_t> prompt = {17, 248044, 9, 100000, 3, 77777, 12345, 5};
  const int64_t T = int64_t(prompt.size()), H = cfg.hidden;
  std::map<std::string, std::vector<float>> cpu_trace, gpu_trace;
  auto recorder = [](std::map<std::string, std::vector<float>>& into) {
    return [&into](const std::string& name, const float* d, const std::vector<int64_t>& shape) {
      int64_t n = 1;
      for (auto s : shape) n *= s;
      into[name].assign(d, d + n);
    };
  };
  gpu_backend.set_trace(recorder(gpu_trace));
  const size_t V = size_t(cfg.vocab);
  std::vector<float> gpu_logits(V), cpu_logits(V);
  auto gs = gpu_backend.new_sequence(16);
  gpu_backend.forward(*gs, prompt, gpu_logits, false);
  gpu_backend.set_trace(nullptr);

  cpu_backend.set_trace(recorder(cpu_trace));
  auto cs = cpu_backend.new_sequence(16);
  for (int64_t i = 0; i < layers; ++i) {
    std::vector<float> h = gpu_trace.at("hidden." + std::to_string(i));
    cpu_backend.forward_layer(i, h.data(), T, *cs);
    const auto& want = gpu_trace.at("hidden." + std::to_string(i + 1));
    // A prompt token whose experts differ by a near tie (router_tie.h) makes the layer's output
    // incomparable; its input is the GPU's, so the next layers still are.
    const std::string tp = "layer" + std::to_string(i) + ".moe.";
    const ChunkRoutes routes =
        compare_chunk_routes(gpu_trace.at(tp + "topk_ids"), cpu_trace.at(tp + "topk_ids"),
                             gpu_trace.at(tp + "router_logits"), cpu_trace.at(tp + "router_logits"),
                             size_t(cfg.experts_per_token));
    // Per-op report: the diagnosis when the check below fails.
    for (const auto& [name, g] : gpu_trace) {
      if (!name.starts_with("layer" + std::to_string(i) + ".")) continue;
      auto it = cpu_trace.find(name);
      if (it == cpu_trace.end() || it->second.size() != g.size()) continue;
      if (name.ends_with("topk_ids")) {
        expect_routes_tied(name, routes);
        continue;
      }
      auto [r, m] = rel_and_max(g, it->second);
      std::printf("  %-28s rel %.2e  max abs %.3e\n", name.c_str(), r, m);
    }
    auto [rel, mx] = rel_and_max(want, h);
    std::printf("  hidden.%-20lld rel %.2e  max abs %.3e\n", (long long)(i + 1), rel, mx);
    if (routes.differ == 0) EXPECT_LT(rel, 5e-3) << "layer " << i << " (max abs " << mx << ")";
  }
  cpu_backend.forward_head(&gpu_trace.at("hidden." + std::to_string(layers))[size_t((T - 1) * H)],
                           1, cpu_logits.data());
  auto [rel, mx] = rel_and_max(gpu_logits, cpu_logits);
  std::printf("  logits                       rel %.2e  max abs %.3e\n", rel, mx);
  EXPECT_LT(rel, 5e-3) << "logits (max abs " << mx << ")";

  // The state the GPU prefill left for each Gated DeltaNet layer against the CPU's (built from the
  // same inputs): a wrong state only shows in the decode steps that follow.
  static_cast<cpu::CpuSequenceState&>(*cs).advance(T);
  for (int64_t i = 0; i < layers; ++i) {
    if (cfg.layer_types[size_t(i)] != LayerType::GatedDeltaNet) continue;
    auto [conv, rec] = gpu_backend.gdn_state(*gs, i);
    const auto& cst = static_cast<cpu::CpuSequenceState&>(*cs);
    auto [rc, mc] = rel_and_max(conv, cst.conv_state[size_t(cfg.slot_of_layer(i))]);
    auto [rr, mr] = rel_and_max(rec, cst.recurrent[size_t(cfg.slot_of_layer(i))]);
    std::printf("  layer%lld conv state rel %.2e (max %.3e), recurrent state rel %.2e (max %.3e)\n",
                (long long)i, rc, mc, rr, mr);
    EXPECT_LT(rc, 5e-3) << "conv state after prefill, layer " << i;
    EXPECT_LT(rr, 5e-3) << "recurrent state after prefill, layer " << i;
  }
  // One decode step, teacher-forced per layer like the prefill above (the GPU step runs un-graphed
  // while traced; the graph replays the same launches).
  int32_t t = 4242;
  auto gs_graph = gpu_backend.clone(*gs);  // for the graphed step below
  gpu_trace.clear();
  cpu_trace.clear();
  gpu_backend.set_trace(recorder(gpu_trace));
  gpu_backend.forward(*gs, std::span(&t, 1), gpu_logits, false);
  gpu_backend.set_trace(nullptr);
  for (int64_t i = 0; i < layers; ++i) {
    std::vector<float> h = gpu_trace.at("decode.hidden." + std::to_string(i));
    cpu_backend.forward_layer(i, h.data(), 1, *cs);
    auto [rd, md] = rel_and_max(gpu_trace.at("decode.hidden." + std::to_string(i + 1)), h);
    std::printf("  decode hidden.%-13lld rel %.2e  max abs %.3e\n", (long long)(i + 1), rd, md);
    // The decode token's experts, as the prefill's above: where the two sides chose different
    // sets, every expert in one set and not the other must be a near tie (its CPU router logit
    // within 10x the sides' largest router-logit difference of the CPU's k-th largest); the
    // layer's output then says nothing about the kernels and is not compared (s32: the GDN
    // state's truncated tf32 split moved such a tie in layer 3).
    const std::string tp = "layer" + std::to_string(i) + ".moe.";
    const RouteComparison rc = compare_routes(
        gpu_trace.at("decode." + tp + "topk_ids"), cpu_trace.at(tp + "topk_ids"),
        gpu_trace.at("decode." + tp + "router_logits"), cpu_trace.at(tp + "router_logits"));
    if (rc.differ) {
      std::printf(
          "  decode layer %lld: the sides chose different experts (%s; router logits "
          "differ by up to %.3e)\n",
          (long long)i, rc.near_tie ? "a near tie" : "NOT a near tie", rc.logit_diff);
      EXPECT_TRUE(rc.near_tie) << "decode step, layer " << i
                               << ": experts differ without a near tie";
      continue;
    }
    EXPECT_LT(rd, 5e-3) << "decode step, layer " << i << " (max abs " << md << ")";
  }
  cpu_backend.set_trace(nullptr);
  // The graphed step gives the traced (un-graphed) step's logits bit for bit.
  std::vector<float> graphed(V);
  gpu_backend.forward(*gs_graph, std::span(&t, 1), graphed, false);
  EXPECT_EQ(graphed, gpu_logits) << "graph replay vs the same launches un-graphed";
  // The GPU's decode path (GEMV, gdn_decode, attention_decode) against its own prefill path over
  // the same 9 tokens, layer by layer on the last token. Not teacher-forced: the two paths round
  // differently, so a router whose k-th and (k+1)-th logits nearly tie may pick another expert in
  // one of them. Such a flip is reported with its margin (and must be a near tie); the layers after
  // it are not comparable. Without a flip every layer and the logits must agree.
  auto gs9 = gpu_backend.new_sequence(16);
  std::vector<int32_t> nine = prompt;
  nine.push_back(t);
  std::vector<float> gpu9(V);
  std::map<std::string, std::vector<float>> trace9;
  gpu_backend.set_trace(recorder(trace9));
  gpu_backend.forward(*gs9, nine, gpu9, false);
  gpu_backend.set_trace(nullptr);
  const size_t k = size_t(cfg.experts_per_token), E = size_t(cfg.experts);
  bool flipped = false;
  for (int64_t i = 0; i < layers && !flipped; ++i) {
    const std::string tp = "layer" + std::to_string(i) + ".moe.";
    const auto& ids9 = trace9.at(tp + "topk_ids");
    std::vector<float> a(ids9.end() - ptrdiff_t(k), ids9.end());
    std::vector<float> b = gpu_trace.at("decode." + tp + "topk_ids");
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      // The margin at the top-k boundary, from the decode step's router logits.
      std::vector<float> logits = gpu_trace.at("decode." + tp + "router_logits");
      std::vector<float> sorted = logits;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const float margin = sorted[k - 1] - sorted[k];
      const auto& l9 = trace9.at(tp + "router_logits");
      std::vector<float> last9(l9.end() - ptrdiff_t(E), l9.end());
      auto [rl, ml] = rel_and_max(logits, last9);
      std::printf(
          "  layer %lld routes the last token differently (top-k margin %.3e, router logits max "
          "abs %.3e)\n",
          (long long)i, margin, ml);
      EXPECT_LT(margin, 4 * ml + 1e-4f)
          << "layer " << i << ": a routing difference that is not a near tie";
      flipped = true;
      continue;
    }
    const auto& h9 = trace9.at("hidden." + std::to_string(i + 1));
    std::vector<float> last(h9.end() - ptrdiff_t(H), h9.end());
    auto [rh, mh] = rel_and_max(gpu_trace.at("decode.hidden." + std::to_string(i + 1)), last);
    std::printf("  decode vs prefill hidden.%-3lld rel %.2e  max abs %.3e\n", (long long)(i + 1),
                rh, mh);
    EXPECT_LT(rh, 1e-2) << "GPU decode step vs GPU prefill of the same tokens, layer " << i;
  }
  auto [rel3, mx3] = rel_and_max(gpu_logits, gpu9);
  std::printf("  gpu decode vs gpu prefill      rel %.2e  max abs %.3e%s\n", rel3, mx3,
              flipped ? " (after a routing flip: not compared)" : "");
  if (!flipped)
    EXPECT_LT(rel3, 1e-2) << "GPU decode step vs GPU prefill of the same tokens (max abs " << mx3
                          << ")";
}

TEST(CudaBackend, SyntheticGreedyDecodeIsDeterministic) {
  LILAC_REQUIRE_GPU();
  cuda::CudaBackend backend(synthetic_eight_layers(3));
  auto run = [&] {
    auto seq = backend.new_sequence(512);
    SamplingParams greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> prompt = spread_prompt(300);
    backend.begin_sampling(*seq, prompt, greedy);
    std::vector<int32_t> out;
    StepResult r = backend.step(*seq, prompt, 0);
    for (int i = 1; i <= 64; ++i) {
      out.push_back(r.token);
      r = backend.step(*seq, std::span(&out.back(), 1), uint64_t(i));
    }
    return out;
  };
  auto a = run();
  auto b = run();
  EXPECT_EQ(a, b);
  for (int32_t id : a) EXPECT_LT(id, kQwen36RealTokens);
}

}  // namespace
}  // namespace lilac::test
