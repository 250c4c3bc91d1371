// q_gemv_rows in the kernel lab: every version on the same random 4/8-bit matrices at the model's
// shapes (in_proj, out_proj accumulating into h, the 8-bit router, lm_head) and T = 16 and 64
// token rows, checked against the CPU twin (dequantize_row and an f64 dot per (row, token)) at
// tokens 0, T / 2 and T - 1 (all rows), then timed as lilac_cuda_bench_q4 times it: a graph of 20
// launches rotating over copies of the matrix totalling > 2x the 60 MB L2 (the weights come from
// HBM, as in a batched decode step), median per launch, GB/s of the weight bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../lab.h"
#include "cuda/q4_layout.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_quantize.h"
#include "model/weight_rows.h"
#include "q_gemv_rows_lab.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::GemvOut;
using cuda::QMatrix;

constexpr int kGroup = 64;
constexpr size_t kRotateBytes = 160u << 20;  // > 2x the H200's 60 MB L2
constexpr int kLaunches = 20;                // per graph, as lilac_cuda_bench_q4

struct Shape {
  const char* name;
  int rows, cols, bits;
  bool accumulate;  // GemvOut::Accumulate (out_proj adds into the residual h)
};
const Shape kShapes[] = {{"gdn_in_proj", 12352, 2048, 4, false},
                         {"gdn_out_proj (+= h)", 2048, 4096, 4, true},
                         {"router 8-bit", 257, 2048, 8, false},
                         {"lm_head", 248320, 2048, 4, false}};
const int kTokens[] = {16, 64};

using Launch = void (*)(const QMatrix&, const bf16*, int, float*, GemvOut, cudaStream_t);

void v2_staged_cluster(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                       cudaStream_t s) {
  cuda::q_gemv_rows(W, x, T, y, mode, s);
}

Launch launcher(int version) {
  return version == 1 ? q_gemv_rows_v1 : v2_staged_cluster;
}

