// MLX checkpoints that are broken in one way each (edited copies of quantized tiny-a): every
// defect is refused with a message naming the tensor or config entry.
#include "io/checkpoint_mlx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "quant_test_util.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string L0 = "language_model.model.layers.0.";
const std::string L1 = "language_model.model.layers.1.";

// A quantized tiny-a as one model.safetensors without index, ready to be edited.
class BrokenMlx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!quantized_) {
      quantized_ = new TempDir();
      quantize_dir(data_path("tiny-a"), quantized_->str("q"));
    }
    dir = tmp.str("m");
    std::filesystem::copy(quantized_->str("q"), dir);
    std::filesystem::remove(dir + "/model.safetensors.index.json");
    ts = TensorSet(dir);
  }
  std::string error_after_write() {
    ts.write(dir);
    return load_error(dir);
  }
  static TempDir* quantized_;
  TempDir tmp;
  std::string dir;
  TensorSet ts;
};
TempDir* BrokenMlx::quantized_ = nullptr;

TEST_F(BrokenMlx, IntactCopyLoads) {
  EXPECT_EQ(error_after_write(), "(no error)");
  LoadReport rep;
  auto ck = Checkpoint::open(dir);
  bind_weights(*ck, load_model_config(dir), rep);
  EXPECT_TRUE(rep.problems.empty());
  EXPECT_EQ(rep.parameters, 2146168);  // logical weights, as the index's total_parameters
  EXPECT_THAT(rep.quantization,
              AllOf(HasSubstr("8 overrides"), HasSubstr("4.516 bits per quantized weight")));
}

TEST_F(BrokenMlx, MissingScales) {
  ts.erase(L1 + "linear_attn.in_proj_z.scales");
  EXPECT_THAT(error_after_write(),
              HasSubstr("missing tensor '" + L1 + "linear_attn.in_proj_z.scales'"));
}

TEST_F(BrokenMlx, MissingCodes) {
  ts.erase(L0 + "mlp.switch_mlp.up_proj.weight");
  EXPECT_THAT(error_after_write(),
              HasSubstr("missing tensor '" + L0 + "mlp.switch_mlp.up_proj.weight'"));
}

TEST_F(BrokenMlx, WrongCodeShape) {
  const int i = ts.find(L0 + "linear_attn.in_proj_qkv.weight");
  ts.infos[size_t(i)].shape = {256, 8};
  ts.bytes[size_t(i)].resize(256 * 8 * 4);
  EXPECT_THAT(error_after_write(),
              AllOf(HasSubstr(L0 + "linear_attn.in_proj_qkv.weight"),
                    HasSubstr("shape [256, 8], expected [256, 16] for 4-bit codes"),
                    HasSubstr("that is 2-bit codes")));
}

TEST_F(BrokenMlx, WrongStackedExpertCount) {
  edit_json(dir + "/config.json", [](auto& j) { j["text_config"]["num_experts"] = 8; });
  EXPECT_THAT(error_after_write(), AllOf(HasSubstr(L0 + "mlp.switch_mlp.gate_proj.weight"),
                                         HasSubstr("expected [8, 64, 16] for 4-bit codes")));
}

// config.json says 4 bits for a router that is stored 8-bit (and 8 for one stored 4-bit).
TEST_F(BrokenMlx, WrongBitsOverride) {
  edit_json(dir + "/config.json", [](auto& j) {
    j["quantization"]["language_model.model.layers.0.mlp.gate"]["bits"] = 4;
    j["quantization"]["language_model.model.layers.1.linear_attn.in_proj_a"] = {{"group_size", 64},
                                                                                {"bits", 8}};
  });
  std::string err = error_after_write();
  EXPECT_THAT(err, AllOf(HasSubstr(L0 + "mlp.gate.weight"),
                         HasSubstr("shape [16, 32], expected [16, 16] for 4-bit codes"),
                         HasSubstr("override \"language_model.model.layers.0.mlp.gate\""),
                         HasSubstr("that is 8-bit codes")));
  EXPECT_THAT(err, AllOf(HasSubstr(L1 + "linear_attn.in_proj_a.weight"),
                         HasSubstr("expected [4, 32] for 8-bit codes")));
}

