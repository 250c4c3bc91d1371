// Conformance cases of the GPU attention kernels against the CPU twin (cpu/attention.cpp composed
// as cpu_backend.cpp does): qk_norm_rope_store, attention_decode_qkv (the decode kernel; its
// version 1, unfused, is in bench/lab), attention_prefill (its versions 1-5), and a prefill +
// decode chain. Real shapes (heads 16, kv 2, hd 256, R 64) and tiny-a shapes (heads 4, kv 2, hd
// 64, R 16); versions 2-5 (hd 256 only) also at GQA groups 4, 2 and 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_util.h"
#include "../kernel_check.h"
#include "../twins/attention_twin.h"
#include "conformance.h"
#include "cuda/attention.h"
#include "util/error.h"

namespace lilac::test {
namespace {

// Attention outputs, compared row by row with attn_row_tolerance (attention_twin.h).
::testing::AssertionResult attn_close(const std::vector<float>& got, const std::vector<float>& want,
                                      int hd, const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  for (size_t r = 0; r * size_t(hd) < want.size(); ++r) {
    const std::vector<float> g(got.begin() + ptrdiff_t(r * hd),
                               got.begin() + ptrdiff_t((r + 1) * hd));
    const std::vector<float> w(want.begin() + ptrdiff_t(r * hd),
                               want.begin() + ptrdiff_t((r + 1) * hd));
    const AtolRtol t = attn_row_tolerance(w);
    auto res = within(g, w, t.atol, t.rtol,
                      what + " row " + std::to_string(r) + " (token * heads + head)");
    if (!res) return res;
  }
  return ::testing::AssertionSuccess();
}

std::string label(const AttnDims& d, const char* what, int a, int b) {
  return std::string(d.name) + " " + what + " " + std::to_string(a) + "/" + std::to_string(b);
}

// ---- qk_norm_rope_store
// --------------------------------------------------------------------------

struct RopeCase {
  AttnDims d;
  int T, pos0;
};

void check_qk_norm_rope_store(const RopeCase& c) {
  const auto [d, T, pos0] = c;
  const int max_ctx = pos0 + T + 3, P = attn_qkv_len(d);
  const uint32_t seed = uint32_t(T * 7919 + pos0 * 31 + d.hd);
  std::vector<float> qkv = random_floats(size_t(T) * P, 1.f, seed);
  std::vector<float> q_norm = random_floats(size_t(d.hd), 0.1f, seed + 1),
                     k_norm = random_floats(size_t(d.hd), 0.1f, seed + 2);
  for (auto& x : q_norm) x += 1.f;
  for (auto& x : k_norm) x += 1.f;
  const std::vector<float> inv = rope_inv_freq(kAttnTheta, d.R);
  // Caches start with random contents everywhere: rows outside [pos0, pos0 + T) must keep them.
  std::vector<float> kc0 = random_floats(size_t(d.kv) * max_ctx * d.hd, 1.f, seed + 3),
                     vc0 = random_floats(kc0.size(), 1.f, seed + 4);
  const std::vector<uint16_t> kbits = to_bf16_rounding(kc0), vbits = to_bf16_rounding(vc0);

  auto d_qkv = upload(qkv);
  auto d_qn = upload(q_norm), d_kn = upload(k_norm), d_inv = upload(inv);
  auto d_pos = upload(std::vector<int32_t>{pos0});
  auto d_kc = upload_bf16(kbits), d_vc = upload_bf16(vbits);
  cuda::DeviceBuffer<cuda::bf16> d_q(size_t(T) * d.heads * d.hd),
      d_gate(size_t(T) * d.heads * d.hd);
  poison(d_q);
  poison(d_gate);
  cuda::qk_norm_rope_store(d_qkv.get(), T, d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(),
                           d.heads, d.kv, d.hd, d.R, kAttnEps, d_q.get(), d_gate.get(), d_kc.get(),
                           d_vc.get(), max_ctx, nullptr);
  const auto q = download_bf16_as_f32(d_q), gate = download_bf16_as_f32(d_gate);
  const auto kc = download_bf16_as_f32(d_kc), vc = download_bf16_as_f32(d_vc);

  const QkvOut want = cpu_qk_norm_rope(qkv, T, pos0, d, q_norm, k_norm, inv);
  std::vector<float> want_kc = kc0, want_vc = vc0;  // already bf16-rounded
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < d.kv; ++h)
      for (int i = 0; i < d.hd; ++i) {
        want_kc[(size_t(h) * max_ctx + pos0 + t) * d.hd + i] =
            want.k[(size_t(t) * d.kv + h) * d.hd + i];
        want_vc[(size_t(h) * max_ctx + pos0 + t) * d.hd + i] =
            want.v[(size_t(t) * d.kv + h) * d.hd + i];
      }
  // bf16 outputs of f32 values: half an ulp (2^-9 relative) plus f32 noise of rsqrt and sincos.
  const std::string l = label(d, "T/pos0", T, pos0);
  EXPECT_TRUE(within(q, want.q, 1e-4, 6e-3, l + " q"));
  EXPECT_TRUE(within(gate, want.gate, 1e-6, 4e-3, l + " gate"));
  EXPECT_TRUE(within(kc, want_kc, 1e-4, 6e-3, l + " k cache"));
  EXPECT_TRUE(within(vc, want_vc, 1e-6, 4e-3, l + " v cache"));
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> c;
  for (const AttnDims& d : {kAttnReal, kAttnTiny})
    for (int T : {1, 3, 17, 200})
      for (int pos0 : {0, 5, 1000}) c.push_back({d, T, pos0});
  c.push_back({kAttnTiny, 2, 131000});  // large angles (the slow path of sincosf)
  return c;
}

// ---- attention_decode_qkv: qk_norm_rope_store (T = 1) + split-K flash decoding in one -----------

struct DecodeCase {
  AttnDims d;
  int n;        // keys: the query sits at position n - 1
  int max_ctx;  // 0: n + 5; else a large capacity (many splits, most of them empty)
};

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> c;
  for (const AttnDims& d : {kAttnReal, kAttnTiny})
    for (int n : {1, 2, 17, 63, 64, 65, 200, 1000, 4097, 40000}) c.push_back({d, n, 0});
  for (int n : {1, 300, 5000})
    c.push_back({kAttnReal, n, 131072});  // as the engine: fixed capacity
  return c;
}

