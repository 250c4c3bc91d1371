// q_gemv_rows in the kernel lab: every version on the same random 4/8-bit matrices at the model's
// shapes (in_proj, out_proj accumulating into h, the 8-bit router, lm_head) and three awkward ones
// (1000 rows: a partial row tile and a partial block; 1536 columns: 3 register sets, accumulating;
// 24600 x 1024 at 8 bits: enough row blocks for v3 to give a block several 8-bit register sets),
// checked at T = 1, 8, 16, 24, 33 and 64 token rows against the CPU twin at tokens 0, T / 2 and
// T - 1 (all rows) as the conformance test of q_gemv_rows checks it (tests/cuda/twins/q4_twin.h:
// the matrix HostQ, the twin q_twin, the bound q_gemv_tolerance); then the model's shapes at T = 16
// and 64 are timed as lilac_cuda_bench_q4 times them: a graph of 20 launches rotating over copies
// of the matrix totalling > 2x the 60 MB L2 (the weights come from HBM, as in a batched decode
// step), median per launch, GB/s of the weight bytes.
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
  bool timed;       // a model shape (the awkward ones are checked only)
};
const Shape kShapes[] = {{"gdn_in_proj", 12352, 2048, 4, false, true},
                         {"gdn_out_proj (+= h)", 2048, 4096, 4, true, true},
                         {"router 8-bit", 257, 2048, 8, false, true},
                         {"lm_head", 248320, 2048, 4, false, true},
                         {"awkward rows", 1000, 2048, 4, false, false},
                         {"awkward cols (+= y)", 2048, 1536, 4, true, false},
                         {"awkward 8-bit", 24600, 1024, 8, false, false}};
const int kCheckedTokens[] = {1, 8, 16, 24, 33, 64};  // 1 chunk, full chunks, partial chunks
const int kTimedTokens[] = {16, 64};
constexpr int kMaxT = 64;  // x and y0 have kMaxT rows; a launch at T reads the first T

using Launch = void (*)(const QMatrix&, const bf16*, int, float*, GemvOut, cudaStream_t);

void v3_slice_pipeline(const QMatrix& W, const bf16* x, int T, float* y, GemvOut mode,
                       cudaStream_t s) {
  cuda::q_gemv_rows(W, x, T, y, mode, s);
}

Launch launcher(int version) {
  return version == 1 ? q_gemv_rows_v1 : version == 2 ? q_gemv_rows_v2 : v3_slice_pipeline;
}

bool available(int version) {
  return version == 1 || cuda::q_gemv_rows_available();  // v2, v3: thread-block clusters
}

// The inputs of one shape, shared by the versions and by every T (a launch at T reads the first T
// rows of x and y0): the matrix W uniform in +-sqrt(3 / cols) (unit-variance outputs for unit x)
// rounded to bf16 and quantized by the CPU quantizer, as the conformance tests' (HostQ); x ~ N(0,
// 1) rounded to bf16, y0 ~ N(0, 9), kMaxT rows each. The twin of a token is computed once.
struct Inputs {
  const Shape* shape = nullptr;
  std::unique_ptr<test::HostQ> W;
  std::vector<float> x;  // [kMaxT, cols], bf16 values
  DeviceBuffer<bf16> d_x;
  std::vector<float> y0;  // [kMaxT, rows]: y before an Accumulate launch
};

// The twin of one token: want and the per-row tolerance.
struct TwinRow {
  std::vector<float> want;
  std::vector<double> tol;
};

double weight_bytes(const test::HostQ& W) {
  return double(W.d_codes.bytes() + W.d_sb.bytes());
}

Inputs& inputs(int i) {
  static std::map<int, Inputs> all;
  auto it = all.find(i);
  if (it != all.end()) return it->second;
  const Shape& s = kShapes[i];
  Inputs in;
  in.shape = &s;
  in.W = std::make_unique<test::HostQ>(s.rows, s.cols, s.bits, std::sqrt(3.f / float(s.cols)),
                                       uint64_t(100 + i));
  const uint32_t seed = uint32_t(1000 + 16 * i);
  in.x = test::random_floats(size_t(kMaxT) * size_t(s.cols), 1.f, seed + 1);
  in.d_x = upload_bf16(test::to_bf16_rounding(in.x));
  if (s.accumulate) in.y0 = test::random_floats(size_t(kMaxT) * size_t(s.rows), 3.f, seed + 2);
  return all.emplace(i, std::move(in)).first->second;
}

// The twin, per token t as conformance/rows.cpp: want = q_twin (dequantize_row, then cpu::matmul
// in f32) within q_gemv_tolerance (the kernel's f32 rounding: MMA steps on partial sums of up to
// Cmax sum |x|, the per-group scale and offset terms, the f32 sums over groups, and the twin's own
// sum); when accumulating, want = y0 + that, tolerance + 2u |want| for the add.
const TwinRow& twin(int i, int t) {
  static std::map<std::pair<int, int>, TwinRow> rows_of;
  auto it = rows_of.find({i, t});
  if (it != rows_of.end()) return it->second;
  const Inputs& in = inputs(i);
  const Shape& s = *in.shape;
  const size_t K = size_t(s.cols), rows = size_t(s.rows);
  const std::vector<float> xt(in.x.begin() + ptrdiff_t(size_t(t) * K),
                              in.x.begin() + ptrdiff_t(size_t(t + 1) * K));
  TwinRow tr;
  tr.want = test::q_twin(*in.W, 0, s.rows, xt);
  tr.tol = test::q_gemv_tolerance(*in.W, 0, s.rows, xt);
  if (s.accumulate)
    for (size_t r = 0; r < rows; ++r) {
      tr.want[r] += in.y0[size_t(t) * rows + r];
      tr.tol[r] += 2 * test::kU * std::fabs(double(tr.want[r]));
    }
  return rows_of.emplace(std::make_pair(i, t), std::move(tr)).first->second;
}

