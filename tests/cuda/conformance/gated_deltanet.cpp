// Conformance cases of the GPU Gated DeltaNet kernels against the CPU twin: cpu::causal_conv_silu,
// l2_norm, gdn_gates, gdn_recurrence (token by token) and gated_rms_norm composed as
// cpu_backend.cpp does. Real shapes (Hk 16, Hv 32, Dk = Dv = 128, K 4) and tiny-a shapes (Hk 2, Hv
// 4, Dk = Dv = 32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "../twins/gated_deltanet_twin.h"
#include "conformance.h"
#include "cuda/gated_deltanet.h"
#include "util/error.h"

namespace lilac::test {
namespace {

std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

// The GPU side of one layer: weights, states and workspaces on the device. The recurrent state
// in f32 (`state`) or, with bf16_state, in bf16 (`state16`, model/state_format.h).
struct GpuGdn {
  GdnDims d;
  cuda::DeviceBuffer<float> taps, neg_exp_A, dt_bias, norm_w, conv_state, state, pre_ws;
  cuda::DeviceBuffer<cuda::bf16> state16;
  int pre_ws_T = 0;

  GpuGdn(const GdnDims& dims, const GdnParams& w, const std::vector<float>& conv0,
         const std::vector<float>& state0, bool bf16_state = false)
      : d(dims),
        taps(upload(w.taps)),
        neg_exp_A(upload(w.neg_exp_A)),
        dt_bias(upload(w.dt_bias)),
        norm_w(upload(w.norm_w)),
        conv_state(upload(conv0)) {
    if (bf16_state)
      state16 = upload_bf16(bf16_bits(state0));
    else
      state = upload(state0);
  }
  bool bf16_state() const { return state16.size() > 0; }
  std::vector<float> download_state() const {
    return bf16_state() ? download_bf16_as_f32(state16) : download(state);
  }

  std::vector<float> decode(const std::vector<float>& proj_row) {
    auto d_proj = upload(proj_row);
    cuda::DeviceBuffer<cuda::bf16> out(size_t(d.Hv) * d.Dv);
    poison(out);
    if (bf16_state())
      cuda::gdn_decode(d_proj.get(), taps.get(), conv_state.get(), neg_exp_A.get(), dt_bias.get(),
                       norm_w.get(), state16.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K, kGdnEps, out.get(),
                       nullptr);
    else
      cuda::gdn_decode(d_proj.get(), taps.get(), conv_state.get(), neg_exp_A.get(), dt_bias.get(),
                       norm_w.get(), state.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K, kGdnEps, out.get(),
                       nullptr);
    return download_bf16_as_f32(out);
  }

