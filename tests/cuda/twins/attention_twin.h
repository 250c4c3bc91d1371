// The gated-attention GPU checks' shapes, inputs, CPU twin and tolerances, without GoogleTest:
// shared by the conformance cases (tests/cuda/conformance/attention.cpp) and the kernel lab
// (bench/lab/attention_decode). The twin is cpu/attention.cpp and cpu/norm.cpp composed as
// cpu_backend.cpp does: split the query and gate, RMS-norm q and k, RoPE, softmax attention over
// the bf16 cache, sigmoid gate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/attention.h"
#include "cpu/norm.h"
#include "host_data.h"
#include "model/rope.h"
#include "util/half.h"

namespace lilac::test {

struct AttnDims {
  const char* name;
  int heads, kv, hd, R;
};
constexpr AttnDims kAttnReal{"real", 16, 2, 256, 64};
constexpr AttnDims kAttnTiny{"tiny", 4, 2, 64, 16};
constexpr float kAttnTheta = 1e7f, kAttnEps = 1e-6f;

// A token's qkv row: q and gate interleaved per head [heads, 2, hd], then k [kv, hd], v [kv, hd].
inline int attn_qkv_len(const AttnDims& d) {
  return d.heads * 2 * d.hd + 2 * d.kv * d.hd;
}

// CPU twin of qk_norm_rope_store: from qkv [T, qkv_len] to q [T, heads, hd], gate [T, heads*hd],
// k, v [T, kv, hd] (f32).
struct QkvOut {
  std::vector<float> q, gate, k, v;
};
inline QkvOut cpu_qk_norm_rope(const std::vector<float>& qkv, int T, int pos0, const AttnDims& d,
                               const std::vector<float>& q_norm, const std::vector<float>& k_norm,
                               const std::vector<float>& inv_freq) {
  const int P = attn_qkv_len(d), hd = d.hd, QG = d.heads * 2 * hd, KV = d.kv * hd;
  std::vector<float> qg(size_t(T) * QG);
  QkvOut r;
  r.q.resize(size_t(T) * d.heads * hd);
  r.gate.resize(r.q.size());
  r.k.resize(size_t(T) * KV);
  r.v.resize(r.k.size());
  for (int t = 0; t < T; ++t) {
    const float* row = &qkv[size_t(t) * P];
    std::copy(row, row + QG, &qg[size_t(t) * QG]);
    std::copy(row + QG, row + QG + KV, &r.k[size_t(t) * KV]);
    std::copy(row + QG + KV, row + QG + 2 * KV, &r.v[size_t(t) * KV]);
  }
  cpu::split_query_gate(qg.data(), T, d.heads, hd, r.q.data(), r.gate.data());
  for (int i = 0; i < T * d.heads; ++i)
    cpu::rms_norm(&r.q[size_t(i) * hd], q_norm.data(), hd, kAttnEps, &r.q[size_t(i) * hd]);
  for (int i = 0; i < T * d.kv; ++i)
    cpu::rms_norm(&r.k[size_t(i) * hd], k_norm.data(), hd, kAttnEps, &r.k[size_t(i) * hd]);
  cpu::rope(r.q.data(), T, d.heads, hd, d.R, pos0, inv_freq.data());
  cpu::rope(r.k.data(), T, d.kv, hd, d.R, pos0, inv_freq.data());
  return r;
}

// GPU cache [kv][max_ctx][hd] (bf16 bits) <-> CPU cache [ctx][kv][hd] (f32).
inline std::vector<float> cpu_cache_from_gpu(const std::vector<uint16_t>& bits, const AttnDims& d,
                                             int max_ctx, int ctx) {
  std::vector<float> c(size_t(ctx) * d.kv * d.hd);
  for (int p = 0; p < ctx; ++p)
    for (int h = 0; h < d.kv; ++h)
      for (int i = 0; i < d.hd; ++i)
        c[(size_t(p) * d.kv + h) * d.hd + i] =
            bf16_to_f32(bits[(size_t(h) * max_ctx + p) * d.hd + i]);
  return c;
}

// A random cache: rows < valid random N(0, 1) bf16, rows >= valid NaN (must never be read).
inline std::vector<uint16_t> random_cache(const AttnDims& d, int max_ctx, int valid,
                                          uint32_t seed) {
  std::vector<float> f = random_floats(size_t(d.kv) * valid * d.hd, 1.f, seed);
  const std::vector<uint16_t> vb = to_bf16_rounding(f);
  std::vector<uint16_t> bits(size_t(d.kv) * max_ctx * d.hd, 0xffff);
  for (int h = 0; h < d.kv; ++h)
    std::copy(vb.begin() + ptrdiff_t(size_t(h) * valid * d.hd),
              vb.begin() + ptrdiff_t(size_t(h + 1) * valid * d.hd),
              bits.begin() + ptrdiff_t(size_t(h) * max_ctx * d.hd));
  return bits;
}

// CPU reference of the gated attention output [T, heads*hd] for bf16 q, gate and cache.
inline std::vector<float> cpu_gated_attention(const std::vector<float>& q,
                                              const std::vector<float>& gate,
                                              const std::vector<float>& kc,
                                              const std::vector<float>& vc, int pos0, int T,
                                              const AttnDims& d) {
  std::vector<float> o(size_t(T) * d.heads * d.hd);
  cpu::attention(q.data(), kc.data(), vc.data(), pos0, T, d.heads, d.kv, d.hd, o.data(),
                 twin_pool());
  for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::sigmoid(gate[i]);
  return o;
}

// Attention outputs, compared row by row (one query head of one token): P is rounded to bf16 on
// the tensor cores (relative 2^-9 per weight: an error of ~1e-3 of the row's rms after averaging
// over the keys, ~5e-3 at the tail of thousands of elements) and the output is bf16 (2^-8 of the
// value at most). A CPU emulation of exactly these roundings (64-key tiles, exp2, bf16 P and
// output) reached 0.67 of the 1.5e-2 rule at T 1000 / pos0 1000 and n 40000. A row's tolerance is
// 2e-2 * rms(row) + 1e-2 * |value|: one key too many or too few changes a row by ~1/sqrt(e * keys)
// of its rms, caught for the short rows of every case.
inline AtolRtol attn_row_tolerance(const std::vector<float>& want_row) {
  return {2e-2 * rms(want_row) + 1e-6, 1e-2};
}
// bf16 stores of f32 values: half an ulp (2^-9 relative) plus f32 noise of rsqrt and sincos (q and
// the new k row, normed and rotated), or copies rounded to bf16 (gate and the new v row).
constexpr AtolRtol kAttnNormedTolerance{1e-4, 6e-3};
constexpr AtolRtol kAttnCopiedTolerance{1e-6, 4e-3};

// ---- decode: one token at position pos = n - 1
// ---------------------------------------------------

// The inputs of a decode of one token at position n - 1 into caches of capacity max_ctx: rows
// [0, n - 1) hold earlier keys and values (random N(0, 1) bf16), row n - 1 and everything after
// are NaN (the kernel must write row n - 1 and never read past it); qkv N(0, 1), the norm weights
// 1 + N(0, 0.1^2). Seed from n and hd.
struct AttnDecodeInputs {
  std::vector<uint16_t> kbits, vbits;  // [kv][max_ctx][hd]
  std::vector<float> qkv, q_norm, k_norm, inv_freq;
};
inline AttnDecodeInputs attn_decode_inputs(const AttnDims& d, int n, int max_ctx) {
  const uint32_t seed = uint32_t(n * 977 + d.hd + 5);
  AttnDecodeInputs in;
  in.kbits = random_cache(d, max_ctx, n - 1, seed);
  in.vbits = random_cache(d, max_ctx, n - 1, seed + 1);
  in.qkv = random_floats(size_t(attn_qkv_len(d)), 1.f, seed + 2);
  in.q_norm = random_floats(size_t(d.hd), 0.1f, seed + 3);
  in.k_norm = random_floats(size_t(d.hd), 0.1f, seed + 4);
  for (auto& x : in.q_norm) x += 1.f;
  for (auto& x : in.k_norm) x += 1.f;
  in.inv_freq = rope_inv_freq(kAttnTheta, d.R);
  return in;
}

// The twin of a decode: the output [heads*hd] and the new cache rows k, v [kv, hd] (f32, before
// the bf16 store) of the token at position n - 1.
struct AttnDecodeWant {
  std::vector<float> out, k_row, v_row;
};
inline AttnDecodeWant cpu_attention_decode(const AttnDecodeInputs& in, const AttnDims& d, int n,
                                           int max_ctx) {
  const int pos = n - 1;
  const QkvOut r = cpu_qk_norm_rope(in.qkv, 1, pos, d, in.q_norm, in.k_norm, in.inv_freq);
  std::vector<float> ck = cpu_cache_from_gpu(in.kbits, d, max_ctx, pos),
                     cv = cpu_cache_from_gpu(in.vbits, d, max_ctx, pos);
  const auto kb = bf16_round(r.k), vb = bf16_round(r.v);
  ck.insert(ck.end(), kb.begin(), kb.end());
  cv.insert(cv.end(), vb.begin(), vb.end());
  return {cpu_gated_attention(bf16_round(r.q), bf16_round(r.gate), ck, cv, pos, 1, d), r.k, r.v};
}

}  // namespace lilac::test
