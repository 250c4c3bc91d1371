// lilac_cuda_bench_q4: times the 4/8-bit kernels (q4_*.cu) at the real model's shapes.
// Decode kernels: a CUDA graph of kReps launches rotating over weight copies totalling > 2x the
// 60 MB L2 (weights come from HBM, as in decode), median of >= 50 replays; bytes = the weight
// bytes a launch must move (codes + scales/biases), GB/s and % of the 4.3 TB/s copy bandwidth.
// Prefill kernels: median of 25 launches, TFLOP/s and % of 790. Load-time kernels: GB/s.
// Usage: lilac_cuda_bench_q4 [--runs N] [--filter SUBSTRING].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "cuda/common.h"
#include "cuda/moe_decode.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_gemm.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_moe.h"
#include "cuda/q4_quantize.h"

namespace {

using lilac::cuda::bf16;
using lilac::cuda::DeviceBuffer;
using lilac::cuda::QMatrix;

constexpr double kCopyBandwidth = 4.3e12;
constexpr double kTensorPeak = 790e12;
constexpr size_t kRotateBytes = 160u << 20;
constexpr int kReps = 20;

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_words(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(mix64(seed ^ mix64(i)));
}
// Scale ~ +-0.004, bias ~ +-0.03: weights of the real model's magnitude.
__global__ void fill_sb(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed ^ mix64(i));
    const float s = (float(uint32_t(h) >> 8) / 16777216.f - 0.5f) * 0.008f;
    const float b = (float(uint32_t(h >> 32) >> 8) / 16777216.f - 0.5f) * 0.06f;
    p[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(s))) |
           uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
  }
}
__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(uint32_t(mix64(seed ^ mix64(i)) >> 40)) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn(a * (2.f * u - 1.f));
  }
}

// A random quantized matrix in the tiled layout (owning).
struct QBuf {
  DeviceBuffer<uint32_t> codes, sb;
  QMatrix q;
  QBuf(int rows, int cols, int bits, uint64_t seed)
      : codes(lilac::cuda::q_code_words(rows, cols, bits)),
        sb(lilac::cuda::q_sb_words(rows, cols)) {
    fill_words<<<1024, 256>>>(codes.get(), codes.size(), seed);
    fill_sb<<<1024, 256>>>(sb.get(), sb.size(), seed + 1);
    LILAC_CUDA_LAUNCHED();
    q = QMatrix{codes.get(), sb.get(), rows, cols, bits};
  }
  double bytes() const { return double(codes.bytes() + sb.bytes()); }
};

DeviceBuffer<bf16> random_bf16(size_t n, uint64_t seed, float a) {
  DeviceBuffer<bf16> b(n);
  fill_bf16<<<1024, 256>>>(b.get(), n, seed, a);
  LILAC_CUDA_LAUNCHED();
  return b;
}

struct Options {
  int runs = 100;
  std::string filter;
};

bool wanted(const Options& o, const std::string& name) {
  return o.filter.empty() || name.find(o.filter) != std::string::npos;
}

// Median time of one of kReps launches, replayed as one graph.
double time_graph(cudaStream_t s, const Options& opt, const std::function<void(int)>& launch) {
  return lilac::bench::median_graph_replay_seconds(s, opt.runs,
                                                   [&] {
                                                     for (int r = 0; r < kReps; ++r) launch(r);
                                                   }) /
         kReps;
}

// Median of n timed launches (prefill: each launch is long, no graph needed).
double time_plain(cudaStream_t s, int n, const std::function<void()>& launch) {
  return lilac::bench::median_seconds(s, n, launch);
}

void report_bw(const char* name, const std::string& shape, double bytes, double s) {
  std::printf("%-28s %-30s %9.2f MB %9.2f us %8.0f GB/s %6.1f%%\n", name, shape.c_str(),
              bytes / 1e6, s * 1e6, bytes / s / 1e9, 100.0 * bytes / s / kCopyBandwidth);
  std::fflush(stdout);
}

void report_tf(const char* name, const std::string& shape, double flops, double s) {
  std::printf("%-28s %-30s %9.1f us %8.1f TFLOP/s %6.1f%%\n", name, shape.c_str(), s * 1e6,
              flops / s / 1e12, 100.0 * flops / s / kTensorPeak);
  std::fflush(stdout);
}

