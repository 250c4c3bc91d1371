#include "model/weight_table.h"

#include <algorithm>
#include <string_view>

#include "model/mlx_affine.h"
#include "util/error.h"

namespace lilac {

namespace {

using Shape = std::vector<int64_t>;
using R = WeightRole;
using S = WeightScope;
using K = WeightKind;
using VR = VectorRule;

// Shapes from the config (names as in config.h: H hidden, C GDN conv channels, Hv value heads,
// Dv value dim, K conv kernel, E experts, I expert intermediate, Is shared intermediate).
Shape vocab_by_hidden(const ModelConfig& c) {
  return {c.vocab, c.hidden};
}
Shape hidden(const ModelConfig& c) {
  return {c.hidden};
}
Shape head_dim(const ModelConfig& c) {
  return {c.head_dim};
}
Shape value_heads(const ModelConfig& c) {
  return {c.gdn_value_heads};
}
Shape by_hidden(int64_t rows, const ModelConfig& c) {
  return {rows, c.hidden};
}

constexpr int kNone = 0;
constexpr int k4 = kMlxDefaultBits;
constexpr int k8 = kMlxRouterBits;

// clang-format off
const WeightEntry kTable[] = {
  {R::Embed, S::Model, K::Matrix, "embed_tokens.weight", "embed_tokens", vocab_by_hidden, VR::Plain, k4,
   "token embedding"},
  {R::LmHead, S::Model, K::Matrix, "lm_head.weight", "lm_head", vocab_by_hidden, VR::Plain, k4,
   "output projection (lm_head)"},
  {R::FinalNorm, S::Model, K::Vector, "norm.weight", "norm.weight", hidden, VR::ZeroCentred, kNone,
   "final norm"},

  {R::InputNorm, S::Layer, K::Vector, "input_layernorm.weight", "input_layernorm.weight", hidden,
   VR::ZeroCentred, kNone, "input norm"},
  {R::AttnQProj, S::Attention, K::Matrix, "self_attn.q_proj.weight", "self_attn.q_proj",
   [](const ModelConfig& c) { return by_hidden(c.q_proj_rows(), c); }, VR::Plain, k4,
   "attention query (and gate) projection"},
  {R::AttnKProj, S::Attention, K::Matrix, "self_attn.k_proj.weight", "self_attn.k_proj",
   [](const ModelConfig& c) { return by_hidden(c.kv_dim(), c); }, VR::Plain, k4,
   "attention key projection"},
  {R::AttnVProj, S::Attention, K::Matrix, "self_attn.v_proj.weight", "self_attn.v_proj",
   [](const ModelConfig& c) { return by_hidden(c.kv_dim(), c); }, VR::Plain, k4,
   "attention value projection"},
  {R::AttnOProj, S::Attention, K::Matrix, "self_attn.o_proj.weight", "self_attn.o_proj",
   [](const ModelConfig& c) { return Shape{c.hidden, c.heads * c.head_dim}; }, VR::Plain, k4,
   "attention output projection"},
  {R::AttnQNorm, S::Attention, K::Vector, "self_attn.q_norm.weight", "self_attn.q_norm.weight",
   head_dim, VR::ZeroCentred, kNone, "attention query norm"},
  {R::AttnKNorm, S::Attention, K::Vector, "self_attn.k_norm.weight", "self_attn.k_norm.weight",
   head_dim, VR::ZeroCentred, kNone, "attention key norm"},
  {R::GdnInProjQkv, S::GatedDeltaNet, K::Matrix, "linear_attn.in_proj_qkv.weight",
   "linear_attn.in_proj_qkv", [](const ModelConfig& c) { return by_hidden(c.gdn_conv_channels(), c); },
   VR::Plain, k4, "Gated DeltaNet q/k/v projection"},
  {R::GdnInProjZ, S::GatedDeltaNet, K::Matrix, "linear_attn.in_proj_z.weight",
   "linear_attn.in_proj_z", [](const ModelConfig& c) { return by_hidden(c.gdn_v_channels(), c); },
   VR::Plain, k4, "Gated DeltaNet output gate projection"},
  {R::GdnInProjB, S::GatedDeltaNet, K::Matrix, "linear_attn.in_proj_b.weight",
   "linear_attn.in_proj_b", [](const ModelConfig& c) { return by_hidden(c.gdn_value_heads, c); },
   VR::Plain, k4, "Gated DeltaNet beta projection"},
  {R::GdnInProjA, S::GatedDeltaNet, K::Matrix, "linear_attn.in_proj_a.weight",
   "linear_attn.in_proj_a", [](const ModelConfig& c) { return by_hidden(c.gdn_value_heads, c); },
   VR::Plain, k4, "Gated DeltaNet decay projection"},
  {R::GdnConv1d, S::GatedDeltaNet, K::Vector, "linear_attn.conv1d.weight",
   "linear_attn.conv1d.weight",
   [](const ModelConfig& c) { return Shape{c.gdn_conv_channels(), 1, c.gdn_conv_kernel}; },
   VR::Plain, kNone, "Gated DeltaNet causal convolution"},
  {R::GdnALog, S::GatedDeltaNet, K::Vector, "linear_attn.A_log", "linear_attn.A_log", value_heads,
   VR::NegExp, kNone, "Gated DeltaNet A_log"},
  {R::GdnDtBias, S::GatedDeltaNet, K::Vector, "linear_attn.dt_bias", "linear_attn.dt_bias",
   value_heads, VR::Plain, kNone, "Gated DeltaNet dt_bias"},
  {R::GdnNorm, S::GatedDeltaNet, K::Vector, "linear_attn.norm.weight", "linear_attn.norm.weight",
   [](const ModelConfig& c) { return Shape{c.gdn_value_dim}; }, VR::Plain, kNone,
   "Gated DeltaNet output norm"},
  {R::GdnOutProj, S::GatedDeltaNet, K::Matrix, "linear_attn.out_proj.weight",
   "linear_attn.out_proj", [](const ModelConfig& c) { return Shape{c.hidden, c.gdn_v_channels()}; },
   VR::Plain, k4, "Gated DeltaNet output projection"},
  {R::PostAttentionNorm, S::Layer, K::Vector, "post_attention_layernorm.weight",
   "post_attention_layernorm.weight", hidden, VR::ZeroCentred, kNone, "post-attention norm"},
  {R::Router, S::Layer, K::Matrix, "mlp.gate.weight", "mlp.gate",
   [](const ModelConfig& c) { return by_hidden(c.experts, c); }, VR::Plain, k8, "MoE router"},
  {R::ExpertsGateUp, S::Layer, K::Fused, "mlp.experts.gate_up_proj", nullptr,
   [](const ModelConfig& c) { return Shape{c.experts, 2 * c.expert_intermediate, c.hidden}; },
   VR::Plain, kNone, "experts' fused gate/up projections"},
  {R::ExpertsDown, S::Layer, K::Fused, "mlp.experts.down_proj", nullptr,
   [](const ModelConfig& c) { return Shape{c.experts, c.hidden, c.expert_intermediate}; },
   VR::Plain, kNone, "experts' stacked down projections"},
  {R::ExpertGate, S::Expert, K::Matrix, "mlp.experts.{e}.gate_proj.weight", "mlp.switch_mlp.gate_proj",
   [](const ModelConfig& c) { return by_hidden(c.expert_intermediate, c); }, VR::Plain, k4,
   "expert gate projection"},
  {R::ExpertUp, S::Expert, K::Matrix, "mlp.experts.{e}.up_proj.weight", "mlp.switch_mlp.up_proj",
   [](const ModelConfig& c) { return by_hidden(c.expert_intermediate, c); }, VR::Plain, k4,
   "expert up projection"},
  {R::ExpertDown, S::Expert, K::Matrix, "mlp.experts.{e}.down_proj.weight", "mlp.switch_mlp.down_proj",
   [](const ModelConfig& c) { return Shape{c.hidden, c.expert_intermediate}; }, VR::Plain, k4,
   "expert down projection"},
  {R::SharedGate, S::Layer, K::Matrix, "mlp.shared_expert.gate_proj.weight",
   "mlp.shared_expert.gate_proj", [](const ModelConfig& c) { return by_hidden(c.shared_intermediate, c); },
   VR::Plain, k4, "shared expert gate projection"},
  {R::SharedUp, S::Layer, K::Matrix, "mlp.shared_expert.up_proj.weight",
   "mlp.shared_expert.up_proj", [](const ModelConfig& c) { return by_hidden(c.shared_intermediate, c); },
   VR::Plain, k4, "shared expert up projection"},
  {R::SharedDown, S::Layer, K::Matrix, "mlp.shared_expert.down_proj.weight",
   "mlp.shared_expert.down_proj",
   [](const ModelConfig& c) { return Shape{c.hidden, c.shared_intermediate}; }, VR::Plain, k4,
   "shared expert down projection"},
  {R::SharedExpertGate, S::Layer, K::Matrix, "mlp.shared_expert_gate.weight",
   "mlp.shared_expert_gate", [](const ModelConfig& c) { return by_hidden(1, c); }, VR::Plain, k8,
   "shared expert gate"},

  {R::MtpFc, S::Mtp, K::Matrix, "mtp.fc.weight", nullptr,
   [](const ModelConfig& c) { return Shape{c.hidden, 2 * c.hidden}; }, VR::Plain, k4,
   "MTP input projection"},
  {R::MtpPreFcNormEmbedding, S::Mtp, K::Vector, "mtp.pre_fc_norm_embedding.weight", nullptr, hidden,
   VR::ZeroCentred, kNone, "MTP embedding norm"},
  {R::MtpPreFcNormHidden, S::Mtp, K::Vector, "mtp.pre_fc_norm_hidden.weight", nullptr, hidden,
   VR::ZeroCentred, kNone, "MTP hidden-state norm"},
  {R::MtpNorm, S::Mtp, K::Vector, "mtp.norm.weight", nullptr, hidden, VR::ZeroCentred, kNone,
   "MTP final norm"},
};
// clang-format on

// "123" -> 123; nullopt for anything but 1 to 9 decimal digits.
std::optional<int64_t> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + (ch - '0');
  }
  return v;
}

