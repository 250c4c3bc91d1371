// q_gemm in the kernel lab: every version on the same random 4-bit matrices at the model's dense
// prefill shapes (GDN in_proj and out_proj += h, attention qkv and o_proj += h) and M = 4096, 512
// and 1000 tokens, checked against the CPU twin as the conformance test of q_gemm checks it
// (tests/cuda/conformance/q4_gemm.cpp): the matrix HostQ (tests/cuda/twins/q4_twin.h), the twin
// dequantize_row_bf16 (the bf16 weights the kernels multiply) + an f64 dot, the bound
// dot_tolerance(K) ||w_r|| ||a_t|| + 2u |want| (twins/gemm_twin.h; the conformance test's, which
// covers both sides' f32 rounding, here only the kernel's). Checked: every row at up to 12 tokens
// spanning the token tiles (0, 1, 127, 128, 255, 256, ..., M - 1), and every output finite (the
// store shapes start poisoned with NaN). Then timed: a CUDA graph of launches, median per launch,
// TFLOP/s of 2 M N K, with cuda::gemm (the BF16 path, tile Auto: the wgmma kernel on an H200) on
// the dequantised bf16 weights as the reference rate. The 4-bit launches rotate over copies of the
// matrix (at least 128 MB of them: get_copies), so they read from DRAM as in the engine (since
// s44; earlier runs timed a matrix left in L2).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../lab.h"
#include "cuda/gemm.h"
#include "cuda/q4_gemm.h"
#include "cuda/q4_linear.h"
#include "q_gemm_lab.h"
#include "twins/gemm_twin.h"
#include "twins/q4_twin.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::GemmOut;
using cuda::QMatrix;

struct Shape {
  const char* name;
  int rows, cols;   // N, K
  bool accumulate;  // GemmOut::AccumulateF32 (out_proj / o_proj add into the residual h)
  bool small_only;  // only in version 4 (the batched decode step's shapes)
};
const Shape kShapes[] = {{"gdn_in_proj", 12352, 2048, false, false},
                         {"gdn_out_proj (+= h)", 2048, 4096, true, false},
                         {"attn_qkv", 9216, 2048, false, false},
                         {"attn_o_proj (+= h)", 2048, 4096, true, false},
                         {"lm_head", 248320, 2048, false, true}};
const int kTokens[] = {4096, 512, 1000, 256};
// Version 4: the batched decode step's row counts (and one row, awkward 17 and 33 checked only).
const int kSmallTokens[] = {16, 32, 64};
const int kSmallChecked[] = {1, 17, 33};
constexpr double kPeak = 790.0;  // TFLOP/s: the bf16 dense rate the GEMM comments use (gemm.cu)

using Launch = std::function<void(const bf16*, int, const QMatrix&, void*, GemmOut, cudaStream_t)>;

// Version 4's reference launch (the batched step's path below 9 rows), checked with a bound of
// its own (check()).
const std::string kGemvRowsTag = " [q_gemv_rows]";