  // chunk_blocks, tf32_split: gdn_prefill's blocks per SM of the chunk kernel and the state
  // pass's split (0: their defaults).
  std::vector<float> prefill(const std::vector<float>& proj, int T, int chunk_blocks = 0,
                             int tf32_split = 0) {
    auto d_proj = upload(proj);
    cuda::DeviceBuffer<float> ws(cuda::gdn_prefill_workspace_floats(T, d.Hk, d.Hv, d.Dk, d.Dv));
    poison(ws);  // nothing read from the workspace may come from before the launch
    cuda::DeviceBuffer<cuda::bf16> out(size_t(T) * d.Hv * d.Dv);
    poison(out);
    if (bf16_state())
      cuda::gdn_prefill(d_proj.get(), T, taps.get(), conv_state.get(), neg_exp_A.get(),
                        dt_bias.get(), norm_w.get(), state16.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K,
                        kGdnEps, ws.get(), out.get(), nullptr, nullptr, chunk_blocks, tf32_split);
    else
      cuda::gdn_prefill(d_proj.get(), T, taps.get(), conv_state.get(), neg_exp_A.get(),
                        dt_bias.get(), norm_w.get(), state.get(), d.Hk, d.Hv, d.Dk, d.Dv, d.K,
                        kGdnEps, ws.get(), out.get(), nullptr, nullptr, chunk_blocks, tf32_split);
    return download_bf16_as_f32(out);
  }
};

// The tolerances of gated_deltanet_twin.h.
::testing::AssertionResult out_close(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::string& w) {
  return within(got, want, kGdnOutTolerance.atol, kGdnOutTolerance.rtol, w + " out");
}
::testing::AssertionResult state_close(const std::vector<float>& got,
                                       const std::vector<float>& want, const std::string& w) {
  const AtolRtol t = gdn_state_tolerance(want);
  return within(got, want, t.atol, t.rtol, w + " state");
}

// The bf16 state format: the twin's state rounded to bf16 after each call, as the kernels store
// it. The two sides round f32 values that agree to ~1e-6 relative, so an element may land one
// bf16 ulp apart (at most 2^-7 relative) where a value sits on a rounding boundary, and from then
// on the two trajectories differ by such roundings, which the next steps' delta-rule updates mix
// into the other elements of the column: over the chain's 140 tokens (H200, s15 run 2) single
// elements ended 2 ulps (wide) and 6 of their own ulps (real: 0.01276 against 0.01239, where the
// state's largest values are ~2) apart. So: within one bf16 ulp of the state's largest value
// (2^-8 max|want|) or 2^-7 relative, and every element a bf16 value (a kernel that stored f32,
// or read or wrote the wrong element, fails one of the two). The outputs keep the f32 tolerance
// (they come from the call's f32 state).
::testing::AssertionResult state16_close(const std::vector<float>& got,
                                         const std::vector<float>& want, const std::string& w) {
  for (size_t i = 0; i < got.size(); ++i)
    if (round_to_bf16(got[i]) != got[i])
      return ::testing::AssertionFailure()
             << w << " state: element " << i << " = " << got[i] << " is not a bf16 value";
  return within(got, want, std::ldexp(std::max(1e-3, max_abs(want)), -8), 8e-3,
                w + " state (bf16)");
}

std::string tag(const GdnDims& d, const char* what, int a, float decay) {
  return std::string(d.name) + " " + what + " " + std::to_string(a) + " decay " +
         std::to_string(decay);
}

// ---- decode
// ---------------------------------------------------------------------------------------

// The one decode kernel (the cluster kernel; version 1, the counter kernel, is in bench/lab,
// checked on the same cases: gdn_decode_cases and their inputs, gated_deltanet_twin.h).
void check_gdn_decode(const GdnDecodeCase& c, bool bf16_state = false) {
  const GdnDims& d = c.d;
  if (!cuda::gdn_decode_uses_cluster(d.Hk, d.Hv, d.Dk, d.Dv))
    GTEST_SKIP() << "no cluster path on this device";
  const GdnParams w = gdn_decode_params(c);
  GdnStart cpu = gdn_decode_start(c);
  if (bf16_state) cpu.state = bf16_round(cpu.state);
  GpuGdn gpu(d, w, cpu.conv, cpu.state, bf16_state);
  for (int step = 0; step < kGdnDecodeSteps; ++step) {
    const std::string l = tag(d, "decode step", step, c.decay);
    const std::vector<float> proj = gdn_decode_proj(c, step);
    const auto out = gpu.decode(proj);
    const auto want = cpu_gdn(proj, 1, d, w, cpu.conv, cpu.state);
    EXPECT_TRUE(out_close(out, want, l));
    if (bf16_state) {
      cpu.state = bf16_round(cpu.state);
      EXPECT_TRUE(state16_close(gpu.download_state(), cpu.state, l));
    } else {
      EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
    }
    EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, kGdnConvStateTolerance.atol,
                       kGdnConvStateTolerance.rtol, l + " conv state"));
  }
}

// The real model and tiny-a take the cluster kernel on an H100/H200.
TEST(GdnDecodePathChoice, RealAndTinyUseClusters) {
  LILAC_REQUIRE_GPU();
  int major = 0, minor = 0;
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major * 10 + minor != 90) GTEST_SKIP() << "not a compute capability 9.0 device";
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kGdnReal.Hk, kGdnReal.Hv, kGdnReal.Dk, kGdnReal.Dv));
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kGdnTiny.Hk, kGdnTiny.Hv, kGdnTiny.Dk, kGdnTiny.Dv));
  EXPECT_TRUE(cuda::gdn_decode_uses_cluster(kGdnWide.Hk, kGdnWide.Hv, kGdnWide.Dk, kGdnWide.Dv));
  EXPECT_FALSE(cuda::gdn_decode_uses_cluster(16, 32, 128, 256));  // 16 blocks per key head
}

// ---- prefill
// --------------------------------------------------------------------------------------

struct PrefillCase {
  GdnDims d;
  int T;
  float decay;
  bool zero_start;
};