void bench_gemv(cudaStream_t s, const Options& opt, const char* name, int rows, int cols, int bits,
                bool acc) {
  if (!wanted(opt, name)) return;
  std::vector<QBuf> W;
  W.emplace_back(rows, cols, bits, 11);
  const int copies = int(std::max<double>(1, double(kRotateBytes) / W[0].bytes() + 1));
  for (int c = 1; c < copies; ++c) W.emplace_back(rows, cols, bits, 11 + c);
  auto x = random_bf16(size_t(cols), 3, 1.f);
  DeviceBuffer<float> y(static_cast<size_t>(rows));
  LILAC_CUDA_CHECK(cudaMemset(y.get(), 0, y.bytes()));
  const double t = time_graph(s, opt, [&](int r) {
    lilac::cuda::q_gemv(W[size_t(r % copies)].q, x.get(), y.get(),
                        acc ? lilac::cuda::GemvOut::Accumulate : lilac::cuda::GemvOut::Store, s);
  });
  report_bw(
      name,
      std::to_string(rows) + " x " + std::to_string(cols) + " " + std::to_string(bits) + "-bit",
      W[0].bytes(), t);
}

// q_gemv_rows (the dense projections of a batched decode step) over T token rows: the weights once
// per launch, as bytes; TFLOP/s would be 2 T rows cols / time.
void bench_gemv_rows(cudaStream_t s, const Options& opt, const char* name, int rows, int cols,
                     int bits, bool acc, int T) {
  const std::string label = std::string("q_gemv_rows ") + name + " T=" + std::to_string(T);
  if (!wanted(opt, label)) return;
  std::vector<QBuf> W;
  W.emplace_back(rows, cols, bits, 11);
  const int copies = int(std::max<double>(1, double(kRotateBytes) / W[0].bytes() + 1));
  for (int c = 1; c < copies; ++c) W.emplace_back(rows, cols, bits, 11 + c);
  auto x = random_bf16(size_t(T) * cols, 3, 1.f);
  DeviceBuffer<float> y(size_t(T) * rows);
  LILAC_CUDA_CHECK(cudaMemset(y.get(), 0, y.bytes()));
  const double t = time_graph(s, opt, [&](int r) {
    lilac::cuda::q_gemv_rows(W[size_t(r % copies)].q, x.get(), T, y.get(),
                             acc ? lilac::cuda::GemvOut::Accumulate : lilac::cuda::GemvOut::Store,
                             s);
  });
  report_bw(
      label.c_str(),
      std::to_string(rows) + " x " + std::to_string(cols) + " " + std::to_string(bits) + "-bit",
      W[0].bytes(), t);
}

