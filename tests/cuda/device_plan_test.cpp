// The device plan against the weight table, on the host (no GPU needed): the synthetic host
// model, which views its fused buffers through the plan, gives every field of ModelWeights the
// shape its table entry says, the parts of each fused device matrix in row order, and the
// `--weights q4` bits of the table.
#include <gtest/gtest.h>

#include "../test_data.h"
#include "cuda/device_model.h"
#include "model/weight_table.h"

namespace lilac::test {
namespace {

// Bytes from a's first row to b's first row, both views into one buffer.
ptrdiff_t distance(const Matrix& a, const Matrix& b) {
  return static_cast<const uint8_t*>(b.data) - static_cast<const uint8_t*>(a.data);
}

void expect_follows_table(const ModelConfig& cfg, bool q4) {
  SCOPED_TRACE(q4 ? "q4" : "bf16");
  auto host = cuda::synthetic_host_model(cfg, 3, cfg.layers, q4);
  ModelWeights& w = host->weights;
  ASSERT_EQ(int64_t(w.layers.size()), cfg.layers);
  auto expect_shape = [&](const WeightEntry& e, const Matrix& m) {
    const std::vector<int64_t> s = e.shape(cfg);
    EXPECT_EQ(m.rows, s[0]) << e.what;
    EXPECT_EQ(m.cols, s[1]) << e.what;
    EXPECT_EQ(m.bits, q4 ? q4_bits_for(e, m.cols) : 0) << e.what;
  };
  for (const WeightEntry& e : weight_table()) {
    if (e.scope == WeightScope::Mtp || e.kind == WeightKind::Fused) continue;
    if (!is_layer_scope(e)) {
      if (e.kind == WeightKind::Matrix)
        expect_shape(e, *model_matrix(w, e.role));
      else
        EXPECT_EQ(int64_t(model_vector(w, e.role)->size()), e.shape(cfg)[0]) << e.what;
      continue;
    }
    for (LayerWeights& L : w.layers) {
      if (!in_layer(e, L.type)) continue;
      if (e.kind == WeightKind::Vector) {
        int64_t n = 1;
        for (int64_t d : e.shape(cfg)) n *= d;
        EXPECT_EQ(int64_t(layer_vector(L, e.role)->size()), n) << e.what;
      } else if (e.scope == WeightScope::Expert) {
        ASSERT_EQ(int64_t(L.moe.experts.size()), cfg.experts);
        for (auto& x : L.moe.experts) expect_shape(e, *expert_matrix(x, e.role));
      } else {
        expect_shape(e, *layer_matrix(L, e.role));
      }
    }
  }
  // The fused device matrices: parts back to back, in the order the kernels read them.
  for (const LayerWeights& L : w.layers) {
    auto next = [](const Matrix& a, const Matrix& b) {
      return distance(a, b) == ptrdiff_t(a.rows) * ptrdiff_t(a.row_bytes());
    };
    if (L.type == LayerType::GatedDeltaNet) {
      EXPECT_TRUE(next(L.gdn.in_proj_qkv, L.gdn.in_proj_z));
      EXPECT_TRUE(next(L.gdn.in_proj_z, L.gdn.in_proj_b));
      EXPECT_TRUE(next(L.gdn.in_proj_b, L.gdn.in_proj_a));
    } else {
      EXPECT_TRUE(next(L.attn.q_proj, L.attn.k_proj));
      EXPECT_TRUE(next(L.attn.k_proj, L.attn.v_proj));
    }
    EXPECT_TRUE(next(L.moe.router, L.moe.shared_expert_gate));
    EXPECT_TRUE(next(L.moe.shared_gate, L.moe.shared_up));
    for (size_t e = 0; e < L.moe.experts.size(); ++e) {
      EXPECT_TRUE(next(L.moe.experts[e].gate, L.moe.experts[e].up));
      if (e + 1 < L.moe.experts.size()) {
        EXPECT_TRUE(next(L.moe.experts[e].up, L.moe.experts[e + 1].gate));
        EXPECT_TRUE(next(L.moe.experts[e].down, L.moe.experts[e + 1].down));
      }
    }
  }
}

TEST(DevicePlan, SyntheticHostModelFollowsTheWeightTable) {
  const ModelConfig cfg = load_model_config(data_path("tiny-a"));
  expect_follows_table(cfg, false);
  expect_follows_table(cfg, true);
}

}  // namespace
}  // namespace lilac::test