void check_gdn_prefill(const PrefillCase& c, bool bf16_state = false) {
  const auto [d, T, decay, zero_start] = c;
  const uint32_t seed = uint32_t(T * 101 + d.Dk + int(decay * 100));
  const GdnParams w = make_gdn_params(d, decay, seed);
  GdnStart cpu = random_gdn_start(d, zero_start, seed + 10);
  if (bf16_state) cpu.state = bf16_round(cpu.state);
  GpuGdn gpu(d, w, cpu.conv, cpu.state, bf16_state);
  const std::vector<float> proj = random_floats(size_t(T) * d.P(), 1.f, seed + 20);
  const auto out = gpu.prefill(proj, T);
  const auto want = cpu_gdn(proj, T, d, w, cpu.conv, cpu.state);
  const std::string l = tag(d, "prefill T", T, decay);
  EXPECT_TRUE(out_close(out, want, l));
  if (bf16_state)
    EXPECT_TRUE(state16_close(gpu.download_state(), bf16_round(cpu.state), l));
  else
    EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
  EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, 0, 0, l + " conv state"));
}

std::vector<PrefillCase> prefill_cases() {
  std::vector<PrefillCase> c;
  for (const GdnDims& d : {kGdnReal, kGdnTiny})
    for (int T : {1, 2, 3, 17, 64, 65, 200, 1000}) c.push_back({d, T, 2.f, false});
  for (int T : {65, 1000}) c.push_back({kGdnReal, T, 0.02f, false});  // long memory
  c.push_back({kGdnReal, 130, 2.f, true});                            // a fresh sequence
  c.push_back({kGdnTiny, 130, 0.02f, true});
  // Past 2,048 tokens: the prep kernel's 64-token tiles (16 below), the chunk kernel per key head.
  c.push_back({kGdnReal, 2100, 0.02f, false});
  return c;
}

// The chunk kernel at one block per SM and at two (its launch bounds, and so its registers, and
// at some lengths its grid: value-head blocks up to two per SM) runs the same operations in the
// same order: the outputs, the state (f32 and bf16) and the conv state bit for bit. Lengths where
// the grid differs between the two (512: key-head blocks at one per SM, value-head at two) and
// where it does not (100, 1,000, 4,096), at the real dims, plus tiny-a's.
TEST(GdnPrefill, ChunkBlocksPerSmGiveTheSameBits) {
  for (const GdnDims& d : {kGdnReal, kGdnTiny})
    for (const int T : {100, 512, 1000, 4096})
      for (const bool bf16_state : {false, true}) {
        if (d.Hv != kGdnReal.Hv && T == 4096) continue;  // tiny-a: up to 1,000
        const uint32_t seed = uint32_t(T * 7 + d.Dk);
        const GdnParams w = make_gdn_params(d, 0.02f, seed);
        GdnStart start = random_gdn_start(d, false, seed + 10);
        if (bf16_state) start.state = bf16_round(start.state);
        const std::vector<float> proj = random_floats(size_t(T) * d.P(), 1.f, seed + 20);
        GpuGdn one(d, w, start.conv, start.state, bf16_state);
        GpuGdn two(d, w, start.conv, start.state, bf16_state);
        const auto out1 = one.prefill(proj, T, 1), out2 = two.prefill(proj, T, 2);
        const std::string l = std::string(d.name) + " T " + std::to_string(T) +
                              (bf16_state ? " bf16 state" : " f32 state");
        EXPECT_TRUE(within(out2, out1, 0, 0, l + " out"));
        EXPECT_TRUE(within(two.download_state(), one.download_state(), 0, 0, l + " state"));
        EXPECT_TRUE(
            within(download(two.conv_state), download(one.conv_state), 0, 0, l + " conv state"));
      }
  // Other counts are refused before any launch, the state untouched.
  const GdnParams w = make_gdn_params(kGdnTiny, 1.f, 5);
  const GdnStart start = random_gdn_start(kGdnTiny, false, 6);
  GpuGdn gpu(kGdnTiny, w, start.conv, start.state);
  const std::vector<float> proj = random_floats(size_t(10) * kGdnTiny.P(), 1.f, 7);
  EXPECT_THROW(gpu.prefill(proj, 10, 3), Error);
  EXPECT_TRUE(within(download(gpu.state), start.state, 0, 0, "state after the refused call"));
}

