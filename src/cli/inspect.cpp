// `lilac inspect --model DIR`: config summary, format, layout, tensor and parameter counts, bytes,
// and every problem found. Exit 1 when the checkpoint is unusable.
#include <cstdio>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

int run_inspect(const std::string& dir) {
  ModelConfig cfg;
  try {
    cfg = load_model_config(dir);
  } catch (const Error& e) {
    std::printf("config:   UNUSABLE\nproblem:  %s\n", e.what());
    return 1;
  }
  std::printf("model:    %s\n", dir.c_str());
  std::printf("config:   %s\n", cfg.summary().c_str());
  std::unique_ptr<Checkpoint> ck;
  try {
    ck = Checkpoint::open(dir);
  } catch (const Error& e) {
    std::printf("files:    UNUSABLE\nproblem:  %s\n", e.what());
    return 1;
  }
  LoadReport rep;
  bind_weights(*ck, cfg, rep);
  std::printf("files:    %zu safetensors file(s), %zu tensors, %.3f GB\n", ck->files().size(),
              ck->tensors().size(), double(ck->total_bytes()) / 1e9);
  std::printf("format:   %s\n", format_name(ck->format()).c_str());
  std::printf("experts:  %s\n", layout_name(rep.layout).c_str());
  if (!rep.quantization.empty()) std::printf("quant:    %s\n", rep.quantization.c_str());
  std::printf("weights:  %lld tensors bound, %.3f B parameters, %.3f GB\n",
              (long long)rep.tensors_used, double(rep.parameters) / 1e9, double(rep.bytes) / 1e9);
  int64_t kv_per_token = cfg.count_layers(LayerType::FullAttention) * 2 * cfg.kv_dim() * 2;
  int64_t gdn_state = cfg.count_layers(LayerType::GatedDeltaNet) *
                      (cfg.gdn_value_heads * cfg.gdn_key_dim * cfg.gdn_value_dim * 4 +
                       (cfg.gdn_conv_kernel - 1) * cfg.gdn_conv_channels() * 4);
  std::printf("state:    KV cache %lld bytes/token (bf16), recurrent state %.2f MB/sequence\n",
              (long long)kv_per_token, double(gdn_state) / 1e6);
  for (const auto& n : rep.notes) std::printf("note:     %s\n", n.c_str());
  for (const auto& p : rep.problems) std::printf("problem:  %s\n", p.c_str());
  std::printf("status:   %s (%zu problem%s)\n", rep.problems.empty() ? "OK" : "UNUSABLE",
              rep.problems.size(), rep.problems.size() == 1 ? "" : "s");
  return rep.problems.empty() ? 0 : 1;
}

const Command kInspect{"inspect", "Describe a checkpoint and list every problem found",
                       [](CLI::App& app) {
                         auto dir = std::make_shared<std::string>();
                         app.add_option("--model", *dir, "Model directory")->required();
                         return Runner([dir] { return run_inspect(*dir); });
                       }};

}  // namespace
}  // namespace lilac::cli