// The checked tokens at T: 0, T / 2, T - 1 (each once).
std::vector<int> checked_tokens(int T) {
  std::vector<int> t = {0, T / 2, T - 1};
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

// got [T, rows] against the twin at the checked tokens: the largest |err| and its largest ratio
// to the per-element tolerance (NaN: a failure).
Error compare_case(const std::vector<float>& got, int i, int T) {
  Error e;
  const size_t rows = size_t(kShapes[i].rows);
  for (int t : checked_tokens(T)) {
    const TwinRow& tr = twin(i, t);
    for (size_t r = 0; r < rows; ++r) {
      const double d = std::fabs(double(got[size_t(t) * rows + r]) - tr.want[r]);
      if (!std::isfinite(d)) {
        e.max_abs = e.worst = INFINITY;
        return e;
      }
      e.max_abs = std::max(e.max_abs, d);
      e.worst = std::max(e.worst, d / tr.tol[r]);
    }
  }
  return e;
}

std::string label(const Shape& s, int T) {
  return std::string(s.name) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         " T=" + std::to_string(T);
}

bool check(int version, int i, int T) {
  const Inputs& in = inputs(i);
  const Shape& s = *in.shape;
  const size_t n = size_t(T) * size_t(s.rows);
  DeviceBuffer<float> y(n);
  if (s.accumulate) {
    LILAC_CUDA_CHECK(cudaMemcpy(y.get(), in.y0.data(), n * 4, cudaMemcpyHostToDevice));
  } else {
    LILAC_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));  // NaN: every element is written
  }
  launcher(version)(in.W->q(), in.d_x.get(), T, y.get(),
                    s.accumulate ? GemvOut::Accumulate : GemvOut::Store, nullptr);
  return report_check(label(s, T) + ", tokens 0, T/2, T-1", compare_case(download(y), i, T));
}

// Per launch: graph replays over > 2x L2 of weight copies (device copies of the checked matrix).
void time_case(const Options& opt, int version, int i, int T) {
  const Inputs& in = inputs(i);
  const Shape& s = *in.shape;
  const test::HostQ& W0 = *in.W;
  const int copies = int(std::max<double>(1, double(kRotateBytes) / weight_bytes(W0) + 1));
  std::vector<DeviceBuffer<uint32_t>> codes, sb;
  std::vector<QMatrix> W = {W0.q()};
  for (int k = 1; k < copies; ++k) {
    codes.emplace_back(W0.d_codes.size());
    sb.emplace_back(W0.d_sb.size());
    LILAC_CUDA_CHECK(cudaMemcpy(codes.back().get(), W0.d_codes.get(), W0.d_codes.bytes(),
                                cudaMemcpyDeviceToDevice));
    LILAC_CUDA_CHECK(
        cudaMemcpy(sb.back().get(), W0.d_sb.get(), W0.d_sb.bytes(), cudaMemcpyDeviceToDevice));
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
    launch(W[size_t(k % copies)], in.d_x.get(), T, y.get(), mode, st);
  });
  LILAC_CUDA_CHECK(cudaStreamDestroy(st));
  const double gbs = weight_bytes(W0) / us * 1e-3;
  std::printf("  time %-36s %9.2f us  %6.0f GB/s (%.2f MB of weights), %4.1f%% of 4.3 TB/s\n",
              label(s, T).c_str(), us, gbs, weight_bytes(W0) * 1e-6, 100.0 * gbs / 4300.0);
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
    for (int T : kCheckedTokens) ok = check(v.number, i, T) && ok;
  for (int i = 0; i < int(std::size(kShapes)); ++i)
    if (kShapes[i].timed)
      for (int T : kTimedTokens) time_case(opt, v.number, i, T);
  return ok;
}

}  // namespace

Op q_gemv_rows_op() {
  return Op{
      "q_gemv_rows",
      "4/8-bit dense projections over T token rows: in_proj 12352x2048, out_proj 2048x4096 "
      "(+=), router 257x2048 8-bit, lm_head 248320x2048 (timed at T 16, 64); checked also on "
      "1000x2048, 2048x1536 (+=), 24600x1024 8-bit, T 1, 8, 16, 24, 33, 64",
      {{1, "set_dot", "q_set_dot_tokens per warp: codes, x chunks, accumulators in registers",
        false},
       {2, "staged",
        "x staged per K-slice in shared memory, slices reduced in a cluster (production until s6)",
        false},
       {3, "slice_pipeline",
        "v2 with a block over several register sets: next set's weights and next stage's x "
        "loaded while the current one computes; ~one wave of blocks (production since s6)",
        true}},
      run};
}

}  // namespace lilac::lab
