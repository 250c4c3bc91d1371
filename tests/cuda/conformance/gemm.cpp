// Conformance cases of the prefill GEMM against cpu::matmul on bf16 inputs: every weight shape of
// the model at M = 1, 7, 128, 1000, 4096, awkward N / K (N = 1, 257, 1000; K = 8, 24, 2056) on
// every tiling, the three output modes. Outputs are poisoned (NaN) first. Large cases are checked
// on sampled rows (every tile-boundary row class plus random rows from each 128-row block, up to a
// CPU budget) over all N columns; small ones completely.
#include "cuda/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../prefill_test_util.h"
#include "conformance.h"
#include "cpu/linear.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using cuda::GemmOut;
using cuda::GemmTile;

const char* mode_name(GemmOut m) {
  switch (m) {
    case GemmOut::StoreF32:
      return "f32";
    case GemmOut::StoreBF16:
      return "bf16";
    case GemmOut::AccumulateF32:
      return "accumulate";
  }
  return "?";
}

// Rows of C to verify: all when the CPU reference is cheap, else the rows next to every tile
// boundary class (0, 1, 31/32, 63/64, 127/128, M-2, M-1) and one random row per 128-row block,
// as many as fit in about 4e9 multiply-adds (at least the boundary rows).
std::vector<int> rows_to_check(int M, int N, int K, uint32_t seed) {
  const double per_row = double(N) * K;
  const int budget = std::max(8, int(4e9 / per_row));
  std::vector<int> rows;
  if (M <= budget) {
    for (int r = 0; r < M; ++r) rows.push_back(r);
    return rows;
  }
  std::set<int> s;
  for (int r : {0, 1, 31, 32, 63, 64, 127, 128, M - 2, M - 1})
    if (r >= 0 && r < M) s.insert(r);
  std::mt19937 rng(seed);
  for (int b = 0; b * 128 < M && int(s.size()) < budget; ++b) {
    const int lo = b * 128, hi = std::min(M, lo + 128);
    s.insert(lo + int(rng() % uint32_t(hi - lo)));
  }
  rows.assign(s.begin(), s.end());
  return rows;
}

// One weight matrix W [N, K] on host and device, checked against several A's.
class GemmChecker {
 public:
  GemmChecker(int N, int K, uint64_t seed) : N_(N), K_(K), seed_(seed) {
    w_bits_ = random_bf16_bits(size_t(N) * K, 1.f, seed);
    w_norm_ = row_norms(w_bits_.data(), N, K);
    w_dev_ = upload_bf16(w_bits_);
    W_.data = w_bits_.data();
    W_.dtype = DType::BF16;
    W_.rows = N;
    W_.cols = K;
    W_.name = "W";
  }

