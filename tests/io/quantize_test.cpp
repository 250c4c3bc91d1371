// `lilac quantize`: tiny-a (both layouts, and an FP8 copy written here) to an MLX 4-bit
// checkpoint that follows mlx-lm's conventions, loads as MLX4, and dequantizes to the original
// weights within MLX's bounds; FP8 decoding; refusals on bad input.
#include "io/quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "../test_data.h"
#include "cpu/cpu_backend.h"
#include "cpu/linear.h"
#include "model/mlx_affine.h"
#include "quant_test_util.h"
#include "util/half.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// FP8 E4M3 values worked out by hand from sign / exponent (bias 7) / mantissa.
TEST(Fp8, DecodesE4M3) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));  // -0
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);         // smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f);     // largest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);         // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);            // e = 7
  EXPECT_EQ(fp8_e4m3_to_f32(0x3C), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xC4), -3.0f);   // 1 1000 100: -(1.5 * 2)
  EXPECT_EQ(fp8_e4m3_to_f32(0x77), 240.0f);  // e = 14: 1.875 * 128
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);  // the largest finite value
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);  // e = 15 is a normal exponent (no infinities)
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xFF)));
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += std::isnan(fp8_e4m3_to_f32(uint8_t(c)));
  EXPECT_EQ(nans, 2);
  // The test encoder used below: round to nearest even, saturating.
  EXPECT_EQ(fp8_e4m3_encode(1.0f), 0x38);
  EXPECT_EQ(fp8_e4m3_encode(1.0625f), 0x38);  // half-way between 1 and 1.125: to the even code
  EXPECT_EQ(fp8_e4m3_encode(1000.f), 0x7E);
  EXPECT_EQ(fp8_e4m3_encode(-3.0f), 0xC4);
}

class QuantizeTinyA : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    quantize_dir(data_path("tiny-a"), tmp_->str("hub"));
    quantize_dir(data_path("tiny-a-per-expert"), tmp_->str("per"));
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string hub() { return tmp_->str("hub"); }
  static std::string per() { return tmp_->str("per"); }
  static TempDir* tmp_;
};
TempDir* QuantizeTinyA::tmp_ = nullptr;

// Same tensors from both layouts; A_log keeps its input dtype (F32 in the hub fixture, BF16 in the
// per-expert one, same values), as mlx-lm's cast_predicate leaves it.
TEST_F(QuantizeTinyA, BothLayoutsGiveTheSameCheckpoint) {
  TensorSet a(hub()), b(per());
  ASSERT_EQ(a.names.size(), b.names.size());
  for (size_t i = 0; i < a.names.size(); ++i) {
    if (a.names[i].ends_with("A_log")) {
      EXPECT_EQ(a.infos[i].dtype, DType::F32);
      EXPECT_EQ(b.info(a.names[i]).dtype, DType::BF16);
      for (size_t k = 0; k < a.bytes[i].size() / 4; ++k) {
        float f;
        uint16_t h;
        std::memcpy(&f, &a.bytes[i][4 * k], 4);
        std::memcpy(&h, &b.at(a.names[i])[2 * k], 2);
        EXPECT_EQ(f, bf16_to_f32(h)) << a.names[i];
      }
      continue;
    }
    EXPECT_TRUE(a.bytes[i] == b.at(a.names[i])) << a.names[i];
  }
  EXPECT_EQ(slurp_file(hub() + "/config.json"), slurp_file(per() + "/config.json"));
  auto m = load_model(hub());
  EXPECT_EQ(m->checkpoint->format(), WeightFormat::MLX4);
  EXPECT_EQ(m->report.layout, ExpertLayout::Stacked);
  EXPECT_THAT(m->report.quantization,
              AllOf(HasSubstr("group size 64"), HasSubstr("4-bit default")));
  const auto& w = m->weights;
  EXPECT_EQ(w.embed.bits, 4);
  EXPECT_EQ(w.lm_head.bits, 4);
  EXPECT_EQ(w.layers[0].moe.router.bits, 8);
  EXPECT_EQ(w.layers[0].moe.shared_expert_gate.bits, 8);
  EXPECT_EQ(w.layers[3].attn.q_proj.bits, 4);
  EXPECT_EQ(w.layers[2].moe.experts[15].down.bits, 4);
  EXPECT_TRUE(has_quantized_weights(w));
}

