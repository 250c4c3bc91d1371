// lilac_cuda_bench_kernels: times the decode bandwidth kernels (norm, linear, moe_decode, sampling)
// at the real model's shapes, then whole decode layers. Each kernel measurement captures a CUDA
// graph of kReps launches that rotate over input copies totalling more than 2x the 60 MB L2 (so
// weights come from HBM, as in decode), warms it up, replays it >= 50 times timed with CUDA events,
// and reports the median per launch, the bytes a launch must move, GB/s and % of the 4.3 TB/s copy
// bandwidth; with programmatic dependent launch (launch.h) on, consecutive launches overlap (as
// consecutive kernels of a decode step do), and the "no PDL" column repeats the measurement without
// it. The layer section (kernels_bench_layers.cpp) times the production decode layer,
// CudaBackend::decode_layer, per layer kind on the full-size synthetic model (BF16 and 4-bit).
// Usage: lilac_cuda_bench_kernels [--runs N] [--filter SUBSTRING] [--context N]
// [--weights bf16|q4|both]. Prints tables; the numbers are recorded in docs/kernels.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_timing.h"
#include "cuda/common.h"
#include "cuda/gemv_rows.h"
#include "cuda/launch.h"
#include "cuda/linear.h"
#include "cuda/moe_decode.h"
#include "cuda/norm.h"
#include "cuda/sampling.h"
#include "kernels_bench_layers.h"

namespace {

using lilac::cuda::bf16;
using lilac::cuda::DeviceBuffer;

constexpr double kCopyBandwidth = 4.3e12;    // bytes/s, the measured H200 device-to-device copy
constexpr size_t kRotateBytes = 160u << 20;  // > 2x L2
constexpr int kReps = 20;                    // launches per graph

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(uint32_t(mix64(seed ^ mix64(i)) >> 40)) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn(a * (2.f * u - 1.f));
  }
}

__global__ void fill_f32(float* p, size_t n, uint64_t seed, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(uint32_t(mix64(seed ^ mix64(i)) >> 40)) * (1.0f / 16777216.0f);
    p[i] = a * (2.f * u - 1.f);
  }
}

template <typename T>
DeviceBuffer<T> random_buffer(size_t n, uint64_t seed, float a) {
  DeviceBuffer<T> b(n);
  if constexpr (std::is_same_v<T, bf16>)
    fill_bf16<<<1024, 256>>>(b.get(), n, seed, a);
  else
    fill_f32<<<1024, 256>>>(b.get(), n, seed, a);
  LILAC_CUDA_LAUNCHED();
  return b;
}

int copies_for(size_t bytes) {
  return int(std::max<size_t>(1, (kRotateBytes + bytes - 1) / bytes));
}

struct Options {
  int runs = 100;
  std::string filter;
  int context = 256;
  std::string weights = "both";  // the layer section's model
};

// Median time of one replay of a graph holding everything `record` launches on s.
double time_graph(cudaStream_t s, const Options& opt, const std::function<void()>& record) {
  return lilac::bench::median_graph_replay_seconds(s, opt.runs, record);
}

// Median time of one launch of `launch(rep)` (rep = 0..kReps-1 picks the rotated inputs), in a
// captured graph of kReps launches; with PDL as set now.
double time_launch(cudaStream_t s, const Options& opt, const std::function<void(int)>& launch) {
  return time_graph(s, opt,
                    [&] {
                      for (int r = 0; r < kReps; ++r) launch(r);
                    }) /
         kReps;
}

// The same with PDL on, and off: {with, without}.
std::pair<double, double> time_both(cudaStream_t s, const Options& opt,
                                    const std::function<void(int)>& launch) {
  double with_pdl, without;
  {
    lilac::cuda::ScopedPdl on(true);
    with_pdl = time_launch(s, opt, launch);
  }
  {
    lilac::cuda::ScopedPdl off(false);
    without = time_launch(s, opt, launch);
  }
  return {with_pdl, without};
}

void report(const char* name, const std::string& shape, double bytes, std::pair<double, double> t) {
  const double seconds = t.first;
  const double gbs = bytes / seconds / 1e9;
  std::printf("%-26s %-28s %9.2f MB %9.2f us %7.0f GB/s %6.1f%% %9.2f us\n", name, shape.c_str(),
              bytes / 1e6, seconds * 1e6, gbs, 100.0 * bytes / seconds / kCopyBandwidth,
              t.second * 1e6);
  std::fflush(stdout);
}

bool wanted(const Options& opt, const std::string& name) {
  return opt.filter.empty() || name.find(opt.filter) != std::string::npos;
}