TEST_F(BrokenMlx, WrongDtypes) {
  ts.infos[size_t(ts.find(L0 + "linear_attn.out_proj.weight"))].dtype = DType::I32;
  const int s = ts.find(L1 + "mlp.shared_expert.up_proj.scales");
  ts.infos[size_t(s)].dtype = DType::F16;
  EXPECT_THAT(error_after_write(), AllOf(HasSubstr(L0 + "linear_attn.out_proj.weight"),
                                         HasSubstr("dtype I32, expected U32"),
                                         HasSubstr(L1 + "mlp.shared_expert.up_proj.scales"),
                                         HasSubstr("dtype F16, expected BF16")));
}

TEST_F(BrokenMlx, UnexpectedTensorAndStrayOverride) {
  std::vector<uint8_t> b(64);
  ts.add(L0 + "mlp.mystery.scales", DType::BF16, {32}, b.data(), b.size());
  edit_json(dir + "/config.json", [](auto& j) {
    j["quantization"]["language_model.model.layers.0.mlp.nothing"] = {{"bits", 8}};
  });
  EXPECT_THAT(error_after_write(),
              AllOf(HasSubstr("unexpected tensor '" + L0 + "mlp.mystery.scales'"),
                    HasSubstr("\"language_model.model.layers.0.mlp.nothing\" names no module")));
}

TEST_F(BrokenMlx, BadQuantizationBlock) {
  edit_json(dir + "/config.json", [](auto& j) {
    j.erase("quantization");
    j.erase("quantization_config");
  });
  EXPECT_THAT(error_after_write(), HasSubstr("config.json has no \"quantization\" object"));
  edit_json(dir + "/config.json", [](auto& j) {
    j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "mxfp4"}};
  });
  EXPECT_THAT(load_error(dir), HasSubstr("mode \"mxfp4\" is not supported"));
  edit_json(dir + "/config.json", [](auto& j) {
    j["quantization"] = {{"group_size", 64}, {"bits", 3}};
  });
  EXPECT_THAT(load_error(dir), HasSubstr("bits 3: only 4- and 8-bit"));
  edit_json(dir + "/config.json", [](auto& j) { j["quantization"] = {{"bits", 4}}; });
  EXPECT_THAT(load_error(dir), HasSubstr("has no \"group_size\""));
}

// An unquantized Linear (no .scales, float weight) binds as a plain matrix, as mlx-lm loads it;
// a float weight that still has scales is refused.
TEST_F(BrokenMlx, UnquantizedLinearIsPlainAndFloatWithScalesIsRefused) {
  for (const char* suffix : {".weight", ".scales", ".biases"})
    ts.erase(L0 + "linear_attn.in_proj_b" + suffix);
  std::vector<uint16_t> w(4 * 128, 0x3C00);  // bf16 0.0078125
  ts.add(L0 + "linear_attn.in_proj_b.weight", DType::BF16, {4, 128},
         reinterpret_cast<uint8_t*>(w.data()), w.size() * 2);
  ts.write(dir);
  auto m = load_model(dir);
  EXPECT_FALSE(m->weights.layers[0].gdn.in_proj_b.quantized());
  EXPECT_EQ(m->weights.layers[0].gdn.in_proj_b.dtype, DType::BF16);
  std::vector<uint16_t> s(4 * 2);
  ts.add(L0 + "linear_attn.in_proj_b.scales", DType::BF16, {4, 2},
         reinterpret_cast<uint8_t*>(s.data()), s.size() * 2);
  EXPECT_THAT(error_after_write(), AllOf(HasSubstr(L0 + "linear_attn.in_proj_b.weight"),
                                         HasSubstr("dtype BF16, expected U32")));
}

TEST_F(BrokenMlx, NormAndConvShapes) {
  const int c = ts.find(L0 + "linear_attn.conv1d.weight");
  ts.infos[size_t(c)].shape = {256, 1, 4};  // HF's layout: MLX stores [C, K, 1]
  EXPECT_THAT(error_after_write(), AllOf(HasSubstr(L0 + "linear_attn.conv1d.weight"),
                                         HasSubstr("expected [256, 4, 1]")));
}

}  // namespace
}  // namespace lilac::test