// Names, dtypes and shapes as mlx-lm writes them; config.json keys; float tensors transformed as
// its sanitize() does (norms + 1 in bf16, conv1d [C, K, 1], A_log untouched); files copied.
TEST_F(QuantizeTinyA, FollowsMlxConventions) {
  TensorSet out(hub()), in(data_path("tiny-a"));
  const auto cfg = load_model_config(data_path("tiny-a"));
  for (const auto& n : out.names) {
    EXPECT_TRUE(n.starts_with("language_model.model.") || n.starts_with("language_model.lm_head."))
        << n;
    EXPECT_EQ(n.find("visual"), std::string::npos) << n;
    EXPECT_EQ(n.find("mtp"), std::string::npos) << n;
  }
  const std::string L0 = "language_model.model.layers.0.", L3 = "language_model.model.layers.3.";
  auto expect_q = [&](const std::string& base, std::vector<int64_t> lead, int64_t rows,
                      int64_t cols, int bits) {
    auto with = [&](int64_t c) {
      auto s = lead;
      s.push_back(rows);
      s.push_back(c);
      return s;
    };
    EXPECT_EQ(out.info(base + ".weight").dtype, DType::U32) << base;
    EXPECT_EQ(out.info(base + ".weight").shape, with(cols * bits / 32)) << base;
    EXPECT_EQ(out.info(base + ".scales").dtype, DType::BF16) << base;
    EXPECT_EQ(out.info(base + ".scales").shape, with(cols / 64)) << base;
    EXPECT_EQ(out.info(base + ".biases").shape, with(cols / 64)) << base;
  };
  expect_q("language_model.model.embed_tokens", {}, 512, 128, 4);
  expect_q("language_model.lm_head", {}, 512, 128, 4);
  expect_q(L0 + "mlp.gate", {}, 16, 128, 8);
  expect_q(L0 + "mlp.shared_expert_gate", {}, 1, 128, 8);
  expect_q(L0 + "mlp.switch_mlp.gate_proj", {16}, 64, 128, 4);
  expect_q(L0 + "mlp.switch_mlp.down_proj", {16}, 128, 64, 4);
  expect_q(L0 + "linear_attn.in_proj_a", {}, 4, 128, 4);
  expect_q(L3 + "self_attn.o_proj", {}, 128, 256, 4);
  // Float tensors.
  const std::string src0 = "model.language_model.layers.0.";
  EXPECT_EQ(out.info(L0 + "linear_attn.conv1d.weight").shape, (std::vector<int64_t>{256, 4, 1}));
  EXPECT_EQ(out.at(L0 + "linear_attn.conv1d.weight"), in.at(src0 + "linear_attn.conv1d.weight"));
  EXPECT_EQ(out.info(L0 + "linear_attn.A_log").dtype, DType::F32);
  EXPECT_EQ(out.at(L0 + "linear_attn.A_log"), in.at(src0 + "linear_attn.A_log"));
  EXPECT_EQ(out.at(L0 + "linear_attn.norm.weight"),
            in.at(src0 + "linear_attn.norm.weight"));  // plain w
  EXPECT_EQ(out.at(L0 + "linear_attn.dt_bias"), in.at(src0 + "linear_attn.dt_bias"));
  for (std::string norm :
       {"layers.0.input_layernorm.weight", "layers.3.self_attn.q_norm.weight", "norm.weight"}) {
    const auto& a = in.at("model.language_model." + norm);
    const auto& b = out.at("language_model.model." + norm);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() / 2; ++i) {
      uint16_t w, s;
      std::memcpy(&w, &a[2 * i], 2);
      std::memcpy(&s, &b[2 * i], 2);
      ASSERT_EQ(s, f32_to_bf16(1.0f + bf16_to_f32(w))) << norm << " element " << i;
    }
  }
  // 4 layers x (router + shared_expert_gate) 8-bit; everything else 4-bit, all quantized.
  auto config = nlohmann::json::parse(slurp_file(hub() + "/config.json"));
  const auto& q = config["quantization"];
  EXPECT_EQ(q["group_size"], 64);
  EXPECT_EQ(q["bits"], 4);
  EXPECT_EQ(q["mode"], "affine");
  EXPECT_EQ(q.size(), 3u + 8u);
  EXPECT_EQ(q["language_model.model.layers.2.mlp.shared_expert_gate"],
            (nlohmann::json{{"group_size", 64}, {"bits", 8}}));
  EXPECT_EQ(q["language_model.model.layers.3.mlp.gate"]["bits"], 8);
  EXPECT_EQ(config["quantization_config"], q);
  EXPECT_FALSE(config.contains("vision_config"));
  EXPECT_EQ(config["text_config"]["hidden_size"], 128);
  // Shard metadata and index.
  auto f = SafetensorsFile::open(hub() + "/model.safetensors");
  EXPECT_EQ(f->metadata().at("format"), "mlx");
  auto index = nlohmann::json::parse(slurp_file(hub() + "/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& t : f->tensors()) total += t.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), f->tensors().size());
  EXPECT_TRUE(std::filesystem::exists(hub() + "/generation_config.json"));
}

// Every weight of every quantized matrix, read back through the loader's Matrix views (embedding,
// stacked experts sliced per expert, 8-bit router), against the BF16 original: within half a
// step inside the group's grid, within one step where MLX clips the far edge (mlx_affine.h).
TEST_F(QuantizeTinyA, DequantizedWeightsStayWithinMlxBoundsOfTheOriginal) {
  auto q = load_model(hub());
  auto b = load_model(data_path("tiny-a"));
  int64_t checked = 0, inside = 0;
  auto check = [&](const Matrix& mq, const Matrix& mb) {
    ASSERT_TRUE(mq.quantized()) << mq.name;
    ASSERT_EQ(mq.rows, mb.rows);
    const float n_bins = float((1 << mq.bits) - 1);
    std::vector<float> dq(size_t(mq.cols)), orig(size_t(mq.cols));
    for (int64_t r = 0; r < mq.rows; ++r) {
      widen_row(mq, r, dq.data());
      widen_row(mb, r, orig.data());
      for (int64_t g = 0; g < mq.cols / 64; ++g) {
        const float s = bf16_to_f32(mq.row_scales(r)[g]), bias = bf16_to_f32(mq.row_biases(r)[g]);
        const float slack = (n_bins * std::fabs(s) + std::fabs(bias)) * 0x1p-8f;
        const float lo = std::min(bias, bias + n_bins * s), hi = std::max(bias, bias + n_bins * s);
        for (int64_t k = g * 64; k < g * 64 + 64; ++k) {
          const float err = std::fabs(dq[size_t(k)] - orig[size_t(k)]);
          const bool in_grid = orig[size_t(k)] >= lo - slack && orig[size_t(k)] <= hi + slack;
          ASSERT_LE(err, (in_grid ? 0.5f : 1.0f) * std::fabs(s) + slack)
              << mq.name << " row " << r << " col " << k;
          ++checked;
          inside += in_grid;
        }
      }
    }
  };
  check(q->weights.embed, b->weights.embed);
  check(q->weights.lm_head, b->weights.lm_head);
  for (size_t i = 0; i < q->weights.layers.size(); ++i) {
    const auto &lq = q->weights.layers[i], &lb = b->weights.layers[i];
    check(lq.moe.router, lb.moe.router);
    check(lq.moe.shared_expert_gate, lb.moe.shared_expert_gate);
    check(lq.moe.shared_down, lb.moe.shared_down);
    for (size_t e = 0; e < lq.moe.experts.size(); ++e) {
      check(lq.moe.experts[e].gate, lb.moe.experts[e].gate);
      check(lq.moe.experts[e].up, lb.moe.experts[e].up);
      check(lq.moe.experts[e].down, lb.moe.experts[e].down);
    }
    if (lq.type == LayerType::FullAttention) {
      check(lq.attn.q_proj, lb.attn.q_proj);
      check(lq.attn.o_proj, lb.attn.o_proj);
    } else {
      check(lq.gdn.in_proj_qkv, lb.gdn.in_proj_qkv);
      check(lq.gdn.in_proj_b, lb.gdn.in_proj_b);
      check(lq.gdn.out_proj, lb.gdn.out_proj);
    }
    EXPECT_EQ(lq.input_norm_scale.size(), lb.input_norm_scale.size());
    for (size_t j = 0; j < lq.input_norm_scale.size(); ++j)
      EXPECT_EQ(lq.input_norm_scale[j], round_to_bf16(lb.input_norm_scale[j]));
  }
  std::printf("%lld weights checked, %.2f%% inside their group's grid\n", (long long)checked,
              100.0 * double(inside) / double(checked));
  EXPECT_GT(checked, 1900000);
  EXPECT_GT(double(inside) / double(checked),
            0.95);  // clipping: at most the far extreme of a group
}

TEST_F(QuantizeTinyA, ShardedOutputHoldsTheSameTensors) {
  TempDir t;
  auto s = quantize_dir(data_path("tiny-a"), t.str("sharded"), 300 * 1024);
  EXPECT_GE(s.shards, 4u);
  EXPECT_TRUE(std::filesystem::exists(
      t.str("sharded/model-00001-of-0000" + std::to_string(s.shards) + ".safetensors")));
  EXPECT_FALSE(std::filesystem::exists(t.str("sharded/model.safetensors")));
  TensorSet a(t.str("sharded")), b(hub());
  ASSERT_EQ(a.names.size(), b.names.size());
  for (size_t i = 0; i < a.names.size(); ++i)
    EXPECT_TRUE(a.bytes[i] == b.at(a.names[i])) << a.names[i];
  auto m = load_model(t.str("sharded"));
  EXPECT_EQ(m->checkpoint->files().size(), s.shards);
  for (const auto& f : m->checkpoint->files())
    EXPECT_LE(std::filesystem::file_size(f->path()), 300u * 1024 + 64 * 1024);
}

// An FP8 checkpoint written here in Qwen's FP8 layout (per-expert F8_E4M3 weights with F32
// weight_scale_inv over 128x128 blocks; embeddings, lm_head, router, shared_expert_gate,
// in_proj_a/b and the float tensors BF16) quantizes to exactly what its BF16 equivalent
// (W = fp8 * scale_inv, rounded to bf16, computed here) quantizes to.
TEST(QuantizeFp8, MatchesItsBf16Equivalent) {
  TempDir t;
  TensorSet fp8 = write_fp8_tiny_a(t.str("fp8"), t.str("bf16"));
  auto s = quantize_dir(t.str("fp8"), t.str("fp8-q4"));
  EXPECT_EQ(s.input_format, WeightFormat::FP8);
  quantize_dir(t.str("bf16"), t.str("bf16-q4"));
  TensorSet a(t.str("fp8-q4")), b(t.str("bf16-q4"));
  ASSERT_EQ(a.names.size(), b.names.size());
  for (size_t i = 0; i < a.names.size(); ++i)
    EXPECT_TRUE(a.bytes[i] == b.at(a.names[i])) << a.names[i];
  auto config = nlohmann::json::parse(slurp_file(t.str("fp8-q4/config.json")));
  EXPECT_EQ(config["quantization_config"]["bits"], 4);  // the FP8 block replaced
  EXPECT_FALSE(config["quantization_config"].contains("quant_method"));
  auto model = load_model(t.str("fp8-q4"));
  EXPECT_EQ(model->checkpoint->format(), WeightFormat::MLX4);
  cpu::CpuBackend backend(model->config, model->weights);  // and it runs
  auto seq = backend.new_sequence(8);
  std::vector<int32_t> ids = {1, 17, 300};
  std::vector<float> logits(3 * 512);
  backend.forward(*seq, ids, logits, true);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));

  // A missing or misshapen scale_inv is refused, naming the tensor.
  const std::string gone = "model.language_model.layers.1.mlp.experts.3.up_proj.weight_scale_inv";
  TensorSet broken = fp8;
  broken.erase(gone);
  broken.write(t.str("fp8"));
  EXPECT_THROW(quantize_dir(t.str("fp8"), t.str("x")), Error);
  try {
    quantize_dir(t.str("fp8"), t.str("y"));
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("missing tensor"),
                                HasSubstr("layers.1.mlp.experts.3.up_proj.weight_scale_inv")));
  }
  EXPECT_FALSE(std::filesystem::exists(t.str("y/model.safetensors")));  // validation writes nothing
}