// mode: 0 Store, 1 Accumulate, 2 bf16 out, 3 gemv_rms Store (the norm fused: h and scale, 16 KB
// more from L2 per block, not counted).
void bench_gemv(cudaStream_t s, const Options& opt, const char* name, int rows, int cols,
                int mode) {
  if (!wanted(opt, name)) return;
  const size_t wbytes = size_t(rows) * cols * 2;
  const int copies = copies_for(wbytes);
  std::vector<DeviceBuffer<bf16>> W;
  for (int c = 0; c < copies; ++c)
    W.push_back(random_buffer<bf16>(size_t(rows) * cols, 11 + c, 0.05f));
  auto x = random_buffer<bf16>(size_t(cols), 3, 1.f);
  auto y = random_buffer<float>(size_t(rows), 4, 1.f);
  auto h = random_buffer<float>(size_t(cols), 5, 1.f);
  auto scale = random_buffer<float>(size_t(cols), 6, 0.1f);
  DeviceBuffer<bf16> yb(static_cast<size_t>(rows));
  const auto t = time_both(s, opt, [&](int r) {
    const bf16* w = W[size_t(r % copies)].get();
    if (mode == 2)
      lilac::cuda::gemv_bf16out(w, rows, cols, x.get(), yb.get(), s);
    else if (mode == 3)
      lilac::cuda::gemv_rms(w, rows, cols, h.get(), scale.get(), 1e-6f, y.get(),
                            lilac::cuda::GemvOut::Store, s);
    else
      lilac::cuda::gemv(w, rows, cols, x.get(), y.get(),
                        mode == 1 ? lilac::cuda::GemvOut::Accumulate : lilac::cuda::GemvOut::Store,
                        s);
  });
  const double bytes = double(wbytes) + cols * (mode == 3 ? 8.0 : 2.0) +
                       rows * (mode == 1   ? 8.0
                               : mode == 2 ? 2.0
                                           : 4.0);
  report(name, std::to_string(rows) + " x " + std::to_string(cols), bytes, t);
}

// gemv_rows (BF16 projections of a batched decode step) over T rows, with the launcher's K-slice
// count and each other one (slices 1..16): which split the weights stream best under.
void bench_gemv_rows(cudaStream_t s, const Options& opt, const char* name, int rows, int cols,
                     bool acc, int T) {
  const std::string label = std::string("gemv_rows ") + name + " T=" + std::to_string(T);
  if (!wanted(opt, label)) return;
  const size_t wbytes = size_t(rows) * cols * 2;
  const int copies = copies_for(wbytes);
  std::vector<DeviceBuffer<bf16>> W;
  for (int c = 0; c < copies; ++c)
    W.push_back(random_buffer<bf16>(size_t(rows) * cols, 11 + c, 0.05f));
  auto x = random_buffer<bf16>(size_t(T) * cols, 3, 1.f);
  auto y = random_buffer<float>(size_t(T) * rows, 4, 1.f);
  for (int S : {0, 1, 2, 4, 8, 16})
    for (bool staged : {true, false}) {  // the staged form applies at S <= 8 (gemv_rows.h)
      if (S == 16 && (T > 32 || !staged)) continue;
      lilac::cuda::set_gemv_rows_staged_enabled(staged);
      const auto t = time_both(s, opt, [&](int r) {
        lilac::cuda::gemv_rows(W[size_t(r % copies)].get(), rows, cols, x.get(), T, y.get(),
                               acc ? lilac::cuda::GemvOut::Accumulate
                                   : lilac::cuda::GemvOut::Store,
                               s, S);
      });
      const std::string shape = std::to_string(rows) + " x " + std::to_string(cols) +
                                (S ? " S=" + std::to_string(S) : " S=auto") +
                                (staged ? "" : " unstaged");
      report(label.c_str(), shape, double(wbytes), t);
    }
  lilac::cuda::set_gemv_rows_staged_enabled(true);
}

