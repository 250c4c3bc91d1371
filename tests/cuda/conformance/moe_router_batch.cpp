// Conformance cases of moe_router_route (src/cuda/moe_router_batch.cu): the batched step's post
// norm, 4/8-bit router, top-k and routing tables in one cluster launch, held bit for bit to the
// launches it replaces, rms_norm + q_gemv_rows + moe_route (each held to its CPU twin by its own
// cases: conformance norm.cpp, rows.cpp, moe_prefill.cpp), on the same inputs: x, the logits and
// every routing table compared byte for byte, the outputs poisoned first and guarded past their
// ends. Shapes: the model's router (E 256, k 8, H 2048, 8 bits: 8 ranks of 4 groups) at 1-32 rows
// and at 4 bits (4 ranks of 8), then awkward ones: one rank (H 192), a short last rank (H 320: 4 +
// 1 groups), E + 1 rows in one tile (E 8), k = E, k = 32, few experts per rank's tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../q4_test_util.h"
#include "conformance.h"
#include "cuda/moe_prefill.h"
#include "cuda/moe_router_batch.h"
#include "cuda/norm.h"
#include "cuda/q4_linear.h"

namespace lilac::test {
namespace {

using cuda::DeviceBuffer;

struct RouterRouteCase {
  int B, E, k, H, bits;
  uint32_t seed;
};

template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& got, const std::vector<T>& want,
                                      const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure()
             << what << ": first difference at [" << i << "] of " << got.size();
  return ::testing::AssertionSuccess();
}

struct Routing {
  DeviceBuffer<uint8_t> buf;
  cuda::MoeRouting r;
  Routing(int T, int E, int k) : buf(cuda::moe_routing_workspace_bytes(T, E, k)) {
    poison(buf);
    r = cuda::moe_routing_layout(buf.get(), T, E, k);
  }
};

// Every table moe_route writes (the multi-kernel path's scratch arrays are not compared: neither
// the one-block paths nor the fused kernel write them).
void expect_same_routing(const cuda::MoeRouting& got, const cuda::MoeRouting& want) {
  const size_t P = size_t(want.T) * want.k;
  EXPECT_TRUE(same_bytes(download_n(got.topk_idx, P), download_n(want.topk_idx, P), "topk_idx"));
  EXPECT_TRUE(
      same_bytes(download_n(got.topk_weight, P), download_n(want.topk_weight, P), "topk_weight"));
  EXPECT_TRUE(same_bytes(download_n(got.expert_offsets, size_t(want.E) + 1),
                         download_n(want.expert_offsets, size_t(want.E) + 1), "expert_offsets"));
  EXPECT_TRUE(same_bytes(download_n(got.sorted_token, P), download_n(want.sorted_token, P),
                         "sorted_token"));
  EXPECT_TRUE(same_bytes(download_n(got.sorted_weight, P), download_n(want.sorted_weight, P),
                         "sorted_weight"));
  EXPECT_TRUE(same_bytes(download_n(got.pair_position, P), download_n(want.pair_position, P),
                         "pair_position"));
  const int tiles = download_n(want.num_tiles, 1)[0];
  ASSERT_EQ(download_n(got.num_tiles, 1)[0], tiles) << "num_tiles";
  EXPECT_TRUE(same_bytes(download_n(got.tile_expert, size_t(tiles)),
                         download_n(want.tile_expert, size_t(tiles)), "tile_expert"));
  EXPECT_TRUE(same_bytes(download_n(got.tile_row0, size_t(tiles)),
                         download_n(want.tile_row0, size_t(tiles)), "tile_row0"));
}

void check_router_route(const RouterRouteCase& c) {
  uint64_t seed = c.seed;
  const HostQ W(c.E + 1, c.H, c.bits, std::sqrt(3.f / float(c.H)), ++seed);
  ASSERT_TRUE(cuda::moe_router_route_supported(W.q(), c.B, c.E, c.k));
  const size_t nx = size_t(c.B) * c.H, nl = size_t(c.B) * (c.E + 1), guard = 37;
  auto dh = upload(random_floats(nx, 3.f, uint32_t(++seed)));
  std::vector<float> scale = random_floats(size_t(c.H), 0.5f, uint32_t(++seed));
  for (float& s : scale) s += 1.f;
  auto ds = upload(scale);
  const float eps = 1e-6f;

  // The launches it replaces.
  DeviceBuffer<cuda::bf16> x1(nx);
  DeviceBuffer<float> l1(nl);
  Routing r1(c.B, c.E, c.k);
  cuda::rms_norm(dh.get(), ds.get(), x1.get(), c.B, c.H, eps, nullptr);
  cuda::q_gemv_rows(W.q(), x1.get(), c.B, l1.get(), cuda::GemvOut::Store, nullptr);
  cuda::moe_route(l1.get(), c.E + 1, c.B, c.E, c.k, r1.r, nullptr);

  // Twice on the same buffers: nothing carried over from the first launch.
  DeviceBuffer<cuda::bf16> x2(nx + guard);
  DeviceBuffer<float> l2(nl + guard);
  Routing r2(c.B, c.E, c.k);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    poison(x2);
    poison(l2);
    poison(r2.buf);
    cuda::moe_router_route(W.q(), dh.get(), ds.get(), eps, c.B, c.E, c.k, l2.get(), x2.get(), r2.r,
                           nullptr);
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    const auto xg = download(x2);
    const auto lg = download(l2);
    EXPECT_TRUE(guard_untouched(xg, nx, "x"));
    EXPECT_TRUE(guard_untouched(lg, nl, "logits"));
    EXPECT_TRUE(same_bytes(std::vector<cuda::bf16>(xg.begin(), xg.begin() + ptrdiff_t(nx)),
                           download(x1), "x (rms_norm)"));
    EXPECT_TRUE(same_bytes(std::vector<float>(lg.begin(), lg.begin() + ptrdiff_t(nl)), download(l1),
                           "logits (q_gemv_rows)"));
    expect_same_routing(r2.r, r1.r);
  }
}