// The launches a version is checked and timed with: (label, launch); v2 also at each fixed tile.
std::vector<std::pair<std::string, Launch>> launches(int version) {
  if (version == 1)
    return {{"", [](const bf16* A, int M, const QMatrix& W, void* C, GemmOut m, cudaStream_t s) {
               cuda::q_gemm_mma(A, M, W, C, m, s);
             }}};
  if (version == 3) {
    // Auto, then each fixed (tokens per block, splits) the device can run (a cluster of 4 blocks
    // of ~220 KB needs 4 free SMs of one GPC).
    std::vector<std::pair<std::string, Launch>> ls;
    const std::pair<int, int> kinds[] = {{0, 0},   {256, 1}, {128, 1}, {256, 2},
                                         {128, 2}, {256, 4}, {128, 4}};
    for (const auto& [bt, sp] : kinds) {
      if (bt != 0 && cuda::q_gemm_wgmma_max_clusters(bt, sp) <= 0) {
        std::printf("  v3 [bt%d s%d]: no cluster of %d such blocks fits on this device; skipped\n",
                    bt, sp, sp);
        continue;
      }
      ls.emplace_back(
          bt == 0 ? std::string() : " [bt" + std::to_string(bt) + " s" + std::to_string(sp) + "]",
          [bt, sp](const bf16* A, int M, const QMatrix& W, void* C, GemmOut m, cudaStream_t s) {
            cuda::q_gemm_wgmma(A, M, W, C, m, s, bt, sp);
          });
    }
    return ls;
  }
  if (version == 4) {
    // Auto (production: the small-M form at M <= 64), each fixed split of the small-M form, s7's
    // narrow form (128-token blocks, wgmma n = 64) at each split, and q_gemv_rows (the batched
    // step's path up to 32 rows before s18) for reference.
    std::vector<std::pair<std::string, Launch>> ls;
    const std::pair<int, int> kinds[] = {{0, 0},  {64, 1},  {64, 2},  {64, 4}, {64, 8}, {32, 1},
                                         {32, 2}, {32, 4},  {32, 8},  {16, 1}, {16, 2}, {16, 4},
                                         {16, 8}, {128, 1}, {128, 2}, {128, 4}};
    for (const auto& [bt, sp] : kinds) {
      if (bt != 0 && cuda::q_gemm_wgmma_max_clusters(bt, sp) <= 0) {
        std::printf("  v4 [bt%d s%d]: no cluster of %d such blocks fits on this device; skipped\n",
                    bt, sp, sp);
        continue;
      }
      // How many fit at once (in_proj's 97 row blocks run in one wave only if >= 97 do).
      if (bt != 0)
        std::printf("  v4 [bt%d s%d]: %d clusters resident at once\n", bt, sp,
                    cuda::q_gemm_wgmma_max_clusters(bt, sp));
      ls.emplace_back(
          bt == 0 ? std::string() : " [bt" + std::to_string(bt) + " s" + std::to_string(sp) + "]",
          [bt, sp](const bf16* A, int M, const QMatrix& W, void* C, GemmOut m, cudaStream_t s) {
            cuda::q_gemm_wgmma(A, M, W, C, m, s, bt, sp);
          });
    }
    ls.emplace_back(kGemvRowsTag, [](const bf16* A, int M, const QMatrix& W, void* C, GemmOut m,
                                     cudaStream_t s) {
      cuda::q_gemv_rows(
          W, A, M, static_cast<float*>(C),
          m == GemmOut::AccumulateF32 ? cuda::GemvOut::Accumulate : cuda::GemvOut::Store, s);
    });
    return ls;
  }
  auto fixed = [](int bt) {
    return [bt](const bf16* A, int M, const QMatrix& W, void* C, GemmOut m, cudaStream_t s) {
      lab::q_gemm_v2(A, M, W, C, m, s, bt);
    };
  };
  return {{"", fixed(0)}, {" [bt256]", fixed(256)}, {" [bt128]", fixed(128)}};
}

// A shape's matrix (the conformance tests' HostQ: W uniform in +-sqrt(3 / K) rounded to bf16,
// quantized by the CPU quantizer), its bf16 dequantisation (the twin's weights, also uploaded for
// the BF16 reference GEMM) and row norms.
struct Weights {
  std::unique_ptr<test::HostQ> q;
  std::vector<uint16_t> wb;
  std::vector<double> wn;
  DeviceBuffer<bf16> d_wb;
};
// Activations [M, K] ~ U(+-1) as bf16, their row norms, and the residual for the += shapes.
struct Acts {
  std::vector<float> a;
  std::vector<double> an;
  DeviceBuffer<bf16> d_a;
};

const Weights& get_weights(int i) {
  static std::map<int, Weights> cache;
  auto it = cache.find(i);
  if (it != cache.end()) return it->second;
  const Shape& s = kShapes[i];
  Weights w;
  w.q = std::make_unique<test::HostQ>(s.rows, s.cols, 4, std::sqrt(3.f / float(s.cols)),
                                      uint64_t(200 + i));
  w.wb = w.q->dequant_bf16();
  w.wn = test::row_norms(w.wb.data(), s.rows, s.cols);
  w.d_wb = upload_bf16(w.wb);
  return cache.emplace(i, std::move(w)).first->second;
}

