// q_gemv_rows in the kernel lab: every version on the same random 4/8-bit matrices at the model's
// shapes (in_proj, out_proj accumulating into h, the 8-bit router, lm_head) and T = 16 and 64
// token rows, checked against the CPU twin at tokens 0, T / 2 and T - 1 (all rows) as the
// conformance test of q_gemv_rows checks it (tests/cuda/twins/q4_twin.h: the matrix HostQ, the twin
// q_twin, the bound q_gemv_tolerance), then timed as lilac_cuda_bench_q4 times it: a graph of 20
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
#include "cuda/q4_linear.h"
#include "q_gemv_rows_lab.h"
#include "twins/q4_twin.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::GemvOut;
using cuda::QMatrix;

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

// The inputs of one (shape, T) and the CPU twin at the checked tokens, shared by the versions. The
// matrix: W uniform in +-sqrt(3 / cols) (unit-variance outputs for unit x) rounded to bf16 and
// quantized by the CPU quantizer, as the conformance tests' (HostQ); x ~ N(0, 1) rounded to bf16,
// y0 ~ N(0, 9).
struct Case {
  const Shape* shape = nullptr;
  const test::HostQ* W = nullptr;
  std::vector<float> x;  // [T, cols], bf16 values
  DeviceBuffer<bf16> d_x;
  std::vector<float> y0;                 // [T, rows]: y before an Accumulate launch
  std::vector<int> tokens;               // the checked tokens
  std::vector<std::vector<float>> want;  // [token][rows]
  std::vector<std::vector<double>> tol;  // [token][rows]
};

double weight_bytes(const test::HostQ& W) {
  return double(W.d_codes.bytes() + W.d_sb.bytes());
}

// The twin, per checked token t as conformance/rows.cpp: want = q_twin (dequantize_row, then
// cpu::matmul in f32) within q_gemv_tolerance (the kernel's f32 rounding: MMA steps on partial
// sums of up to Cmax sum |x|, the per-group scale and offset terms, the f32 sums over groups, and
// the twin's own sum); when accumulating, want = y0 + that, tolerance + 2u |want| for the add.
void twin(Case& c) {
  const Shape& s = *c.shape;
  const size_t K = size_t(s.cols), rows = size_t(s.rows);
  c.want.clear();
  c.tol.clear();
  for (int t : c.tokens) {
    const std::vector<float> xt(c.x.begin() + ptrdiff_t(size_t(t) * K),
                                c.x.begin() + ptrdiff_t(size_t(t + 1) * K));
    std::vector<float> want = test::q_twin(*c.W, 0, s.rows, xt);
    std::vector<double> tol = test::q_gemv_tolerance(*c.W, 0, s.rows, xt);
    if (s.accumulate)
      for (size_t r = 0; r < rows; ++r) {
        want[r] += c.y0[size_t(t) * rows + r];
        tol[r] += 2 * test::kU * std::fabs(double(want[r]));
      }
    c.want.push_back(std::move(want));
    c.tol.push_back(std::move(tol));
  }
}

// The case of shape i at T rows, built once for all versions (lm_head's host matrix and twin are
// large): the matrix of a shape is shared by its T.
Case& get_case(int i, int T) {
  static std::map<int, std::unique_ptr<test::HostQ>> matrices;
  static std::map<std::pair<int, int>, Case> cases;
  auto it = cases.find({i, T});
  if (it != cases.end()) return it->second;
  const Shape& s = kShapes[i];
  std::unique_ptr<test::HostQ>& m = matrices[i];
  if (!m)
    m = std::make_unique<test::HostQ>(s.rows, s.cols, s.bits, std::sqrt(3.f / float(s.cols)),
                                      uint64_t(100 + i));
  Case c;
  const uint32_t seed = uint32_t(1000 + 16 * i + T);
  c.shape = &s;
  c.W = m.get();
  c.x = test::random_floats(size_t(T) * size_t(s.cols), 1.f, seed + 1);
  c.d_x = upload_bf16(test::to_bf16_rounding(c.x));
  if (s.accumulate) c.y0 = test::random_floats(size_t(T) * size_t(s.rows), 3.f, seed + 2);
  c.tokens = {0, T / 2, T - 1};
  twin(c);
  return cases.emplace(std::make_pair(i, T), std::move(c)).first->second;
}

// got [T, rows] against the twin at the checked tokens: the largest |err| and its largest ratio
// to the per-element tolerance (NaN: a failure).
Error compare_case(const std::vector<float>& got, const Case& c) {
  Error e;
  const size_t rows = size_t(c.shape->rows);
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
  const Shape& s = *c.shape;
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
  const Shape& s = *c.shape;
  const int copies = int(std::max<double>(1, double(kRotateBytes) / weight_bytes(*c.W) + 1));
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
  const double gbs = weight_bytes(*c.W) / us * 1e-3;
  std::printf("  time %-36s %9.2f us  %6.0f GB/s (%.2f MB of weights), %4.1f%% of 4.3 TB/s\n",
              label(s, T).c_str(), us, gbs, weight_bytes(*c.W) * 1e-6, 100.0 * gbs / 4300.0);
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
