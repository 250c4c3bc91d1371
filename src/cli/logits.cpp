// `lilac logits`: prefill a prompt, decode N tokens greedily, write the logits in the layout of the
// HF fixtures' reference.safetensors, and optionally compare against such a file. This is how
// every backend and weight format is checked against references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "runtime/backends.h"
#include "runtime/weights_choice.h"
#include "util/error.h"
#include "util/version.h"

namespace lilac::cli {
namespace {

struct LogitsOptions {
  std::string model, prompt_from, prompt_ids, out, compare, dump_trace, device = "cpu",
                                                                        weights = "auto";
  int decode = 0;
  int prefill_chunk = 0;
  bool rope_freq_bf16 = false;
  bool teacher_force = false;
  double atol = 1e-3;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not a token id", item);
    }
  }
  return ids;
}

int32_t argmax(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

int compare_with(const std::string& path, const std::vector<int32_t>& prompt,
                 const std::vector<float>& prefill, const std::vector<int32_t>& ids,
                 const std::vector<float>& decode, double atol, int64_t vocab) {
  auto ref = SafetensorsFile::open(path);
  bool ok = true;
  auto cmp = [&](const char* name, const std::vector<float>& got) {
    if (!ref->find(name)) {
      std::printf("%-16s not in %s (skipped)\n", name, path.c_str());
      return;
    }
    std::vector<float> want = read_f32(*ref, name);
    if (want.size() != got.size()) {
      std::printf("%-16s size %zu, reference has %zu  FAIL\n", name, got.size(), want.size());
      ok = false;
      return;
    }
    double max_err = 0;
    size_t where = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      double e = std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) : INFINITY;
      if (e > max_err || std::isnan(e)) max_err = e, where = i;
    }
    bool pass = max_err <= atol;
    ok = ok && pass;
    std::printf("%-16s max abs err %.3e at %zu (atol %.1e)  %s\n", name, max_err, where, atol,
                pass ? "ok" : "FAIL");
    // Distribution agreement per row of V logits: same argmax, and KL(reference || this) in nats.
    const size_t V = size_t(vocab), rows = V ? got.size() / V : 0;
    if (rows == 0) return;
    size_t agree = 0;
    double kl_sum = 0, kl_max = 0;
    for (size_t r = 0; r < rows; ++r) {
      const float* g = &got[r * V];
      const float* w = &want[r * V];
      agree += std::max_element(g, g + V) - g == std::max_element(w, w + V) - w;
      const double mg = *std::max_element(g, g + V), mw = *std::max_element(w, w + V);
      double zg = 0, zw = 0;
      for (size_t i = 0; i < V; ++i)
        zg += std::exp(double(g[i]) - mg), zw += std::exp(double(w[i]) - mw);
      double kl = 0;
      for (size_t i = 0; i < V; ++i) {
        const double lw = double(w[i]) - mw - std::log(zw), lg = double(g[i]) - mg - std::log(zg);
        kl += std::exp(lw) * (lw - lg);
      }
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
    }
    std::printf(
        "%-16s top-1 agreement %zu/%zu (%.1f%%), KL(reference || this) mean %.4g max %.4g nats\n",
        "", agree, rows, 100.0 * double(agree) / double(rows), kl_sum / double(rows), kl_max);
  };
  if (ref->find("prompt_ids") && read_i32(*ref, "prompt_ids") != prompt)
    std::printf("note: prompt_ids differ from the reference's\n");
  cmp("prefill_logits", prefill);
  if (!ids.empty()) {
    if (ref->find("decode_ids")) {
      std::vector<int32_t> want = read_i32(*ref, "decode_ids");
      size_t n = std::min(want.size(), ids.size()), same = 0;
      while (same < n && want[same] == ids[same]) ++same;
      bool pass = same == n;
      ok = ok && pass;
      std::printf("%-16s %zu/%zu identical before the first difference  %s\n", "decode_ids", same,
                  n, pass ? "ok" : "FAIL");
      // Logits are only comparable while the ids agree (same inputs).
      if (pass && want.size() == ids.size()) cmp("decode_logits", decode);
    }
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 3;
}

