// The CUDA backend on 4-bit weights (label gpu):
//  * tiny-a, `--weights q4` on the BF16 checkpoint: the GPU quantizes at load, the CPU in memory
//    (quantize_model_in_memory): the same dequantised weights. GPU vs CPU logits (prefill and 16
//    greedy decode steps) within the bf16-activation tolerance, the same greedy ids;
//  * tiny-a written as an MLX 4-bit checkpoint (`lilac quantize`) and loaded: uploaded as is
//    (repack only), GPU vs CPU, and bit-identical to the quantize-at-load GPU run;
//  * the full-size synthetic model in 4-bit (8-bit routers), first layers, GPU vs CPU
//    teacher-forced layer by layer on the same quantized weights (host copy quantized by the CPU
//    quantizer), and the GPU's decode step against its own prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include <unistd.h>

#include "../io/quant_test_util.h"
#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "cpu/linear.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "io/checkpoint.h"
#include "io/quantize.h"
#include "io/safetensors.h"
#include "model/qwen36.h"
#include "router_tie.h"
#include "util/thread_pool.h"

namespace lilac::test {
namespace {

std::pair<double, double> rel_and_max(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
    mx = std::isnan(d) ? INFINITY : std::max(mx, std::fabs(d));
  }
  return {std::sqrt(num / std::max(den, 1e-30)), mx};
}

int32_t argmax(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

// Prefill logits of the fixture's prompt (all positions) and 16 greedy decode steps' logits;
// with `forced`, the decode feeds those ids instead of its own argmax (teacher forcing).
struct LogitsRun {
  std::vector<float> prefill;
  std::vector<std::vector<float>> steps;
  std::vector<int32_t> ids;  // the greedy ids (argmax of the previous logits)
};

LogitsRun run(Backend& b, const std::vector<int32_t>& prompt, int64_t V,
              const std::vector<int32_t>* forced = nullptr) {
  LogitsRun r;
  auto seq = b.new_sequence(64);
  r.prefill.resize(prompt.size() * size_t(V));
  b.forward(*seq, prompt, r.prefill, true);
  int32_t next = argmax(&r.prefill[(prompt.size() - 1) * size_t(V)], V);
  for (size_t j = 0; j < 16; ++j) {
    r.ids.push_back(next);
    int32_t feed = forced ? (*forced)[j] : next;
    std::vector<float> step(static_cast<size_t>(V));
    b.forward(*seq, std::span(&feed, 1), step, false);
    next = argmax(step.data(), V);
    r.steps.push_back(std::move(step));
  }
  return r;
}

// An FP8 checkpoint on the GPU: each weight is uploaded as bf16(fp8 * scale), the exact values of
// its bf16 equivalent, and quantized at load from those values, so both runs give the bf16
// equivalent's logits and ids bit for bit (BF16 weights, and --weights q4).
TEST(Q4Backend, Fp8CheckpointEqualsItsBf16Equivalent) {
  LILAC_REQUIRE_GPU();
  TempDir t;
  write_fp8_tiny_a(t.str("fp8"), t.str("bf16"));
  auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
  const auto prompt = read_i32(*ref, "prompt_ids");
  for (bool quantize : {false, true}) {
    SCOPED_TRACE(quantize ? "--weights q4" : "bf16");
    auto f = load_model(t.str("fp8"));
    auto b = load_model(t.str("bf16"));
    ASSERT_EQ(f->checkpoint->format(), WeightFormat::FP8);
    auto gf = cuda::make_cuda_backend(f->config, f->weights, f->checkpoint->dir(), quantize);
    auto gb = cuda::make_cuda_backend(b->config, b->weights, b->checkpoint->dir(), quantize);
    const int64_t V = f->config.vocab;
    const LogitsRun rf = run(*gf, prompt, V), rb = run(*gb, prompt, V);
    const auto [rel, mx] = rel_and_max(rf.prefill, rb.prefill);
    EXPECT_EQ(mx, 0.0) << "prefill logits (rel " << rel << ")";
    EXPECT_EQ(rf.ids, rb.ids);
    for (size_t j = 0; j < rf.steps.size(); ++j)
      EXPECT_EQ(rel_and_max(rf.steps[j], rb.steps[j]).second, 0.0) << "decode step " << j;
  }
}

// Replaces every quantized matrix of `w` by the weights the GPU prefill kernels multiply:
// bf16 RNE(s q + b) (dequantize_row_bf16), stored in `storage`. The embedding stays: the
// GPU's lookup (q_embed) dequantises it exactly in f32, as the CPU does.
void to_prefill_weights(ModelWeights& w, std::vector<std::vector<uint16_t>>& storage) {
  auto conv = [&](Matrix& m) {
    if (!m.quantized()) return;
    auto& v = storage.emplace_back(size_t(m.rows * m.cols));
    ThreadPool::global().parallel_for(size_t(m.rows), [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r)
        dequantize_row_bf16(m.row(int64_t(r)), m.row_scales(int64_t(r)), m.row_biases(int64_t(r)),
                            m.bits, m.group_size, m.cols, &v[r * size_t(m.cols)]);
    });
    m = Matrix{v.data(), DType::BF16, m.rows, m.cols, m.name};
  };
  conv(w.lm_head);
  for (auto& L : w.layers) L.for_each_matrix(conv);
}

// The GPU runs greedily; the CPU is fed the GPU's ids, so every step compares the same sequence.
// Each greedy id must be the CPU's too, unless the CPU's own top two are closer than the two
// backends' logits differ at that step (a genuine near-tie; reported).
// The GPU prefill's large GEMMs multiply bf16-rounded dequantised weights (2^-9 relative), its
// decode and, since 2026-12-02, the prefill projections of <= 4096 rows at <= 256 tokens
// (q_gemv_rows slabs: every projection of tiny-a's short prompts) the exact f32 ones. So a short
// prompt's prefill logits sit between `prefill_twin` (a CPU backend over the weights
// to_prefill_weights gives) and `cpu` (the exact weights): they are compared with whichever of the
// two is nearer element by element, at the same 8e-2 (tiny-a's random logits move by up to ~0.2
// between the two weight sets: its bf16 GPU run is 4.6e-2 from the HF reference already); the
// decode steps are compared with `cpu`.
void expect_close(Backend& gpu, Backend& cpu, Backend& prefill_twin,
                  const std::vector<int32_t>& prompt, int64_t V, const std::string& what) {
  const LogitsRun g = run(gpu, prompt, V);
  const LogitsRun c = run(cpu, prompt, V, &g.ids);
  std::vector<float> twin(prompt.size() * size_t(V));
  auto seq = prefill_twin.new_sequence(64);
  prefill_twin.forward(*seq, prompt, twin, true);
  // 8e-2: tiny-a's bf16-activation logits are that sensitive to summation order alone (its BF16
  // GPU run is 4.6e-2 from the HF reference).
  std::vector<float> nearer(twin.size());
  for (size_t i = 0; i < twin.size(); ++i)
    nearer[i] = std::fabs(g.prefill[i] - twin[i]) <= std::fabs(g.prefill[i] - c.prefill[i])
                    ? twin[i]
                    : c.prefill[i];
  EXPECT_TRUE(all_close(g.prefill, nearer, 8e-2, 0, what + " prefill logits"));
  const auto [rel, mx] = rel_and_max(g.prefill, c.prefill);
  std::printf("  %s prefill logits vs the CPU's f32 4-bit path: rel %.2e, max abs %.3e\n",
              what.c_str(), rel, mx);
  int same = 0;
  for (size_t j = 0; j < g.ids.size(); ++j) {
    const std::vector<float>& prev =
        j == 0 ? std::vector<float>(c.prefill.end() - V, c.prefill.end()) : c.steps[j - 1];
    const std::vector<float>& gprev =
        j == 0 ? std::vector<float>(g.prefill.end() - V, g.prefill.end()) : g.steps[j - 1];
    double diff = 0;
    for (int64_t v = 0; v < V; ++v)
      diff = std::max(diff, std::fabs(double(prev[size_t(v)]) - gprev[size_t(v)]));
    const int32_t cpu_id = argmax(prev.data(), V);
    if (cpu_id == g.ids[j]) {
      ++same;
    } else {
      const double margin = double(prev[size_t(cpu_id)]) - prev[size_t(g.ids[j])];
      std::printf("  %s step %zu: gpu id %d, cpu id %d, cpu margin %.3g, logit difference %.3g\n",
                  what.c_str(), j, g.ids[j], cpu_id, margin, diff);
      EXPECT_LE(margin, 2 * diff) << what << ": greedy id differs at decode step " << j
                                  << " without a near-tie";
    }
    EXPECT_TRUE(
        all_close(g.steps[j], c.steps[j], 5e-2, 0, what + " decode step " + std::to_string(j)));
  }
  std::printf("  %s: %d of %zu greedy ids identical\n", what.c_str(), same, g.ids.size());
}

TEST(Q4Backend, TinyAQuantizedAtLoadMatchesTheCpu) {
  LILAC_REQUIRE_GPU();
  auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
  const auto prompt = read_i32(*ref, "prompt_ids");

  auto gpu_model = load_model(data_path("tiny-a"));
  gpu_model->config.rope_inv_freq_bf16 = true;
  auto gpu = cuda::make_cuda_backend(gpu_model->config, gpu_model->weights,
                                     gpu_model->checkpoint->dir(), /*quantize=*/true);
  EXPECT_GT(gpu->model().quantized_matrices, 0);
  EXPECT_TRUE(gpu->model().lm_head.affine() && gpu->model().embed.affine());
  EXPECT_EQ(gpu->model().layers[0].router.format, cuda::DeviceFormat::Affine);
  EXPECT_EQ(gpu->model().layers[0].router.q.bits, 8);
  EXPECT_EQ(gpu->model().layers[0].gate_up.q.bits, 4);

  auto cpu_model = load_model(data_path("tiny-a"));
  cpu_model->config.rope_inv_freq_bf16 = true;
  quantize_model_in_memory(*cpu_model);
  cpu::CpuBackend cpu_backend(cpu_model->config, cpu_model->weights);
  cpu_backend.set_bf16_activations(true);
  ModelWeights twin_weights = cpu_model->weights;
  std::vector<std::vector<uint16_t>> twin_storage;
  to_prefill_weights(twin_weights, twin_storage);
  cpu::CpuBackend twin(cpu_model->config, twin_weights);
  twin.set_bf16_activations(true);

  expect_close(*gpu, cpu_backend, twin, prompt, gpu_model->config.vocab,
               "tiny-a q4 (quantized at load)");
}

TEST(Q4Backend, TinyAMlxCheckpointMatchesTheCpuAndTheLoadTimeQuantization) {
  LILAC_REQUIRE_GPU();
  const auto dir =
      std::filesystem::temp_directory_path() / ("lilac-q4-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  QuantizeOptions qo;
  qo.input = data_path("tiny-a");
  qo.output = dir.string();
  quantize_checkpoint(qo);
  auto ref = SafetensorsFile::open(data_path("tiny-a/reference.safetensors"));
  const auto prompt = read_i32(*ref, "prompt_ids");

  auto model = load_model(dir.string());
  model->config.rope_inv_freq_bf16 = true;
  ASSERT_TRUE(has_quantized_weights(model->weights));
  auto gpu = cuda::make_cuda_backend(model->config, model->weights, model->checkpoint->dir());
  cpu::CpuBackend cpu_backend(model->config, model->weights);
  cpu_backend.set_bf16_activations(true);
  ModelWeights twin_weights = model->weights;
  std::vector<std::vector<uint16_t>> twin_storage;
  to_prefill_weights(twin_weights, twin_storage);
  cpu::CpuBackend twin(model->config, twin_weights);
  twin.set_bf16_activations(true);
  const int64_t V = model->config.vocab;
  expect_close(*gpu, cpu_backend, twin, prompt, V, "tiny-a MLX 4-bit checkpoint");
  const LogitsRun g = run(*gpu, prompt, V);

  // The same device weights as quantizing the BF16 checkpoint on the GPU: identical logits.
  auto bf = load_model(data_path("tiny-a"));
  bf->config.rope_inv_freq_bf16 = true;
  auto gpu2 =
      cuda::make_cuda_backend(bf->config, bf->weights, bf->checkpoint->dir(), /*quantize=*/true);
  const LogitsRun g2 = run(*gpu2, prompt, V);
  const auto [rel, mx] = rel_and_max(g2.prefill, g.prefill);
  EXPECT_EQ(mx, 0.0)
      << "GPU logits of the MLX checkpoint and of load-time quantization differ (rel " << rel
      << ")";
  EXPECT_EQ(g2.ids, g.ids);
  std::filesystem::remove_all(dir);
}

// As CudaBackend.SyntheticFullSizeFirstLayersMatchTheCpu (cuda_backend_test.cpp), on the q4
// synthetic model: the device quantizes the synthetic bf16 values with cuda::quantize_mlx, the host
// copy with mlx_quantize_row (bit-identical), so both backends hold the same quantized weights.
// The GPU prefill multiplies them as bf16 RNE(s q + b), so the CPU runs that twin of them
// (to_prefill_weights): with the f32 dequantisation instead, the routers' inputs would differ by
// ~1e-3 relative and near-tied experts would swap, which says nothing about the kernels (the
// tiny-a tests compare with the CPU's f32 4-bit path end to end).
TEST(Q4Backend, SyntheticFullSizeFirstLayersMatchTheCpu) {
  LILAC_REQUIRE_GPU();
  ModelConfig cfg = qwen36_35b_a3b_config();
  const int64_t layers = 4;
  const uint64_t seed = 5;
  auto host = cuda::synthetic_host_model(cfg, seed, layers, /*q4=*/true);
  ASSERT_TRUE(host->weights.layers[0].moe.router.quantized());
  EXPECT_EQ(host->weights.layers[0].moe.router.bits, 8);
  EXPECT_EQ(host->weights.layers[0].moe.experts[0].down.bits, 4);
  std::vector<std::vector<uint16_t>> prefill_storage;
  to_prefill_weights(host->weights, prefill_storage);
  cpu::CpuBackend cpu_backend(host->config, host->weights);
  cpu_backend.set_bf16_activations(true);
  cuda::CudaBackend gpu_backend(std::shared_ptr<cuda::DeviceModel>(
      cuda::synthetic_device_model(host->config, seed, /*q4=*/true)));
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

  int32_t t = 4242;
  gpu_backend.forward(*gs, std::span(&t, 1), gpu_logits, false);
  auto gs9 = gpu_backend.new_sequence(16);
  std::vector<int32_t> nine = prompt;
  nine.push_back(t);
  std::vector<float> gpu9(V);
  gpu_backend.forward(*gs9, nine, gpu9, false);
  auto [rel3, mx3] = rel_and_max(gpu_logits, gpu9);
  std::printf("  gpu decode vs gpu prefill      rel %.2e  max abs %.3e\n", rel3, mx3);
  // Decode multiplies the exact f32 dequantised weights, prefill their bf16 rounding (and a
  // near-tied expert may swap): looser than the BF16 test's 1e-2; a decode kernel bug is O(1).
  EXPECT_LT(rel3, 5e-2) << "GPU decode step vs GPU prefill of the same tokens (max abs " << mx3
                        << ")";
}

// The q4 synthetic model is deterministic under greedy decoding (graphs, fixed summation orders).
TEST(Q4Backend, SyntheticGreedyDecodeIsDeterministic) {
  LILAC_REQUIRE_GPU();
  cuda::CudaBackend backend(synthetic_eight_layers(3, /*q4=*/true));
  auto once = [&] {
    auto seq = backend.new_sequence(512);
    SamplingParams greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> prompt = spread_prompt(300);
    backend.begin_sampling(*seq, prompt, greedy);
    std::vector<int32_t> out;
    StepResult r = backend.step(*seq, prompt, 0);
    for (int i = 1; i <= 32; ++i) {
      out.push_back(r.token);
      r = backend.step(*seq, std::span(&out.back(), 1), uint64_t(i));
    }
    return out;
  };
  EXPECT_EQ(once(), once());
}

// Prompt chunks: each layer's MoE combine writes the next layer's input norm in its blocks
// (CudaOptions::prefill_combine_norm, s31; default since s32) with rms_norm's own device function,
// so the logits of a prompt are the same bits with the fusion on and off: BF16 and 4-bit, at
// chunk lengths that take the small-M expert kernels (100), rows32 (300) and rows64 (1,000).
TEST(Q4Backend, PrefillCombineNormGivesTheSameBits) {
  LILAC_REQUIRE_GPU();
  for (const bool q4 : {false, true}) {
    cuda::CudaBackend backend(synthetic_eight_layers(11, q4));
    const size_t V = size_t(backend.config().vocab);
    auto logits_of = [&](bool fused) {
      cuda::CudaOptions o = backend.options();
      o.prefill_combine_norm = fused;
      backend.set_options(o);
      std::vector<float> all;
      for (const int T : {100, 300, 1000}) {
        auto seq = backend.new_sequence(T + 8);
        const std::vector<int32_t> prompt = spread_prompt(T, uint32_t(T));
        std::vector<float> logits(V);
        backend.forward(*seq, prompt, logits, false);
        all.insert(all.end(), logits.begin(), logits.end());
      }
      return all;
    };
    const std::vector<float> plain = logits_of(false), fused = logits_of(true);
    ASSERT_EQ(plain.size(), fused.size());
    EXPECT_EQ(bits_differ(plain, fused), 0u)
        << (q4 ? "4-bit" : "BF16") << ": logits that differ in their bits";
    // And the fusion happens: with it on, the prompt chunks of the kernel breakdown (256 and
    // 4,096 tokens) run one fused combine per layer but the last; with it off, none.
    const int L = int(backend.config().layers);
    for (const bool fused : {true, false}) {
      cuda::CudaOptions o = backend.options();
      o.prefill_combine_norm = fused;
      backend.set_options(o);
      int chunks = 0, fused_lines = 0;
      for (const std::string& line : backend.kernel_breakdown()) {
        if (line.rfind("prefill chunk", 0) == 0) ++chunks;
        if (chunks > 0 && line.find("moe_combine+rms_norm") != std::string::npos) {
          ++fused_lines;
          EXPECT_NE(line.find("(" + std::to_string(L - 1) + " launches)"), std::string::npos)
              << line;
        }
      }
      EXPECT_EQ(chunks, 2);
      EXPECT_EQ(fused_lines, fused ? 2 : 0) << (q4 ? "4-bit" : "BF16") << ", fused " << fused;
    }
  }
}

// Prompt chunks with the routed experts' down outputs stored as bf16 (CudaOptions::
// prefill_moe_y_bf16, s32): each rounded once (relative error <= 2^-9) before the f32 combine.
// The first layer sees the same input either way, so its MoE output differs by that rounding
// alone: at 300 and 1,000 tokens (the rows32 and rows64 wgmma kernels) layer 0's moe_out within
// 2^-9 of the f32 path's (norm-wise: the rows' independent roundings do not add up to more than
// one's bound) and not the same bits (the switch acts); at 100 tokens (the small-M kernels, f32
// only) the same bits. (The end-to-end logits of the random 8-layer model are no measure: a
// first version of this test found them 7e-2 apart, as far as the batched and single paths'.)
TEST(Q4Backend, PrefillMoeYBf16RoundsOnlyTheExpertRows) {
  LILAC_REQUIRE_GPU();
  cuda::CudaBackend backend(synthetic_eight_layers(11, true));
  const size_t V = size_t(backend.config().vocab);
  auto layer0_of = [&](bool y_bf16, int T) {
    cuda::CudaOptions o = backend.options();
    o.prefill_moe_y_bf16 = y_bf16;
    backend.set_options(o);
    std::map<std::string, std::vector<float>> trace;
    backend.set_trace(
        [&trace](const std::string& name, const float* d, const std::vector<int64_t>& shape) {
          if (!name.starts_with("layer0.")) return;
          int64_t n = 1;
          for (auto x : shape) n *= x;
          trace[name].assign(d, d + n);
        });
    auto seq = backend.new_sequence(T + 8);
    const std::vector<int32_t> prompt = spread_prompt(T, uint32_t(T));
    std::vector<float> logits(V);
    backend.forward(*seq, prompt, logits, false);
    backend.set_trace(nullptr);
    return trace;
  };
  for (const int T : {100, 300, 1000}) {
    auto f32 = layer0_of(false, T), b16 = layer0_of(true, T);
    ASSERT_EQ(f32.at("layer0.moe.topk_ids"), b16.at("layer0.moe.topk_ids")) << "T " << T;
    const auto& a = f32.at("layer0.moe_out");
    const auto& b = b16.at("layer0.moe_out");
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0 ? 1 : 0;
    auto [rel, mx] = rel_and_max(b, a);
    std::printf(
        "  T %4d: layer 0 moe_out, bf16 rows against f32: rel %.2e  max abs %.3e, %zu of "
        "%zu differ\n",
        T, rel, mx, differ, a.size());
    if (T == 100) {
      EXPECT_EQ(differ, 0u) << "T 100 takes the small-M kernels, which keep f32 rows";
      continue;
    }
    EXPECT_LT(rel, 1.0 / 512) << "T " << T << " (max abs " << mx << ")";
    EXPECT_GT(differ, 0u) << "T " << T << ": the switch changed nothing";
  }
}

}  // namespace
}  // namespace lilac::test
