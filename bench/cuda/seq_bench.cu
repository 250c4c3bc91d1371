// lilac_cuda_bench_seq: times the sequence-mixing kernels (attention, Gated DeltaNet) at the real
// model's shapes: heads 16, kv 2, hd 256, R 64; GDN Hk 16, Hv 32, Dk = Dv = 128, K 4.
// qk_norm_rope_store at T = 1: a CUDA graph of 20 launches rotating over 10 attention layers' KV
// caches, replayed >= 21 times with CUDA events, the median per launch. Prefill kernels: CUDA
// events around single launches after a warm-up, median of >= 20; gdn_prefill also per stage
// (prep, chunk, state, out). The decode kernels (attention_decode, gdn_decode), every version of
// them, are timed by the kernel lab (lilac_cuda_bench_lab, bench/lab). Usage: lilac_cuda_bench_seq.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "cpu/attention.h"
#include "cuda/attention.h"
#include "cuda/common.h"
#include "cuda/gated_deltanet.h"
#include "cuda/synthetic_fill.h"

using namespace lilac::cuda;

namespace {

cudaStream_t g_stream = nullptr;

// Median over `reps` runs of fn(i, stream) in microseconds, after `warm` untimed runs.
double time_us(const std::function<void(int, cudaStream_t)>& fn, int warm = 3, int reps = 21) {
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());  // fills and copies on the default stream are done
  cudaEvent_t a, b;
  LILAC_CUDA_CHECK(cudaEventCreate(&a));
  LILAC_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn(i, g_stream);
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    LILAC_CUDA_CHECK(cudaEventRecord(a, g_stream));
    fn(warm + i, g_stream);
    LILAC_CUDA_CHECK(cudaEventRecord(b, g_stream));
    LILAC_CUDA_CHECK(cudaEventSynchronize(b));
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], a, b));
  }
  LILAC_CUDA_CHECK(cudaEventDestroy(a));
  LILAC_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

// Per-launch time of fn(i, stream) inside a CUDA graph of `launches` launches (i = 0..launches-1),
// median over `replays` timed replays. Also proves the launcher is capturable.
double time_graph_us(const std::function<void(int, cudaStream_t)>& fn, int launches = 20,
                     int replays = 21) {
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < launches; ++i) fn(i, g_stream);  // warm-up outside the capture
  LILAC_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) fn(i, g_stream);
  LILAC_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us =
      time_us([&](int, cudaStream_t s) { LILAC_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 2, replays);
  LILAC_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LILAC_CUDA_CHECK(cudaGraphDestroy(graph));
  return us / launches;
}

uint64_t g_key = 1;
void fill(float* p, size_t n, float centre, float a) {
  fill_synthetic_f32(p, n, g_key++, centre, a, nullptr);
}
void fill(bf16* p, size_t n, float centre, float a) {
  fill_synthetic_bf16(p, n, g_key++, centre, a, nullptr);
}

constexpr int kHeads = 16, kKv = 2, kHd = 256, kR = 64, kMaxCtx = 131072, kAttnLayers = 10;

void bench_attention() {
  std::printf("\n== attention (heads %d, kv %d, hd %d)\n", kHeads, kKv, kHd);
  const size_t cache = size_t(kKv) * kMaxCtx * kHd;
  std::vector<DeviceBuffer<bf16>> kc, vc;
  for (int l = 0; l < kAttnLayers; ++l) {
    kc.emplace_back(cache);
    vc.emplace_back(cache);
    fill(kc.back().get(), cache, 0.f, 1.7f);
    fill(vc.back().get(), cache, 0.f, 1.7f);
  }
  DeviceBuffer<int32_t> pos(1);
  const int P = kHeads * 2 * kHd + 2 * kKv * kHd;
  const std::vector<float> inv_h = lilac::rope_inv_freq(1e7f, kR);
  DeviceBuffer<float> inv(inv_h.size()), qn(static_cast<size_t>(kHd)), kn(static_cast<size_t>(kHd));
  LILAC_CUDA_CHECK(cudaMemcpy(inv.get(), inv_h.data(), inv_h.size() * 4, cudaMemcpyHostToDevice));
  fill(qn.get(), qn.size(), 1.f, 0.1f);
  fill(kn.get(), kn.size(), 1.f, 0.1f);

  // qk_norm_rope_store: decode (T = 1) and a prefill chunk.
  for (int T : {1, 8192}) {
    DeviceBuffer<float> qkv(size_t(T) * P);
    fill(qkv.get(), qkv.size(), 0.f, 1.7f);
    DeviceBuffer<bf16> qb(size_t(T) * kHeads * kHd), gb(qb.size());
    const int p = 0;
    LILAC_CUDA_CHECK(cudaMemcpy(pos.get(), &p, 4, cudaMemcpyHostToDevice));
    const auto launch = [&](int i, cudaStream_t s) {
      qk_norm_rope_store(qkv.get(), T, pos.get(), qn.get(), kn.get(), inv.get(), kHeads, kKv, kHd,
                         kR, 1e-6f, qb.get(), gb.get(), kc[size_t(i % kAttnLayers)].get(),
                         vc[size_t(i % kAttnLayers)].get(), kMaxCtx, s);
    };
    const double us = T == 1 ? time_graph_us(launch) : time_us(launch);
    const double bytes = double(T) * (P * 4.0 + 2.0 * kHeads * kHd * 2 + 2.0 * kKv * kHd * 2);
    std::printf("qk_norm_rope_store T=%-6d %10.2f us %8.0f GB/s\n", T, us, bytes / us * 1e-3);
  }

  // Prefill: causal, FLOPs = 4 hd heads sum_t (pos0 + t + 1). Version 1 (mma.sync) and, on a
  // GPU that has them, versions 2-4 (wgmma; 3 with the softmax overlapped, 4 warp-specialised, 5
  // ping-pong) at each shape, one after the other.
  std::printf("attention_prefill\n%8s %8s %8s %12s %10s\n", "version", "T", "pos0", "ms",
              "TFLOP/s");
  struct Case {
    int T, pos0;
  };
  const bool v2 = attention_prefill_wgmma_supported(kHd);
  for (const Case c : {Case{512, 0}, Case{4096, 0}, Case{16384, 0}, Case{8192, kMaxCtx - 8192}}) {
    DeviceBuffer<bf16> qp(size_t(c.T) * kHeads * kHd), gp(qp.size()), op(qp.size());
    fill(qp.get(), qp.size(), 0.f, 1.7f);
    fill(gp.get(), gp.size(), 0.f, 1.7f);
    for (int version = 1; version <= (v2 ? 5 : 1); ++version) {
      const double us = time_us(
          [&](int, cudaStream_t s) {
            attention_prefill(qp.get(), gp.get(), kc[0].get(), vc[0].get(), c.pos0, c.T, kHeads,
                              kKv, kHd, kMaxCtx, op.get(), s, version);
          },
          2, 20);
      const double flops =
          4.0 * kHd * kHeads * (double(c.T) * c.pos0 + double(c.T) * (c.T + 1) / 2);
      std::printf("%8d %8d %8d %12.3f %10.1f\n", version, c.T, c.pos0, us * 1e-3,
                  flops / us * 1e-6);
    }
  }
}

