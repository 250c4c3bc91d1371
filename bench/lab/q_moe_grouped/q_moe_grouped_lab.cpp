// q_moe_grouped in the kernel lab: the grouped 4-bit expert GEMMs of a prefill chunk
// (q_moe_grouped_gate_up: act = bf16(silu(x gate_e^T) * (x up_e^T)) over moe_route's sorted rows;
// q_moe_grouped_down: y = act down_e^T, f32, sorted rows) at the real model's shapes (H 2048,
// I 512, E 256, k 8), on the conformance case q_moe_prefill's inputs and twin
// (tests/cuda/twins/q4_moe_twin.h: the expert stacks quantized by the CPU quantizer, seed 77;
// router logits uniform in +-3; x uniform in +-1 as bf16; per act / y element the f64 dot products
// on dequantize_row_bf16's weights and the conformance bounds). Cases: T = 4096, 512 and 256 with
// moe_route's routing of the random logits, and T = 1000 skewed (tokens 0..299 all pick expert
// 0: ~320 rows, three tiles, the last partial). Checked per version and case: every act and y
// element finite (outputs start poisoned with NaN; the 16 elements past y stay NaN) and at ~50
// sorted rows (tile and expert boundaries, the most loaded expert, the last row, random ones) all
// I act and all H y values against the twin; down runs on the version's own act (as the
// conformance test). Timed: a CUDA graph of 4 (T >= 2048) or 16 launches, median per launch;
// TFLOP/s on the real MACs (gate_up T k 2I H, down T k H I).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "../lab.h"
#include "cuda/moe_prefill.h"
#include "cuda/q4_moe.h"
#include "q_moe_grouped_lab.h"
#include "twins/q4_moe_twin.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::MoeRouting;
using cuda::QMatrix;

constexpr int kH = 2048, kI = 512, kE = 256, kK = 8;
constexpr uint64_t kSeed = 77;  // the conformance test's real-shape prefill case

struct Case {
  const char* name;
  int T;
  int skew;  // tokens [0, skew) get expert 0 first (logit + 20)
};
const Case kCases[] = {
    {"uniform", 4096, 0}, {"uniform", 512, 0}, {"uniform", 256, 0}, {"skewed", 1000, 300}};

struct Impl {
  std::function<void(const bf16*, const QMatrix&, const MoeRouting&, bf16*, cudaStream_t)> gate_up;
  std::function<void(const bf16*, const QMatrix&, const MoeRouting&, float*, cudaStream_t)> down;
};

Impl impl(int version) {
  if (version == 1)
    return {[](const bf16* x, const QMatrix& W, const MoeRouting& r, bf16* act, cudaStream_t s) {
              cuda::q_moe_grouped_gate_up_mma(x, kH, W, kI, r, act, s);
            },
            [](const bf16* act, const QMatrix& W, const MoeRouting& r, float* y, cudaStream_t s) {
              cuda::q_moe_grouped_down_mma(act, kI, W, kH, r, y, s);
            }};
  if (version >= 15 && version <= 18)  // v15_ws.cu: its gate_up, production's rows32 down
    return {[version](const bf16* x, const QMatrix& W, const MoeRouting& r, bf16* act,
                      cudaStream_t s) { q_moe_grouped_ws_lab(version, x, kH, W, kI, r, act, s); },
            [](const bf16* act, const QMatrix& W, const MoeRouting& r, float* y, cudaStream_t s) {
              cuda::q_moe_grouped_down_wgmma(act, kI, W, kH, r, y, s, cuda::QMoeWgmmaTile::rows32);
            }};
  if (version >= 4 && version != 11 && version != 12)  // v6_rows32_configs.cu
    return {
        [version](const bf16* x, const QMatrix& W, const MoeRouting& r, bf16* act, cudaStream_t s) {
          q_moe_grouped_gate_up_lab(version, x, kH, W, kI, r, act, s);
        },
        [version](const bf16* act, const QMatrix& W, const MoeRouting& r, float* y,
                  cudaStream_t s) { q_moe_grouped_down_lab(version, act, kI, W, kH, r, y, s); }};
  // Version 2 is version 3 with the wgmma n fixed at 128; versions 11 and 12 production's
  // short-tile forms since s21 (s20's, versions 4 and 5, run from v6_rows32_configs.cu).
  using Tile = cuda::QMoeWgmmaTile;
  const Tile tile = version == 2    ? Tile::fixed128
                    : version == 3  ? Tile::adaptive
                    : version == 12 ? Tile::rows64
                                    : Tile::rows32;
  return {[tile](const bf16* x, const QMatrix& W, const MoeRouting& r, bf16* act, cudaStream_t s) {
            cuda::q_moe_grouped_gate_up_wgmma(x, kH, W, kI, r, act, s, tile);
          },
          [tile](const bf16* act, const QMatrix& W, const MoeRouting& r, float* y, cudaStream_t s) {
            cuda::q_moe_grouped_down_wgmma(act, kI, W, kH, r, y, s, tile);
          }};
}

