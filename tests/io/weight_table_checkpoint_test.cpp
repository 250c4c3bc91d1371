// The weight table (model/weight_table.h) against real checkpoints: every tensor of the tiny
// fixtures (both HF expert layouts) and of their `lilac quantize` output (MLX) is described by
// exactly one table entry with the stored shape; the cost model's weights equal the loaded
// matrices'; a tensor the table places in another kind of layer is reported as such.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "model/cost.h"
#include "model/weight_table.h"
#include "quant_test_util.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Every name the table gives a model of config `c` in `layout` (HF: both expert layouts, and an
// MTP head of c.mtp_layers layers), with how many entries give it.
std::map<std::string, std::vector<const WeightEntry*>> table_names(const ModelConfig& c,
                                                                   NameLayout layout) {
  std::map<std::string, std::vector<const WeightEntry*>> names;
  auto add = [&](const WeightEntry& e, int64_t layer, int64_t expert, bool mtp) {
    std::string n = weight_name(e, layout, layer, expert, mtp);
    if (n.empty()) return;
    names[n].push_back(&e);
  };
  for (const WeightEntry& e : weight_table()) {
    if (!is_layer_scope(e)) {
      add(e, -1, -1, false);
      continue;
    }
    for (int mtp = 0; mtp < 2; ++mtp) {
      const int64_t layers = mtp ? c.mtp_layers : c.layers;
      for (int64_t i = 0; i < layers; ++i) {
        if (!in_layer(e, mtp ? LayerType::FullAttention : c.layer_types[size_t(i)])) continue;
        if (e.scope == WeightScope::Expert && layout == NameLayout::Hf)
          for (int64_t x = 0; x < c.experts; ++x) add(e, i, x, mtp);
        else
          add(e, i, -1, mtp);
      }
    }
  }
  return names;
}

void expect_every_tensor_described(const std::string& dir) {
  SCOPED_TRACE(dir);
  const ModelConfig c = load_model_config(dir);
  auto ck = Checkpoint::open(dir);
  const NameLayout layout = ck->format() == WeightFormat::MLX4 ? NameLayout::Mlx : NameLayout::Hf;
  const auto names = table_names(c, layout);
  int64_t described = 0;
  for (const auto& [name, t] : ck->tensors()) {
    const std::string canon = canonical_tensor_name(name);
    if (canon.empty()) continue;  // vision
    const auto m = match_weight(canon, layout);
    ASSERT_TRUE(m) << name << " matches no entry";
    const WeightEntry& e = *m->entry;
    // The name of the weight itself (MLX: the module's base for matrices).
    std::string weight = canon;
    if (layout == NameLayout::Mlx && e.kind == WeightKind::Matrix)
      weight = canon.substr(0, canon.rfind('.'));
    auto it = names.find(weight);
    ASSERT_NE(it, names.end()) << name << ": not a name of this config's model";
    ASSERT_EQ(it->second.size(), 1u) << name << " is described by several entries";
    EXPECT_EQ(it->second[0], &e) << name;
    // The stored shape: the table's, with MLX codes [..., cols * bits / 32] and scales / biases
    // [..., cols / group] for quantized matrices.
    std::vector<int64_t> shape = stored_shape(e, layout, c);
    if (layout == NameLayout::Mlx && e.kind == WeightKind::Matrix &&
        ck->tensors().count(name.substr(0, name.rfind('.')) + ".scales")) {
      const int64_t cols = shape.back();
      shape.back() = m->part == WeightPart::Weight ? cols * e.q4_bits / 32 : cols / 64;
      EXPECT_EQ(t.info->dtype, m->part == WeightPart::Weight ? DType::U32 : DType::BF16) << name;
    }
    EXPECT_EQ(t.info->shape, shape) << name;
    ++described;
  }
  EXPECT_GT(described, 40);
}

TEST(WeightTableCheckpoint, EveryFixtureTensorHasOneEntry) {
  expect_every_tensor_described(data_path("tiny-a"));
  expect_every_tensor_described(data_path("tiny-a-per-expert"));
  TempDir t;
  quantize_dir(data_path("tiny-a"), t.str("mlx"));
  expect_every_tensor_described(t.str("mlx"));
}

// With every expert active, the weights one token reads are the loaded model's matrices, less the
// embedding's other rows.
TEST(WeightTableCheckpoint, CostModelCountsTheLoadedMatrices) {
  auto model = load_model(data_path("tiny-a"));
  ModelConfig all = model->config;
  all.experts_per_token = all.experts;
  int64_t n = model->weights.embed.cols + model->weights.lm_head.numel();
  for (const auto& L : model->weights.layers)
    L.for_each_matrix([&](const Matrix& m) { n += m.data ? m.numel() : 0; });
  EXPECT_EQ(active_params_per_token(all), n);
  EXPECT_LT(active_params_per_token(model->config), n);
}

TEST(WeightTableCheckpoint, TensorOfAnotherLayerKindIsExplained) {
  TempDir t;
  const std::string dir = t.str("model");
  copy_configs("tiny-a-per-expert", dir);
  TensorSet ts(data_path("tiny-a-per-expert"));
  // Layer 0 is a Gated DeltaNet layer; layer 3 has the attention projections.
  const std::string from = "model.language_model.layers.3.self_attn.k_proj.weight";
  const TensorInfo info = ts.info(from);
  const std::vector<uint8_t> bytes = ts.at(from);
  ts.add("model.language_model.layers.0.self_attn.k_proj.weight", info.dtype, info.shape,
         bytes.data(), bytes.size());
  ts.add("model.language_model.layers.0.mlp.experts.99.up_proj.weight", info.dtype, info.shape,
         bytes.data(), bytes.size());
  ts.write(dir);
  EXPECT_THAT(load_error(dir),
              AllOf(HasSubstr("unexpected tensor 'model.language_model.layers.0.self_attn.k_proj"
                              ".weight'"),
                    HasSubstr("the attention key projection of layer 0, a Gated DeltaNet layer, "
                              "which has none"),
                    HasSubstr("expert 99 in layer 0, beyond the config's 16 experts")));
}

}  // namespace
}  // namespace lilac::test
