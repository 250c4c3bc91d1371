// The weight table: every tensor of the model described once (docs/weights.md). One entry per
// kind of tensor (not per layer): its role, where it occurs, its canonical name in the HF layout
// (after canonical_tensor_name's prefix stripping) and in the MLX layout, its shape from the
// config, the dtypes each format stores it in, and how `lilac quantize` / `--weights q4` treat it.
//
// Readers: the checkpoint binders (io/checkpoint.cpp, io/checkpoint_mlx.cpp: names, shapes, which
// field of LayerWeights a tensor fills), the quantizer (io/quantize.cpp: what to quantize, at how
// many bits, the MLX names it writes), the cost model (model/cost.cpp: the weights a decode token
// reads, summed over the table). Adding a tensor to the model: an entry here, its field in
// weights.h and its case in the slot functions below.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace lilac {

// What a tensor is for. One value per kind of tensor of the model.
enum class WeightRole : uint8_t {
  Embed,              // embed_tokens [V, H]
  LmHead,             // lm_head [V, H]
  FinalNorm,          // norm [H]
  InputNorm,          // input_layernorm [H]
  PostAttentionNorm,  // post_attention_layernorm [H]
  AttnQProj,          // [heads * head_dim * 2, H]
  AttnKProj,          // [kv_heads * head_dim, H]
  AttnVProj,          // [kv_heads * head_dim, H]
  AttnOProj,          // [H, heads * head_dim]
  AttnQNorm,          // [head_dim]
  AttnKNorm,          // [head_dim]
  GdnInProjQkv,       // [C, H]
  GdnInProjZ,         // [Hv * Dv, H]
  GdnInProjB,         // [Hv, H]
  GdnInProjA,         // [Hv, H]
  GdnConv1d,          // [C, 1, K] (HF), [C, K, 1] (MLX)
  GdnALog,            // [Hv]
  GdnDtBias,          // [Hv]
  GdnNorm,            // [Dv]
  GdnOutProj,         // [H, Hv * Dv]
  Router,             // mlp.gate [E, H]
  ExpertsGateUp,      // HF hub layout: the experts' gate and up fused, [E, 2I, H]
  ExpertsDown,        // HF hub layout: the experts' down stacked, [E, H, I]
  ExpertGate,         // one expert's gate_proj [I, H] (MLX: stacked [E, I, H])
  ExpertUp,           // one expert's up_proj [I, H]
  ExpertDown,         // one expert's down_proj [H, I]
  SharedGate,         // shared_expert.gate_proj [Is, H]
  SharedUp,           // shared_expert.up_proj [Is, H]
  SharedDown,         // shared_expert.down_proj [H, Is]
  SharedExpertGate,   // shared_expert_gate [1, H]
  MtpFc,              // mtp.fc [H, 2H]
  MtpPreFcNormEmbedding,
  MtpPreFcNormHidden,
  MtpNorm,
};

// Where a tensor occurs.
enum class WeightScope : uint8_t {
  Model,          // once ("embed_tokens.weight")
  Mtp,            // once, in checkpoints with an MTP head ("mtp.fc.weight")
  Layer,          // in every decoder layer and every MTP layer
  Attention,      // in full-attention layers (every MTP layer is one)
  GatedDeltaNet,  // in Gated DeltaNet layers
  Expert,         // once per routed expert of every layer (the HF name holds "{e}")
};

// How a tensor is stored and read.
enum class WeightKind : uint8_t {
  Matrix,  // a Linear / Embedding [rows, cols], viewed in place; FP8 or MLX-quantized when the
           // checkpoint is; quantized by `lilac quantize`
  Fused,   // the HF hub layout's fused expert tensors [E, rows, cols], viewed per expert as the
           // Expert-scope matrices; float only
  Vector,  // a small float tensor converted to f32 at load
};

// How a vector's stored numbers become the f32 values of ModelWeights.
enum class VectorRule : uint8_t {
  Plain,        // as stored
  ZeroCentred,  // a zero-centred RMSNorm weight: HF stores w (load adds 1), MLX stores
                // bf16(1 + w) (load keeps it); `lilac quantize` writes bf16(1 + w)
  NegExp,       // A_log: the model uses -exp(A_log); MLX keeps its input dtype (F32)
};

// The two name layouts the loader knows: HF (BF16 hub / per-expert, FP8) and MLX (affine
// quantized, stacked switch_mlp experts).
enum class NameLayout : uint8_t { Hf, Mlx };

// Which of a weight's stored tensors a name is.
enum class WeightPart : uint8_t {
  Weight,       // the weight (MLX quantized: its codes)
  Fp8ScaleInv,  // HF FP8: "<name>_scale_inv", the block scales
  MlxScales,    // MLX: "<base>.scales"
  MlxBiases,    // MLX: "<base>.biases"
};

