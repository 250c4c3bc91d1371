// lilac_cuda_bench_gemm: GPU microbenchmark of the prefill GEMM (every model shape at M = 512,
// 2048, 8192, every tiling and the automatic choice) and of the MoE prefill block (T = 512, 2048,
// 8192, synthetic uniform router; mma.sync and wgmma kernels). CUDA events, 3 warm-up runs, median
// of 25; inputs random (never zeros), rotated over several copies when they would fit in L2. Usage:
// lilac_cuda_bench_gemm [--quick]   (--quick: M = T = 2048 only)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "cuda/gemm.h"
#include "cuda/moe_prefill.h"

namespace {

using lilac::cuda::bf16;
using lilac::cuda::DeviceBuffer;
using lilac::cuda::GemmOut;
using lilac::cuda::GemmTile;

constexpr double kPeakTflops = 790.0;  // H200 bf16 dense rate (docs/benchmarking.md section 3)
constexpr int kWarmup = 3, kRuns = 25;

__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    p[i] =
        __float2bfloat16(scale * (float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23)));
  }
}
__global__ void fill_f32(float* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    p[i] = scale * (float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23));
  }
}
void random_fill(bf16* p, size_t n, uint64_t seed, float scale) {
  fill_bf16<<<1024, 256>>>(p, n, seed, scale);
  LILAC_CUDA_LAUNCHED();
}
void random_fill(float* p, size_t n, uint64_t seed, float scale) {
  fill_f32<<<1024, 256>>>(p, n, seed, scale);
  LILAC_CUDA_LAUNCHED();
}

// Median time in microseconds of `runs` executions of fn (events around each).
template <class Fn>
double median_us(Fn&& fn, int runs = kRuns) {
  for (int i = 0; i < kWarmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * runs));
  for (auto& e : ev) LILAC_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    LILAC_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i)]));
    fn(i);
    LILAC_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i + 1)]));
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) {
    float ms = 0;
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    t[size_t(i)] = ms * 1e3;
  }
  for (auto& e : ev) LILAC_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Shape {
  const char* name;
  int N, K;
  GemmOut mode;  // as the model uses it
};

const char* mode_name(GemmOut m) {
  return m == GemmOut::StoreF32 ? "f32" : m == GemmOut::StoreBF16 ? "bf16" : "acc";
}

void bench_gemm(const std::vector<int>& Ms) {
  const Shape shapes[] = {{"gdn_in_proj", 12352, 2048, GemmOut::StoreF32},
                          {"out_proj", 2048, 4096, GemmOut::AccumulateF32},
                          {"attn_qkv", 9216, 2048, GemmOut::StoreF32},
                          {"router", 257, 2048, GemmOut::StoreF32},
                          {"shared_gate_up", 1024, 2048, GemmOut::StoreBF16},
                          {"shared_down", 2048, 512, GemmOut::AccumulateF32},
                          {"lm_head", 248320, 2048, GemmOut::StoreBF16}};
  const GemmTile tiles[] = {GemmTile::Auto, GemmTile::Mma128x256, GemmTile::Mma128x128,
                            GemmTile::Mma64x128, GemmTile::Wgmma128x256};
  std::printf("\n== gemm: C[M,N] = A[M,K] . W[N,K]^T (median of %d, %% of %.0f TFLOP/s) ==\n",
              kRuns, kPeakTflops);
  std::printf("%-15s %6s %6s %5s %5s  %-13s %10s %8s %6s\n", "shape", "N", "K", "M", "out", "tile",
              "us", "TFLOP/s", "%peak");
  for (const Shape& s : shapes) {
    for (int M : Ms) {
      const size_t a_n = size_t(M) * s.K, w_n = size_t(s.N) * s.K, c_n = size_t(M) * s.N;
      const double in_bytes = double(a_n + w_n) * 2;
      const int sets = int(std::clamp(192e6 / in_bytes, 1.0, 8.0));
      std::vector<DeviceBuffer<bf16>> A, W;
      for (int i = 0; i < sets; ++i) {
        A.emplace_back(a_n);
        W.emplace_back(w_n);
        random_fill(A.back().get(), a_n, 10 + i, 1.f);
        random_fill(W.back().get(), w_n, 20 + i, 0.05f);
      }
      DeviceBuffer<float> C(s.mode == GemmOut::StoreBF16 ? (c_n + 1) / 2 : c_n);
      if (s.mode == GemmOut::AccumulateF32) random_fill(C.get(), c_n, 5, 1.f);
      const double flop = 2.0 * M * double(s.N) * s.K;
      for (GemmTile tile : tiles) {
        const double us = median_us([&](int i) {
          lilac::cuda::gemm(A[size_t(i % sets)].get(), M, s.K, W[size_t(i % sets)].get(), s.N,
                            C.get(), s.mode, nullptr, tile);
        });
        const double tf = flop / us * 1e-6;
        const std::string name =
            tile == GemmTile::Auto
                ? std::string("auto=") +
                      lilac::cuda::gemm_tile_name(lilac::cuda::gemm_auto_tile(M, s.N, s.K))
                : lilac::cuda::gemm_tile_name(tile);
        std::printf("%-15s %6d %6d %5d %5s  %-13s %10.1f %8.1f %5.1f%%\n", s.name, s.N, s.K, M,
                    mode_name(s.mode), name.c_str(), us, tf, 100.0 * tf / kPeakTflops);
      }
    }
  }
}

