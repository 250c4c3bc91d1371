#include "model/cost.h"

namespace lilac {

int64_t active_params_per_token(const ModelConfig& c) {
  const int64_t H = c.hidden;
  int64_t n = 0;
  for (auto t : c.layer_types) {
    if (t == LayerType::FullAttention) {
      n += c.q_proj_rows() * H + 2 * c.kv_dim() * H + H * c.heads * c.head_dim;
    } else {
      n += (c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads) * H +
           H * c.gdn_v_channels();
    }
    n += (c.experts + 1) * H;                                  // router + shared expert gate
    n += c.experts_per_token * 3 * c.expert_intermediate * H;  // routed experts
    n += 3 * c.shared_intermediate * H;                        // shared expert
  }
  n += H;            // embedding row
  n += c.vocab * H;  // lm_head
  return n;
}

double decode_bytes(const ModelConfig& c, int64_t context, double bytes_per_weight) {
  double bytes = double(active_params_per_token(c)) * bytes_per_weight;
  const double gdn_state = double(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim) * 4.0;
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