// The state pass's two tf32 splits (tf32_split 1, the default: hi rounded as cvt.rna; 2, s32: hi
// is x itself, lo = x - hi's tf32 bits, both cut by the mma; LILAC_GDN_TF32_SPLIT) each hold
// the CPU twin's tolerances at the real and tiny dims, with a fresh and a carried state; at 16,384
// tokens they stay within them of each other though not bit for bit (so the switch is seen to
// act). Other values are refused before any launch.
TEST(GdnPrefill, BothTf32SplitsHoldTheTolerances) {
  LILAC_REQUIRE_GPU();
  for (const GdnDims& d : {kGdnReal, kGdnTiny})
    for (const int T : {65, 1000, 2100}) {
      const uint32_t seed = uint32_t(T * 13 + d.Dk);
      const GdnParams w = make_gdn_params(d, 0.02f, seed);
      GdnStart cpu = random_gdn_start(d, T == 65, seed + 10);
      GpuGdn rounded(d, w, cpu.conv, cpu.state), truncated(d, w, cpu.conv, cpu.state);
      const std::vector<float> proj = random_floats(size_t(T) * d.P(), 1.f, seed + 20);
      const auto out_r = rounded.prefill(proj, T, 0, 1), out_t = truncated.prefill(proj, T, 0, 2);
      const auto want = cpu_gdn(proj, T, d, w, cpu.conv, cpu.state);
      const std::string l = tag(d, "prefill T", T, 0.02f);
      EXPECT_TRUE(out_close(out_r, want, l + " rounded split"));
      EXPECT_TRUE(state_close(download(rounded.state), cpu.state, l + " rounded split"));
      EXPECT_TRUE(out_close(out_t, want, l + " truncated split"));
      EXPECT_TRUE(state_close(download(truncated.state), cpu.state, l + " truncated split"));
    }
  {
    const int T = 16384;
    const GdnParams w = make_gdn_params(kGdnReal, 0.02f, 41);
    const GdnStart start = random_gdn_start(kGdnReal, false, 42);
    const std::vector<float> proj = random_floats(size_t(T) * kGdnReal.P(), 1.f, 43);
    GpuGdn rounded(kGdnReal, w, start.conv, start.state),
        truncated(kGdnReal, w, start.conv, start.state);
    const auto out_r = rounded.prefill(proj, T, 0, 1), out_t = truncated.prefill(proj, T, 0, 2);
    const auto state_r = download(rounded.state), state_t = download(truncated.state);
    EXPECT_TRUE(out_close(out_t, out_r, "T 16384 truncated against rounded"));
    EXPECT_TRUE(state_close(state_t, state_r, "T 16384 truncated against rounded"));
    size_t differ = 0;
    for (size_t i = 0; i < state_r.size(); ++i) differ += state_r[i] != state_t[i] ? 1 : 0;
    EXPECT_GT(differ, state_r.size() / 100) << "the truncated split changed almost no bits";
  }
  const GdnParams w = make_gdn_params(kGdnTiny, 1.f, 5);
  const GdnStart start = random_gdn_start(kGdnTiny, false, 6);
  GpuGdn gpu(kGdnTiny, w, start.conv, start.state);
  const std::vector<float> proj = random_floats(size_t(10) * kGdnTiny.P(), 1.f, 7);
  EXPECT_THROW(gpu.prefill(proj, 10, 0, 3), Error);
  EXPECT_TRUE(within(download(gpu.state), start.state, 0, 0, "state after the refused call"));
}

// ---- prefill in two calls, then decode: the state carried between launchers
// ----------------------

void check_gdn_chain(const GdnDims& d, bool bf16_state = false) {
  const uint32_t seed = 777u + uint32_t(d.Dk);
  const GdnParams w = make_gdn_params(d, 1.f, seed);
  GdnStart cpu = random_gdn_start(d, true, seed + 10);
  GpuGdn gpu(d, w, cpu.conv, cpu.state, bf16_state);
  // The state after a call, as the format stores it.
  auto check_state = [&](const std::string& l) {
    if (bf16_state) {
      cpu.state = bf16_round(cpu.state);
      EXPECT_TRUE(state16_close(gpu.download_state(), cpu.state, l));
    } else {
      EXPECT_TRUE(state_close(download(gpu.state), cpu.state, l));
    }
  };
  int pos = 0;
  for (int T : {100, 37, 1, 1, 1}) {
    const std::string l = tag(d, "chain at", pos, 1.f) + " T " + std::to_string(T);
    const std::vector<float> proj =
        random_floats(size_t(T) * d.P(), 1.f, seed + 20 + uint32_t(pos));
    const auto out = T > 1 ? gpu.prefill(proj, T) : gpu.decode(proj);
    const auto want = cpu_gdn(proj, T, d, w, cpu.conv, cpu.state);
    EXPECT_TRUE(out_close(out, want, l));
    check_state(l);
    EXPECT_TRUE(within(download(gpu.conv_state), cpu.conv, 0, 0, l + " conv state"));
    pos += T;
  }
  // A one-token prefill is the same function as a decode step.
  const std::vector<float> proj = random_floats(size_t(d.P()), 1.f, seed + 999);
  const auto out = gpu.prefill(proj, 1);
  const auto want = cpu_gdn(proj, 1, d, w, cpu.conv, cpu.state);
  EXPECT_TRUE(out_close(out, want, tag(d, "chain prefill T=1 at", pos, 1.f)));
  check_state(tag(d, "chain prefill T=1 at", pos, 1.f));
}