void check_attention_decode_qkv(const DecodeCase& c) {
  const auto [d, n, ctx] = c;
  const int max_ctx = ctx ? ctx : n + 5, pos = n - 1;
  const AttnDecodeInputs in = attn_decode_inputs(d, n, max_ctx);
  const std::vector<uint16_t>&kbits = in.kbits, &vbits = in.vbits;
  auto d_qkv = upload(in.qkv), d_qn = upload(in.q_norm), d_kn = upload(in.k_norm),
       d_inv = upload(in.inv_freq);
  auto d_kc = upload_bf16(kbits), d_vc = upload_bf16(vbits);
  auto d_pos = upload(std::vector<int32_t>{pos});
  cuda::DeviceBuffer<float> ws(
      cuda::attention_decode_workspace_floats(d.heads, d.kv, d.hd, max_ctx));
  cuda::DeviceBuffer<cuda::bf16> d_out(size_t(d.heads) * d.hd);
  poison(ws);
  poison(d_out);
  cuda::attention_decode_qkv(d_qkv.get(), d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(), d.heads,
                             d.kv, d.hd, d.R, kAttnEps, d_kc.get(), d_vc.get(), max_ctx, ws.get(),
                             d_out.get(), nullptr);
  const auto out = download_bf16_as_f32(d_out);
  const auto kc = download_bf16_as_f32(d_kc), vc = download_bf16_as_f32(d_vc);

  const AttnDecodeWant want = cpu_attention_decode(in, d, n, max_ctx);
  const std::string l =
      label(d, "decode_qkv n/splits", n, cuda::attention_decode_splits(d.kv, max_ctx));
  EXPECT_TRUE(attn_close(out, want.out, d.hd, l));
  // The caches: row pos holds the new key and value (tolerances as QkNormRopeStore), every other
  // row is bit for bit what it was (NaN past pos).
  std::vector<float> want_kc(kbits.size()), want_vc(vbits.size());
  for (size_t i = 0; i < kbits.size(); ++i)
    want_kc[i] = bf16_to_f32(kbits[i]), want_vc[i] = bf16_to_f32(vbits[i]);
  std::vector<float> got_k_row, want_k_row, got_v_row, want_v_row;
  for (int h = 0; h < d.kv; ++h)
    for (int i = 0; i < d.hd; ++i) {
      const size_t at = (size_t(h) * max_ctx + pos) * d.hd + i;
      got_k_row.push_back(kc[at]);
      got_v_row.push_back(vc[at]);
      want_k_row.push_back(want.k_row[size_t(h) * d.hd + i]);
      want_v_row.push_back(want.v_row[size_t(h) * d.hd + i]);
      want_kc[at] = kc[at];  // compared above/below through the row vectors
      want_vc[at] = vc[at];
    }
  EXPECT_TRUE(within(got_k_row, want_k_row, kAttnNormedTolerance.atol, kAttnNormedTolerance.rtol,
                     l + " new k row"));
  EXPECT_TRUE(within(got_v_row, want_v_row, kAttnCopiedTolerance.atol, kAttnCopiedTolerance.rtol,
                     l + " new v row"));
  size_t changed = 0;
  for (size_t i = 0; i < kc.size(); ++i) {
    const bool same_k = std::isnan(want_kc[i]) ? std::isnan(kc[i]) : kc[i] == want_kc[i];
    const bool same_v = std::isnan(want_vc[i]) ? std::isnan(vc[i]) : vc[i] == want_vc[i];
    changed += !same_k + !same_v;
  }
  EXPECT_EQ(changed, 0u) << l << ": cache rows other than the new one changed";
}

