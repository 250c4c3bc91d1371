// The router of the synthetic full-size model (`--synthetic --router uniform|zipf`).
//
// uniform: every row of a layer's router matrix is uniform in [-a, a], a = sqrt(3 / hidden), so
//   for any hidden state the 256 logits are alike in distribution and the top-8 selection is
//   near-uniform over the experts.
// zipf: the row of the expert of rank r (a per-layer permutation of the experts, drawn from the
//   router tensor's key, so every layer favours different experts) is scaled by
//   w_r = (r + 1)^-kZipfRowExponent / rms_r((r + 1)^-kZipfRowExponent): the logit of expert e is
//   w_rank(e) * z_e with z_e alike across experts, so high-ranked experts win the top-8 more
//   often. The router has no bias and the hidden states of a random-weight model are
//   (nearly) sign-symmetric (x and -x about equally likely), so a linear router can put no expert
//   in more than half of the tokens' top-8; scaling rows is the knob that remains. Measured on the
//   model's own hidden states (tests/model/synthetic_router_test.cpp, docs/benchmarking.md): the
//   popularity of rank r falls roughly as (r + 1)^-0.9 (Zipf-like), flatter among the first ranks.
// The shared expert's gate (the router tensor's last row) is never scaled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lilac {

enum class SyntheticRouter { Uniform, Zipf };

inline constexpr double kZipfRowExponent = 0.25;

// "uniform" / "zipf"; anything else fails naming the choices.
SyntheticRouter parse_synthetic_router(const std::string& name);
const char* synthetic_router_name(SyntheticRouter router);

// The row scale of each rank, w_r above: `experts` values, decreasing, root mean square 1.
std::vector<float> zipf_rank_scales(int64_t experts);

// The rank of each expert in the layer whose router tensor has key `tensor_key`: a permutation
// of 0..experts-1 (Fisher-Yates driven by a splitmix64 stream of the key).
std::vector<int64_t> zipf_expert_ranks(uint64_t tensor_key, int64_t experts);

// The value range of each row of a synthetic tensor: empty when the rows are uniform in [-a, a]
// (every tensor of the uniform router; every tensor but "layers.N.router" of the zipf one), else
// `rows` amplitudes: a * w_rank(e) for the expert rows e < rows - 1 and a for the last row (the
// shared expert's gate). Host and device generate row i's values with amplitude [i].
std::vector<float> synthetic_row_amplitudes(SyntheticRouter router, const std::string& tensor_name,
                                            uint64_t tensor_key, int64_t rows, float a);

}  // namespace lilac