// Matches `name` against `pattern`, where "{e}" stands for an index (stored in *index).
bool match_pattern(std::string_view pattern, std::string_view name, int64_t* index) {
  const size_t at = pattern.find("{e}");
  if (at == std::string_view::npos) return pattern == name;
  const std::string_view prefix = pattern.substr(0, at), suffix = pattern.substr(at + 3);
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return false;
  auto v = parse_index(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
  if (!v) return false;
  *index = *v;
  return true;
}

// Matches a name (relative to its layer, or whole for Model / Mtp scope) against one entry.
bool match_entry(const WeightEntry& e, NameLayout layout, std::string_view name, WeightMatch& m) {
  const char* pat = layout == NameLayout::Hf ? e.hf : e.mlx;
  if (!pat) return false;
  int64_t expert = -1;
  const std::string_view p(pat);
  auto hit = [&](WeightPart part) {
    m.entry = &e;
    m.part = part;
    m.expert = expert;
    return true;
  };
  if (layout == NameLayout::Hf || e.kind != WeightKind::Matrix) {
    if (match_pattern(p, name, &expert)) return hit(WeightPart::Weight);
    constexpr std::string_view kScale = "_scale_inv";
    if (layout == NameLayout::Hf && e.kind == WeightKind::Matrix && name.ends_with(kScale) &&
        match_pattern(p, name.substr(0, name.size() - kScale.size()), &expert))
      return hit(WeightPart::Fp8ScaleInv);
    return false;
  }
  // MLX matrices: the module base plus ".weight" (codes or plain), ".scales", ".biases".
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || name.substr(0, dot) != p) return false;
  const std::string_view leaf = name.substr(dot + 1);
  if (leaf == "weight") return hit(WeightPart::Weight);
  if (leaf == "scales") return hit(WeightPart::MlxScales);
  if (leaf == "biases") return hit(WeightPart::MlxBiases);
  return false;
}