const test::QMoeExperts& experts() {
  static const std::unique_ptr<test::QMoeExperts> m =
      std::make_unique<test::QMoeExperts>(kH, kE, kI, 4, kSeed);
  return *m;
}

// One case's inputs: the routing on the device (and its tables on the host), x, the checked rows.
struct Inputs {
  int T = 0, P = 0;
  DeviceBuffer<uint8_t> workspace;
  MoeRouting r;
  std::vector<int32_t> sorted_token, offsets, expert_of;
  int tiles = 0, max_rows = 0;
  std::vector<float> x;
  DeviceBuffer<bf16> d_x;
  std::vector<int> rows;  // checked sorted rows
};

const Inputs& get_inputs(int ci) {
  static std::map<int, std::unique_ptr<Inputs>> cache;
  auto it = cache.find(ci);
  if (it != cache.end()) return *it->second;
  const Case& c = kCases[ci];
  auto in = std::make_unique<Inputs>();
  in->T = c.T;
  in->P = c.T * kK;
  std::vector<float> logits = test::moe_router_logits(c.T, kE, kSeed);
  for (int t = 0; t < c.skew; ++t) logits[size_t(t) * (kE + 1)] += 20.f;
  in->workspace.resize(cuda::moe_routing_workspace_bytes(c.T, kE, kK));
  in->r = cuda::moe_routing_layout(in->workspace.get(), c.T, kE, kK);
  auto dlog = upload(logits);
  cuda::moe_route(dlog.get(), kE + 1, c.T, kE, kK, in->r, nullptr);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  in->sorted_token.resize(size_t(in->P));
  in->offsets.resize(kE + 1);
  in->expert_of.resize(size_t(in->P));
  LILAC_CUDA_CHECK(cudaMemcpy(in->sorted_token.data(), in->r.sorted_token, size_t(in->P) * 4,
                              cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(
      cudaMemcpy(in->offsets.data(), in->r.expert_offsets, (kE + 1) * 4, cudaMemcpyDeviceToHost));
  LILAC_CUDA_CHECK(cudaMemcpy(&in->tiles, in->r.num_tiles, 4, cudaMemcpyDeviceToHost));
  int busiest = 0;
  for (int e = 0; e < kE; ++e) {
    const int n = in->offsets[size_t(e) + 1] - in->offsets[size_t(e)];
    if (n > in->max_rows) in->max_rows = n, busiest = e;
    for (int i = in->offsets[size_t(e)]; i < in->offsets[size_t(e) + 1]; ++i)
      in->expert_of[size_t(i)] = e;
  }
  const auto xb = test::random_bf16_bits(size_t(c.T) * kH, 1.f, kSeed + 8);
  in->x = test::widen(xb.data(), xb.size());
  in->d_x = upload_bf16(xb);
  std::set<int> rows = {0, 1, 127, 128, 129, in->P / 2, in->P - 2, in->P - 1};
  for (int e : {0, 1, kE / 2, kE - 1, busiest}) {
    const int b = in->offsets[size_t(e)], n = in->offsets[size_t(e) + 1] - b;
    for (int d : {0, 1, 126, 127, 128, 129, 255, 256, n - 2, n - 1})
      if (d >= 0 && d < n) rows.insert(b + d);
  }
  for (uint64_t i = 0; i < 12; ++i)
    rows.insert(int(test::hash_uniform(kSeed + 9, i, 0.5f) * float(in->P) + float(in->P) / 2) %
                in->P);
  for (int s : rows)
    if (s >= 0 && s < in->P) in->rows.push_back(s);
  std::printf("  case %s T=%d: %d pairs, %d tiles (max %d), busiest expert %d rows\n", c.name, c.T,
              in->P, in->tiles, in->r.max_tiles, in->max_rows);
  return *cache.emplace(ci, std::move(in)).first->second;
}

std::string label(int ci, const char* what) {
  return std::string(what) + " " + kCases[ci].name + " T=" + std::to_string(kCases[ci].T);
}

Error all_finite(const std::vector<float>& v, size_t n) {
  Error e;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) {
      e.max_abs = e.worst = INFINITY;
      break;
    }
  return e;
}

bool check(const Impl& f, int ci) {
  const test::QMoeExperts& m = experts();
  const Inputs& in = get_inputs(ci);
  const size_t P = size_t(in.P);
  DeviceBuffer<bf16> act(P * kI + 16);
  DeviceBuffer<float> y(P * kH + 16);
  test::poison(act);
  test::poison(y);
  f.gate_up(in.d_x.get(), m.gu.q(), in.r, act.get(), nullptr);
  f.down(act.get(), m.dn.q(), in.r, y.get(), nullptr);
  const std::vector<float> a = download_bf16_as_f32(act);
  const std::vector<float> yg = download(y);
  Error ea = all_finite(a, P * kI), ey = all_finite(yg, P * kH);
  for (size_t i = P * kH; i < yg.size(); ++i)
    if (!std::isnan(yg[i])) ey.max_abs = ey.worst = INFINITY;  // written past the end
  std::vector<Error> era(in.rows.size()), ery(in.rows.size());
  ThreadPool::global().parallel_for(in.rows.size(), [&](size_t b0, size_t e0) {
    for (size_t j = b0; j < e0; ++j) {
      const size_t s = size_t(in.rows[j]);
      const int e = in.expert_of[s];
      const float* xt = &in.x[size_t(in.sorted_token[s]) * kH];
      const double xn = std::sqrt(std::inner_product(xt, xt + kH, xt, 0.0));
      const std::vector<uint16_t> gu = test::dequant_rows_bf16(m.gu, int64_t(e) * 2 * kI, 2 * kI);
      for (int i = 0; i < kI; ++i) {
        const test::TwinValue t =
            test::moe_act_twin(&gu[size_t(i) * kH], &gu[size_t(kI + i) * kH], xt, kH, xn);
        const double d = std::fabs(double(a[s * kI + size_t(i)]) - t.want);
        era[j].max_abs = std::max(era[j].max_abs, std::isfinite(d) ? d : INFINITY);
        era[j].worst = std::max(era[j].worst, std::isfinite(d) ? d / t.tol : INFINITY);
      }
      const float* at = &a[s * kI];
      const double an = std::sqrt(std::inner_product(at, at + kI, at, 0.0));
      const std::vector<uint16_t> dn = test::dequant_rows_bf16(m.dn, int64_t(e) * kH, kH);
      for (int c = 0; c < kH; ++c) {
        const test::TwinValue t = test::moe_down_twin(&dn[size_t(c) * kI], at, kI, an);
        const double d = std::fabs(double(yg[s * kH + size_t(c)]) - t.want);
        ery[j].max_abs = std::max(ery[j].max_abs, std::isfinite(d) ? d : INFINITY);
        ery[j].worst = std::max(ery[j].worst, std::isfinite(d) ? d / t.tol : INFINITY);
      }
    }
  });
  for (size_t j = 0; j < in.rows.size(); ++j) merge(ea, era[j]), merge(ey, ery[j]);
  const std::string n = std::to_string(in.rows.size()) + " rows, all finite";
  const bool ok_a = report_check(label(ci, "gate_up") + ", " + n, ea);
  const bool ok_y = report_check(label(ci, "down") + ", " + n, ey);
  return ok_a && ok_y;
}

double time_one(const Options& opt, int T, const std::function<void(cudaStream_t)>& launch) {
  cudaStream_t st;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int reps = T >= 2048 ? 4 : 16;
  const double us = graph_us(st, opt.runs, reps, [&](int) { launch(st); });
  LILAC_CUDA_CHECK(cudaStreamDestroy(st));
  return us;
}

void time_case(const Options& opt, const Impl& f, int ci) {
  const test::QMoeExperts& m = experts();
  const Inputs& in = get_inputs(ci);
  const size_t P = size_t(in.P);
  DeviceBuffer<bf16> act(P * kI);
  DeviceBuffer<float> y(P * kH);
  LILAC_CUDA_CHECK(cudaMemset(act.get(), 0, act.bytes()));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  const double gu_us = time_one(
      opt, in.T, [&](cudaStream_t s) { f.gate_up(in.d_x.get(), m.gu.q(), in.r, act.get(), s); });
  const double dn_us =
      time_one(opt, in.T, [&](cudaStream_t s) { f.down(act.get(), m.dn.q(), in.r, y.get(), s); });
  const double gu_f = 2.0 * double(P) * 2 * kI * kH, dn_f = 2.0 * double(P) * kH * kI;
  std::printf("  time %-34s %9.2f us  %6.1f TFLOP/s\n", label(ci, "gate_up").c_str(), gu_us,
              gu_f / gu_us * 1e-6);
  std::printf("  time %-34s %9.2f us  %6.1f TFLOP/s\n", label(ci, "down").c_str(), dn_us,
              dn_f / dn_us * 1e-6);
  std::printf("  time %-34s %9.2f us  %6.1f TFLOP/s (x40 layers: %.1f ms)\n",
              label(ci, "gate_up + down").c_str(), gu_us + dn_us,
              (gu_f + dn_f) / (gu_us + dn_us) * 1e-6, 40 * (gu_us + dn_us) * 1e-3);
  std::fflush(stdout);
}

bool run(const Options& opt, const Version& v) {
  if (v.number >= 2 && !cuda::q_moe_grouped_wgmma_available()) {
    std::printf("  not available here (wgmma: a compute capability 9.0 GPU)\n");
    return true;
  }
  const Impl f = impl(v.number);
  bool ok = true;
  for (int ci = 0; ci < int(std::size(kCases)); ++ci) ok = check(f, ci) && ok;
  for (int ci = 0; ci < int(std::size(kCases)); ++ci) time_case(opt, f, ci);
  return ok;
}

}  // namespace