// Device copies of shape i's 4-bit matrix, enough that the timed launches, rotating over them,
// read at least kColdBytes of weights between two reads of one copy: more than the L2 (50 MB on
// H100 / H200), so every launch reads its weights from DRAM, as the engine's projections do (a
// layer's experts evict them). Until s44 the lab timed one matrix launch after launch: in_proj
// (12.6 MB) stayed in L2, and at 16 rows its S = 1 form timed 9.87 us against S = 2's 10.39 where
// the step's timeline, from DRAM, shows S = 1 at ~20 us exposed per call against S = 2's 10.9 (s44
// runs 2, 8, 9). Copy 0 is the matrix itself.
constexpr size_t kColdBytes = size_t(128) << 20;
struct Copies {
  std::vector<DeviceBuffer<uint32_t>> codes, sb;
  std::vector<QMatrix> q;
};
const std::vector<QMatrix>& get_copies(int i) {
  static std::map<int, Copies> cache;
  auto it = cache.find(i);
  if (it != cache.end()) return it->second.q;
  const QMatrix& q0 = get_weights(i).q->q();
  const size_t cw = q0.code_words(), sw = q0.sb_words(), bytes = (cw + sw) * 4;
  const size_t n = std::max<size_t>(1, (kColdBytes + bytes - 1) / bytes);
  Copies c;
  c.q.push_back(q0);
  for (size_t j = 1; j < n; ++j) {
    c.codes.emplace_back(cw);
    c.sb.emplace_back(sw);
    LILAC_CUDA_CHECK(cudaMemcpy(c.codes.back().get(), q0.codes, cw * 4, cudaMemcpyDeviceToDevice));
    LILAC_CUDA_CHECK(cudaMemcpy(c.sb.back().get(), q0.sb, sw * 4, cudaMemcpyDeviceToDevice));
    QMatrix q = q0;
    q.codes = c.codes.back().get();
    q.sb = c.sb.back().get();
    c.q.push_back(q);
  }
  return cache.emplace(i, std::move(c)).first->second.q;
}

const Acts& get_acts(int K, int M) {
  static std::map<std::pair<int, int>, Acts> cache;
  auto it = cache.find({K, M});
  if (it != cache.end()) return it->second;
  Acts x;
  const std::vector<uint16_t> bits =
      test::random_bf16_bits(size_t(M) * size_t(K), 1.f, uint64_t(300 + M + K));
  x.a = test::widen(bits.data(), bits.size());
  x.an = test::row_norms(bits.data(), M, K);
  x.d_a = upload_bf16(bits);
  return cache.emplace(std::make_pair(K, M), std::move(x)).first->second;
}

std::vector<int> checked_tokens(int M) {
  std::vector<int> t;
  for (int v : {0, 1, 127, 128, 129, 255, 256, M / 2, M - 257, M - 129, M - 2, M - 1})
    if (v >= 0 && v < M && std::find(t.begin(), t.end(), v) == t.end()) t.push_back(v);
  return t;
}

std::vector<float> residual(size_t n, uint64_t seed) {
  std::vector<float> c0(n);
  for (size_t i = 0; i < n; ++i) c0[i] = test::hash_uniform(seed, i, 2.f);
  return c0;
}

std::string label(const Shape& s, int M) {
  return std::string(s.name) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         " M=" + std::to_string(M);
}

// The twin at the checked tokens of (shape i, M), computed once for every launch checked there:
// want[j * N + r] (token toks[j], row r; the residual included) and its tolerance.
struct Twin {
  std::vector<int> toks;
  std::vector<float> c0;  // the residual for the += shapes, [M, N]
  std::vector<double> want, tol;
};