void bench_moe(const std::vector<int>& Ts) {
  const int E = 256, k = 8, I = 512, Is = 512, H = 2048, stride = E + 1;
  std::printf("\n== MoE prefill block (E %d, k %d, I %d, Is %d, H %d; uniform random router) ==\n",
              E, k, I, Is, H);
  DeviceBuffer<bf16> gate_up(size_t(E) * 2 * I * H), down(size_t(E) * H * I),
      sgu(size_t(2) * Is * H), sdown(size_t(H) * Is), router(size_t(stride) * H);
  random_fill(gate_up.get(), gate_up.size(), 1, 0.038f);  // sqrt(3 / H)
  random_fill(down.get(), down.size(), 2, 0.076f);        // sqrt(3 / I)
  random_fill(sgu.get(), sgu.size(), 3, 0.038f);
  random_fill(sdown.get(), sdown.size(), 4, 0.076f);
  random_fill(router.get(), router.size(), 5, 0.038f);
  std::printf("%6s %-9s %9s %9s %9s %9s %9s %9s %10s %8s %6s\n", "T", "path", "route", "gate_up",
              "down", "sh_gu", "sh_down", "combine", "block us", "TFLOP/s", "%peak");
  for (int T : Ts) {
    const size_t P = size_t(T) * k;
    DeviceBuffer<bf16> x(size_t(T) * H), act(P * I), act_s(size_t(T) * Is);
    DeviceBuffer<float> logits(size_t(T) * stride), y(P * H), shared(size_t(T) * H),
        h(size_t(T) * H);
    random_fill(x.get(), x.size(), 6, 1.7f);
    random_fill(h.get(), h.size(), 7, 1.f);
    lilac::cuda::gemm(x.get(), T, H, router.get(), stride, logits.get(), GemmOut::StoreF32,
                      nullptr);
    DeviceBuffer<uint8_t> ws(lilac::cuda::moe_routing_workspace_bytes(T, E, k));
    const lilac::cuda::MoeRouting r = lilac::cuda::moe_routing_layout(ws.get(), T, E, k);
    const double flop = 2.0 * double(P) * 3.0 * I * H + 2.0 * T * 3.0 * Is * H;
    for (bool wg : {false, true}) {
      auto route = [&](int) { lilac::cuda::moe_route(logits.get(), stride, T, E, k, r, nullptr); };
      auto gu = [&](int) {
        lilac::cuda::moe_grouped_gate_up(x.get(), H, gate_up.get(), I, r, act.get(), nullptr, wg);
      };
      auto dn = [&](int) {
        lilac::cuda::moe_grouped_down(act.get(), I, down.get(), H, r, y.get(), nullptr, wg);
      };
      auto sgu_f = [&](int) {
        lilac::cuda::moe_shared_gate_up(x.get(), T, H, sgu.get(), Is, act_s.get(), nullptr, wg);
      };
      auto sdn = [&](int) {
        lilac::cuda::gemm(act_s.get(), T, Is, sdown.get(), H, shared.get(), GemmOut::StoreF32,
                          nullptr);
      };
      auto comb = [&](int) {
        lilac::cuda::moe_combine(y.get(), r, logits.get(), stride, shared.get(), H, h.get(),
                                 nullptr);
      };
      const double t_route = median_us(route);
      const double t_gu = median_us(gu), t_dn = median_us(dn), t_sgu = median_us(sgu_f),
                   t_sdn = median_us(sdn);
      const double t_comb = median_us(comb);
      const double t_all = median_us([&](int i) {
        route(i);
        gu(i);
        dn(i);
        sgu_f(i);
        sdn(i);
        comb(i);
      });
      const double tf = flop / t_all * 1e-6;
      std::printf("%6d %-9s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %8.1f %5.1f%%\n", T,
                  wg ? "wgmma" : "mma.sync", t_route, t_gu, t_dn, t_sgu, t_sdn, t_comb, t_all, tf,
                  100.0 * tf / kPeakTflops);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  try {
    cudaDeviceProp prop{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
                prop.minor);
    const std::vector<int> sizes =
        quick ? std::vector<int>{2048} : std::vector<int>{512, 2048, 8192};
    bench_gemm(sizes);
    bench_moe(sizes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