Op q_moe_grouped_op() {
  return Op{
      "q_moe_grouped",
      "4-bit grouped MoE prefill GEMMs on moe_route's tiles: gate_up [256 x 1024, 2048] -> act "
      "silu(g) u, down [256 x 2048, 512] -> y f32; T 4096, 512, 256 (uniform router), 1000 "
      "(skewed)",
      {{1, "mma_sync",
        "q_moe_grouped_gate_up_mma / _down_mma: q_gemm's mma.sync engine, 256 weight rows x "
        "one 128-row routing tile per block, weights dequantised in registers (production for "
        "4-bit until s7, for 8-bit since)",
        false},
       {2, "wgmma_rs",
        "q_gemm_wgmma's Cfg128 main loop (weights dequantised in registers as wgmma's A, tokens "
        "gathered into swizzled smem as B, 8-stage cp.async), 128 weight rows x one routing tile; "
        "gate_up pairs gate (warpgroup 0) and up (warpgroup 1) through smem (production's wgmma "
        "kernels with adapt_n false)",
        false},
       {3, "wgmma_rs_n",
        "v2 with the wgmma n per block the smallest of 32, 64, 128 covering the tile's rows (an "
        "expert's short second tile costs ~1/4 - 1/2 of a full one); production for 4-bit on "
        "Hopper since s7 (q_moe_grouped_gate_up_wgmma / _down_wgmma)",
        true},
       {4, "wgmma_rows64",
        "v3's loop over a routing tile's rows in passes of 64 (QGemmV2Cfg<64, 8, 2>: 8 stages of "
        "12.5 KB, 2 blocks per SM, wgmma n 16 / 32 / 64): twice the weight bytes in flight per SM "
        "for the ~8-30-row tiles of short prompts (QMoeWgmmaTile::rows64 in s20; "
        "v6_rows32_configs.cu)",
        false},
       {5, "wgmma_rows32",
        "the same in passes of 32 rows (QGemmV2Cfg<32, 8, 3>: 8 stages of 8.5 KB, 3 blocks per "
        "SM, <= 85 registers, wgmma n 16 / 32; QMoeWgmmaTile::rows32 in s20; v6_rows32_configs.cu)",
        false},
       {6, "wgmma_rows32_deep",
        "v5 at 12 stages and 2 blocks per SM (QGemmV2Cfg<32, 12, 2>: 10 k-tiles of prefetch per "
        "block, 16 warps per SM): deeper per block (v6_rows32_configs.cu)",
        false},
       {7, "wgmma_rows32_wide",
        "v5 at 6 stages and 4 blocks per SM (QGemmV2Cfg<32, 6, 4>: 4 k-tiles per block, 32 warps "
        "per SM, 63 registers): more blocks overlapping their k-tile latency "
        "(v6_rows32_configs.cu)",
        false},
       {8, "wgmma_rows32_pairs",
        "v6's configuration with the k-tiles two at a time: one wait and one block barrier per "
        "pair, 8 wgmmas per group, 10 k-tiles in flight per block (pair_loop.cuh)",
        false},
       {9, "wgmma_rows32_two",
        "v5's 8 stages at 2 blocks per SM (QGemmV2Cfg<32, 8, 2>, 128 registers): ptxas serialises "
        "v5's wgmmas (C7512 at <= 85 registers), not these (v6_rows32_configs.cu)",
        false},
       {10, "wgmma_rows64_one",
        "v4's pipeline at 1 block per SM (QGemmV2Cfg<64, 8, 1>, ~196 registers): v4's wgmmas are "
        "serialised (C7512), these not; for the prompts above 512 tokens (v6_rows32_configs.cu)",
        false},
       {11, "wgmma_rows32_pairs3",
        "v8's loop over pairs of k-tiles at rows32's configuration (QGemmV2Cfg<32, 8, 3>: 4 pair "
        "slots, 3 pairs in flight ahead, 3 blocks per SM): the per-k-tile overhead halved without "
        "giving up a block per SM (s21: the short-tile kernels issue-bound, ncu); production "
        "QMoeWgmmaTile::rows32 since s21",
        false},
       {12, "wgmma_rows64_pairs",
        "v8's loop over pairs of k-tiles at rows64's configuration (QGemmV2Cfg<64, 8, 2>): for the "
        "prompts above 512 tokens; production QMoeWgmmaTile::rows64 since s21",
        false},
       {13, "wgmma_rows32_groups4",
        "v6's configuration (QGemmV2Cfg<32, 12, 2>: 3 group slots, 2 groups = 8 k-tiles ahead) "
        "with 4 k-tiles per block barrier and wgmma wait (GroupLoop<4>, 128 registers): the "
        "issue-bound short tiles' bookkeeping a quarter per k-tile (v6_rows32_configs.cu)",
        false},
       {14, "wgmma_rows32_groups3",
        "the same with 3 k-tiles per barrier (GroupLoop<3>: 4 slots, 9 k-tiles ahead, 122 "
        "registers; 32 k-tiles end with a group of 2) (v6_rows32_configs.cu)",
        false},
       {15, "ws_rows32",
        "rows32's gate_up with a producer warp: the weights' blocks by the bulk copy engine, the "
        "token rows by cp.async, full / empty mbarriers per stage, 10 stages, 2 blocks per SM; the "
        "8 consumer warps only wait, dequantise and multiply (no block barrier in the loop), one "
        "k-tile per wgmma wait; down: production's rows32 (v15_ws.cu)",
        false},
       {16, "ws_rows32_pairs", "v15 with two k-tiles per wgmma group and wait (v15_ws.cu)", false},
       {17, "ws_rows32_pairs6", "v16 with 6 stages (v15_ws.cu)", false},
       {18, "ws_rows32_pairs_cp_async",
        "v16 with the weights copied by the producer's lanes (cp.async, 9 x 16 bytes each per "
        "stage) instead of 16 bulk copies (v15_ws.cu)",
        false}},
      run};
}

}  // namespace lilac::lab
