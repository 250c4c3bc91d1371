// attention_decode in the kernel lab: every version on the same inputs, checked against the CPU
// twin (cpu/attention.cpp and cpu/norm.cpp composed as the CPU backend composes them: RMS norm,
// RoPE, softmax attention, sigmoid gate) at the real and the tiny-a shapes over a range of context
// lengths, then timed at the real shape as lilac_cuda_bench_seq timed it: a graph of 20 launches
// rotating over 10 layers' KV caches (max_ctx 131072), median per launch, context 256 to 131072.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../lab.h"
#include "attention_decode_lab.h"
#include "cpu/attention.h"
#include "cpu/norm.h"
#include "cuda/attention.h"
#include "cuda/synthetic_fill.h"
#include "model/rope.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

struct Dims {
  const char* name;
  int heads, kv, hd, R;
  int P() const { return heads * 2 * hd + 2 * kv * hd; }
};
constexpr Dims kReal{"real", 16, 2, 256, 64};
constexpr Dims kTiny{"tiny", 4, 2, 64, 16};
constexpr float kTheta = 1e7f, kEps = 1e-6f;

using Launch = void (*)(const AttentionDecodeArgs&, cudaStream_t);

void v2_fused(const AttentionDecodeArgs& a, cudaStream_t s) {
  cuda::attention_decode_qkv(a.qkv, a.d_pos, a.q_norm, a.k_norm, a.inv_freq, a.heads, a.kv_heads,
                             a.hd, a.rotary_dim, a.eps, a.k_cache, a.v_cache, a.max_ctx, a.partial,
                             a.out, s);
}

Launch launcher(int version) {
  return version == 1 ? attention_decode_v1_split : v2_fused;
}

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

double rms(const float* v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
  return std::sqrt(s / double(std::max<size_t>(1, n)));
}

std::vector<float> bf16_round(std::vector<float> v) {
  for (auto& x : v) x = round_to_bf16(x);
  return v;
}