const char* layer_type_name(LayerType t) {
  return t == LayerType::FullAttention ? "full-attention" : "Gated DeltaNet";
}

}  // namespace

std::span<const WeightEntry> weight_table() {
  return kTable;
}

const WeightEntry& weight_entry(WeightRole role) {
  for (const auto& e : kTable)
    if (e.role == role) return e;
  fail("weight table: no entry for role {}", int(role));
}

bool is_layer_scope(const WeightEntry& e) {
  return e.scope == S::Layer || e.scope == S::Attention || e.scope == S::GatedDeltaNet ||
         e.scope == S::Expert;
}

bool in_layer(const WeightEntry& e, LayerType type) {
  switch (e.scope) {
    case S::Layer:
    case S::Expert:
      return true;
    case S::Attention:
      return type == LayerType::FullAttention;
    case S::GatedDeltaNet:
      return type == LayerType::GatedDeltaNet;
    case S::Model:
    case S::Mtp:
      return false;
  }
  return false;
}

int q4_bits_for(const WeightEntry& e, int64_t in_dim) {
  return in_dim % kMlxGroupSize != 0 ? 0 : e.q4_bits;
}

int64_t decode_weights_read(const WeightEntry& e, const ModelConfig& c) {
  if (e.kind != K::Matrix || e.scope == S::Mtp) return 0;
  const std::vector<int64_t> s = e.shape(c);
  if (e.role == R::Embed) return s[1];  // the token's row
  const int64_t n = s[0] * s[1];
  return e.scope == S::Expert ? c.experts_per_token * n : n;
}