void bench_moe(cudaStream_t s, const Options& opt) {
  const int H = 2048, E = 256, k = 8, I = 512, Is = 512;
  auto gate_up =
      random_buffer<bf16>(size_t(E) * 2 * I * H, 21, 0.05f);  // 1.07 GB: never L2-resident
  auto down = random_buffer<bf16>(size_t(E) * H * I, 22, 0.05f);
  auto sgu = random_buffer<bf16>(size_t(2) * Is * H, 23, 0.05f);
  auto sdown = random_buffer<bf16>(size_t(H) * Is, 24, 0.05f);
  auto x = random_buffer<bf16>(size_t(H), 25, 1.f);
  auto h = random_buffer<float>(size_t(H), 26, 1.f);
  // kReps different expert sets (distinct experts within a set), and their weights.
  std::vector<int32_t> idx(size_t(kReps) * k);
  std::vector<float> w(size_t(kReps) * k, 1.f / k);
  uint64_t z = 12345;
  for (int r = 0; r < kReps; ++r)
    for (int j = 0; j < k; ++j) {
      int e;
      bool dup;
      do {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        e = int((z >> 33) % E);
        dup = false;
        for (int q = 0; q < j; ++q) dup |= idx[size_t(r) * k + q] == e;
      } while (dup);
      idx[size_t(r) * k + j] = e;
    }
  DeviceBuffer<int32_t> didx(idx.size());
  DeviceBuffer<float> dw(w.size());
  LILAC_CUDA_CHECK(cudaMemcpy(didx.get(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  auto logits = random_buffer<float>(size_t(kReps) * (E + 1), 27, 3.f);
  DeviceBuffer<bf16> act(size_t(k) * I + Is);
  if (wanted(opt, "router_topk")) {
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::router_topk(logits.get() + size_t(r) * (E + 1), E + 1, 1, E, k,
                               didx.get() + size_t(r) * k, dw.get() + size_t(r) * k, s);
    });
    report("router_topk", "E 256, k 8, T 1", (E + 1) * 4.0 + k * 8.0, t);
    // router_topk rewrote the sets from random logits: restore distinct random experts.
    LILAC_CUDA_CHECK(cudaMemcpy(didx.get(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    LILAC_CUDA_CHECK(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  }
  if (wanted(opt, "moe_router")) {
    // The router rows rotate over > 2x L2 (1.05 MB each); h and the norm scale stay in L2 as in
    // decode (the previous kernel just wrote h).
    const size_t rbytes = size_t(E + 1) * H * 2;
    const int copies = copies_for(rbytes);
    std::vector<DeviceBuffer<bf16>> router;
    for (int c = 0; c < copies; ++c)
      router.push_back(random_buffer<bf16>(size_t(E + 1) * H, 28 + c, 0.04f));
    auto scale = random_buffer<float>(size_t(H), 29, 0.1f);
    DeviceBuffer<float> rl(static_cast<size_t>(E + 1));
    DeviceBuffer<int32_t> ri(static_cast<size_t>(k));
    DeviceBuffer<float> rw(static_cast<size_t>(k));
    DeviceBuffer<bf16> rx(static_cast<size_t>(H));
    DeviceBuffer<char> ws(lilac::cuda::moe_router_workspace_bytes());
    LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::moe_router(router[size_t(r % copies)].get(), E, H, h.get(), scale.get(), 1e-6f,
                              k, rl.get(), ri.get(), rw.get(), rx.get(), ws.get(), s);
    });
    report("moe_router (norm+gemv+topk)", "257 x 2048, k 8", double(rbytes) + H * 8.0, t);
  }
  if (wanted(opt, "moe_gate_up_gemv")) {
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::moe_gate_up_gemv(gate_up.get(), sgu.get(), didx.get() + size_t(r) * k, k,
                                    x.get(), H, I, Is, act.get(), s);
    });
    report("moe_gate_up_gemv", "8 x 1024 + 1024 rows x 2048",
           (double(k) * 2 * I + 2.0 * Is) * H * 2, t);
  }
  if (wanted(opt, "moe_down_gemv")) {
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::moe_down_gemv(down.get(), sdown.get(), didx.get() + size_t(r) * k,
                                 dw.get() + size_t(r) * k, logits.get() + E, act.get(), k, H, I, Is,
                                 h.get(), s);
    });
    report("moe_down_gemv", "9 x 2048 rows x 512", (double(k) * I + Is) * H * 2 + H * 8.0, t);
  }
}