int run_logits(const LogitsOptions& o) {
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty())
    prompt = parse_ids(o.prompt_ids);
  else if (!o.prompt_from.empty())
    prompt = read_i32(*SafetensorsFile::open(o.prompt_from), "prompt_ids");
  else
    fail("give --prompt-from FILE or --prompt-ids 1,2,3");
  if (prompt.empty()) fail("the prompt is empty");
  if (o.decode < 0) fail("--decode must be >= 0");
  const runtime::WeightsChoice weights = runtime::parse_weights(o.weights);
  // Teacher forcing: decode feeds the reference's decode_ids, so every logits row is comparable.
  std::vector<int32_t> forced;
  if (o.teacher_force) {
    if (o.compare.empty()) fail("--teacher-force needs --compare REF (its decode_ids are fed)");
    forced = read_i32(*SafetensorsFile::open(o.compare), "decode_ids");
    if (int64_t(forced.size()) < o.decode)
      fail("--teacher-force: {} holds {} decode_ids, fewer than --decode {}", o.compare,
           forced.size(), o.decode);
  }

  auto model = load_model(o.model);
  model->config.rope_inv_freq_bf16 = o.rope_freq_bf16;
  // q4 on a float checkpoint: quantized in memory (cpu) or on the GPU at load (cuda), the same
  // codes.
  const runtime::WeightsPlan plan = runtime::plan_weights(weights, *model);
  auto backend = runtime::open_backend(*model, o.device, plan.quantize_at_load);
  const int64_t V = model->config.vocab, T = int64_t(prompt.size());
  auto seq = backend->new_sequence(T + o.decode + 1);
  // Named intermediates of the prefill (the first time each name appears), for backend diffs.
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> trace;
  if (!o.dump_trace.empty())
    backend->set_trace(
        [&](const std::string& name, const float* d, const std::vector<int64_t>& shape) {
          int64_t n = 1;
          for (auto s : shape) n *= s;
          trace.try_emplace(name, shape, std::vector<float>(d, d + n));
        });

  std::vector<float> prefill(size_t(T * V));
  int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : T;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    int64_t n = std::min(chunk, T - t0);
    backend->forward(*seq, std::span(prompt).subspan(size_t(t0), size_t(n)),
                     std::span(prefill).subspan(size_t(t0 * V), size_t(n * V)), true);
  }
  backend->set_trace(nullptr);
  if (!o.dump_trace.empty()) {
    std::vector<TensorToWrite> ts;
    for (const auto& [name, t] : trace)
      ts.push_back(
          {name, DType::F32, t.first,
           std::span(reinterpret_cast<const uint8_t*>(t.second.data()), t.second.size() * 4)});
    write_safetensors(o.dump_trace, ts);
  }
  std::vector<int32_t> ids;
  std::vector<float> decode(size_t(o.decode) * size_t(V));
  if (o.decode > 0)
    ids.push_back(forced.empty() ? argmax(&prefill[size_t((T - 1) * V)], V) : forced[0]);
  for (int j = 0; j < o.decode; ++j) {
    float* out = &decode[size_t(j) * size_t(V)];
    backend->forward(*seq, std::span(&ids[size_t(j)], 1), std::span(out, size_t(V)), false);
    if (j + 1 < o.decode) ids.push_back(forced.empty() ? argmax(out, V) : forced[size_t(j) + 1]);
  }

  if (!o.out.empty()) {
    auto bytes = [](const auto& v) {
      return std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
    };
    write_safetensors(
        o.out,
        {{"prompt_ids", DType::I32, {T}, bytes(prompt)},
         {"prefill_logits", DType::F32, {T, V}, bytes(prefill)},
         {"decode_ids", DType::I32, {int64_t(ids.size())}, bytes(ids)},
         {"decode_logits", DType::F32, {int64_t(o.decode), V}, bytes(decode)}},
        {{"producer", std::string("lilac ") + git_commit()}, {"device", backend->name()}});
    std::fprintf(stderr, "wrote %s (%lld prompt tokens, %d decoded, device %s)\n", o.out.c_str(),
                 (long long)T, o.decode, backend->name().c_str());
  }
  if (!o.compare.empty()) return compare_with(o.compare, prompt, prefill, ids, decode, o.atol, V);
  return 0;
}

const Command kLogits{
    "logits",
    "Prefill a prompt, decode greedily, write / compare logits (reference.safetensors layout)",
    [](CLI::App& app) {
      auto o = std::make_shared<LogitsOptions>();
      app.add_option("--model", o->model, "Model directory")->required();
      app.add_option("--prompt-from", o->prompt_from, "safetensors file holding I32 prompt_ids");
      app.add_option("--prompt-ids", o->prompt_ids, "Comma-separated token ids");
      app.add_option("--decode", o->decode, "Greedy decode steps after the prompt")->default_val(0);
      app.add_option("--out", o->out, "Output safetensors file");
      app.add_option("--device", o->device, "cpu, cuda or auto")->default_val("cpu");
      app.add_option("--compare", o->compare, "Reference safetensors to compare against");
      app.add_option("--atol", o->atol, "Max abs error allowed by --compare")->default_val(1e-3);
      app.add_option("--dump-trace", o->dump_trace,
                     "Write the prefill's named intermediates to this safetensors file");
      app.add_flag("--rope-freq-bf16", o->rope_freq_bf16,
                   "Round RoPE inv_freq to bf16, as the HF fixtures do (docs/model-notes.md)");
      app.add_option("--prefill-chunk", o->prefill_chunk,
                     "Feed the prompt in chunks of this many tokens");
      app.add_flag("--teacher-force", o->teacher_force,
                   "Decode feeds the --compare file's decode_ids instead of the argmax (for "
                   "weight-format quality)");
      app.add_option("--weights", o->weights,
                     "auto, bf16, fp8 or q4 (the checkpoint's format; q4 on a BF16 or FP8 "
                     "checkpoint quantizes at load, as `lilac quantize` would)")
          ->capture_default_str();
      return Runner([o] { return run_logits(*o); });
    }};

}  // namespace
}  // namespace lilac::cli
