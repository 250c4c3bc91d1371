#include "model/synthetic_router.h"

#include <cmath>
#include <numeric>

#include "util/error.h"

namespace lilac {

SyntheticRouter parse_synthetic_router(const std::string& name) {
  if (name == "uniform") return SyntheticRouter::Uniform;
  if (name == "zipf") return SyntheticRouter::Zipf;
  fail("--router {}: uniform or zipf", name);
}

const char* synthetic_router_name(SyntheticRouter router) {
  return router == SyntheticRouter::Zipf ? "zipf" : "uniform";
}

std::vector<float> zipf_rank_scales(int64_t experts) {
  std::vector<double> w(static_cast<size_t>(experts));
  double sum_sq = 0;
  for (size_t r = 0; r < w.size(); ++r) {
    w[r] = std::pow(double(r + 1), -kZipfRowExponent);
    sum_sq += w[r] * w[r];
  }
  const double rms = std::sqrt(sum_sq / double(experts));
  std::vector<float> out(w.size());
  for (size_t r = 0; r < w.size(); ++r) out[r] = float(w[r] / rms);
  return out;
}

std::vector<int64_t> zipf_expert_ranks(uint64_t tensor_key, int64_t experts) {
  std::vector<int64_t> rank(static_cast<size_t>(experts));
  std::iota(rank.begin(), rank.end(), int64_t(0));
  uint64_t state = tensor_key;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (size_t i = rank.size(); i > 1; --i) std::swap(rank[i - 1], rank[next() % i]);
  return rank;
}

std::vector<float> synthetic_row_amplitudes(SyntheticRouter router, const std::string& tensor_name,
                                            uint64_t tensor_key, int64_t rows, float a) {
  if (router == SyntheticRouter::Uniform || !tensor_name.ends_with(".router") || rows < 2)
    return {};
  const int64_t experts = rows - 1;
  const std::vector<float> scale = zipf_rank_scales(experts);
  const std::vector<int64_t> rank = zipf_expert_ranks(tensor_key, experts);
  std::vector<float> amplitude(static_cast<size_t>(rows), a);
  for (size_t e = 0; e < size_t(experts); ++e) amplitude[e] = a * scale[size_t(rank[e])];
  return amplitude;
}

}  // namespace lilac