std::string dims_name(const GdnDims& d) {
  return std::string(d.name) + "_Hk" + std::to_string(d.Hk) + "_Hv" + std::to_string(d.Hv) + "_Dk" +
         std::to_string(d.Dk) + "_Dv" + std::to_string(d.Dv) + "_K" + std::to_string(d.K);
}

// The real dims (Hk 16, Hv 32, Dk = Dv = 128, K 4), tiny-a's (Hk 2, Hv 4, Dk = Dv = 32) and a
// wide one (a full 8-block cluster); decay "strong" (2) or "mild" (0.02, long memory; 1 for wide).
LILAC_CONFORMANCE_CASES(gated_deltanet) {
  std::vector<OpCase> cases;
  const char* twin =
      "cpu::causal_conv_silu + l2_norm + gdn_gates + gdn_recurrence + gated_rms_norm";
  for (const GdnDecodeCase& c : gdn_decode_cases())
    cases.push_back({"gdn_decode",
                     dims_name(c.d) + (c.decay > 1.f ? "_strong" : "_mild") + "_4steps_cluster",
                     "f32", twin, [c] { check_gdn_decode(c); }});
  for (const PrefillCase& c : prefill_cases())
    cases.push_back({"gdn_prefill",
                     dims_name(c.d) + "_T" + std::to_string(c.T) +
                         (c.decay > 1.f ? "_strong" : "_mild") + (c.zero_start ? "_fresh" : ""),
                     "f32", twin, [c] { check_gdn_prefill(c); }});
  // Prefill 100 and 37 tokens, 3 decode steps, then a one-token prefill.
  for (const GdnDims& d : {kGdnReal, kGdnTiny, kGdnWide})
    cases.push_back({"gdn_chain", dims_name(d) + "_T100_37_decode3_prefill1", "f32", twin,
                     [d] { check_gdn_chain(d); }});
  // The bf16 state format (model/state_format.h): the same kernels storing the state in bf16;
  // the twin's state rounded to bf16 after each call.
  const char* twin16 = "the same twin, its recurrent state rounded to bf16 after each call";
  for (const GdnDecodeCase& c : gdn_decode_cases())
    cases.push_back({"gdn_decode",
                     dims_name(c.d) + (c.decay > 1.f ? "_strong" : "_mild") + "_4steps_bf16_state",
                     "f32", twin16, [c] { check_gdn_decode(c, true); }});
  for (const PrefillCase& c : prefill_cases())
    if (c.T == 1 || c.T == 65 || c.T == 1000 || c.zero_start)
      cases.push_back({"gdn_prefill",
                       dims_name(c.d) + "_T" + std::to_string(c.T) +
                           (c.decay > 1.f ? "_strong" : "_mild") + (c.zero_start ? "_fresh" : "") +
                           "_bf16_state",
                       "f32", twin16, [c] { check_gdn_prefill(c, true); }});
  for (const GdnDims& d : {kGdnReal, kGdnTiny, kGdnWide})
    cases.push_back({"gdn_chain", dims_name(d) + "_T100_37_decode3_prefill1_bf16_state", "f32",
                     twin16, [d] { check_gdn_chain(d, true); }});
  // Awkward prefill-only shapes: Dk 64 (the third width the prefill supports), 3 value heads per
  // key head, 3 column blocks per head, conv kernel 2; 2 and 5 chunks, the last partial.
  constexpr GdnDims kDk64{"dk64", 2, 6, 64, 96, 2};
  for (const int T : {100, 300})
    cases.push_back({"gdn_prefill", dims_name(kDk64) + "_T" + std::to_string(T), "f32", twin, [T] {
                       check_gdn_prefill({kDk64, T, 1.f, false});
                     }});
  return cases;
}

}  // namespace
}  // namespace lilac::test