// What the fused kernel refuses (the backend then launches the three kernels).
void check_refusals() {
  const HostQ W(257, 2048, 8, 0.03f, 7);
  EXPECT_TRUE(cuda::moe_router_route_supported(W.q(), 32, 256, 8));
  EXPECT_FALSE(cuda::moe_router_route_supported(W.q(), 33, 256, 8));  // > 32 rows
  EXPECT_FALSE(cuda::moe_router_route_supported(W.q(), 0, 256, 8));
  EXPECT_FALSE(cuda::moe_router_route_supported(W.q(), 16, 255, 8));   // rows != E + 1
  EXPECT_FALSE(cuda::moe_router_route_supported(W.q(), 16, 256, 33));  // k > 32
  const HostQ wide(257, 2112, 8, 0.03f, 8);  // H > 2,048: rms_norm's threads sum two chunks
  EXPECT_FALSE(cuda::moe_router_route_supported(wide.q(), 16, 256, 8));
  const HostQ many(301, 2048, 8, 0.03f, 9);  // E 300 > 256
  EXPECT_FALSE(cuda::moe_router_route_supported(many.q(), 16, 300, 8));
}

LILAC_CONFORMANCE_CASES(moe_router_batch) {
  std::vector<OpCase> cases;
  uint32_t seed = 3100;
  auto add = [&](const std::string& shape, RouterRouteCase c) {
    c.seed = seed += 4;
    cases.push_back({"moe_router_route", shape, c.bits == 4 ? "q4" : "q8",
                     "rms_norm + q_gemv_rows + moe_route (bit for bit)",
                     [c] { check_router_route(c); }});
  };
  for (int B : {1, 2, 7, 8, 9, 13, 16, 17, 24, 31, 32})
    add("model_B" + std::to_string(B), {B, 256, 8, 2048, 8, 0});
  for (int B : {3, 16, 32}) add("model_B" + std::to_string(B), {B, 256, 8, 2048, 4, 0});
  add("one_rank_E33_k3_H192_B13", {13, 33, 3, 192, 8, 0});
  add("short_rank_E100_k6_H320_B32", {32, 100, 6, 320, 8, 0});
  add("short_rank_E100_k6_H320_B5", {5, 100, 6, 320, 4, 0});
  add("one_tile_E8_k2_H128_B32", {32, 8, 2, 128, 8, 0});
  add("k_equals_E_E4_H256_B9", {9, 4, 4, 256, 8, 0});
  add("k32_E64_H2048_B16", {16, 64, 32, 2048, 8, 0});
  add("E200_k8_H1024_B31", {31, 200, 8, 1024, 8, 0});
  cases.push_back({"moe_router_route", "refusals", "q8", "moe_router_route_supported",
                   [] { check_refusals(); }});
  return cases;
}

}  // namespace
}  // namespace lilac::test
