// FP8 E4M3 checkpoints loaded for inference (Qwen's FP8 layout: F8_E4M3 weights with
// weight_scale_inv over 128x128 blocks): the loader binds each weight with its block scales,
// strictly validated; the CPU backend reads W = fp8 * scale as it goes; `--weights q4` at load
// gives exactly what `lilac quantize` writes from the same file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/linear.h"
#include "quant_test_util.h"
#include "util/half.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<float> prefill_logits(const Model& m, const std::vector<int32_t>& ids) {
  cpu::CpuBackend backend(m.config, m.weights);
  auto seq = backend.new_sequence(int64_t(ids.size()) + 1);
  std::vector<float> logits(ids.size() * size_t(m.config.vocab));
  backend.forward(*seq, ids, logits, true);
  return logits;
}

TEST(CheckpointFp8, LoadsRunsAndQuantizesAtLoad) {
  TempDir t;
  TensorSet fp8 = write_fp8_tiny_a(t.str("fp8"), t.str("bf16"));
  auto m = load_model(t.str("fp8"));
  auto b = load_model(t.str("bf16"));
  EXPECT_EQ(m->checkpoint->format(), WeightFormat::FP8);
  EXPECT_TRUE(m->report.problems.empty());
  EXPECT_EQ(m->report.parameters, b->report.parameters);  // the scales are not parameters

  // Every FP8 weight row reads as fp8 * scale in f32: its bf16 rounding is the bf16 equivalent's.
  int fp8_matrices = 0;
  auto same_rows = [&](const Matrix& A, const Matrix& B) {
    if (!A.fp8()) return;
    ++fp8_matrices;
    std::vector<float> a(size_t(A.cols)), w(size_t(B.cols));
    for (int64_t r = 0; r < A.rows; ++r) {
      widen_row(A, r, a.data());
      widen_row(B, r, w.data());
      for (size_t c = 0; c < a.size(); ++c)
        ASSERT_EQ(round_to_bf16(a[c]), w[c]) << A.name << " [" << r << ", " << c << "]";
    }
  };
  for (size_t l = 0; l < m->weights.layers.size(); ++l) {
    const auto& L = m->weights.layers[l];
    const auto& K = b->weights.layers[l];
    for (size_t e = 0; e < L.moe.experts.size(); ++e) {
      same_rows(L.moe.experts[e].gate, K.moe.experts[e].gate);
      same_rows(L.moe.experts[e].up, K.moe.experts[e].up);
      same_rows(L.moe.experts[e].down, K.moe.experts[e].down);
    }
    same_rows(L.attn.q_proj, K.attn.q_proj);
    same_rows(L.attn.o_proj, K.attn.o_proj);
    same_rows(L.gdn.in_proj_qkv, K.gdn.in_proj_qkv);
    same_rows(L.gdn.out_proj, K.gdn.out_proj);
  }
  EXPECT_GT(fp8_matrices, 100);

  // The CPU runs the FP8 model; its logits differ from the bf16 equivalent's by the bf16
  // rounding of the weights only (a wrong scale or decode would be off by O(1)).
  const std::vector<int32_t> ids = {1, 17, 300, 42, 7, 99};
  const std::vector<float> lf = prefill_logits(*m, ids), lb = prefill_logits(*b, ids);
  double worst = 0;
  for (size_t i = 0; i < lf.size(); ++i) {
    ASSERT_TRUE(std::isfinite(lf[i]));
    worst = std::max(worst, std::fabs(double(lf[i]) - lb[i]));
  }
  EXPECT_LT(worst, 5e-2) << "FP8 vs its bf16 equivalent, max abs logit difference";
  std::printf("  FP8 vs bf16-equivalent logits: max abs difference %.3g\n", worst);

  // --weights q4 at load (in memory) is `lilac quantize` of the FP8 file: identical logits.
  quantize_model_in_memory(*m);
  quantize_dir(t.str("fp8"), t.str("fp8-q4"));
  auto q = load_model(t.str("fp8-q4"));
  const std::vector<float> a = prefill_logits(*m, ids), c = prefill_logits(*q, ids);
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * 4))
      << "FP8 quantized at load differs from `lilac quantize` of the FP8 checkpoint";
}

TEST(CheckpointFp8, RefusesMissingOrMisshapenScales) {
  TempDir t;
  TensorSet fp8 = write_fp8_tiny_a(t.str("fp8"), t.str("bf16"));
  const std::string scale = "model.language_model.layers.1.mlp.experts.3.up_proj.weight_scale_inv";
  TensorSet gone = fp8;
  gone.erase(scale);
  gone.write(t.str("fp8"));
  EXPECT_THAT(load_error(t.str("fp8")),
              AllOf(HasSubstr("missing tensor"),
                    HasSubstr("layers.1.mlp.experts.3.up_proj.weight_scale_inv")));
  TensorSet misshapen = fp8;
  misshapen.erase(scale);
  const float one[3] = {1.f, 1.f, 1.f};
  misshapen.add(scale, DType::F32, {1, 3}, reinterpret_cast<const uint8_t*>(one), sizeof one);
  misshapen.write(t.str("fp8"));
  EXPECT_THAT(load_error(t.str("fp8")),
              AllOf(HasSubstr("up_proj.weight_scale_inv"), HasSubstr("shape [1, 3]")));
  // An integer weight where a float or FP8 one belongs is refused too, naming it.
  TensorSet ints = fp8;
  const std::string w = "model.language_model.layers.0.mlp.experts.0.gate_proj.weight";
  const auto& info =
      ints.infos[size_t(std::find(ints.names.begin(), ints.names.end(), w) - ints.names.begin())];
  const std::vector<int64_t> shape = info.shape;
  std::vector<uint8_t> raw(size_t(shape[0] * shape[1]), 0);
  ints.erase(w);
  ints.add(w, DType::I8, shape, raw.data(), raw.size());
  ints.write(t.str("fp8"));
  EXPECT_THAT(load_error(t.str("fp8")),
              AllOf(HasSubstr("experts.0.gate_proj.weight"), HasSubstr("dtype I8")));
}

}  // namespace
}  // namespace lilac::test
