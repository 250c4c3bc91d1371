// The fused decode launch sequence of the bandwidth kernels (gemv_rms, gemv accumulate, moe_router,
// moe_gate_up_gemv, moe_down_gemv, then gemv_rms for the head, argmax and sample), as
// CudaBackend::layer_decode / decode_launches issue it, over several layers whose residual h
// evolves (so the router picks different experts per layer): captured in a CUDA graph with
// programmatic dependent launch (launch.h) and replayed, it must give the same bits as the same
// launches run eagerly without PDL. A missing pdl_wait before a dependent access shows here as a
// (possibly intermittent) difference; the graph is replayed several times.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/launch.h"
#include "cuda/linear.h"
#include "cuda/moe_decode.h"
#include "cuda/sampling.h"
#include "cuda_test_util.h"
#include "kernel_check.h"

namespace lilac::test {
namespace {

struct Sequence {
  // Real H and expert shapes; fewer experts and shorter projections than the model (memory).
  static constexpr int H = 2048, E = 32, k = 8, I = 512, Is = 512, Rin = 4096, Mix = 4096, V = 8192;
  static constexpr int kLayers = 6;
  static constexpr float kEps = 1e-6f;
  cuda::DeviceBuffer<cuda::bf16> in_proj, out_proj, router, gate_up, down, sgu, sdown, lm_head, mix;
  cuda::DeviceBuffer<float> norm1, norm2, norm3;
  // Activations.
  cuda::DeviceBuffer<float> h, proj, logits_r, topk_w, logits;
  cuda::DeviceBuffer<int32_t> topk_idx, token;
  cuda::DeviceBuffer<cuda::bf16> x, act;
  cuda::DeviceBuffer<uint8_t> router_ws, argmax_ws, sample_ws;
  cuda::DeviceBuffer<cuda::DeviceSamplingParams> params;
  cuda::DeviceBuffer<cuda::DeviceSampleResult> result;
  std::vector<float> h0;

  Sequence() {
    in_proj = upload_bf16(random_bf16(size_t(Rin) * H, 0.05f, 1));
    out_proj = upload_bf16(random_bf16(size_t(H) * Mix, 0.02f, 2));
    router = upload_bf16(random_bf16(size_t(E + 1) * H, 0.05f, 3));
    gate_up = upload_bf16(random_bf16(size_t(E) * 2 * I * H, 0.05f, 4));
    down = upload_bf16(random_bf16(size_t(E) * H * I, 0.05f, 5));
    sgu = upload_bf16(random_bf16(size_t(2) * Is * H, 0.05f, 6));
    sdown = upload_bf16(random_bf16(size_t(H) * Is, 0.05f, 7));
    lm_head = upload_bf16(random_bf16(size_t(V) * H, 0.05f, 8));
    mix = upload_bf16(random_bf16(size_t(Mix), 1.f, 9));
    auto scale = [](uint32_t seed) {
      std::vector<float> s = random_floats(size_t(H), 0.1f, seed);
      for (auto& v : s) v += 1.f;
      return upload(s);
    };
    norm1 = scale(10);
    norm2 = scale(11);
    norm3 = scale(12);
    h0 = random_floats(size_t(H), 1.f, 13);
    h = upload(h0);
    proj.resize(size_t(Rin));
    logits_r.resize(size_t(E + 1));
    topk_w.resize(size_t(k));
    topk_idx.resize(size_t(k));
    logits.resize(size_t(V));
    token.resize(1);
    x.resize(size_t(H));
    act.resize(size_t(k) * I + Is);
    std::vector<uint8_t> z(cuda::moe_router_workspace_bytes(), 0);
    router_ws = upload(z);
    argmax_ws.resize(cuda::argmax_workspace_bytes(V));
    LILAC_CUDA_CHECK(cudaMemset(argmax_ws.get(), 0, argmax_ws.bytes()));
    sample_ws.resize(cuda::sample_workspace_bytes(V));
    LILAC_CUDA_CHECK(cudaMemset(sample_ws.get(), 0, sample_ws.bytes()));
    cuda::DeviceSamplingParams p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 5;
    p.top_logprobs = 3;
    params = upload(std::vector<cuda::DeviceSamplingParams>{p});
    result.resize(1);
  }

  // Resets the state a replay starts from (outside any capture).
  void reset(cudaStream_t s) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(h.get(), h0.data(), h0.size() * 4, cudaMemcpyHostToDevice, s));
  }