struct WeightEntry {
  WeightRole role;
  WeightScope scope;
  WeightKind kind;
  // Canonical HF name; layer scopes relative to "layers.N." ("self_attn.q_proj.weight"). Expert
  // scope: "{e}" stands for the expert index. nullptr: no HF tensor.
  const char* hf;
  // MLX name, relative the same way: matrices the module path without ".weight" (the codes are
  // "<mlx>.weight", then ".scales", ".biases"), vectors the tensor name. nullptr: no MLX tensor.
  const char* mlx;
  // The shape of one tensor: HF layout; for Expert scope one expert's [rows, cols] (the HF
  // per-expert tensor; MLX stacks E of them: [E, rows, cols]).
  std::vector<int64_t> (*shape)(const ModelConfig&);
  VectorRule vector_rule;  // vectors only
  // Matrices: the bits `lilac quantize` and `--weights q4` give it (mlx-lm's predicate for this
  // model: 8 for the router and the shared expert gate, else 4), when its input dimension is a
  // multiple of the group size (else it stays BF16).
  int q4_bits;
  const char* what;  // a short description for messages ("the attention query projection")
};

// The table, in the order the quantizer writes a layer (and the loaders bind one).
std::span<const WeightEntry> weight_table();
const WeightEntry& weight_entry(WeightRole role);

// True when the entry occurs in a layer of this type (Layer, Attention or GDN, Expert scopes).
bool in_layer(const WeightEntry& e, LayerType type);
bool is_layer_scope(const WeightEntry& e);

// The bits `lilac quantize` and `--weights q4` store a Matrix entry's tensor with: 0 (left BF16)
// when its input dimension is not a multiple of the MLX group size (mlx-lm's wrapped predicate),
// else e.q4_bits.
int q4_bits_for(const WeightEntry& e, int64_t in_dim);

// Weights of the entry one decode token reads in a layer of the config (or once, Model scope):
// every element of a Matrix, one row of the embedding, experts_per_token of the routed experts.
// 0 for vectors (small next to the matrices: the cost model leaves them out), for the Fused
// entries (the Expert entries count those weights) and for the MTP head (not run per token).
int64_t decode_weights_read(const WeightEntry& e, const ModelConfig& c);

// The stored shape in a layout: HF as `shape`; MLX: Expert scope [E, rows, cols], conv1d
// [C, K, 1], quantized matrices' code words and scales are derived by the MLX binder.
std::vector<int64_t> stored_shape(const WeightEntry& e, NameLayout layout, const ModelConfig& c);

// The full canonical name of an entry's tensor (HF: the weight; MLX: matrices the module base,
// vectors the tensor). layer < 0 for Model / Mtp scope; mtp: an MTP layer ("mtp.layers.N.").
std::string weight_name(const WeightEntry& e, NameLayout layout, int64_t layer = -1,
                        int64_t expert = -1, bool mtp = false);

// A canonical tensor name identified by the table.
struct WeightMatch {
  const WeightEntry* entry = nullptr;
  WeightPart part = WeightPart::Weight;
  int64_t layer = -1;   // layer scopes
  int64_t expert = -1;  // Expert scope in the HF per-expert layout
  bool mtp = false;     // an MTP layer or MTP tensor
};
// The entry a canonical tensor name belongs to, or nullopt for a name no entry describes.
std::optional<WeightMatch> match_weight(const std::string& canonical, NameLayout layout);

// Why a checkpoint tensor the binder did not use is there: "the attention query projection of
// layer 3, a Gated DeltaNet layer", "... of layer 9, beyond the config's 4 layers", or "no entry
// of the weight table (src/model/weight_table.cpp) describes it".
std::string explain_unused_tensor(const std::string& canonical, NameLayout layout,
                                  const ModelConfig& c);

// The field of ModelWeights / LayerWeights / MtpWeights an entry fills (nullptr for entries of
// another kind or scope: Fused entries fill the experts' matrices).
Matrix* layer_matrix(LayerWeights& L, WeightRole role);
std::vector<float>* layer_vector(LayerWeights& L, WeightRole role);
Matrix* expert_matrix(ExpertWeights& x, WeightRole role);
Matrix* model_matrix(ModelWeights& w, WeightRole role);
std::vector<float>* model_vector(ModelWeights& w, WeightRole role);
Matrix* mtp_matrix(MtpWeights& m, WeightRole role);
std::vector<float>* mtp_vector(MtpWeights& m, WeightRole role);

}  // namespace lilac