bool available(int version) {
  return version == 1 || cuda::q_gemv_rows_available();
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A random MLX-quantized matrix (uniform codes; scales in +-0.004 and biases in +-0.03, the real
// model's magnitudes, as lilac_cuda_bench_q4's) on the host, and its tiled device copy.
struct QHost {
  Shape shape;
  std::vector<uint32_t> codes;           // [rows, cols * bits / 32]
  std::vector<uint16_t> scales, biases;  // [rows, cols / 64] bf16
  DeviceBuffer<uint32_t> d_codes, d_sb;  // tiled (q4_layout.h)

  QHost(const Shape& s, uint64_t seed) : shape(s) {
    const size_t rows = size_t(s.rows), wpr = size_t(s.cols) * s.bits / 32,
                 G = size_t(s.cols) / kGroup;
    codes.resize(rows * wpr);
    scales.resize(rows * G);
    biases.resize(rows * G);
    ThreadPool::global().parallel_for(rows, [&](size_t r0, size_t r1) {
      for (size_t i = r0 * wpr; i < r1 * wpr; ++i) codes[i] = uint32_t(mix64(seed ^ mix64(i)));
      for (size_t i = r0 * G; i < r1 * G; ++i) {
        const uint64_t h = mix64(~seed ^ mix64(i));
        const float sc = (float(uint32_t(h) >> 8) / 16777216.f - 0.5f) * 0.008f;
        const float b = (float(uint32_t(h >> 32) >> 8) / 16777216.f - 0.5f) * 0.06f;
        scales[i] = f32_to_bf16(sc);
        biases[i] = f32_to_bf16(b);
      }
    });
    auto dc = upload(codes);
    auto ds = upload(scales);
    auto db = upload(biases);
    d_codes.resize(cuda::q_code_words(s.rows, s.cols, s.bits));
    d_sb.resize(cuda::q_sb_words(s.rows, s.cols));
    cuda::repack_mlx(dc.get(), ds.get(), db.get(), s.rows, s.cols, s.bits, d_codes.get(),
                     d_sb.get(), nullptr);
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  }

  QMatrix q() const {
    return QMatrix{d_codes.get(), d_sb.get(), shape.rows, shape.cols, shape.bits};
  }
  double bytes() const { return double(d_codes.bytes() + d_sb.bytes()); }
};

// The inputs of one (shape, T) and the CPU twin at the checked tokens, shared by the versions.
struct Case {
  const QHost* W = nullptr;
  std::vector<float> x;  // [T, cols], bf16 values
  DeviceBuffer<bf16> d_x;
  std::vector<float> y0;                 // [T, rows]: y before an Accumulate launch
  std::vector<int> tokens;               // the checked tokens
  std::vector<std::vector<float>> want;  // [token][rows]
  std::vector<std::vector<double>> tol;  // [token][rows]
};

// The twin: for each row r, w = dequantize_row(r) in f32 (the kernels' values), then per checked
// token want = sum_k w_k x_k in f64 (+ y0 when accumulating). The tolerance is the q_gemv bound of
// tests/cuda/q4_test_util.h (q_gemv_tolerance; the conformance test of q_gemv_rows uses it): with
// u = 2^-24, A = sum_k |w_k x_k| and Cmax = 143 (4 bits) or 2431 (8 bits),
//   u [2 (K/16 + 2G + 32) A + 16 sum_g (Cmax |s_g| + |b_g|) sum_{k in g} |x_k|]
// (the kernel's f32 rounding: MMA steps on partial sums of up to Cmax sum |x|, the per-group
// scale and offset terms, the f32 sums over groups), plus 2u |want| for the add into y0.
void twin(Case& c) {
  const Shape& s = c.W->shape;
  const int64_t K = s.cols, G = K / kGroup, wpr = K * s.bits / 32;
  const double u = std::ldexp(1.0, -24), cmax = s.bits == 4 ? 143 : 2431;
  const size_t nt = c.tokens.size();
  std::vector<std::vector<double>> sabs(nt, std::vector<double>(size_t(G), 0.0));
  for (size_t j = 0; j < nt; ++j)
    for (int64_t k = 0; k < K; ++k)
      sabs[j][size_t(k / kGroup)] += std::fabs(c.x[size_t(c.tokens[j]) * size_t(K) + size_t(k)]);
  c.want.assign(nt, std::vector<float>(size_t(s.rows)));
  c.tol.assign(nt, std::vector<double>(size_t(s.rows)));
  ThreadPool::global().parallel_for(size_t(s.rows), [&](size_t r0, size_t r1) {
    std::vector<float> w(static_cast<size_t>(K));
    for (size_t r = r0; r < r1; ++r) {
      const uint16_t* sc = &c.W->scales[r * size_t(G)];
      const uint16_t* bi = &c.W->biases[r * size_t(G)];
      dequantize_row(&c.W->codes[r * size_t(wpr)], sc, bi, s.bits, kGroup, K, w.data());
      for (size_t j = 0; j < nt; ++j) {
        const float* x = &c.x[size_t(c.tokens[j]) * size_t(K)];
        double dot = 0, A = 0, B = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(w[size_t(k)]) * double(x[k]);
          dot += p;
          A += std::fabs(p);
        }
        for (int64_t g = 0; g < G; ++g)
          B += (cmax * std::fabs(bf16_to_f32(sc[g])) + std::fabs(bf16_to_f32(bi[g]))) *
               sabs[j][size_t(g)];
        double t = u * (2.0 * (double(K) / 16 + 2.0 * double(G) + 32) * A + 16 * B) + 1e-30;
        if (s.accumulate) {
          dot += double(c.y0[size_t(c.tokens[j]) * size_t(s.rows) + r]);
          t += 2 * u * std::fabs(dot);
        }
        c.want[j][r] = float(dot);
        c.tol[j][r] = t;
      }
    }
  });
}

// The case of shape i at T rows, built once for all versions (lm_head's host matrix and twin are
// large): the matrix of a shape is shared by its T.
Case& get_case(int i, int T) {
  static std::map<int, std::unique_ptr<QHost>> matrices;
  static std::map<std::pair<int, int>, Case> cases;
  auto it = cases.find({i, T});
  if (it != cases.end()) return it->second;
  const Shape& s = kShapes[i];
  std::unique_ptr<QHost>& m = matrices[i];
  if (!m) m = std::make_unique<QHost>(s, uint64_t(100 + i));
  Case c;
  const uint32_t seed = uint32_t(1000 + 16 * i + T);
  c.W = m.get();
  const std::vector<uint16_t> xb =
      to_bf16_bits(random_floats(size_t(T) * size_t(s.cols), 1.f, seed + 1));
  c.x = from_bf16_bits(xb);
  c.d_x = upload_bf16(xb);
  if (s.accumulate) c.y0 = random_floats(size_t(T) * size_t(s.rows), 3.f, seed + 2);
  c.tokens = {0, T / 2, T - 1};
  twin(c);
  return cases.emplace(std::make_pair(i, T), std::move(c)).first->second;
}

// got [T, rows] against the twin at the checked tokens: the largest |err| and its largest ratio
// to the per-element tolerance (NaN: a failure).
Error compare_case(const std::vector<float>& got, const Case& c) {
  Error e;
  const size_t rows = size_t(c.W->shape.rows);
  for (size_t j = 0; j < c.tokens.size(); ++j)
    for (size_t r = 0; r < rows; ++r) {
      const double d = std::fabs(double(got[size_t(c.tokens[j]) * rows + r]) - c.want[j][r]);
      if (!std::isfinite(d)) {
        e.max_abs = e.worst = INFINITY;
        return e;
      }
      e.max_abs = std::max(e.max_abs, d);
      e.worst = std::max(e.worst, d / c.tol[j][r]);
    }
  return e;
}

std::string label(const Shape& s, int T) {
  return std::string(s.name) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         " T=" + std::to_string(T);
}

bool check(int version, int i, int T) {
  const Case& c = get_case(i, T);
  const Shape& s = c.W->shape;
  const size_t n = size_t(T) * size_t(s.rows);
  DeviceBuffer<float> y(n);
  if (s.accumulate) {
    LILAC_CUDA_CHECK(cudaMemcpy(y.get(), c.y0.data(), n * 4, cudaMemcpyHostToDevice));
  } else {
    LILAC_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));  // NaN: every element is written
  }
  launcher(version)(c.W->q(), c.d_x.get(), T, y.get(),
                    s.accumulate ? GemvOut::Accumulate : GemvOut::Store, nullptr);
  return report_check(label(s, T) + ", tokens 0, T/2, T-1", compare_case(download(y), c));
}