  void launches(cudaStream_t s) {
    for (int l = 0; l < kLayers; ++l) {
      cuda::gemv_rms(in_proj.get(), Rin, H, h.get(), norm1.get(), kEps, proj.get(),
                     cuda::GemvOut::Store, s);
      // (the mixer would read proj; the out projection's input stands in for its output)
      cuda::gemv(out_proj.get(), H, Mix, mix.get(), h.get(), cuda::GemvOut::Accumulate, s);
      cuda::moe_router(router.get(), E, H, h.get(), norm2.get(), kEps, k, logits_r.get(),
                       topk_idx.get(), topk_w.get(), x.get(), router_ws.get(), s);
      cuda::moe_gate_up_gemv(gate_up.get(), sgu.get(), topk_idx.get(), k, x.get(), H, I, Is,
                             act.get(), s);
      cuda::moe_down_gemv(down.get(), sdown.get(), topk_idx.get(), topk_w.get(), logits_r.get() + E,
                          act.get(), k, H, I, Is, h.get(), s);
    }
    cuda::gemv_rms(lm_head.get(), V, H, h.get(), norm3.get(), kEps, logits.get(),
                   cuda::GemvOut::Store, s);
    cuda::argmax(logits.get(), V, argmax_ws.get(), token.get(), s);
    cuda::sample(logits.get(), V, params.get(), nullptr, nullptr, sample_ws.get(), result.get(), s);
  }

  struct Out {
    std::vector<float> h, proj, logits;
    std::vector<int32_t> idx, token;
    std::vector<uint8_t> result;
  };
  Out read(cudaStream_t s) {
    LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
    Out o{download(h), download(proj), download(logits), download(topk_idx), download(token), {}};
    o.result.resize(sizeof(cuda::DeviceSampleResult));
    LILAC_CUDA_CHECK(
        cudaMemcpy(o.result.data(), result.get(), o.result.size(), cudaMemcpyDeviceToHost));
    return o;
  }
};

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b,
                                     const char* what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0)
      return ::testing::AssertionFailure()
             << what << " differs first at [" << i << "]: " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

TEST(CudaDecodeSequence, GraphWithPdlEqualsPlainLaunches) {
  LILAC_REQUIRE_GPU();
  Sequence seq;
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Reference: eager launches, no PDL.
  Sequence::Out want;
  {
    cuda::ScopedPdl off(false);
    seq.reset(s);
    seq.launches(s);
    want = seq.read(s);
  }
  // Sanity: the state moved and the routing is a valid set.
  EXPECT_FALSE(same_bits(want.h, seq.h0, "h").operator bool()) << "the layers did not change h";
  for (int32_t e : want.idx) EXPECT_TRUE(e >= 0 && e < Sequence::E) << e;

  // Eager launches with PDL (where the device supports it).
  {
    cuda::ScopedPdl on(true);
    seq.reset(s);
    seq.launches(s);
    Sequence::Out got = seq.read(s);
    EXPECT_TRUE(same_bits(got.h, want.h, "eager PDL h"));
    EXPECT_TRUE(same_bits(got.logits, want.logits, "eager PDL logits"));
    EXPECT_EQ(got.token, want.token);
    EXPECT_EQ(got.result, want.result);
  }

  // The L2 prefetch hints switched the other way round (they must not change a bit).
  {
    cuda::ScopedPdl on(true);
    const bool prefetch = cuda::l2_prefetch_enabled();
    cuda::set_l2_prefetch_enabled(!prefetch);
    seq.reset(s);
    seq.launches(s);
    Sequence::Out got = seq.read(s);
    cuda::set_l2_prefetch_enabled(prefetch);
    EXPECT_TRUE(same_bits(got.h, want.h, "switched prefetch h"));
    EXPECT_TRUE(same_bits(got.logits, want.logits, "switched prefetch logits"));
    EXPECT_EQ(got.result, want.result);
  }

  // One graph with PDL edges, replayed several times from the same state.
  cuda::ScopedPdl on(true);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  seq.launches(s);
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  int with_wait = 0, without = 0;
  cuda::pdl_kernel_counts(&with_wait, &without);
  std::printf("  PDL %s: %d kernels launched with it, %d without (no wait in their machine code)\n",
              cuda::pdl_enabled() ? "on" : "off (device)", with_wait, without);
  for (int replay = 0; replay < 5; ++replay) {
    SCOPED_TRACE(testing::Message() << "graph replay " << replay);
    seq.reset(s);
    LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s));
    Sequence::Out got = seq.read(s);
    EXPECT_TRUE(same_bits(got.h, want.h, "h"));
    EXPECT_TRUE(same_bits(got.proj, want.proj, "proj"));
    EXPECT_TRUE(same_bits(got.logits, want.logits, "logits"));
    EXPECT_EQ(got.idx, want.idx);
    EXPECT_EQ(got.token, want.token);
    EXPECT_EQ(got.result, want.result) << "sample result";
  }
  LILAC_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LILAC_CUDA_CHECK(cudaGraphDestroy(graph));
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace lilac::test
