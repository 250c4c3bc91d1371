// moe_route on the device with its tables brought back to the host, for the grouped MoE kernel
// tests (moe_route itself is held to a counting sort by conformance/moe_prefill.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/moe_prefill.h"
#include "cuda_test_util.h"

namespace lilac::test {

// Routes T tokens by logits [T, E + 1] (top k of the first E columns): the device tables in `r`
// (valid while this object lives), and on the host each sorted row's token and expert and each
// expert's first sorted row (offsets [E + 1]).
struct DeviceRouting {
  cuda::DeviceBuffer<uint8_t> workspace;
  cuda::MoeRouting r;
  std::vector<int32_t> sorted_token, offsets, expert_of;

  DeviceRouting(const std::vector<float>& logits, int T, int E, int k)
      : workspace(cuda::moe_routing_workspace_bytes(T, E, k)),
        r(cuda::moe_routing_layout(workspace.get(), T, E, k)),
        sorted_token(static_cast<size_t>(T) * size_t(k)),
        offsets(size_t(E) + 1),
        expert_of(static_cast<size_t>(T) * size_t(k)) {
    auto dlog = upload(logits);
    cuda::moe_route(dlog.get(), E + 1, T, E, k, r, nullptr);
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    LILAC_CUDA_CHECK(cudaMemcpy(sorted_token.data(), r.sorted_token, sorted_token.size() * 4,
                                cudaMemcpyDeviceToHost));
    LILAC_CUDA_CHECK(
        cudaMemcpy(offsets.data(), r.expert_offsets, offsets.size() * 4, cudaMemcpyDeviceToHost));
    for (int e = 0; e < E; ++e)
      for (int i = offsets[size_t(e)]; i < offsets[size_t(e) + 1]; ++i) expert_of[size_t(i)] = e;
  }
};

}  // namespace lilac::test