// ---- attention_prefill --------------------------------------------------------------------------

// Random inputs of one attention_prefill call at dims d: T queries from position pos0 (q, gate
// N(0, 1)), caches of max_ctx rows with rows >= pos0 + T NaN (never to be read); on the host and
// the device.
struct PrefillInputs {
  AttnDims d;
  int T, pos0, max_ctx;
  std::vector<uint16_t> kbits, vbits;
  std::vector<float> q, gate;
  cuda::DeviceBuffer<cuda::bf16> d_q, d_gate, d_kc, d_vc;

  PrefillInputs(const AttnDims& d_, int T_, int pos0_, int max_ctx_, uint32_t seed)
      : d(d_),
        T(T_),
        pos0(pos0_),
        max_ctx(max_ctx_),
        kbits(random_cache(d, max_ctx, pos0 + T, seed)),
        vbits(random_cache(d, max_ctx, pos0 + T, seed + 1)),
        q(random_floats(size_t(T) * d.heads * d.hd, 1.f, seed + 2)),
        gate(random_floats(q.size(), 1.f, seed + 3)),
        d_q(upload_bf16(to_bf16_rounding(q))),
        d_gate(upload_bf16(to_bf16_rounding(gate))),
        d_kc(upload_bf16(kbits)),
        d_vc(upload_bf16(vbits)) {}

  // attention_prefill's output (version `version`) as f32, its buffer poisoned first.
  std::vector<float> run(int version) const {
    cuda::DeviceBuffer<cuda::bf16> d_out(q.size());
    poison(d_out);
    cuda::attention_prefill(d_q.get(), d_gate.get(), d_kc.get(), d_vc.get(), pos0, T, d.heads, d.kv,
                            d.hd, max_ctx, d_out.get(), nullptr, version);
    return download_bf16_as_f32(d_out);
  }
};