void bench_moe_decode(cudaStream_t s, const Options& opt) {
  const int H = 2048, E = 256, k = 8, I = 512, Is = 512;
  QBuf gu(E * 2 * I, H, 4, 21), dn(E * H, I, 4, 22), sgu(2 * Is, H, 4, 23), sdn(H, Is, 4, 24);
  auto x = random_bf16(size_t(H), 25, 1.f);
  DeviceBuffer<float> h(static_cast<size_t>(H));
  LILAC_CUDA_CHECK(cudaMemset(h.get(), 0, h.bytes()));
  std::vector<int32_t> idx(static_cast<size_t>(kReps) * k);
  std::vector<float> w(static_cast<size_t>(kReps) * k, 1.f / k);
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
  DeviceBuffer<float> dw(w.size()), logit(1);
  LILAC_CUDA_CHECK(cudaMemcpy(didx.get(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  LILAC_CUDA_CHECK(cudaMemset(logit.get(), 0, 4));
  DeviceBuffer<bf16> act(static_cast<size_t>(k) * I + Is);
  LILAC_CUDA_CHECK(cudaMemset(act.get(), 0, act.bytes()));
  const double gu_bytes = (double(k) * 2 * I + 2.0 * Is) * H * 4.5 / 8;
  const double dn_bytes = (double(k) * I + Is) * H * 4.5 / 8;
  if (wanted(opt, "q_moe_gate_up_gemv")) {
    const double t = time_graph(s, opt, [&](int r) {
      lilac::cuda::q_moe_gate_up_gemv(gu.q, sgu.q, didx.get() + size_t(r) * k, k, x.get(), H, I, Is,
                                      act.get(), s);
    });
    report_bw("q_moe_gate_up_gemv", "8 x 1024 + 1024 rows x 2048", gu_bytes, t);
  }
  if (wanted(opt, "q_moe_down_gemv")) {
    const double t = time_graph(s, opt, [&](int r) {
      lilac::cuda::q_moe_down_gemv(dn.q, sdn.q, didx.get() + size_t(r) * k,
                                   dw.get() + size_t(r) * k, logit.get(), act.get(), k, H, I, Is,
                                   h.get(), s);
    });
    report_bw("q_moe_down_gemv", "9 x 2048 rows x 512", dn_bytes, t);
  }
  if (wanted(opt, "q_embed")) {
    QBuf table(248320, H, 4, 26);
    const double t = time_graph(s, opt, [&](int r) {
      lilac::cuda::q_embed(didx.get() + r, table.q, h.get(), 1, s);  // any valid row ids
    });
    report_bw("q_embed", "1 row of 248320 x 2048", H * 4.5 / 8 + H * 4.0, t);
  }
}

void bench_gemm(cudaStream_t s, const Options& opt) {
  struct Shape {
    const char* name;
    int N, K, bits;
    lilac::cuda::GemmOut mode;
  };
  const Shape shapes[] = {
      {"q_gemm gdn_in_proj", 12352, 2048, 4, lilac::cuda::GemmOut::StoreF32},
      {"q_gemm attn_qkv", 9216, 2048, 4, lilac::cuda::GemmOut::StoreF32},
      {"q_gemm out_proj (+=)", 2048, 4096, 4, lilac::cuda::GemmOut::AccumulateF32},
      {"q_gemm router 8-bit", 257, 2048, 8, lilac::cuda::GemmOut::StoreF32},
      {"q_gemm shared_down", 2048, 512, 4, lilac::cuda::GemmOut::StoreF32}};
  for (const Shape& sh : shapes) {
    if (!wanted(opt, sh.name)) continue;
    QBuf W(sh.N, sh.K, sh.bits, 31);
    for (int M : {512, 2048, 8192}) {
      auto A = random_bf16(size_t(M) * sh.K, 32, 1.f);
      DeviceBuffer<float> C(static_cast<size_t>(M) * sh.N);
      LILAC_CUDA_CHECK(cudaMemset(C.get(), 0, C.bytes()));
      const double t =
          time_plain(s, 25, [&] { lilac::cuda::q_gemm(A.get(), M, W.q, C.get(), sh.mode, s); });
      report_tf(
          sh.name,
          "N " + std::to_string(sh.N) + " K " + std::to_string(sh.K) + " M " + std::to_string(M),
          2.0 * M * sh.N * sh.K, t);
    }
  }
}

// The MoE block of one layer in prefill (route, grouped gate_up, grouped down, shared gate_up,
// shared down, combine) on 4-bit experts, uniform random router.
void bench_moe_prefill(cudaStream_t s, const Options& opt) {
  if (!wanted(opt, "q_moe prefill")) return;
  const int H = 2048, E = 256, k = 8, I = 512, Is = 512;
  QBuf gu(E * 2 * I, H, 4, 41), dn(E * H, I, 4, 42), sgu(2 * Is, H, 4, 43), sdn(H, Is, 4, 44);
  std::printf(
      "== q_moe prefill block (E 256, k 8, I 512, H 2048; 4-bit experts, uniform random router) "
      "==\n");
  std::printf("%6s %9s %9s %9s %9s %9s %9s %10s %8s\n", "T", "route", "gate_up", "down", "sh_gu",
              "sh_down", "combine", "block us", "TFLOP/s");
  for (int T : {512, 2048, 8192}) {
    auto x = random_bf16(size_t(T) * H, 45, 1.f);
    DeviceBuffer<float> logits(static_cast<size_t>(T) * (E + 1));
    {
      auto lb = random_bf16(size_t(T) * (E + 1), 46, 3.f);
      std::vector<uint16_t> hb(lb.size());
      LILAC_CUDA_CHECK(cudaMemcpy(hb.data(), lb.get(), hb.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<float> hf(hb.size());
      for (size_t i = 0; i < hf.size(); ++i) {
        const uint32_t u = uint32_t(hb[i]) << 16;
        std::memcpy(&hf[i], &u, 4);
      }
      LILAC_CUDA_CHECK(cudaMemcpy(logits.get(), hf.data(), hf.size() * 4, cudaMemcpyHostToDevice));
    }
    DeviceBuffer<uint8_t> ws(lilac::cuda::moe_routing_workspace_bytes(T, E, k));
    const lilac::cuda::MoeRouting r = lilac::cuda::moe_routing_layout(ws.get(), T, E, k);
    DeviceBuffer<bf16> act(static_cast<size_t>(T) * k * I), sact(size_t(T) * Is);
    DeviceBuffer<float> y(static_cast<size_t>(T) * k * H), shared(size_t(T) * H), h(size_t(T) * H);
    LILAC_CUDA_CHECK(cudaMemset(h.get(), 0, h.bytes()));
    lilac::cuda::moe_route(logits.get(), E + 1, T, E, k, r, s);
    const double t_route =
        time_plain(s, 25, [&] { lilac::cuda::moe_route(logits.get(), E + 1, T, E, k, r, s); });
    const double t_gu = time_plain(
        s, 25, [&] { lilac::cuda::q_moe_grouped_gate_up(x.get(), H, gu.q, I, r, act.get(), s); });
    const double t_dn = time_plain(
        s, 25, [&] { lilac::cuda::q_moe_grouped_down(act.get(), I, dn.q, H, r, y.get(), s); });
    const double t_sgu = time_plain(
        s, 25, [&] { lilac::cuda::q_moe_shared_gate_up(x.get(), T, H, sgu.q, Is, sact.get(), s); });
    const double t_sdn = time_plain(s, 25, [&] {
      lilac::cuda::q_gemm(sact.get(), T, sdn.q, shared.get(), lilac::cuda::GemmOut::StoreF32, s);
    });
    const double t_comb = time_plain(s, 25, [&] {
      lilac::cuda::moe_combine(y.get(), r, logits.get(), E + 1, shared.get(), H, h.get(), s);
    });
    const double total = t_route + t_gu + t_dn + t_sgu + t_sdn + t_comb;
    const double flops = 2.0 * T * (double(k) * 3 * I * H + 3.0 * Is * H);
    std::printf("%6d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %8.1f\n", T, t_route * 1e6,
                t_gu * 1e6, t_dn * 1e6, t_sgu * 1e6, t_sdn * 1e6, t_comb * 1e6, total * 1e6,
                flops / total / 1e12);
    std::fflush(stdout);
  }
}

void bench_load(cudaStream_t s, const Options& opt) {
  if (!wanted(opt, "quantize")) return;
  const int rows = 262144, cols = 2048;  // one layer's gate_up stack: 1.07 GB of bf16
  auto w = random_bf16(size_t(rows) * cols, 51, 0.05f);
  DeviceBuffer<uint32_t> codes(static_cast<size_t>(rows) * cols / 8),
      tiled(lilac::cuda::q_code_words(rows, cols, 4)), sb(lilac::cuda::q_sb_words(rows, cols));
  DeviceBuffer<uint16_t> sc(static_cast<size_t>(rows) * cols / 64), bi(size_t(rows) * cols / 64);
  const double tq = time_plain(s, 5, [&] {
    lilac::cuda::quantize_mlx(w.get(), rows, cols, 4, codes.get(), sc.get(), bi.get(), s);
  });
  report_bw("quantize_mlx (4-bit)", "262144 x 2048 bf16 in",
            double(rows) * cols * 2 * (1 + 4.5 / 16), tq);
  const double tr = time_plain(s, 5, [&] {
    lilac::cuda::repack_mlx(codes.get(), sc.get(), bi.get(), rows, cols, 4, tiled.get(), sb.get(),
                            s);
  });
  report_bw("repack_mlx (4-bit)", "262144 x 2048", double(rows) * cols * 4.5 / 8 * 2, tr);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc)
      opt.runs = std::max(10, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc)
      opt.filter = argv[++i];
  }
  try {
    cudaDeviceProp p{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf(
        "%s, %d SMs; 4-bit weights: 4.5 bits per weight (8-bit: 8.5); decode: median of %d graph "
        "replays of %d launches over > 2x L2 of weight copies\n",
        p.name, p.multiProcessorCount, opt.runs, kReps);
    cudaStream_t s;
    LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf("%-28s %-30s %12s %12s %13s %7s\n", "kernel", "shape", "bytes", "time", "bandwidth",
                "of peak");
    bench_gemv(s, opt, "q_gemv gdn_in_proj", 12352, 2048, 4, false);
    bench_gemv(s, opt, "q_gemv attn_qkv", 9216, 2048, 4, false);
    bench_gemv(s, opt, "q_gemv out_proj (+= h)", 2048, 4096, 4, true);
    bench_gemv(s, opt, "q_gemv router 8-bit", 257, 2048, 8, false);
    bench_gemv(s, opt, "q_gemv lm_head", 248320, 2048, 4, false);
    for (int T : {16, 64}) {
      bench_gemv_rows(s, opt, "gdn_in_proj", 12352, 2048, 4, false, T);
      bench_gemv_rows(s, opt, "attn_qkv", 9216, 2048, 4, false, T);
      bench_gemv_rows(s, opt, "out_proj (+= h)", 2048, 4096, 4, true, T);
      bench_gemv_rows(s, opt, "router 8-bit", 257, 2048, 8, false, T);
      bench_gemv_rows(s, opt, "lm_head", 248320, 2048, 4, false, T);
    }
    bench_moe_decode(s, opt);
    bench_load(s, opt);
    bench_gemm(s, opt);
    bench_moe_prefill(s, opt);
    LILAC_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