constexpr int kHk = 16, kHv = 32, kDk = 128, kDv = 128, kK = 4;
constexpr int kC = 2 * kHk * kDk + kHv * kDv, kP = kC + kHv * kDv + 2 * kHv;

struct GdnLayer {
  DeviceBuffer<float> taps{size_t(kC) * kK}, neg_exp_A{size_t(kHv)}, dt_bias{size_t(kHv)},
      norm_w{size_t(kDv)};
  DeviceBuffer<float> conv{size_t(kK - 1) * kC}, state{size_t(kHv) * kDk * kDv};
  GdnLayer() {
    fill(taps.get(), taps.size(), 0.f, 0.5f);
    fill(neg_exp_A.get(), neg_exp_A.size(), -1.f, 0.5f);
    fill(dt_bias.get(), dt_bias.size(), 0.f, 0.5f);
    fill(norm_w.get(), norm_w.size(), 1.f, 0.1f);
    fill(conv.get(), conv.size(), 0.f, 1.f);
    fill(state.get(), state.size(), 0.f, 0.3f);
  }
};

void bench_gdn() {
  std::printf("\n== gated deltanet (Hk %d, Hv %d, Dk %d, Dv %d, K %d)\n", kHk, kHv, kDk, kDv, kK);
  std::vector<GdnLayer> layers(1);
  std::printf(
      "gdn_prefill (stages: median of the per-launch event times)\n%8s %10s %14s %9s %9s %9s %9s\n",
      "T", "ms", "tokens/s/layer", "prep", "chunk", "state", "out");
  cudaEvent_t ev[5];
  for (auto& e : ev) LILAC_CUDA_CHECK(cudaEventCreate(&e));
  for (int T : {256, 512, 4096, 65536}) {
    DeviceBuffer<float> pp(size_t(T) * kP);
    fill(pp.get(), pp.size(), 0.f, 1.7f);
    DeviceBuffer<float> pws(gdn_prefill_workspace_floats(T, kHk, kHv, kDk, kDv));
    DeviceBuffer<bf16> po(size_t(T) * kHv * kDv);
    GdnLayer& L = layers[0];
    const auto launch = [&](cudaStream_t s, const cudaEvent_t* events) {
      gdn_prefill(pp.get(), T, L.taps.get(), L.conv.get(), L.neg_exp_A.get(), L.dt_bias.get(),
                  L.norm_w.get(), L.state.get(), kHk, kHv, kDk, kDv, kK, 1e-6f, pws.get(), po.get(),
                  s, events);
    };
    const double t_us = time_us([&](int, cudaStream_t s) { launch(s, nullptr); }, 2, 20);
    // Stage times: separate runs with events between the launches (median per stage).
    std::vector<std::vector<float>> st(4);
    for (int rep = 0; rep < 11; ++rep) {
      launch(g_stream, ev);
      LILAC_CUDA_CHECK(cudaEventSynchronize(ev[4]));
      for (int i = 0; i < 4; ++i) {
        float ms = 0.f;
        LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
        st[size_t(i)].push_back(ms);
      }
    }
    double med[4];
    for (int i = 0; i < 4; ++i) {
      std::sort(st[size_t(i)].begin(), st[size_t(i)].end());
      med[i] = st[size_t(i)][st[size_t(i)].size() / 2];
    }
    std::printf("%8d %10.3f %14.0f %9.3f %9.3f %9.3f %9.3f\n", T, t_us * 1e-3, T / t_us * 1e6,
                med[0], med[1], med[2], med[3]);
  }
  for (auto& e : ev) LILAC_CUDA_CHECK(cudaEventDestroy(e));
}

}  // namespace

int main() {
  try {
    int dev = 0;
    cudaDeviceProp prop{};
    LILAC_CUDA_CHECK(cudaGetDevice(&dev));
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("lilac_cuda_bench_seq on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    bench_attention();
    bench_gdn();
    LILAC_CUDA_CHECK(cudaStreamDestroy(g_stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