// version: attention_prefill's (1 mma.sync, 2 wgmma, 3 wgmma with the softmax overlapped, 4 that
// warp-specialised with TMA copies, 5 that with the warpgroups' MMAs taking turns); a
// wgmma case on a GPU without wgmma is skipped (the GPU suite runs on Hopper; other GPUs run
// version 1 only).
void check_attention_prefill(const RopeCase& c, int version) {
  const auto [d, T, pos0] = c;
  if (version > 1 && !cuda::attention_prefill_wgmma_supported(d.hd))
    GTEST_SKIP() << "attention_prefill version " << version
                 << " needs hd 256 on a compute capability 9.x GPU";
  const int n = pos0 + T, max_ctx = n + 7;
  const PrefillInputs in(d, T, pos0, max_ctx, uint32_t(T * 313 + pos0 * 7 + d.hd));
  const auto out = in.run(version);
  const auto want = cpu_gated_attention(in.q, in.gate, cpu_cache_from_gpu(in.kbits, d, max_ctx, n),
                                        cpu_cache_from_gpu(in.vbits, d, max_ctx, n), pos0, T, d);
  EXPECT_TRUE(attn_close(out, want, d.hd, label(d, "prefill T/pos0", T, pos0)));
}

std::vector<RopeCase> prefill_cases() {
  std::vector<RopeCase> c;
  for (const AttnDims& d : {kAttnReal, kAttnTiny})
    for (int T : {1, 3, 17, 64, 65, 200, 1000})
      for (int pos0 : {0, 5, 1000}) c.push_back({d, T, pos0});
  return c;
}

// Versions 2 and 3 (hd 256 only): the real dims at lengths that end mid-tile, mid-block and on
// either side of a 64-key tile, a chunk far into the context, and GQA groups of 4, 2 and 1 (blocks
// of 32, 64 and 128 queries: the causal edge inside a warpgroup's rows, and across the two).
std::vector<RopeCase> prefill_wgmma_cases() {
  std::vector<RopeCase> c;
  for (int T : {1, 3, 16, 17, 63, 64, 65, 200})
    for (int pos0 : {0, 5, 64, 1000}) c.push_back({kAttnReal, T, pos0});
  c.push_back({kAttnReal, 1000, 0});
  c.push_back({kAttnReal, 1000, 1000});
  c.push_back({kAttnReal, 33, 20000});
  for (const AttnDims& d : {AttnDims{"g4", 8, 2, 256, 64}, AttnDims{"g2", 4, 2, 256, 64},
                            AttnDims{"g1", 2, 2, 256, 64}})
    for (int T : {1, 70, 333})
      for (int pos0 : {0, 37}) c.push_back({d, T, pos0});
  return c;
}

// ---- the chain: qkv rows -> prefill in two chunks -> 3 decode steps, against the CPU ------------

struct ChainCase {
  AttnDims d;
};