std::vector<int64_t> stored_shape(const WeightEntry& e, NameLayout layout, const ModelConfig& c) {
  std::vector<int64_t> s = e.shape(c);
  if (layout == NameLayout::Mlx) {
    if (e.scope == S::Expert) s.insert(s.begin(), c.experts);
    if (e.role == R::GdnConv1d) s = {s[0], s[2], s[1]};  // [C, K, 1]: mlx-lm's moveaxis(2, 1)
  }
  return s;
}

std::string weight_name(const WeightEntry& e, NameLayout layout, int64_t layer, int64_t expert,
                        bool mtp) {
  const char* pat = layout == NameLayout::Hf ? e.hf : e.mlx;
  if (!pat) return "";
  std::string name(pat);
  if (const size_t at = name.find("{e}"); at != std::string::npos)
    name.replace(at, 3, std::to_string(expert));
  if (!is_layer_scope(e)) return name;
  return std::string(mtp ? "mtp.layers." : "layers.") + std::to_string(layer) + "." + name;
}

std::optional<WeightMatch> match_weight(const std::string& canonical, NameLayout layout) {
  WeightMatch m;
  std::string_view name(canonical);
  for (const bool mtp : {true, false}) {
    const std::string_view prefix = mtp ? "mtp.layers." : "layers.";
    if (!name.starts_with(prefix)) continue;
    const std::string_view rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const auto layer = parse_index(rest.substr(0, dot));
    if (!layer) return std::nullopt;
    for (const auto& e : kTable) {
      if (!is_layer_scope(e) || !match_entry(e, layout, rest.substr(dot + 1), m)) continue;
      m.layer = *layer;
      m.mtp = mtp;
      return m;
    }
    return std::nullopt;
  }
  for (const auto& e : kTable) {
    if (is_layer_scope(e) || !match_entry(e, layout, name, m)) continue;
    m.mtp = e.scope == S::Mtp;
    return m;
  }
  return std::nullopt;
}