void bench_norm(cudaStream_t s, const Options& opt) {
  const int H = 2048, V = 248320;
  auto h = random_buffer<float>(size_t(H), 31, 1.f);
  auto scale = random_buffer<float>(size_t(H), 32, 1.f);
  DeviceBuffer<bf16> out(static_cast<size_t>(H));
  if (wanted(opt, "rms_norm")) {
    const auto t = time_both(s, opt, [&](int) {
      lilac::cuda::rms_norm(h.get(), scale.get(), out.get(), 1, H, 1e-6f, s);
    });
    report("rms_norm", "T 1, H 2048", H * 10.0, t);
  }
  if (wanted(opt, "embed")) {
    auto table = random_buffer<bf16>(size_t(V) * H, 33, 1.f);
    std::vector<int32_t> ids(kReps);
    for (int r = 0; r < kReps; ++r) ids[size_t(r)] = int32_t((uint64_t(r) * 2654435761u) % V);
    DeviceBuffer<int32_t> dids(ids.size());
    LILAC_CUDA_CHECK(cudaMemcpy(dids.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    DeviceBuffer<float> hh(static_cast<size_t>(H));
    const auto t = time_both(
        s, opt, [&](int r) { lilac::cuda::embed(dids.get() + r, table.get(), hh.get(), 1, H, s); });
    report("embed", "T 1, H 2048", H * 6.0, t);
  }
}

void bench_sampling(cudaStream_t s, const Options& opt) {
  const int V = 248320, n = 248077;
  std::vector<DeviceBuffer<float>> logits;
  for (int c = 0; c < 4; ++c) logits.push_back(random_buffer<float>(size_t(V), 41 + c, 8.f));
  DeviceBuffer<int32_t> out(1);
  if (wanted(opt, "argmax")) {
    DeviceBuffer<char> ws(lilac::cuda::argmax_workspace_bytes(n));
    LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::argmax(logits[size_t(r % 4)].get(), n, ws.get(), out.get(), s);
    });
    report("argmax", "n 248077", n * 4.0, t);
  }
  struct Case {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
    lilac::cuda::SamplerPath path = lilac::cuda::SamplerPath::General;
  };
  constexpr auto kSmall = lilac::cuda::SamplerPath::SmallTopK;
  for (Case c :
       {Case{"sample greedy", 0.f, 1.f, 0.f, 0}, Case{"sample T1 k20 p0.95", 1.f, 0.95f, 0.f, 20},
        Case{"sample small-k T1 k20 p0.95", 1.f, 0.95f, 0.f, 20, kSmall},
        Case{"sample T1 p0.95", 1.f, 0.95f, 0.f, 0},
        Case{"sample T0.6 min_p 0.05", 0.6f, 1.f, 0.05f, 0}}) {
    if (!wanted(opt, c.name)) continue;
    DeviceBuffer<char> ws(lilac::cuda::sample_workspace_bytes(n));
    lilac::cuda::DeviceSamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 7;
    p.advance = 1;  // the step moves on the device between replays
    DeviceBuffer<lilac::cuda::DeviceSamplingParams> dp(1);
    LILAC_CUDA_CHECK(cudaMemcpy(dp.get(), &p, sizeof(p), cudaMemcpyHostToDevice));
    DeviceBuffer<lilac::cuda::DeviceSampleResult> res(1);
    const auto t = time_both(s, opt, [&](int r) {
      lilac::cuda::sample(logits[size_t(r % 4)].get(), n, dp.get(), nullptr, nullptr, ws.get(),
                          res.get(), s, c.path);
    });
    report(c.name, c.path == kSmall ? "n 248077 (3 launches)" : "n 248077 (10 launches)", n * 4.0,
           t);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc)
      opt.runs = std::max(50, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc)
      opt.filter = argv[++i];
    else if (!std::strcmp(argv[i], "--context") && i + 1 < argc)
      opt.context = std::max(2, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--weights") && i + 1 < argc)
      opt.weights = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--runs N (>= 50)] [--filter SUBSTRING] [--context N] "
                   "[--weights bf16|q4|both]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    if (lilac::cuda::device_count() == 0) {
      std::fprintf(stderr, "no CUDA device\n");
      return 1;
    }
    cudaDeviceProp prop;
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf(
        "%s, %d SMs, L2 %d MB; median of %d graph replays of %d launches; %% of %.1f TB/s\n",
        prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, opt.runs, kReps,
        kCopyBandwidth / 1e12);
    std::printf("PDL (launch.h) %s; \"no PDL\": the same graph launched without it\n",
                lilac::cuda::pdl_enabled() ? "on" : "not available");
    std::printf("%-26s %-28s %12s %12s %12s %7s %12s\n", "kernel", "shape", "bytes", "time",
                "bandwidth", "of peak", "no PDL");
    cudaStream_t s;
    LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bench_gemv(s, opt, "gemv gdn in_proj", 12352, 2048, 0);
    bench_gemv(s, opt, "gemv_rms gdn in_proj", 12352, 2048, 3);
    bench_gemv(s, opt, "gemv attn qkv", 9216, 2048, 0);
    bench_gemv(s, opt, "gemv_rms attn qkv", 9216, 2048, 3);
    bench_gemv(s, opt, "gemv out_proj (+= h)", 2048, 4096, 1);
    bench_gemv(s, opt, "gemv router", 257, 2048, 0);
    bench_gemv(s, opt, "gemv lm_head", 248320, 2048, 0);
    bench_gemv(s, opt, "gemv_rms lm_head", 248320, 2048, 3);
    bench_gemv(s, opt, "gemv_bf16out 2048x2048", 2048, 2048, 2);
    for (int T : {16, 32, 64}) {
      bench_gemv_rows(s, opt, "gdn in_proj", 12352, 2048, false, T);
      bench_gemv_rows(s, opt, "attn qkv", 9216, 2048, false, T);
      bench_gemv_rows(s, opt, "out_proj (+= h)", 2048, 4096, true, T);
      bench_gemv_rows(s, opt, "router", 257, 2048, false, T);
    }
    bench_moe(s, opt);
    bench_norm(s, opt);
    bench_sampling(s, opt);
    if (wanted(opt, "layer")) lilac::bench::bench_decode_layers(opt.weights, opt.context, opt.runs);
    LILAC_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lilac_cuda_bench_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