// Per launch: graph replays over > 2x L2 of weight copies (device copies of the checked matrix).
void time_case(const Options& opt, int version, int i, int T) {
  const Case& c = get_case(i, T);
  const Shape& s = c.W->shape;
  const int copies = int(std::max<double>(1, double(kRotateBytes) / c.W->bytes() + 1));
  std::vector<DeviceBuffer<uint32_t>> codes, sb;
  std::vector<QMatrix> W = {c.W->q()};
  for (int k = 1; k < copies; ++k) {
    codes.emplace_back(c.W->d_codes.size());
    sb.emplace_back(c.W->d_sb.size());
    LILAC_CUDA_CHECK(cudaMemcpy(codes.back().get(), c.W->d_codes.get(), c.W->d_codes.bytes(),
                                cudaMemcpyDeviceToDevice));
    LILAC_CUDA_CHECK(
        cudaMemcpy(sb.back().get(), c.W->d_sb.get(), c.W->d_sb.bytes(), cudaMemcpyDeviceToDevice));
    W.push_back(QMatrix{codes.back().get(), sb.back().get(), s.rows, s.cols, s.bits});
  }
  DeviceBuffer<float> y(size_t(T) * size_t(s.rows));
  LILAC_CUDA_CHECK(cudaMemset(y.get(), 0, y.bytes()));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t st;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const Launch launch = launcher(version);
  const GemvOut mode = s.accumulate ? GemvOut::Accumulate : GemvOut::Store;
  const double us = graph_us(st, opt.runs, kLaunches, [&](int k) {
    launch(W[size_t(k % copies)], c.d_x.get(), T, y.get(), mode, st);
  });
  LILAC_CUDA_CHECK(cudaStreamDestroy(st));
  const double gbs = c.W->bytes() / us * 1e-3;
  std::printf("  time %-36s %9.2f us  %6.0f GB/s (%.2f MB of weights), %4.1f%% of 4.3 TB/s\n",
              label(s, T).c_str(), us, gbs, c.W->bytes() * 1e-6, 100.0 * gbs / 4300.0);
  std::fflush(stdout);
}

bool run(const Options& opt, const Version& v) {
  if (!available(v.number)) {
    std::printf(
        "  not available here (needs thread-block clusters: a compute capability 9.0 GPU)\n");
    return true;
  }
  bool ok = true;
  for (int i = 0; i < int(std::size(kShapes)); ++i)
    for (int T : kTokens) ok = check(v.number, i, T) && ok;
  for (int i = 0; i < int(std::size(kShapes)); ++i)
    for (int T : kTokens) time_case(opt, v.number, i, T);
  return ok;
}

}  // namespace

Op q_gemv_rows_op() {
  return Op{
      "q_gemv_rows",
      "4/8-bit dense projections over T token rows: in_proj 12352x2048, out_proj 2048x4096 "
      "(+=), router 257x2048 8-bit, lm_head 248320x2048; T 16, 64",
      {{1, "set_dot", "q_set_dot_tokens per warp: codes, x chunks, accumulators in registers",
        false},
       {2, "staged", "x staged per K-slice in shared memory, slices reduced in a cluster", true}},
      run};
}

}  // namespace lilac::lab