void check_attention_chain(const ChainCase& c) {
  const auto [d] = c;
  const int T1 = 70, T2 = 59, steps = 3, total = T1 + T2 + steps, max_ctx = total + 16,
            P = attn_qkv_len(d);
  const uint32_t seed = 4242u + uint32_t(d.hd);
  const std::vector<float> qkv = random_floats(size_t(total) * P, 1.f, seed);
  std::vector<float> q_norm = random_floats(size_t(d.hd), 0.1f, seed + 1),
                     k_norm = random_floats(size_t(d.hd), 0.1f, seed + 2);
  for (auto& x : q_norm) x += 1.f;
  for (auto& x : k_norm) x += 1.f;
  const std::vector<float> inv = rope_inv_freq(kAttnTheta, d.R);

  auto d_qkv = upload(qkv);
  auto d_qn = upload(q_norm), d_kn = upload(k_norm), d_inv = upload(inv);
  cuda::DeviceBuffer<cuda::bf16> d_kc(size_t(d.kv) * max_ctx * d.hd), d_vc(d_kc.size());
  poison(d_kc);
  poison(d_vc);
  cuda::DeviceBuffer<cuda::bf16> d_q(size_t(T1) * d.heads * d.hd), d_gate(d_q.size()),
      d_out(d_q.size());
  cuda::DeviceBuffer<float> ws(
      cuda::attention_decode_workspace_floats(d.heads, d.kv, d.hd, max_ctx));
  cuda::DeviceBuffer<int32_t> d_pos(1);

  // CPU state: the f32 cache [ctx][kv][hd] holding the bf16-rounded k, v the GPU stores.
  std::vector<float> kc, vc;
  int pos = 0;
  auto step = [&](int T, bool decode) {
    const std::string l = label(d, decode ? "chain decode at" : "chain prefill at", pos, T);
    LILAC_CUDA_CHECK(cudaMemcpy(d_pos.get(), &pos, sizeof(int32_t), cudaMemcpyHostToDevice));
    poison(d_out);
    const float* rows = d_qkv.get() + size_t(pos) * P;
    if (decode) {
      cuda::attention_decode_qkv(rows, d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(), d.heads,
                                 d.kv, d.hd, d.R, kAttnEps, d_kc.get(), d_vc.get(), max_ctx,
                                 ws.get(), d_out.get(), nullptr);
    } else {
      cuda::qk_norm_rope_store(rows, T, d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(), d.heads,
                               d.kv, d.hd, d.R, kAttnEps, d_q.get(), d_gate.get(), d_kc.get(),
                               d_vc.get(), max_ctx, nullptr);
      cuda::attention_prefill(d_q.get(), d_gate.get(), d_kc.get(), d_vc.get(), pos, T, d.heads,
                              d.kv, d.hd, max_ctx, d_out.get(), nullptr);
    }
    std::vector<float> out = download_bf16_as_f32(d_out);
    out.resize(size_t(T) * d.heads * d.hd);

    const std::vector<float> in(qkv.begin() + ptrdiff_t(size_t(pos) * P),
                                qkv.begin() + ptrdiff_t(size_t(pos + T) * P));
    QkvOut r = cpu_qk_norm_rope(in, T, pos, d, q_norm, k_norm, inv);
    const auto kb = bf16_round(r.k), vb = bf16_round(r.v);
    kc.insert(kc.end(), kb.begin(), kb.end());
    vc.insert(vc.end(), vb.begin(), vb.end());
    const auto want = cpu_gated_attention(bf16_round(r.q), bf16_round(r.gate), kc, vc, pos, T, d);
    EXPECT_TRUE(attn_close(out, want, d.hd, l));
    pos += T;
  };
  step(T1, false);
  step(T2, false);
  for (int i = 0; i < steps; ++i) step(1, true);
}

std::string dims_name(const AttnDims& d) {
  return std::string(d.name) + "_heads" + std::to_string(d.heads) + "_kv" + std::to_string(d.kv) +
         "_hd" + std::to_string(d.hd);
}

// The real dims (heads 16, kv 2, hd 256, R 64) and tiny-a's (heads 4, kv 2, hd 64, R 16).
LILAC_CONFORMANCE_CASES(attention) {
  std::vector<OpCase> cases;
  const char* twin = "cpu::split_query_gate + rms_norm + rope + attention";
  for (const RopeCase& c : rope_cases())
    cases.push_back({"qk_norm_rope_store",
                     dims_name(c.d) + "_T" + std::to_string(c.T) + "_pos" + std::to_string(c.pos0),
                     "bf16", twin, [c] { check_qk_norm_rope_store(c); }});
  for (const DecodeCase& c : decode_cases()) {
    const std::string shape = dims_name(c.d) + "_n" + std::to_string(c.n) +
                              (c.max_ctx ? "_cap" + std::to_string(c.max_ctx) : "");
    cases.push_back(
        {"attention_decode_qkv", shape, "bf16", twin, [c] { check_attention_decode_qkv(c); }});
  }
  for (const RopeCase& c : prefill_cases())
    cases.push_back({"attention_prefill",
                     dims_name(c.d) + "_T" + std::to_string(c.T) + "_pos" + std::to_string(c.pos0),
                     "bf16", twin, [c] { check_attention_prefill(c, 1); }});
  for (const RopeCase& c : prefill_wgmma_cases())
    for (const int version : {2, 3, 4, 5})
      cases.push_back(
          {version == 2   ? "attention_prefill_wgmma"
           : version == 3 ? "attention_prefill_wgmma_overlap"
           : version == 4 ? "attention_prefill_wgmma_ws"
                          : "attention_prefill_wgmma_pingpong",
           dims_name(c.d) + "_T" + std::to_string(c.T) + "_pos" + std::to_string(c.pos0), "bf16",
           twin, [c, version] { check_attention_prefill(c, version); }});
  // qkv rows -> prefill in two chunks (70, 59) -> 3 decode steps (the fused decode kernel).
  for (const ChainCase& c : {ChainCase{kAttnReal}, ChainCase{kAttnTiny}})
    cases.push_back({"attention_chain", dims_name(c.d) + "_T70_59_decode3_fused", "bf16", twin,
                     [c] { check_attention_chain(c); }});
  return cases;
}