// One token at position pos = n - 1 over a cache whose rows [0, pos) hold earlier keys (random
// bf16) and rows >= pos are NaN (the version writes row pos and must read nothing past it).
// Compared with the CPU twin: the output row by row (one query head: P is rounded to bf16 on the
// tensor cores, the output is bf16; tolerance 2e-2 rms(row) + 1e-2 |value|, as
// tests/cuda/attention_test.cpp), the new k and v rows, and every other cache row unchanged.
bool check(int version, const Dims& d, int n, int max_ctx) {
  const int pos = n - 1, P = d.P(), hd = d.hd;
  const uint32_t seed = uint32_t(n * 977 + hd + 5);
  std::vector<uint16_t> kbits(size_t(d.kv) * max_ctx * hd, 0xffff), vbits(kbits.size(), 0xffff);
  const std::vector<uint16_t> kr = to_bf16_bits(random_floats(size_t(d.kv) * pos * hd, 1.f, seed)),
                              vr = to_bf16_bits(
                                  random_floats(size_t(d.kv) * pos * hd, 1.f, seed + 1));
  for (int h = 0; h < d.kv; ++h)
    for (int p = 0; p < pos; ++p)
      for (int i = 0; i < hd; ++i) {
        kbits[(size_t(h) * max_ctx + p) * hd + i] = kr[(size_t(h) * pos + p) * hd + i];
        vbits[(size_t(h) * max_ctx + p) * hd + i] = vr[(size_t(h) * pos + p) * hd + i];
      }
  const std::vector<float> qkv = random_floats(size_t(P), 1.f, seed + 2);
  std::vector<float> q_norm = random_floats(size_t(hd), 0.1f, seed + 3),
                     k_norm = random_floats(size_t(hd), 0.1f, seed + 4);
  for (auto& x : q_norm) x += 1.f;
  for (auto& x : k_norm) x += 1.f;
  const std::vector<float> inv = rope_inv_freq(kTheta, d.R);

  auto d_qkv = upload(qkv), d_qn = upload(q_norm), d_kn = upload(k_norm), d_inv = upload(inv);
  auto d_kc = upload_bf16(kbits), d_vc = upload_bf16(vbits);
  auto d_pos = upload(std::vector<int32_t>{pos});
  DeviceBuffer<float> ws(cuda::attention_decode_workspace_floats(d.heads, d.kv, hd, max_ctx));
  DeviceBuffer<bf16> q(size_t(d.heads) * hd), gate(q.size()), out(q.size());
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0xff, ws.bytes()));  // NaN: nothing stale may be read
  LILAC_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
  const AttentionDecodeArgs a{d_qkv.get(), d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(),
                              d.heads,     d.kv,        hd,         d.R,        kEps,
                              d_kc.get(),  d_vc.get(),  max_ctx,    ws.get(),   q.get(),
                              gate.get(),  out.get()};
  launcher(version)(a, nullptr);
  const std::vector<float> got = download_bf16(out), kc = download_bf16(d_kc),
                           vc = download_bf16(d_vc);

  // The CPU twin: q, gate, k, v of the token; the caches [ctx][kv][hd] in f32 with the new row.
  const int QG = d.heads * 2 * hd, KV = d.kv * hd;
  std::vector<float> tq(size_t(d.heads) * hd), tgate(tq.size());
  cpu::split_query_gate(qkv.data(), 1, d.heads, hd, tq.data(), tgate.data());
  std::vector<float> tk(qkv.begin() + QG, qkv.begin() + QG + KV),
      tv(qkv.begin() + QG + KV, qkv.begin() + QG + 2 * KV);
  for (int h = 0; h < d.heads; ++h)
    cpu::rms_norm(&tq[size_t(h) * hd], q_norm.data(), hd, kEps, &tq[size_t(h) * hd]);
  for (int h = 0; h < d.kv; ++h)
    cpu::rms_norm(&tk[size_t(h) * hd], k_norm.data(), hd, kEps, &tk[size_t(h) * hd]);
  cpu::rope(tq.data(), 1, d.heads, hd, d.R, pos, inv.data());
  cpu::rope(tk.data(), 1, d.kv, hd, d.R, pos, inv.data());
  const std::vector<float> kb = bf16_round(tk), vb = bf16_round(tv);
  std::vector<float> ck(size_t(n) * KV), cv(ck.size());
  for (int p = 0; p < n; ++p)
    for (int h = 0; h < d.kv; ++h)
      for (int i = 0; i < hd; ++i) {
        const size_t at = (size_t(p) * d.kv + h) * hd + i;
        ck[at] = p < pos ? bf16_to_f32(kbits[(size_t(h) * max_ctx + p) * hd + i])
                         : kb[size_t(h) * hd + i];
        cv[at] = p < pos ? bf16_to_f32(vbits[(size_t(h) * max_ctx + p) * hd + i])
                         : vb[size_t(h) * hd + i];
      }
  const std::vector<float> qr = bf16_round(tq), gr = bf16_round(tgate);
  std::vector<float> want(tq.size());
  cpu::attention(qr.data(), ck.data(), cv.data(), pos, 1, d.heads, d.kv, hd, want.data(), pool());
  for (size_t i = 0; i < want.size(); ++i) want[i] *= cpu::sigmoid(gr[i]);

  Error e_out;
  for (int h = 0; h < d.heads; ++h) {
    const size_t o = size_t(h) * hd;
    const std::vector<float> g(got.begin() + ptrdiff_t(o), got.begin() + ptrdiff_t(o + hd)),
        w(want.begin() + ptrdiff_t(o), want.begin() + ptrdiff_t(o + hd));
    merge(e_out, compare(g, w, 2e-2 * rms(w.data(), w.size()) + 1e-6, 1e-2));
  }
  std::vector<float> got_k, got_v, want_k(tk), want_v(tv);
  size_t changed = 0;
  for (int h = 0; h < d.kv; ++h)
    for (int p = 0; p < max_ctx; ++p)
      for (int i = 0; i < hd; ++i) {
        const size_t at = (size_t(h) * max_ctx + p) * hd + i;
        if (p == pos) {
          got_k.push_back(kc[at]);
          got_v.push_back(vc[at]);
          continue;
        }
        const float wk = bf16_to_f32(kbits[at]), wv = bf16_to_f32(vbits[at]);
        changed += !(std::isnan(wk) ? std::isnan(kc[at]) : kc[at] == wk);
        changed += !(std::isnan(wv) ? std::isnan(vc[at]) : vc[at] == wv);
      }
  const std::string l =
      std::string(d.name) + " n " + std::to_string(n) + " max_ctx " + std::to_string(max_ctx);
  bool ok = report_check(l + ": out", e_out);
  ok = report_check(l + ": new k row", compare(got_k, want_k, 1e-4, 6e-3)) && ok;
  ok = report_check(l + ": new v row", compare(got_v, want_v, 1e-6, 4e-3)) && ok;
  if (changed)
    std::printf("  check %s: %zu other cache elements changed FAIL\n", l.c_str(), changed);
  return ok && changed == 0;
}