std::string explain_unused_tensor(const std::string& canonical, NameLayout layout,
                                  const ModelConfig& c) {
  const auto m = match_weight(canonical, layout);
  if (!m)
    return fmt::format(
        "not part of this config's text model (no entry of the weight table, "
        "src/model/weight_table.cpp, describes a tensor named '{}' in the {} layout)",
        canonical, layout == NameLayout::Hf ? "HF" : "MLX");
  const WeightEntry& e = *m->entry;
  if (is_layer_scope(e)) {
    const int64_t n = m->mtp ? std::max<int64_t>(c.mtp_layers, 1) : c.layers;
    const char* where = m->mtp ? "MTP layer" : "layer";
    if (m->layer >= n)
      return fmt::format("the {} of {} {}, beyond the config's {} {}s", e.what, where, m->layer, n,
                         where);
    const LayerType t = m->mtp ? LayerType::FullAttention : c.layer_types[size_t(m->layer)];
    if (!in_layer(e, t))
      return fmt::format("the {} of {} {}, a {} layer, which has none", e.what, where, m->layer,
                         layer_type_name(t));
    if (m->expert >= c.experts)
      return fmt::format("the {} of expert {} in {} {}, beyond the config's {} experts", e.what,
                         m->expert, where, m->layer, c.experts);
  }
  if (m->part == WeightPart::Fp8ScaleInv)
    return fmt::format("FP8 block scales of the {}, whose weight is not FP8", e.what);
  return fmt::format(
      "the {}, not expected here (a second expert layout, a head the config ties to the embedding, "
      "or a tensor of a format the other tensors are not in)",
      e.what);
}

Matrix* layer_matrix(LayerWeights& L, WeightRole role) {
  switch (role) {
    case R::AttnQProj:
      return &L.attn.q_proj;
    case R::AttnKProj:
      return &L.attn.k_proj;
    case R::AttnVProj:
      return &L.attn.v_proj;
    case R::AttnOProj:
      return &L.attn.o_proj;
    case R::GdnInProjQkv:
      return &L.gdn.in_proj_qkv;
    case R::GdnInProjZ:
      return &L.gdn.in_proj_z;
    case R::GdnInProjB:
      return &L.gdn.in_proj_b;
    case R::GdnInProjA:
      return &L.gdn.in_proj_a;
    case R::GdnOutProj:
      return &L.gdn.out_proj;
    case R::Router:
      return &L.moe.router;
    case R::SharedGate:
      return &L.moe.shared_gate;
    case R::SharedUp:
      return &L.moe.shared_up;
    case R::SharedDown:
      return &L.moe.shared_down;
    case R::SharedExpertGate:
      return &L.moe.shared_expert_gate;
    default:
      return nullptr;
  }
}

std::vector<float>* layer_vector(LayerWeights& L, WeightRole role) {
  switch (role) {
    case R::InputNorm:
      return &L.input_norm_scale;
    case R::PostAttentionNorm:
      return &L.post_attention_norm_scale;
    case R::AttnQNorm:
      return &L.attn.q_norm_scale;
    case R::AttnKNorm:
      return &L.attn.k_norm_scale;
    case R::GdnConv1d:
      return &L.gdn.conv;
    case R::GdnALog:
      return &L.gdn.neg_exp_A;
    case R::GdnDtBias:
      return &L.gdn.dt_bias;
    case R::GdnNorm:
      return &L.gdn.norm_scale;
    default:
      return nullptr;
  }
}

Matrix* expert_matrix(ExpertWeights& x, WeightRole role) {
  switch (role) {
    case R::ExpertGate:
      return &x.gate;
    case R::ExpertUp:
      return &x.up;
    case R::ExpertDown:
      return &x.down;
    default:
      return nullptr;
  }
}

Matrix* model_matrix(ModelWeights& w, WeightRole role) {
  switch (role) {
    case R::Embed:
      return &w.embed;
    case R::LmHead:
      return &w.lm_head;
    default:
      return nullptr;
  }
}

std::vector<float>* model_vector(ModelWeights& w, WeightRole role) {
  return role == R::FinalNorm ? &w.final_norm_scale : nullptr;
}

Matrix* mtp_matrix(MtpWeights& m, WeightRole role) {
  return role == R::MtpFc ? &m.fc : nullptr;
}

std::vector<float>* mtp_vector(MtpWeights& m, WeightRole role) {
  switch (role) {
    case R::MtpPreFcNormEmbedding:
      return &m.pre_fc_norm_embedding_scale;
    case R::MtpPreFcNormHidden:
      return &m.pre_fc_norm_hidden_scale;
    case R::MtpNorm:
      return &m.final_norm_scale;
    default:
      return nullptr;
  }
}

}  // namespace lilac