  // Runs C = A . W^T for each tile and mode on one random A [M, K]; fails naming the element.
  void check(int M, const std::vector<GemmTile>& tiles, const std::vector<GemmOut>& modes) {
    const int N = N_, K = K_;
    const uint64_t aseed = seed_ * 1000003u + uint64_t(M);
    const auto a_bits = random_bf16_bits(size_t(M) * K, 1.f, aseed);
    auto a_dev = upload_bf16(a_bits);
    const std::vector<int> rows = rows_to_check(M, N, K, uint32_t(aseed));
    const size_t R = rows.size();

    // CPU reference on the checked rows (bf16 inputs widened exactly to f32).
    std::vector<float> x(R * size_t(K));
    std::vector<double> a_norm(R);
    for (size_t i = 0; i < R; ++i) {
      double s = 0;
      for (int j = 0; j < K; ++j) {
        const float v = bf16_to_f32(a_bits[size_t(rows[i]) * K + j]);
        x[i * K + j] = v;
        s += double(v) * v;
      }
      a_norm[i] = std::sqrt(s);
    }
    std::vector<float> ref(R * size_t(N));
    cpu::matmul(W_, x.data(), int64_t(R), K, ref.data(), N, ThreadPool::global());

    const double gamma = dot_tolerance(K);
    cuda::DeviceBuffer<float> c_dev(size_t(M) * N);  // large enough for every mode
    for (GemmTile tile : tiles) {
      for (GemmOut mode : modes) {
        const std::string what = "gemm M " + std::to_string(M) + " N " + std::to_string(N) + " K " +
                                 std::to_string(K) + " " + cuda::gemm_tile_name(tile) + " " +
                                 mode_name(mode);
        std::vector<float> c0;  // initial C for the accumulate mode, on the checked rows
        if (mode == GemmOut::AccumulateF32) {
          std::vector<float> init(size_t(M) * N);
          const uint64_t cseed = aseed ^ 0x5bd1e995u;
          ThreadPool::global().parallel_for(
              init.size(),
              [&](size_t b, size_t e) {
                for (size_t i = b; i < e; ++i) init[i] = hash_uniform(cseed, i, 4.f);
              },
              1 << 16);
          LILAC_CUDA_CHECK(
              cudaMemcpy(c_dev.get(), init.data(), init.size() * 4, cudaMemcpyHostToDevice));
          c0.resize(R * size_t(N));
          for (size_t i = 0; i < R; ++i)
            std::copy_n(init.begin() + ptrdiff_t(size_t(rows[i]) * N), N,
                        c0.begin() + ptrdiff_t(i * N));
        } else {
          poison(c_dev);
        }
        cuda::gemm(a_dev.get(), M, K, w_dev_.get(), N, c_dev.get(), mode, nullptr, tile);
        LILAC_CUDA_CHECK(cudaDeviceSynchronize());

        // Download the checked rows.
        std::vector<float> got(R * size_t(N));
        if (mode == GemmOut::StoreBF16) {
          std::vector<uint16_t> row_bits(static_cast<size_t>(N));
          for (size_t i = 0; i < R; ++i) {
            LILAC_CUDA_CHECK(
                cudaMemcpy(row_bits.data(),
                           reinterpret_cast<const uint16_t*>(c_dev.get()) + size_t(rows[i]) * N,
                           size_t(N) * 2, cudaMemcpyDeviceToHost));
            for (int j = 0; j < N; ++j) got[i * N + j] = bf16_to_f32(row_bits[size_t(j)]);
          }
        } else {
          for (size_t i = 0; i < R; ++i)
            LILAC_CUDA_CHECK(cudaMemcpy(&got[i * N], c_dev.get() + size_t(rows[i]) * N,
                                        size_t(N) * 4, cudaMemcpyDeviceToHost));
        }
        const bool bf16_out = mode == GemmOut::StoreBF16, acc = mode == GemmOut::AccumulateF32;
        EXPECT_TRUE(within(
            R * size_t(N), [&](size_t i) { return got[i]; },
            [&](size_t i) { return double(ref[i]) + (acc ? double(c0[i]) : 0.0); },
            [&](size_t i) {
              // Accumulation-order bound, plus bf16 rounding of the result (<= 2^-9 relative;
              // 2^-8 covers the f32 error of the value rounded), plus the f32 add of C.
              double t = gamma * a_norm[i / N] * w_norm_[i % N] + 1e-30;
              if (bf16_out) t += std::ldexp(std::fabs(double(ref[i])), -8);
              if (acc) t += std::ldexp(std::fabs(double(ref[i])) + std::fabs(double(c0[i])), -22);
              return t;
            },
            [&](size_t i) {
              return "row " + std::to_string(rows[i / N]) + ", col " + std::to_string(i % N);
            },
            what))
            << "(" << R << " of " << M << " rows checked)";
      }
    }
  }

 private:
  int N_, K_;
  uint64_t seed_;
  std::vector<uint16_t> w_bits_;
  std::vector<double> w_norm_;
  cuda::DeviceBuffer<cuda::bf16> w_dev_;
  Matrix W_;
};

const std::vector<GemmOut> kAllModes = {GemmOut::StoreF32, GemmOut::StoreBF16,
                                        GemmOut::AccumulateF32};