// The real shape: 10 layers' caches (max_ctx 131072) rotating in a graph of 20 launches.
void time_real(const Options& opt, int version) {
  const Dims d = kReal;
  const int layers = 10, max_ctx = 131072, P = d.P();
  const size_t cache = size_t(d.kv) * max_ctx * d.hd;
  uint64_t key = 1;
  std::vector<DeviceBuffer<bf16>> kc, vc;
  for (int l = 0; l < layers; ++l) {
    kc.emplace_back(cache);
    vc.emplace_back(cache);
    cuda::fill_synthetic_bf16(kc.back().get(), cache, key++, 0.f, 1.7f, nullptr);
    cuda::fill_synthetic_bf16(vc.back().get(), cache, key++, 0.f, 1.7f, nullptr);
  }
  DeviceBuffer<float> qkv(static_cast<size_t>(P)), qn(static_cast<size_t>(d.hd)),
      kn(static_cast<size_t>(d.hd));
  cuda::fill_synthetic_f32(qkv.get(), qkv.size(), key++, 0.f, 1.7f, nullptr);
  cuda::fill_synthetic_f32(qn.get(), qn.size(), key++, 1.f, 0.1f, nullptr);
  cuda::fill_synthetic_f32(kn.get(), kn.size(), key++, 1.f, 0.1f, nullptr);
  auto inv = upload(rope_inv_freq(kTheta, d.R));
  DeviceBuffer<float> ws(cuda::attention_decode_workspace_floats(d.heads, d.kv, d.hd, max_ctx));
  DeviceBuffer<bf16> q(size_t(d.heads) * d.hd), gate(q.size()), out(q.size());
  DeviceBuffer<int32_t> pos(1);
  cudaStream_t s;
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Launch launch = launcher(version);
  std::printf(
      "  time real shape, %d splits (max_ctx %d), bytes = K + V of the context (2 KiB per "
      "token)\n  %10s %10s %10s %8s\n",
      cuda::attention_decode_splits(d.kv, max_ctx), max_ctx, "context", "us", "GB/s", "of copy");
  for (int ctx = 256; ctx <= max_ctx; ctx *= 2) {
    const int p = ctx - 1;
    LILAC_CUDA_CHECK(cudaMemcpy(pos.get(), &p, 4, cudaMemcpyHostToDevice));
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    const double us = graph_us(s, opt.runs, 20, [&](int i) {
      const int l = i % layers;
      const AttentionDecodeArgs a{qkv.get(),
                                  pos.get(),
                                  qn.get(),
                                  kn.get(),
                                  inv.get(),
                                  d.heads,
                                  d.kv,
                                  d.hd,
                                  d.R,
                                  kEps,
                                  kc[size_t(l)].get(),
                                  vc[size_t(l)].get(),
                                  max_ctx,
                                  ws.get(),
                                  q.get(),
                                  gate.get(),
                                  out.get()};
      launch(a, s);
    });
    const double gbs = double(ctx) * 2048.0 / us * 1e-3;
    std::printf("  %10d %10.2f %10.0f %7.0f%%\n", ctx, us, gbs, 100.0 * gbs / 4300.0);
    std::fflush(stdout);
  }
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
}

bool run(const Options& opt, const Version& v) {
  bool ok = true;
  for (const Dims& d : {kReal, kTiny})
    for (int n : {1, 2, 17, 64, 65, 1000, 4097}) ok = check(v.number, d, n, n + 5) && ok;
  ok = check(v.number, kReal, 300, 131072) && ok;  // as the engine: a fixed large capacity
  time_real(opt, v.number);
  return ok;
}

}  // namespace

Op attention_decode_op() {
  return Op{"attention_decode",
            "gated attention decode, one token from its qkv row: real heads 16 kv 2 hd 256 R 64",
            {{1, "split", "qk_norm_rope_store, then split-K flash decoding + combine (3 launches)",
              false},
             {2, "fused",
              "the norm, RoPE and cache store in the split kernel's prologue (2 "
              "launches)",
              true}},
            run};
}

}  // namespace lilac::lab
