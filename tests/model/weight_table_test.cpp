// The weight table (model/weight_table.h) on its own: names round-trip through match_weight, every
// entry has its field in ModelWeights, the cost model sums the table, and names no entry describes
// (or that belong to another layer kind) are explained. The checks against real checkpoints are in
// tests/io/weight_table_checkpoint_test.cpp.
#include "model/weight_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "model/cost.h"
#include "model/mlx_affine.h"
#include "model/qwen36.h"

namespace lilac::test {
namespace {

using ::testing::HasSubstr;

// The closed form the cost model used before it summed the table (docs/benchmarking.md): dense
// projections per layer kind, router + shared expert gate, k routed experts, the shared expert,
// one embedding row and the lm_head.
int64_t closed_form_active_params(const ModelConfig& c) {
  const int64_t H = c.hidden;
  int64_t n = 0;
  for (auto t : c.layer_types) {
    if (t == LayerType::FullAttention)
      n += c.q_proj_rows() * H + 2 * c.kv_dim() * H + H * c.heads * c.head_dim;
    else
      n += (c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads) * H +
           H * c.gdn_v_channels();
    n += (c.experts + 1) * H + c.experts_per_token * 3 * c.expert_intermediate * H +
         3 * c.shared_intermediate * H;
  }
  return n + H + c.vocab * H;
}

TEST(WeightTable, CostModelSumsTheTable) {
  const ModelConfig c = qwen36_35b_a3b_config();
  EXPECT_EQ(active_params_per_token(c), closed_form_active_params(c));
  // About 3B active parameters: the "A3B" of the name.
  EXPECT_GT(active_params_per_token(c), 2'500'000'000);
  EXPECT_LT(active_params_per_token(c), 3'500'000'000);
  ModelConfig more = c;
  more.experts_per_token = 10;
  EXPECT_EQ(active_params_per_token(more) - active_params_per_token(c),
            2 * 3 * c.expert_intermediate * c.hidden * c.layers);
}

TEST(WeightTable, RolesAreUniqueAndLookedUp) {
  std::set<WeightRole> roles;
  for (const WeightEntry& e : weight_table()) {
    EXPECT_TRUE(roles.insert(e.role).second) << e.what;
    EXPECT_EQ(&weight_entry(e.role), &e);
    EXPECT_NE(e.what, nullptr);
    EXPECT_TRUE(e.hf || e.mlx) << e.what;
  }
}

// Every layer entry has its field in LayerWeights (or ExpertWeights), each field filled by one
// entry; the same for the model-level and MTP entries.
TEST(WeightTable, EveryEntryHasOneField) {
  LayerWeights L;
  L.moe.experts.resize(1);
  ModelWeights w;
  MtpWeights mtp;
  std::set<const void*> fields;
  for (const WeightEntry& e : weight_table()) {
    const void* field = nullptr;
    if (e.kind == WeightKind::Fused) {
      EXPECT_EQ(layer_matrix(L, e.role), nullptr);  // fills the Expert entries' matrices
      continue;
    }
    switch (e.scope) {
      case WeightScope::Model:
        field = e.kind == WeightKind::Matrix ? static_cast<const void*>(model_matrix(w, e.role))
                                             : model_vector(w, e.role);
        break;
      case WeightScope::Mtp:
        field = e.kind == WeightKind::Matrix ? static_cast<const void*>(mtp_matrix(mtp, e.role))
                                             : mtp_vector(mtp, e.role);
        break;
      case WeightScope::Expert:
        field = expert_matrix(L.moe.experts[0], e.role);
        break;
      default:
        field = e.kind == WeightKind::Matrix ? static_cast<const void*>(layer_matrix(L, e.role))
                                             : layer_vector(L, e.role);
    }
    ASSERT_NE(field, nullptr) << e.what;
    EXPECT_TRUE(fields.insert(field).second) << e.what << " shares a field";
  }
  // LayerWeights::for_each_matrix visits exactly the table's layer matrices.
  size_t matrices = 0;
  L.for_each_matrix([&](Matrix& m) {
    EXPECT_TRUE(fields.count(&m)) << "a LayerWeights matrix no table entry fills";
    ++matrices;
  });
  size_t entries = 0;
  for (const WeightEntry& e : weight_table())
    entries += e.kind == WeightKind::Matrix && is_layer_scope(e);
  EXPECT_EQ(matrices, entries);
}

TEST(WeightTable, NamesRoundTrip) {
  for (const WeightEntry& e : weight_table()) {
    for (NameLayout layout : {NameLayout::Hf, NameLayout::Mlx}) {
      const bool layered = is_layer_scope(e);
      const bool per_expert = e.scope == WeightScope::Expert && layout == NameLayout::Hf;
      const std::string name = weight_name(e, layout, layered ? 7 : -1, per_expert ? 11 : -1);
      if ((layout == NameLayout::Hf ? e.hf : e.mlx) == nullptr) {
        EXPECT_EQ(name, "");
        continue;
      }
      const bool mlx_module = layout == NameLayout::Mlx && e.kind == WeightKind::Matrix;
      const auto m = match_weight(mlx_module ? name + ".weight" : name, layout);
      ASSERT_TRUE(m) << name;
      EXPECT_EQ(m->entry, &e) << name;
      EXPECT_EQ(m->part, WeightPart::Weight);
      EXPECT_EQ(m->layer, layered ? 7 : -1) << name;
      EXPECT_EQ(m->expert, per_expert ? 11 : -1) << name;
      if (mlx_module) {
        EXPECT_EQ(match_weight(name + ".scales", layout)->part, WeightPart::MlxScales);
        EXPECT_EQ(match_weight(name + ".biases", layout)->part, WeightPart::MlxBiases);
      }
      if (layout == NameLayout::Hf && e.kind == WeightKind::Matrix) {
        EXPECT_EQ(match_weight(name + "_scale_inv", layout)->part, WeightPart::Fp8ScaleInv);
      }
    }
    // The quantizer reads a non-expert matrix under its HF name and writes it under its MLX
    // module path: the HF name is that path's ".weight".
    if (e.kind == WeightKind::Matrix && e.scope != WeightScope::Expert && e.hf && e.mlx) {
      EXPECT_EQ(std::string(e.hf), std::string(e.mlx) + ".weight");
    }
  }
  const auto mtp = match_weight("mtp.layers.0.self_attn.q_proj.weight", NameLayout::Hf);
  ASSERT_TRUE(mtp);
  EXPECT_TRUE(mtp->mtp);
  EXPECT_EQ(mtp->entry->role, WeightRole::AttnQProj);
}

TEST(WeightTable, UnknownNamesMatchNothing) {
  for (const char* name :
       {"layers.0.mystery.weight", "layers.x.input_layernorm.weight",
        "layers..input_layernorm.weight", "layers.0.mlp.experts.-1.up_proj.weight",
        "layers.0.mlp.experts..up_proj.weight", "layers.0.self_attn.q_proj.scales", "embed_tokens",
        "mtp.fc.weight.extra"})
    EXPECT_FALSE(match_weight(name, NameLayout::Hf)) << name;
  // MLX names are not HF names, and the HF hub layout has no MLX name.
  EXPECT_FALSE(match_weight("layers.0.mlp.switch_mlp.up_proj.weight", NameLayout::Hf));
  EXPECT_FALSE(match_weight("layers.0.mlp.experts.gate_up_proj", NameLayout::Mlx));
  EXPECT_FALSE(match_weight("mtp.fc.weight", NameLayout::Mlx));
}

TEST(WeightTable, ExplainsUnusedTensors) {
  ModelConfig c = qwen36_35b_a3b_config();  // layer 0 Gated DeltaNet, layer 3 full attention
  ASSERT_EQ(c.layer_types[0], LayerType::GatedDeltaNet);
  EXPECT_THAT(explain_unused_tensor("layers.0.mystery.weight", NameLayout::Hf, c),
              HasSubstr("no entry of the weight table"));
  EXPECT_THAT(explain_unused_tensor("layers.0.self_attn.q_proj.weight", NameLayout::Hf, c),
              HasSubstr("attention query (and gate) projection of layer 0, a Gated DeltaNet "
                        "layer, which has none"));
  EXPECT_THAT(explain_unused_tensor("layers.40.input_layernorm.weight", NameLayout::Hf, c),
              HasSubstr("of layer 40, beyond the config's 40 layers"));
  EXPECT_THAT(explain_unused_tensor("layers.1.mlp.experts.256.up_proj.weight", NameLayout::Hf, c),
              HasSubstr("expert 256 in layer 1, beyond the config's 256 experts"));
  EXPECT_THAT(explain_unused_tensor("layers.3.mlp.gate.weight_scale_inv", NameLayout::Hf, c),
              HasSubstr("FP8 block scales of the MoE router"));
  EXPECT_THAT(explain_unused_tensor("mtp.layers.1.mlp.gate.weight", NameLayout::Hf, c),
              HasSubstr("MTP layer 1, beyond the config's 1 MTP layers"));
}

TEST(WeightTable, Q4BitsFollowTheTable) {
  for (const WeightEntry& e : weight_table()) {
    if (e.kind != WeightKind::Matrix || !e.mlx) continue;
    const std::string base = weight_name(e, NameLayout::Mlx, is_layer_scope(e) ? 0 : -1);
    EXPECT_EQ(mlx_bits_for(base, 2048), e.q4_bits) << base;
    EXPECT_EQ(q4_bits_for(e, 2048), e.q4_bits);
    EXPECT_EQ(q4_bits_for(e, 2048 + 32), 0);  // not a multiple of the group size: BF16
  }
  EXPECT_EQ(weight_entry(WeightRole::Router).q4_bits, 8);
  EXPECT_EQ(weight_entry(WeightRole::SharedExpertGate).q4_bits, 8);
}

TEST(WeightTable, StoredShapes) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const WeightEntry& conv = weight_entry(WeightRole::GdnConv1d);
  EXPECT_EQ(stored_shape(conv, NameLayout::Hf, c),
            (std::vector<int64_t>{c.gdn_conv_channels(), 1, c.gdn_conv_kernel}));
  EXPECT_EQ(stored_shape(conv, NameLayout::Mlx, c),
            (std::vector<int64_t>{c.gdn_conv_channels(), c.gdn_conv_kernel, 1}));
  EXPECT_EQ(stored_shape(weight_entry(WeightRole::ExpertDown), NameLayout::Mlx, c),
            (std::vector<int64_t>{c.experts, c.hidden, c.expert_intermediate}));
}

}  // namespace
}  // namespace lilac::test