std::string quantize_error(const std::string& in, const std::string& out) {
  try {
    quantize_dir(in, out);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantizeErrors, RefusesBadInputAndOutput) {
  TempDir t;
  quantize_dir(data_path("tiny-a"), t.str("q"));
  EXPECT_THAT(quantize_error(t.str("q"), t.str("again")),
              HasSubstr("already an MLX quantized checkpoint"));
  EXPECT_THAT(quantize_error(data_path("tiny-a"), t.str("q")), HasSubstr("not an empty directory"));
  EXPECT_THAT(quantize_error(t.str("nowhere"), t.str("z")), HasSubstr("config.json"));

  // A NaN weight is refused, naming the tensor; a config mismatch lists the tensors.
  copy_configs("tiny-a-per-expert", t.str("nan"));
  TensorSet ts(data_path("tiny-a-per-expert"));
  const std::string victim = "model.language_model.layers.2.linear_attn.in_proj_z.weight";
  auto& bytes = ts.bytes[size_t(ts.find(victim))];
  bytes[2 * 300] = 0xC0, bytes[2 * 300 + 1] = 0x7F;  // bf16 NaN
  ts.write(t.str("nan"));
  EXPECT_THAT(quantize_error(t.str("nan"), t.str("nan-q")),
              AllOf(HasSubstr(victim), HasSubstr("non-finite")));
  edit_json(t.str("nan/config.json"),
            [](auto& j) { j["text_config"]["moe_intermediate_size"] = 32; });
  EXPECT_THAT(quantize_error(t.str("nan"), t.str("nan-q2")),
              AllOf(HasSubstr("experts.0.gate_proj.weight"), HasSubstr("expected [32, 128]")));
}

}  // namespace
}  // namespace lilac::test
