#include "model/cost.h"

#include "model/weight_table.h"

namespace lilac {

// The weight table's matrices, each as often as the config has it (model/weight_table.h:
// decode_weights_read says what one token reads of an entry).
int64_t active_params_per_token(const ModelConfig& c) {
  int64_t n = 0;
  for (const WeightEntry& e : weight_table()) {
    if (!is_layer_scope(e)) {
      n += decode_weights_read(e, c);
      continue;
    }
    for (LayerType t : c.layer_types)
      if (in_layer(e, t)) n += decode_weights_read(e, c);
  }
  return n;
}

double decode_bytes(const ModelConfig& c, int64_t context, double bytes_per_weight,
                    double state_bytes_per_value) {
  double bytes = double(active_params_per_token(c)) * bytes_per_weight;
  const double gdn_state =
      double(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim) * state_bytes_per_value;
  bytes += 2.0 * gdn_state * double(c.count_layers(LayerType::GatedDeltaNet));
  bytes += double(c.count_layers(LayerType::FullAttention)) * 2.0 * double(c.kv_dim()) * 2.0 *
           double(context);
  return bytes;
}

double prefill_flops(const ModelConfig& c, int64_t L) {
  double flops = 2.0 * double(active_params_per_token(c) - c.hidden) * double(L);
  flops += double(c.count_layers(LayerType::FullAttention)) * 4.0 * double(c.heads * c.head_dim) *
           double(L) * double(L) / 2.0;
  flops += double(c.count_layers(LayerType::GatedDeltaNet)) * 6.0 *
           double(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim) * double(L);
  return flops;
}

}  // namespace lilac
