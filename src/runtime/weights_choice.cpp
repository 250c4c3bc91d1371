#include "runtime/weights_choice.h"

#include "model/weight_rows.h"
#include "util/error.h"

namespace lilac::runtime {

namespace {

const char* flag_name(WeightsChoice c) {
  switch (c) {
    case WeightsChoice::Auto:
      return "auto";
    case WeightsChoice::BF16:
      return "bf16";
    case WeightsChoice::FP8:
      return "fp8";
    case WeightsChoice::Q4:
      return "q4";
  }
  return "?";
}

}  // namespace

WeightsChoice parse_weights(const std::string& flag) {
  if (flag == "auto") return WeightsChoice::Auto;
  if (flag == "bf16") return WeightsChoice::BF16;
  if (flag == "fp8") return WeightsChoice::FP8;
  if (flag == "q4") return WeightsChoice::Q4;
  fail("--weights {}: expected auto, bf16, fp8 or q4", flag);
}

WeightsPlan plan_weights(WeightsChoice choice, const Model& model) {
  const WeightFormat format = model.checkpoint->format();
  const std::string name = format_name(format);
  WeightsPlan p;
  p.quantize_at_load =
      choice == WeightsChoice::Q4 && (format == WeightFormat::BF16 || format == WeightFormat::FP8);
  p.four_bit = p.quantize_at_load || has_quantized_weights(model.weights);
  p.description = p.quantize_at_load ? name + " quantized to 4-bit at load" : name;
  const std::string wanted = choice == WeightsChoice::Q4 ? "mlx-4bit" : flag_name(choice);
  if (choice != WeightsChoice::Auto && wanted != name && !p.quantize_at_load)
    fail(
        "--weights {}: the checkpoint in {} holds {} weights; lilac runs a checkpoint in its own "
        "format, or quantizes a BF16 or FP8 one at load (--weights q4)",
        flag_name(choice), model.checkpoint->dir(), name);
  return p;
}

std::string synthetic_weights(WeightsChoice choice) {
  if (choice == WeightsChoice::FP8) fail("--weights fp8: the synthetic model is bf16 or q4");
  return choice == WeightsChoice::Q4 ? "q4" : "bf16";
}

}  // namespace lilac::runtime
