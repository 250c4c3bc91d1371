// The zipf router of the synthetic model on the GPU (label gpu): the device generates the same
// router rows as the host twin (synthetic_row_amplitudes, the same amplitude per row on both),
// and the routing the running model makes is skewed by rank in every layer, measured on the
// model's own hidden states (the moe.topk_ids trace of a 1024-token prefill through the first
// four layers of the full-size architecture).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/synthetic.h"
#include "cuda_test_util.h"
#include "model/qwen36.h"
#include "model/synthetic_router.h"

namespace lilac::test {
namespace {

TEST(SyntheticRouterGpu, ZipfRouterMatchesTheHostTwinAndSkewsEveryLayer) {
  LILAC_REQUIRE_GPU();
  const ModelConfig cfg = qwen36_35b_a3b_config();
  const int64_t layers = 4, E = cfg.experts, H = cfg.hidden, k = cfg.experts_per_token;
  const uint64_t seed = 5;
  auto host = cuda::synthetic_host_model(cfg, seed, layers, false, SyntheticRouter::Zipf);
  auto dm = std::shared_ptr<cuda::DeviceModel>(
      cuda::synthetic_device_model(host->config, seed, false, SyntheticRouter::Zipf));
  for (int64_t i = 0; i < layers; ++i) {
    std::vector<uint16_t> dev(size_t((E + 1) * H));
    ASSERT_EQ(cudaMemcpy(dev.data(), dm->layers[size_t(i)].router.dense, dev.size() * 2,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    // The host twin's router and shared-expert gate are rows of one fused buffer, as on the device.
    const auto* want =
        static_cast<const uint16_t*>(host->weights.layers[size_t(i)].moe.router.data);
    EXPECT_EQ(std::memcmp(dev.data(), want, dev.size() * 2), 0) << "layer " << i;
  }

  cuda::CudaBackend backend(dm, cuda::CudaOptions{});
  std::vector<std::vector<float>> ids(static_cast<size_t>(layers));
  backend.set_trace(
      [&](const std::string& name, const float* d, const std::vector<int64_t>& shape) {
        for (int64_t i = 0; i < layers; ++i)
          if (name == "layer" + std::to_string(i) + ".moe.topk_ids")
            ids[size_t(i)].insert(ids[size_t(i)].end(), d, d + shape[0] * shape[1]);  // per chunk
      });
  const int64_t T = 1024;
  std::vector<int32_t> prompt(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) prompt[size_t(t)] = int32_t(t * 241 % kQwen36RealTokens);
  std::vector<float> logits(size_t(cfg.vocab));
  auto seq = backend.new_sequence(T + 1);
  backend.forward(*seq, prompt, logits, false);
  backend.set_trace(nullptr);
  for (int64_t i = 0; i < layers; ++i) {
    ASSERT_EQ(ids[size_t(i)].size(), size_t(T * k)) << "layer " << i;
    const auto rank = zipf_expert_ranks(
        synthetic::tensor_key(seed, ("layers." + std::to_string(i) + ".router").c_str()), E);
    std::vector<double> by_rank(static_cast<size_t>(E));
    for (float id : ids[size_t(i)]) by_rank[size_t(rank[size_t(id)])] += 1;
    const double total = double(T * k);
    const double top = std::accumulate(by_rank.begin(), by_rank.begin() + E / 10, 0.0) / total;
    const double bottom = std::accumulate(by_rank.end() - E / 10, by_rank.end(), 0.0) / total;
    std::printf(
        "  layer %lld: rank 0 in %.1f%% of the tokens' top-8; top 10%% of experts %.1f%% "
        "of the selections, bottom 10%% %.1f%%\n",
        (long long)i, 100 * by_rank[0] / double(T), 100 * top, 100 * bottom);
    // Uniform routing: 3.1%, 10%, 10%. The CPU test (tests/model/synthetic_router_test.cpp)
    // measures about 25%, 40% and 1% on layer 0's inputs.
    EXPECT_GT(by_rank[0] / double(T), 0.12) << "layer " << i;
    EXPECT_GT(top, 0.25) << "layer " << i;
    EXPECT_LT(bottom, 0.05) << "layer " << i;
  }
}

}  // namespace
}  // namespace lilac::test