const Twin& get_twin(int i, int M) {
  static std::map<std::pair<int, int>, Twin> cache;
  auto it = cache.find({i, M});
  if (it != cache.end()) return it->second;
  const Shape& s = kShapes[i];
  const Weights& w = get_weights(i);
  const Acts& x = get_acts(s.cols, M);
  const size_t N = size_t(s.rows), K = size_t(s.cols);
  Twin tw;
  tw.toks = checked_tokens(M);
  if (s.accumulate) tw.c0 = residual(size_t(M) * N, uint64_t(400 + i));
  tw.want.resize(tw.toks.size() * N);
  tw.tol.resize(tw.toks.size() * N);
  const double dt = test::dot_tolerance(int64_t(K));
  ThreadPool::global().parallel_for(N, [&](size_t b, size_t end) {
    std::vector<double> wr(K);
    for (size_t r = b; r < end; ++r) {
      for (size_t k = 0; k < K; ++k) wr[k] = bf16_to_f32(w.wb[r * K + k]);
      for (size_t j = 0; j < tw.toks.size(); ++j) {
        const size_t t = size_t(tw.toks[j]);
        const float* at = x.a.data() + t * K;
        double d = 0;
        for (size_t k = 0; k < K; ++k) d += wr[k] * double(at[k]);
        const double want = (tw.c0.empty() ? 0.0 : double(tw.c0[t * N + r])) + d;
        tw.want[j * N + r] = want;
        tw.tol[j * N + r] = dt * w.wn[r] * x.an[t] + 2 * test::kU * std::fabs(want) + 1e-30;
      }
    }
  });
  return cache.emplace(std::make_pair(i, M), std::move(tw)).first->second;
}

// The narrow-stage forms ([bt16 ..] / [bt32 ..]) take at most that many tokens.
bool runs_at(const std::string& tag, int M) {
  if (tag.rfind(" [bt16 ", 0) == 0) return M <= 16;
  if (tag.rfind(" [bt32 ", 0) == 0) return M <= 32;
  return true;
}

bool check(const Launch& launch, const std::string& tag, int i, int M) {
  // q_gemv_rows multiplies the exact dequantised weights (f32 scale q + bias), not their bf16
  // rounding that the twin and the wgmma kernels use: |w - bf16(w)| <= 2^-8 |w| per element, so
  // its outputs may also differ from the twin by up to 2^-8 sum |w_k a_k| <= 2^-8 ||w_r|| ||a_t||.
  const double weight_rounding = tag == kGemvRowsTag ? 1.0 / 256 : 0.0;
  const Shape& s = kShapes[i];
  const Weights& w = get_weights(i);
  const Acts& x = get_acts(s.cols, M);
  const Twin& tw = get_twin(i, M);
  const size_t N = size_t(s.rows), n = size_t(M) * N;
  DeviceBuffer<float> c(n);
  if (s.accumulate)
    LILAC_CUDA_CHECK(cudaMemcpy(c.get(), tw.c0.data(), n * 4, cudaMemcpyHostToDevice));
  else
    test::poison(c);
  launch(x.d_a.get(), M, w.q->q(), c.get(),
         s.accumulate ? GemmOut::AccumulateF32 : GemmOut::StoreF32, nullptr);
  const std::vector<float> got = download(c);
  Error e;
  for (float v : got)
    if (!std::isfinite(v)) {
      e.max_abs = e.worst = INFINITY;
      break;
    }
  for (size_t j = 0; j < tw.toks.size(); ++j)
    for (size_t r = 0; r < N; ++r) {
      const double err = std::fabs(double(got[size_t(tw.toks[j]) * N + r]) - tw.want[j * N + r]);
      e.max_abs = std::max(e.max_abs, std::isfinite(err) ? err : INFINITY);
      const double tol = tw.tol[j * N + r] + weight_rounding * w.wn[r] * x.an[size_t(tw.toks[j])];
      e.worst = std::max(e.worst, std::isfinite(err) ? err / tol : INFINITY);
    }
  return report_check(
      label(s, M) + tag + ", " + std::to_string(tw.toks.size()) + " tokens, all finite", e);
}

// launch(stream, j): the j-th launch of the graph (j < reps), which reads weight copy j % copies.
void time_one(const Options& opt, const std::string& what, int M, const Shape& s,
              const std::function<void(cudaStream_t, int)>& launch) {
  cudaStream_t st;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int reps = M >= 2048 ? 4 : 16;
  const double us = graph_us(st, opt.runs, reps, [&](int j) { launch(st, j); });
  LILAC_CUDA_CHECK(cudaStreamDestroy(st));
  const double tf = 2.0 * M * double(s.rows) * s.cols / us * 1e-6;
  std::printf("  time %-46s %9.2f us  %6.1f TFLOP/s (%4.1f%% of %.0f)\n", what.c_str(), us, tf,
              100.0 * tf / kPeak, kPeak);
  std::fflush(stdout);
}