const std::vector<GemmTile> kAllTiles = {GemmTile::Mma128x256, GemmTile::Mma128x128,
                                         GemmTile::Mma64x128, GemmTile::Wgmma128x256};
const std::vector<int> kModelM = {1, 7, 128, 1000, 4096};

std::string m_list(const std::vector<int>& Ms) {
  std::string s = "_M";
  for (size_t i = 0; i < Ms.size(); ++i) s += (i ? "-" : "") + std::to_string(Ms[i]);
  return s;
}

LILAC_CONFORMANCE_CASES(gemm) {
  std::vector<OpCase> cases;
  auto add = [&](std::string shape, std::function<void()> run) {
    cases.push_back({"gemm", std::move(shape), "bf16", "cpu::matmul", std::move(run)});
  };
  // Every weight shape of the model at M = 1, 7, 128, 1000, 4096, the automatic tiling, all
  // three output modes.
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {
      {"in_proj", 12352, 2048}, {"out_proj", 2048, 4096},       {"qkv", 9216, 2048},
      {"router", 257, 2048},    {"shared_gate_up", 1024, 2048}, {"shared_down", 2048, 512}};
  uint64_t seed = 11;
  for (const Shape& s : shapes) {
    const std::string name = std::string(s.name) + "_N" + std::to_string(s.N) + "_K" +
                             std::to_string(s.K) + m_list(kModelM) + "_auto";
    add(name, [s, seed] {
      GemmChecker c(s.N, s.K, seed);
      for (int M : kModelM) c.check(M, {GemmTile::Auto}, kAllModes);
    });
    ++seed;
  }
  // lm_head (N = 248320): f32 and bf16 logits (it never accumulates into the residual stream,
  // and a 4096 x 248320 f32 initial C would cost seconds of host time for nothing new).
  add("lm_head_N248320_K2048" + m_list(kModelM) + "_auto_f32_bf16out", [] {
    GemmChecker c(248320, 2048, 99);
    for (int M : kModelM) c.check(M, {GemmTile::Auto}, {GemmOut::StoreF32, GemmOut::StoreBF16});
  });
  // Every tiling on a model shape with M tails (1000 = 7 x 128 + 104; 4096 whole tiles).
  add("N2048_K2048_M1000-4096-130_every_tile", [] {
    GemmChecker c(2048, 2048, 5);
    for (int M : {1000, 4096, 130}) c.check(M, kAllTiles, kAllModes);
  });
  add("N1024_K2048_M333_every_tile", [] {
    GemmChecker d(1024, 2048, 6);
    d.check(333, kAllTiles, kAllModes);
  });
  // N and K that are not multiples of the tiles (N odd: scalar epilogue; K = 8, 24: less than
  // one k-tile; K = 2056: a 8-element k tail), with M tails, on every tiling.
  seed = 100;
  for (int N : {1, 257, 1000})
    for (int K : {8, 24, 2056}) {
      add("awkward_N" + std::to_string(N) + "_K" + std::to_string(K) + "_M1-7-130-1000_every_tile",
          [N, K, seed] {
            GemmChecker c(N, K, seed);
            for (int M : {1, 7, 130, 1000}) c.check(M, kAllTiles, kAllModes);
          });
      ++seed;
    }
  return cases;
}

// The contract's preconditions are enforced (before any device work).
TEST(Gemm, RejectsBadShapes) {
  EXPECT_THROW(cuda::gemm(nullptr, 4, 12, nullptr, 8, nullptr, GemmOut::StoreF32, nullptr),
               Error);  // K % 8
  EXPECT_THROW(cuda::gemm(nullptr, 0, 16, nullptr, 8, nullptr, GemmOut::StoreF32, nullptr),
               Error);  // M = 0
  EXPECT_THROW(cuda::gemm(nullptr, 4, 16, nullptr, 0, nullptr, GemmOut::StoreF32, nullptr),
               Error);  // N = 0
}

}  // namespace
}  // namespace lilac::test