// attention_prefill refuses, with an error naming the version, a version it does not have and a
// wgmma version where wgmma cannot run (hd 64 anywhere; hd 256 off Hopper); version 0 falls back to
// version 1 there instead. The output stays unwritten (poison) after each refusal.
TEST(AttentionPrefill, RefusesAVersionItDoesNotHave) {
  LILAC_REQUIRE_GPU();
  const AttnDims d = kAttnTiny;
  const int T = 4, max_ctx = 8;
  cuda::DeviceBuffer<cuda::bf16> q(size_t(T) * d.heads * d.hd), gate(q.size()),
      kc(size_t(max_ctx) * d.kv * d.hd), vc(kc.size()), out(q.size());
  poison(out);
  const auto call = [&](int hd, int version) {
    cuda::attention_prefill(q.get(), gate.get(), kc.get(), vc.get(), 0, T, d.heads, d.kv, hd,
                            max_ctx, out.get(), nullptr, version);
  };
  for (const int version : {-1, 6}) {
    try {
      call(d.hd, version);
      ADD_FAILURE() << "version " << version << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("version " + std::to_string(version)), std::string::npos)
          << e.what();
    }
  }
  ASSERT_FALSE(cuda::attention_prefill_wgmma_supported(d.hd));
  for (const int version : {2, 3, 4, 5}) {
    try {
      call(d.hd, version);
      ADD_FAILURE() << "version " << version << " at head_dim " << d.hd << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("wgmma"), std::string::npos) << e.what();
    }
  }
  const auto untouched = download_bf16_as_f32(out);
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) {
    return std::isnan(v);
  })) << "a refused call wrote its output";
}

// Versions 3, 4 and 5 issue the same MMAs on the same operands in the same order and run the same
// softmax: only how K and V reach shared memory (cp.async by every thread, or TMA) and when each
// warpgroup issues differ. So their outputs are the same bits (what makes version 5 the default
// on version 3's backend-level test record; docs/kernels.md s34). Real dims, GQA groups 8 and 2,
// chunks from 0 and far into the context, lengths off the 64-key tiles.
TEST(AttentionPrefill, WarpSpecialisedVersionsGiveVersion3sBits) {
  LILAC_REQUIRE_GPU();
  if (!cuda::attention_prefill_wgmma_supported(kAttnReal.hd))
    GTEST_SKIP() << "versions 3-5 need a compute capability 9.x GPU";
  AttnDims g2 = kAttnReal;
  g2.kv = 8;
  for (const AttnDims& d : {kAttnReal, g2})
    for (const auto& [T, pos0] : {std::pair{1, 0}, {77, 0}, {333, 1000}, {1000, 4000}}) {
      const PrefillInputs in(d, T, pos0, pos0 + T + 5, uint32_t(T * 17 + pos0 + d.kv));
      const std::vector<float> outs[3] = {in.run(3), in.run(4), in.run(5)};
      for (int v = 1; v < 3; ++v) {
        size_t differ = 0;
        for (size_t i = 0; i < outs[0].size(); ++i)
          differ += std::memcmp(&outs[0][i], &outs[size_t(v)][i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "version " << 3 + v << " against version 3: " << differ << " of "
                              << outs[0].size() << " outputs differ (kv " << d.kv << ", T " << T
                              << ", pos0 " << pos0 << ")";
      }
    }
}

}  // namespace
}  // namespace lilac::test