void time_case(const Options& opt, const std::vector<std::pair<std::string, Launch>>& ls, int i,
               int M) {
  const Shape& s = kShapes[i];
  const Weights& w = get_weights(i);
  const std::vector<QMatrix>& qs = get_copies(i);
  const Acts& x = get_acts(s.cols, M);
  DeviceBuffer<float> c(size_t(M) * size_t(s.rows));
  LILAC_CUDA_CHECK(cudaMemset(c.get(), 0, c.bytes()));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  const GemmOut mode = s.accumulate ? GemmOut::AccumulateF32 : GemmOut::StoreF32;
  for (const auto& [tag, launch] : ls)
    if (runs_at(tag, M))
      time_one(opt, label(s, M) + tag, M, s, [&](cudaStream_t st, int j) {
        launch(x.d_a.get(), M, qs[size_t(j) % qs.size()], c.get(), mode, st);
      });
  // One bf16 copy (in L2 where it fits: in_proj's 50 MB does not).
  time_one(opt, label(s, M) + " [bf16 gemm ref]", M, s, [&](cudaStream_t st, int) {
    cuda::gemm(x.d_a.get(), M, s.cols, w.d_wb.get(), s.rows, c.get(), mode, st);
  });
}

bool run(const Options& opt, const Version& v) {
  if (v.number >= 2 && !cuda::q_gemm_wgmma_available()) {
    std::printf("  not available here (wgmma: a compute capability 9.0 GPU)\n");
    return true;
  }
  const auto ls = launches(v.number);
  bool ok = true;
  const bool small = v.number == 4;
  std::vector<int> checked, timed;
  if (small) {
    checked.assign(std::begin(kSmallTokens), std::end(kSmallTokens));
    checked.insert(checked.end(), std::begin(kSmallChecked), std::end(kSmallChecked));
    timed.assign(std::begin(kSmallTokens), std::end(kSmallTokens));
  } else {
    checked.assign(std::begin(kTokens), std::end(kTokens));
    timed = checked;
  }
  for (int i = 0; i < int(std::size(kShapes)); ++i)
    if (small || !kShapes[i].small_only)
      for (int M : checked)
        for (const auto& [tag, launch] : ls)
          if (runs_at(tag, M)) ok = check(launch, tag, i, M) && ok;
  for (int i = 0; i < int(std::size(kShapes)); ++i)
    if (small || !kShapes[i].small_only)
      for (int M : timed) time_case(opt, ls, i, M);
  return ok;
}

}  // namespace

Op q_gemm_op() {
  return Op{
      "q_gemm",
      "4-bit dense prefill GEMM C (=|+=) A W^T: in_proj 12352x2048, out_proj 2048x4096 (+=), qkv "
      "9216x2048, o_proj 2048x4096 (+=); M 4096, 512, 1000, 256 (v4: M 16, 32, 64 and lm_head "
      "248320x2048)",
      {{1, "mma_sync",
        "mma.sync m16n8k16, W as the A operand dequantised in registers from the tiled layout, 256 "
        "rows x 128 tokens per block (production for 8-bit weights; for 4-bit until s6)",
        true},
       {2, "wgmma_rs",
        "wgmma m64nBTk16 with W dequantised in registers as the A operand (RS), tokens from "
        "swizzled smem as B; 128 rows x 256 (or 128) tokens, 6-8 stage cp.async (production for "
        "4-bit weights in s6)",
        false},
       {3, "splitk_cluster",
        "v2's main loop on 1/S of K per block (S = 1, 2, 4), the S blocks of a tile a cluster "
        "reducing through distributed shared memory in rank order; epilogue through shared "
        "memory (16-byte coalesced rows, residual loads batched); production for 4-bit weights "
        "since s7",
        false},
       {4, "small_m",
        "the batched decode step's M = 16 .. 64 (and lm_head): v3 with 64-token blocks (wgmma n "
        "16 / 32 / 64 by M), 8 stages of 12.5 KB, 2 blocks per SM, K split up to 8 ways; against "
        "s7's 128-token narrow form and q_gemv_rows; production from s18 (from s22 the M <= 16 / "
        "<= 32 forms with stages of 16 / 32 tokens, 3 blocks per SM: [bt16 sS] / [bt32 sS])",
        true}},
      run};
}

}  // namespace lilac::lab
