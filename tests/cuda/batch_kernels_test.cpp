// The batched decode kernels (label gpu) against their single-sequence versions at the real
// model's dimensions: each batch row must give what the B = 1 launch gives for it alone.
//  * gdn_decode_batch (prep + state kernels) vs gdn_decode (cluster kernel) per row, B up to 16:
//  outputs and both states bit-identical, with the recurrent state in f32 and in bf16;
//  * attention_decode_qkv_batch vs attention_decode_qkv per row (rows of different lengths and
//    cache sizes): the new K/V cache rows bit-identical, the output within bf16 rounding (the
//    batched launch's split count follows B, so its f32 combine sums in another order);
//  * moe_{gate_up,down}_gemv and q_moe_* with B tokens vs B single launches: bit-identical;
//  * argmax_batch vs argmax per row (ties and NaN planted): identical;
//  * finish_decode_batch: every row's position counter becomes pos + 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/attention.h"
#include "cuda/decode_batch.h"
#include "cuda/gated_deltanet.h"
#include "cuda/moe_decode.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_moe.h"
#include "cuda/sampling.h"
#include "cuda/synthetic_fill.h"
#include "cuda_test_util.h"
#include "q4_test_util.h"

namespace lilac::test {
namespace {

using cuda::bf16;
using cuda::DecodeBatchRow;
using cuda::DeviceBuffer;

std::vector<uint16_t> bits_of(const DeviceBuffer<bf16>& d) {
  std::vector<uint16_t> h(d.size());
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  LILAC_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

DeviceBuffer<bf16> random_bf16(size_t n, float scale, uint32_t seed) {
  auto v = random_floats(n, scale, seed);
  return upload_bf16(to_bf16_rounding(v));
}

// ---- Gated DeltaNet ---------------------------------------------------------------------------

// A random recurrent state of n values (scale 0.1) in the element type ST.
template <class ST>
DeviceBuffer<ST> random_state(size_t n, uint32_t seed) {
  if constexpr (std::is_same_v<ST, bf16>)
    return random_bf16(n, 0.1f, seed);
  else
    return upload(random_floats(n, 0.1f, seed));
}
template <class ST>
std::vector<uint16_t> state_bits(const DeviceBuffer<ST>& d) {
  if constexpr (std::is_same_v<ST, bf16>) {
    return bits_of(d);
  } else {
    const auto f = download(d);
    std::vector<uint16_t> b(f.size() * 2);
    std::memcpy(b.data(), f.data(), f.size() * 4);
    return b;
  }
}

// Rows b of one launch against gdn_decode per row, at (Hk, Hv, Dk, Dv, K); ST: the recurrent
// state's element type (float or bf16); kernel: the state pass's implementation (both must give
// the single-row kernel's bits).
template <class ST>
void check_gdn_batch_rows(int Hk, int Hv, int Dk, int Dv, int K, std::initializer_list<int> Bs,
                          cuda::GdnBatchKernel kernel) {
  const int slots = 3, slot = 1;
  ASSERT_TRUE(cuda::gdn_decode_uses_cluster(Hk, Hv, Dk, Dv));
  const int C = 2 * Hk * Dk + Hv * Dv, P = C + Hv * Dv + 2 * Hv;
  const size_t conv_n = size_t(K - 1) * C, rec_n = size_t(Hv) * Dk * Dv;
  auto taps = upload(random_floats(size_t(C) * K, 0.3f, 1));
  std::vector<float> negA = random_floats(size_t(Hv), 0.5f, 2);
  for (float& x : negA) x = -std::exp(x);
  auto nA = upload(negA);
  auto dtb = upload(random_floats(size_t(Hv), 0.5f, 3));
  auto normw = upload(random_floats(size_t(Dv), 0.2f, 4));
  for (int B : Bs) {
    SCOPED_TRACE("B = " + std::to_string(B));
    auto proj = upload(random_floats(size_t(B) * P, 1.f, uint32_t(10 + B)));
    std::vector<DeviceBuffer<float>> conv, conv_ref;
    std::vector<DeviceBuffer<ST>> rec, rec_ref;
    std::vector<DecodeBatchRow> rows(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      auto c0 = random_floats(conv_n * slots, 0.5f, uint32_t(100 + b));
      conv.push_back(upload(c0));
      conv_ref.push_back(upload(c0));
      rec.push_back(random_state<ST>(rec_n * slots, uint32_t(200 + b)));
      rec_ref.push_back(random_state<ST>(rec_n * slots, uint32_t(200 + b)));
      rows[size_t(b)].conv = conv.back().get();
      if constexpr (std::is_same_v<ST, bf16>)
        rows[size_t(b)].rec_bf16 = rec.back().get();
      else
        rows[size_t(b)].rec = rec.back().get();
    }
    auto d_rows = upload(rows);
    DeviceBuffer<bf16> out(size_t(B) * Hv * Dv), out_ref(size_t(B) * Hv * Dv);
    poison(out);
    DeviceBuffer<float> ws(cuda::gdn_decode_batch_workspace_floats(B, Hk, Hv, Dk, Dv));
    poison(ws);  // needs no initialisation
    cuda::gdn_decode_batch(proj.get(), B, d_rows.get(), slot, taps.get(), nA.get(), dtb.get(),
                           normw.get(), Hk, Hv, Dk, Dv, K, 1e-6f, ws.get(), out.get(), nullptr,
                           std::is_same_v<ST, bf16> ? GdnStateFormat::bf16 : GdnStateFormat::f32,
                           kernel);
    for (int b = 0; b < B; ++b)
      cuda::gdn_decode(proj.get() + size_t(b) * P, taps.get(),
                       conv_ref[size_t(b)].get() + size_t(slot) * conv_n, nA.get(), dtb.get(),
                       normw.get(), rec_ref[size_t(b)].get() + size_t(slot) * rec_n, Hk, Hv, Dk, Dv,
                       K, 1e-6f, out_ref.get() + size_t(b) * Hv * Dv, nullptr);
    EXPECT_EQ(bits_of(out), bits_of(out_ref));
    for (int b = 0; b < B; ++b) {
      EXPECT_EQ(download(conv[size_t(b)]), download(conv_ref[size_t(b)])) << "conv row " << b;
      EXPECT_EQ(state_bits(rec[size_t(b)]), state_bits(rec_ref[size_t(b)])) << "state row " << b;
    }
  }
}

constexpr cuda::GdnBatchKernel kGdnBatchKernels[] = {cuda::GdnBatchKernel::split,
                                                     cuda::GdnBatchKernel::head};

TEST(BatchKernels, GdnDecodeBatchEqualsSingleRows) {
  LILAC_REQUIRE_GPU();
  if (!cuda::gdn_decode_uses_cluster(16, 32, 128, 128)) GTEST_SKIP() << "needs an sm_90 GPU";
  // The real shape (clusters of 4 column blocks); a wide one (Dv 64: clusters of 2, K 3); Dk 64
  // (K 2); tiny-a's (Dk = Dv = 32: one block per head, no cluster barrier). The head kernel at 64
  // rows deals 2,048 items over its resident blocks (several rounds of its ring), at 517 rows of
  // tiny-a's shape 2,068.
  for (const auto kernel : kGdnBatchKernels) {
    SCOPED_TRACE(kernel == cuda::GdnBatchKernel::head ? "head kernel" : "split kernel");
    check_gdn_batch_rows<float>(16, 32, 128, 128, 4, {1, 3, 7, 16, 40, 64}, kernel);
    check_gdn_batch_rows<float>(2, 8, 128, 64, 3, {1, 5, 123}, kernel);
    check_gdn_batch_rows<float>(4, 4, 64, 64, 2, {2, 211}, kernel);
    check_gdn_batch_rows<float>(2, 4, 32, 32, 4, {3, 517}, kernel);
    // The real shape again after a narrower head of the same Dk (s16: the head kernel's shared
    // memory allowance was set per Dv, and the narrower shape's refused the real one's launch).
    check_gdn_batch_rows<float>(16, 32, 128, 128, 4, {5}, kernel);
  }
}

// The same with the recurrent state in bf16 (model/state_format.h).
TEST(BatchKernels, GdnDecodeBatchEqualsSingleRowsBf16State) {
  LILAC_REQUIRE_GPU();
  if (!cuda::gdn_decode_uses_cluster(16, 32, 128, 128)) GTEST_SKIP() << "needs an sm_90 GPU";
  for (const auto kernel : kGdnBatchKernels) {
    SCOPED_TRACE(kernel == cuda::GdnBatchKernel::head ? "head kernel" : "split kernel");
    check_gdn_batch_rows<bf16>(16, 32, 128, 128, 4, {1, 7, 16, 64}, kernel);
    check_gdn_batch_rows<bf16>(2, 8, 128, 64, 3, {5, 123}, kernel);
    check_gdn_batch_rows<bf16>(2, 4, 32, 32, 4, {3, 517}, kernel);
  }
}

// ---- attention --------------------------------------------------------------------------------

TEST(BatchKernels, AttentionDecodeQkvBatchEqualsSingleRows) {
  LILAC_REQUIRE_GPU();
  const int heads = 16, kv = 2, hd = 256, R = 64, slots = 2, slot = 1;
  const int qkv_n = heads * 2 * hd + 2 * kv * hd;
  auto qn = upload(random_floats(size_t(hd), 0.2f, 1));
  auto kn = upload(random_floats(size_t(hd), 0.2f, 2));
  std::vector<float> inv(static_cast<size_t>(R / 2));
  for (int j = 0; j < R / 2; ++j) inv[size_t(j)] = std::pow(1e7f, -2.f * float(j) / float(R));
  auto d_inv = upload(inv);
  // (position, cache rows): short, tile edges, one split, many splits, a full cache.
  const std::vector<std::pair<int, int>> shapes = {{0, 8},      {17, 64},     {63, 300}, {64, 65},
                                                   {999, 1024}, {4100, 5000}, {127, 128}};
  // 16 and 64 rows: fewer splits per row (4 and 1 on 132 SMs), each over more tiles.
  for (int B : {1, 2, 7, 16, 64}) {
    SCOPED_TRACE("B = " + std::to_string(B) + ", " +
                 std::to_string(cuda::attention_decode_batch_splits(B, kv)) + " splits per row");
    auto qkv = upload(random_floats(size_t(B) * qkv_n, 1.f, uint32_t(30 + B)));
    std::vector<DeviceBuffer<bf16>> kvs, kvs_ref;
    std::vector<DecodeBatchRow> rows(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      const auto [pos, max_ctx] = shapes[size_t(b) % shapes.size()];
      const size_t n = size_t(slots) * 2 * kv * size_t(max_ctx) * hd;
      auto init = random_floats(n, 1.f, uint32_t(300 + b));
      auto bits = to_bf16_rounding(init);
      kvs.push_back(upload_bf16(bits));
      kvs_ref.push_back(upload_bf16(bits));
      rows[size_t(b)].kv = kvs.back().get();
      rows[size_t(b)].max_ctx = max_ctx;
      rows[size_t(b)].pos = pos;
    }
    auto d_rows = upload(rows);
    DeviceBuffer<float> part(cuda::attention_decode_batch_workspace_floats(B, heads, kv, hd));
    DeviceBuffer<bf16> out(size_t(B) * heads * hd), out_ref(size_t(B) * heads * hd);
    poison(out);
    cuda::attention_decode_qkv_batch(qkv.get(), B, d_rows.get(), slot, qn.get(), kn.get(),
                                     d_inv.get(), heads, kv, hd, R, 1e-6f, part.get(), out.get(),
                                     nullptr);
    for (int b = 0; b < B; ++b) {
      const auto [pos, max_ctx] = shapes[size_t(b) % shapes.size()];
      auto d_pos = upload(std::vector<int32_t>{pos});
      DeviceBuffer<float> p1(cuda::attention_decode_workspace_floats(heads, kv, hd, max_ctx));
      bf16* kc = kvs_ref[size_t(b)].get() + size_t(slot) * 2 * kv * size_t(max_ctx) * hd;
      cuda::attention_decode_qkv(qkv.get() + size_t(b) * qkv_n, d_pos.get(), qn.get(), kn.get(),
                                 d_inv.get(), heads, kv, hd, R, 1e-6f, kc,
                                 kc + size_t(kv) * max_ctx * hd, max_ctx, p1.get(),
                                 out_ref.get() + size_t(b) * heads * hd, nullptr);
      LILAC_CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (int b = 0; b < B; ++b)
      EXPECT_EQ(bits_of(kvs[size_t(b)]), bits_of(kvs_ref[size_t(b)])) << "KV cache of row " << b;
    // Output within bf16 rounding (values ~ 1: 2^-8 relative, plus one ulp of slack).
    EXPECT_TRUE(all_close(download_bf16_as_f32(out), download_bf16_as_f32(out_ref), 1e-2, 1e-2,
                          "attention_decode_qkv_batch out"));
  }
}

// ---- MoE --------------------------------------------------------------------------------------

struct MoeInputs {
  int B, E, k, H, I, Is;
  DeviceBuffer<int32_t> idx;
  DeviceBuffer<float> w, logits;
  DeviceBuffer<bf16> x;
  std::vector<float> h0;
};

MoeInputs moe_inputs(int B, int E, int k, int H, int I, int Is, uint32_t seed) {
  MoeInputs m{B, E, k, H, I, Is, {}, {}, {}, {}, {}};
  std::vector<int32_t> idx(size_t(B) * k);
  std::mt19937 rng(seed);
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    std::copy_n(e.begin(), k, idx.begin() + ptrdiff_t(b) * k);
  }
  idx[0] = idx[size_t(k)];  // token 0 and token 1 share an expert (when B > 1)
  if (B == 1) idx[0] = 3;
  m.idx = upload(idx);
  m.w = upload(random_floats(size_t(B) * k, 0.2f, seed + 1));
  m.logits = upload(random_floats(size_t(B) * (E + 1), 1.f, seed + 2));
  m.x = random_bf16(size_t(B) * H, 1.f, seed + 3);
  m.h0 = random_floats(size_t(B) * H, 1.f, seed + 4);
  return m;
}

TEST(BatchKernels, MoeDecodeBatchEqualsSingleTokensBf16) {
  LILAC_REQUIRE_GPU();
  const int E = 16, k = 8, H = 2048, I = 512, Is = 512;
  DeviceBuffer<bf16> gate_up(size_t(E) * 2 * I * H), down(size_t(E) * H * I),
      sgu(size_t(2) * Is * H), sdn(size_t(H) * Is);
  cuda::fill_synthetic_bf16(gate_up.get(), gate_up.size(), 11, 0.f, 0.03f, nullptr);
  cuda::fill_synthetic_bf16(down.get(), down.size(), 12, 0.f, 0.03f, nullptr);
  cuda::fill_synthetic_bf16(sgu.get(), sgu.size(), 13, 0.f, 0.03f, nullptr);
  cuda::fill_synthetic_bf16(sdn.get(), sdn.size(), 14, 0.f, 0.03f, nullptr);
  for (int B : {1, 2, 5, 16}) {
    SCOPED_TRACE("B = " + std::to_string(B));
    MoeInputs m = moe_inputs(B, E, k, H, I, Is, uint32_t(50 + B));
    const size_t A = size_t(k) * I + Is;
    DeviceBuffer<bf16> act(size_t(B) * A), act_ref(size_t(B) * A);
    poison(act);
    cuda::moe_gate_up_gemv(gate_up.get(), sgu.get(), m.idx.get(), k, m.x.get(), H, I, Is, act.get(),
                           nullptr, B);
    for (int b = 0; b < B; ++b)
      cuda::moe_gate_up_gemv(gate_up.get(), sgu.get(), m.idx.get() + b * k, k,
                             m.x.get() + size_t(b) * H, H, I, Is, act_ref.get() + size_t(b) * A,
                             nullptr);
    EXPECT_EQ(bits_of(act), bits_of(act_ref));
    auto h = upload(m.h0), h_ref = upload(m.h0);
    cuda::moe_down_gemv(down.get(), sdn.get(), m.idx.get(), m.w.get(), m.logits.get() + E,
                        act_ref.get(), k, H, I, Is, h.get(), nullptr, B, E + 1);
    for (int b = 0; b < B; ++b)
      cuda::moe_down_gemv(down.get(), sdn.get(), m.idx.get() + b * k, m.w.get() + b * k,
                          m.logits.get() + size_t(b) * (E + 1) + E, act_ref.get() + size_t(b) * A,
                          k, H, I, Is, h_ref.get() + size_t(b) * H, nullptr);
    EXPECT_EQ(download(h), download(h_ref));
  }
}

TEST(BatchKernels, MoeDecodeBatchEqualsSingleTokensQ4) {
  LILAC_REQUIRE_GPU();
  const int E = 8, k = 6, H = 2048, I = 512, Is = 512;
  HostQ gate_up(int64_t(E) * 2 * I, H, 4, 0.05f, 21), down(int64_t(E) * H, I, 4, 0.05f, 22),
      sgu(2 * Is, H, 4, 0.05f, 23), sdn(H, Is, 4, 0.05f, 24);
  for (int B : {1, 3, 9}) {
    SCOPED_TRACE("B = " + std::to_string(B));
    MoeInputs m = moe_inputs(B, E, k, H, I, Is, uint32_t(70 + B));
    const size_t A = size_t(k) * I + Is;
    DeviceBuffer<bf16> act(size_t(B) * A), act_ref(size_t(B) * A);
    poison(act);
    cuda::q_moe_gate_up_gemv(gate_up.q(), sgu.q(), m.idx.get(), k, m.x.get(), H, I, Is, act.get(),
                             nullptr, B);
    for (int b = 0; b < B; ++b)
      cuda::q_moe_gate_up_gemv(gate_up.q(), sgu.q(), m.idx.get() + b * k, k,
                               m.x.get() + size_t(b) * H, H, I, Is, act_ref.get() + size_t(b) * A,
                               nullptr);
    // The launcher splits each row's sets over fewer warps when B fills the GPU, so the f32 sum
    // of the slices runs in another order: the bf16 act within one rounding step.
    EXPECT_TRUE(all_close(download_bf16_as_f32(act), download_bf16_as_f32(act_ref), 1e-4, 1e-2,
                          "q_moe_gate_up_gemv B rows"));
    // The sorted launch (pairs in expert order, one grid row): the same activations.
    DeviceBuffer<int32_t> order(size_t(B) * k);
    cuda::moe_sort_pairs(m.idx.get(), B * k, order.get(), nullptr);
    DeviceBuffer<bf16> act_sorted(size_t(B) * A);
    poison(act_sorted);
    cuda::q_moe_gate_up_gemv(gate_up.q(), sgu.q(), m.idx.get(), k, m.x.get(), H, I, Is,
                             act_sorted.get(), nullptr, B, order.get());
    EXPECT_TRUE(all_close(download_bf16_as_f32(act_sorted), download_bf16_as_f32(act_ref), 1e-4,
                          1e-2, "q_moe_gate_up_gemv sorted"));
    auto h = upload(m.h0), h_ref = upload(m.h0);
    cuda::q_moe_down_gemv(down.q(), sdn.q(), m.idx.get(), m.w.get(), m.logits.get() + E,
                          act_ref.get(), k, H, I, Is, h.get(), nullptr, B, E + 1);
    for (int b = 0; b < B; ++b)
      cuda::q_moe_down_gemv(down.q(), sdn.q(), m.idx.get() + b * k, m.w.get() + b * k,
                            m.logits.get() + size_t(b) * (E + 1) + E, act_ref.get() + size_t(b) * A,
                            k, H, I, Is, h_ref.get() + size_t(b) * H, nullptr);
    EXPECT_EQ(download(h), download(h_ref));
  }
}

TEST(BatchKernels, MoeSortPairsIsAStableSortByExpert) {
  LILAC_REQUIRE_GPU();
  for (int n : {1, 7, 512, 2048}) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    for (auto& e : idx) e = int32_t(rng() % 37);  // many repeats
    auto d_idx = upload(idx);
    DeviceBuffer<int32_t> order(static_cast<size_t>(n));
    poison(order);
    cuda::moe_sort_pairs(d_idx.get(), n, order.get(), nullptr);
    std::vector<int32_t> want(static_cast<size_t>(n));
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(),
                     [&](int32_t a, int32_t b) { return idx[size_t(a)] < idx[size_t(b)]; });
    EXPECT_EQ(download(order), want) << "n = " << n;
  }
}

// ---- argmax and the position counters ----------------------------------------------------------

TEST(BatchKernels, ArgmaxBatchEqualsArgmaxPerRow) {
  LILAC_REQUIRE_GPU();
  const int V = 248320, n = 248077, B = 9;
  std::vector<float> x = random_floats(size_t(B) * V, 3.f, 5);
  x[size_t(1) * V + 100] = 50.f;  // row 1: a tie at the maximum, lowest id wins
  x[size_t(1) * V + 7] = 50.f;
  x[size_t(2) * V + n - 1] = 60.f;                                 // row 2: the last real id
  x[size_t(2) * V + n] = 90.f;                                     // ... beyond n: not a candidate
  x[size_t(3) * V + 5] = std::numeric_limits<float>::quiet_NaN();  // NaN never wins
  auto d = upload(x);
  DeviceBuffer<uint8_t> ws(size_t(B) * cuda::argmax_workspace_bytes(n)), ws1(256);
  LILAC_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
  LILAC_CUDA_CHECK(cudaMemset(ws1.get(), 0, ws1.bytes()));
  DeviceBuffer<int32_t> out(static_cast<size_t>(B)), one(1);
  for (int rep = 0; rep < 2; ++rep) {  // the workspace is left zeroed: a second launch agrees
    cuda::argmax_batch(d.get(), n, size_t(V), B, ws.get(), out.get(), nullptr);
    const auto got = download(out);
    for (int b = 0; b < B; ++b) {
      cuda::argmax(d.get() + size_t(b) * V, n, ws1.get(), one.get(), nullptr);
      EXPECT_EQ(got[size_t(b)], download(one)[0]) << "row " << b;
    }
    EXPECT_EQ(got[1], 7);
    EXPECT_EQ(got[2], n - 1);
  }
}

TEST(BatchKernels, FinishDecodeBatchAdvancesEachRow) {
  LILAC_REQUIRE_GPU();
  const int B = 70;
  DeviceBuffer<int32_t> pos(static_cast<size_t>(B));
  LILAC_CUDA_CHECK(cudaMemset(pos.get(), 0, pos.bytes()));
  std::vector<DecodeBatchRow> rows(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    rows[size_t(b)].d_pos = pos.get() + (B - 1 - b);
    rows[size_t(b)].pos = 10 * b;
  }
  auto d_rows = upload(rows);
  cuda::finish_decode_batch(d_rows.get(), B, nullptr);
  const auto got = download(pos);
  for (int b = 0; b < B; ++b) EXPECT_EQ(got[size_t(B - 1 - b)], 10 * b + 1);
}

}  // namespace
}  // namespace lilac::test
