// attention_decode in the kernel lab: every version on the same inputs, checked against the CPU
// twin (cpu/attention.cpp and cpu/norm.cpp composed as the CPU backend composes them: RMS norm,
// RoPE, softmax attention, sigmoid gate) at the real and the tiny-a shapes over a range of context
// lengths (inputs, twin and tolerances of the conformance registry's decode cases:
// tests/cuda/twins/attention_twin.h), then timed at the real shape as lilac_cuda_bench_seq timed
// it: a graph of 20 launches rotating over 10 layers' KV caches (max_ctx 131072), median per
// launch, context 256 to 131072.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../lab.h"
#include "attention_decode_lab.h"
#include "cuda/attention.h"
#include "cuda/synthetic_fill.h"
#include "model/rope.h"
#include "twins/attention_twin.h"
#include "util/half.h"

namespace lilac::lab {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

using test::AttnDims;
using test::kAttnEps;
using test::kAttnReal;
using test::kAttnTheta;
using test::kAttnTiny;

using Launch = void (*)(const AttentionDecodeArgs&, cudaStream_t);

void v2_fused(const AttentionDecodeArgs& a, cudaStream_t s) {
  cuda::attention_decode_qkv(a.qkv, a.d_pos, a.q_norm, a.k_norm, a.inv_freq, a.heads, a.kv_heads,
                             a.hd, a.rotary_dim, a.eps, a.k_cache, a.v_cache, a.max_ctx, a.partial,
                             a.out, s);
}

Launch launcher(int version) {
  return version == 1 ? attention_decode_v1_split : v2_fused;
}

// One token at position pos = n - 1 over a cache whose rows [0, pos) hold earlier keys (random
// bf16) and rows >= pos are NaN (the version writes row pos and must read nothing past it): the
// inputs of the conformance test's decode case (attn_decode_inputs). Compared with the CPU twin
// (cpu_attention_decode) with the conformance tolerances: the output row by row (one query head:
// P is rounded to bf16 on the tensor cores, the output is bf16; attn_row_tolerance), the new k and
// v rows, and every other cache row unchanged.
bool check(int version, const AttnDims& d, int n, int max_ctx) {
  const int pos = n - 1, hd = d.hd;
  const test::AttnDecodeInputs in = test::attn_decode_inputs(d, n, max_ctx);
  const std::vector<uint16_t>&kbits = in.kbits, &vbits = in.vbits;
  auto d_qkv = upload(in.qkv), d_qn = upload(in.q_norm), d_kn = upload(in.k_norm),
       d_inv = upload(in.inv_freq);
  auto d_kc = upload_bf16(kbits), d_vc = upload_bf16(vbits);
  auto d_pos = upload(std::vector<int32_t>{pos});
  DeviceBuffer<float> ws(cuda::attention_decode_workspace_floats(d.heads, d.kv, hd, max_ctx));
  DeviceBuffer<bf16> q(size_t(d.heads) * hd), gate(q.size()), out(q.size());
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0xff, ws.bytes()));  // NaN: nothing stale may be read
  LILAC_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
  const AttentionDecodeArgs a{d_qkv.get(), d_pos.get(), d_qn.get(), d_kn.get(), d_inv.get(),
                              d.heads,     d.kv,        hd,         d.R,        kAttnEps,
                              d_kc.get(),  d_vc.get(),  max_ctx,    ws.get(),   q.get(),
                              gate.get(),  out.get()};
  launcher(version)(a, nullptr);
  const std::vector<float> got = download_bf16_as_f32(out), kc = download_bf16_as_f32(d_kc),
                           vc = download_bf16_as_f32(d_vc);

  const test::AttnDecodeWant want = test::cpu_attention_decode(in, d, n, max_ctx);
  Error e_out;
  for (int h = 0; h < d.heads; ++h) {
    const size_t o = size_t(h) * hd;
    const std::vector<float> g(got.begin() + ptrdiff_t(o), got.begin() + ptrdiff_t(o + hd)),
        w(want.out.begin() + ptrdiff_t(o), want.out.begin() + ptrdiff_t(o + hd));
    const test::AtolRtol t = test::attn_row_tolerance(w);
    merge(e_out, compare(g, w, t.atol, t.rtol));
  }
  std::vector<float> got_k, got_v;
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
  const test::AtolRtol tk = test::kAttnNormedTolerance, tv = test::kAttnCopiedTolerance;
  ok = report_check(l + ": new k row", compare(got_k, want.k_row, tk.atol, tk.rtol)) && ok;
  ok = report_check(l + ": new v row", compare(got_v, want.v_row, tv.atol, tv.rtol)) && ok;
  if (changed)
    std::printf("  check %s: %zu other cache elements changed FAIL\n", l.c_str(), changed);
  return ok && changed == 0;
}

// The real shape: 10 layers' caches (max_ctx 131072) rotating in a graph of 20 launches.
void time_real(const Options& opt, int version) {
  const AttnDims d = kAttnReal;
  const int layers = 10, max_ctx = 131072, P = test::attn_qkv_len(d);
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
  auto inv = upload(rope_inv_freq(kAttnTheta, d.R));
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
                                  kAttnEps,
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
  for (const AttnDims& d : {kAttnReal, kAttnTiny})
    for (int n : {1, 2, 17, 64, 65, 1000, 4097}) ok = check(v.number, d, n, n + 5) && ok;
  ok = check(v.number, kAttnReal, 300, 131072) && ok;  // as the engine: a fixed large capacity
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
