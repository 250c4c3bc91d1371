// Conformance cases of cuda::q_gemm against its twin: dequantize_row_bf16 (exactly the weights the
// kernel multiplies) + cpu::matmul, so only the f32 summation order differs (tight tolerance); and
// against the f32 dequantisation (dequantize_row) within the bf16 rounding of the weights.
// Real prefill shapes (GDN in_proj, out_proj +=, the 8-bit router, shared down) and awkward ones
// (M = 1, 17, 130, 257; N not a multiple of 16 or of the 256-row block; K of one group). Outputs
// poisoned.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "../q4_test_util.h"
#include "conformance.h"
#include "cuda/q4_gemm.h"
#include "util/error.h"

namespace lilac::test {
namespace {

struct Case {
  int M, N, K, bits;
  cuda::GemmOut mode;
  // q_gemm (the dispatch) when splits == 0, else q_gemm_wgmma with this tile and split of K
  // (-1: the stream-K form).
  int tokens_per_block = 0, splits = 0;
  // With a stream-K scratch (always at splits -1): the dispatch may take the stream-K form.
  bool scratch = false;
  // q_gemm_wgmma's whole_tiles (splits > 1): that many tiles alone, the rest split.
  int whole = 0;
};

void check_case(const Case& c, uint64_t seed) {
  const std::string what = "q_gemm M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
                           std::to_string(c.K) + " " + std::to_string(c.bits) + "-bit mode " +
                           std::to_string(int(c.mode));
  SCOPED_TRACE(what);
  if (c.splits != 0 && !cuda::q_gemm_wgmma_available())
    GTEST_SKIP() << "q_gemm_wgmma needs a compute capability 9.x GPU";
  if (c.splits > 0 && cuda::q_gemm_wgmma_max_clusters(c.tokens_per_block, c.splits) <= 0)
    GTEST_SKIP() << "no cluster of " << c.splits << " such blocks fits on this GPU";
  const bool with_scratch = c.scratch || c.splits == -1;
  if (with_scratch && cuda::q_gemm_scratch_bytes() == 0)
    GTEST_SKIP() << "q_gemm_wgmma's stream-K form needs a compute capability 9.x GPU";
  HostQ W(c.N, c.K, c.bits, std::sqrt(3.f / float(c.K)), seed);
  const std::vector<uint16_t> wb = W.dequant_bf16();
  const std::vector<uint16_t> ab = random_bf16_bits(size_t(c.M) * c.K, 1.f, seed + 1);
  const std::vector<float> a = widen(ab.data(), ab.size());
  std::vector<float> want(static_cast<size_t>(c.M) * c.N), want32(size_t(c.M) * c.N);
  cpu::matmul(Matrix{wb.data(), DType::BF16, c.N, c.K, "w"}, a.data(), c.M, c.K, want.data(), c.N,
              ThreadPool::global());
  cpu::matmul(W.view(0, c.N), a.data(), c.M, c.K, want32.data(), c.N, ThreadPool::global());
  const auto wn = row_norms(wb.data(), c.N, c.K), an = row_norms(ab.data(), c.M, c.K);
  const double dt = dot_tolerance(int64_t(c.K));

  std::vector<float> c0;  // the residual for AccumulateF32
  if (c.mode == cuda::GemmOut::AccumulateF32) {
    c0.resize(size_t(c.M) * c.N);
    for (size_t i = 0; i < c0.size(); ++i) c0[i] = hash_uniform(seed + 2, i, 2.f);
  }
  auto da = upload_bf16(ab);
  const size_t n = size_t(c.M) * c.N, guard = 64;
  const bool bf = c.mode == cuda::GemmOut::StoreBF16;
  cuda::DeviceBuffer<float> cf(bf ? 0 : n + guard);
  cuda::DeviceBuffer<cuda::bf16> cb(bf ? n + guard : 0);
  if (bf)
    poison(cb);
  else
    poison(cf);
  if (!c0.empty()) LILAC_CUDA_CHECK(cudaMemcpy(cf.get(), c0.data(), n * 4, cudaMemcpyHostToDevice));
  void* out = bf ? static_cast<void*>(cb.get()) : cf.get();
  // The stream-K scratch, zeroed once as the backend's is; poisoned around it would not do: its
  // flags must start at zero.
  cuda::DeviceBuffer<uint8_t> scratch(with_scratch ? cuda::q_gemm_scratch_bytes() : 0);
  if (with_scratch) LILAC_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));
  const cuda::QGemmScratch qs{scratch.get(), scratch.bytes()};
  auto run = [&] {
    if (c.splits == 0)
      cuda::q_gemm(da.get(), c.M, W.q(), out, c.mode, nullptr, qs);
    else
      cuda::q_gemm_wgmma(da.get(), c.M, W.q(), out, c.mode, nullptr, c.tokens_per_block, c.splits,
                         qs, c.whole);
  };
  run();
  if (with_scratch) {
    EXPECT_FALSE(cuda::q_gemm_scratch_failed(qs)) << "a stream-K block gave up waiting";
    // A second launch on the same scratch (its flags left at zero by the first) gives the same
    // bits: the pieces of a tile are added in one fixed order.
    if (c.mode != cuda::GemmOut::AccumulateF32) {
      std::vector<uint8_t> first(bf ? cb.bytes() : cf.bytes()), second(first.size());
      LILAC_CUDA_CHECK(cudaMemcpy(first.data(), out, first.size(), cudaMemcpyDeviceToHost));
      run();
      LILAC_CUDA_CHECK(cudaMemcpy(second.data(), out, second.size(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(first == second) << "the stream-K form's second launch gave other bits";
      EXPECT_FALSE(cuda::q_gemm_scratch_failed(qs));
    }
  }
  std::vector<float> got(n + guard);
  if (bf) {
    const auto g = download_bf16_as_f32(cb);
    std::vector<uint16_t> raw(cb.size());
    LILAC_CUDA_CHECK(cudaMemcpy(raw.data(), cb.get(), cb.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(guard_untouched(raw, n, what));
    got.assign(g.begin(), g.end());
  } else {
    got = download(cf);
    EXPECT_TRUE(guard_untouched(got, n, what));
  }
  auto base = [&](size_t i) { return c0.empty() ? 0.0 : double(c0[i]); };
  auto tol = [&](size_t i, double extra) {
    const double t = dt * wn[i % size_t(c.N)] * an[i / size_t(c.N)] + extra;
    const double ref = base(i) + want[i];
    return t + (bf ? std::fabs(ref) / 256 : 2 * kU * std::fabs(ref)) + 1e-30;
  };
  auto where = [&](size_t i) {
    return "token " + std::to_string(i / size_t(c.N)) + ", row " + std::to_string(i % size_t(c.N));
  };
  EXPECT_TRUE(within(
      n, [&](size_t i) { return got[i]; }, [&](size_t i) { return base(i) + double(want[i]); },
      [&](size_t i) { return tol(i, 0.0); }, where, what + " vs the bf16-weight twin"));
  // The f32 dequantisation: each weight within 2^-9 of its bf16 rounding: sum |w a| 2^-9 <= 2^-9
  // ||w|| ||a||.
  EXPECT_TRUE(within(
      n, [&](size_t i) { return got[i]; }, [&](size_t i) { return base(i) + double(want32[i]); },
      [&](size_t i) { return tol(i, std::ldexp(wn[i % size_t(c.N)] * an[i / size_t(c.N)], -9)); },
      where, what + " vs the f32 twin"));
}

const char* mode_name(cuda::GemmOut m) {
  return m == cuda::GemmOut::StoreF32    ? "f32"
         : m == cuda::GemmOut::StoreBF16 ? "bf16out"
                                         : "accumulate";
}

LILAC_CONFORMANCE_CASES(q4_gemm) {
  std::vector<OpCase> cases;
  auto add = [&](const char* role, Case c, uint64_t seed) {
    cases.push_back({"q_gemm",
                     role + std::string("M") + std::to_string(c.M) + "_N" + std::to_string(c.N) +
                         "_K" + std::to_string(c.K) + "_" + mode_name(c.mode) +
                         (c.splits > 0 ? "_bt" + std::to_string(c.tokens_per_block) + "_s" +
                                             std::to_string(c.splits) +
                                             (c.whole ? "_w" + std::to_string(c.whole) : "")
                          : c.splits < 0 ? std::string("_streamk")
                          : c.scratch    ? std::string("_scratch")
                                         : std::string()),
                     c.bits == 4 ? "q4" : "q8", "dequantize_row_bf16 + cpu::matmul",
                     [c, seed] { check_case(c, seed); }});
  };
  // GDN in_proj, out_proj +=, the 8-bit router, shared down, shared gate_up (bf16 out).
  add("in_proj_", {130, 12352, 2048, 4, cuda::GemmOut::StoreF32}, 1);
  add("out_proj_", {257, 2048, 4096, 4, cuda::GemmOut::AccumulateF32}, 2);
  add("router_", {300, 257, 2048, 8, cuda::GemmOut::StoreF32}, 3);
  add("shared_down_", {129, 2048, 512, 4, cuda::GemmOut::StoreF32}, 4);
  add("shared_gate_up_", {64, 1024, 2048, 4, cuda::GemmOut::StoreBF16}, 5);
  // Batched decode rows (up to 64) through q_gemm_wgmma's small-M form (the dispatch's pick).
  add("rows_in_proj_", {64, 12352, 2048, 4, cuda::GemmOut::StoreF32}, 6);
  add("rows_out_proj_", {48, 2048, 4096, 4, cuda::GemmOut::AccumulateF32}, 7);
  // M = 1, 17, 3, 200; N not a multiple of 16 or of the 256-row block; K of one group.
  uint64_t seed = 50;
  for (int bits : {4, 8})
    for (const Case& c : {Case{1, 100, 64, bits, cuda::GemmOut::StoreF32},
                          Case{17, 392, 128, bits, cuda::GemmOut::AccumulateF32},
                          Case{3, 17, 192, bits, cuda::GemmOut::StoreF32},
                          Case{200, 300, 256, bits, cuda::GemmOut::StoreBF16},
                          Case{128, 256, 576, bits, cuda::GemmOut::StoreF32}})
      add("awkward_", c, seed++);
  // q_gemm_wgmma at each tile and split of K (the dispatch picks one per shape): out_proj +=, a
  // 17-row matrix (the element-by-element epilogue), bf16 output.
  using O = cuda::GemmOut;
  for (const auto& [bt, sp] :
       {std::pair{256, 1}, {128, 1}, {256, 2}, {128, 2}, {256, 4}, {128, 4}}) {
    add("wgmma_out_proj_", {257, 2048, 4096, 4, O::AccumulateF32, bt, sp}, seed++);
    add("wgmma_awkward_", {33, 17, 256, 4, O::AccumulateF32, bt, sp}, seed++);
    add("wgmma_bf16_", {200, 300, 512, 4, O::StoreBF16, bt, sp}, seed++);
  }
  // The dispatch's pick at out_proj / o_proj's 256 tokens ((128, 4) since s36).
  add("out_proj_256_", {256, 2048, 4096, 4, O::AccumulateF32}, seed++);
  // Whole tiles first, the rest split (s36): in_proj at 512 tokens (194 tiles: 132 alone, 62 in
  // pairs, the H100's pick), qkv at 512 (144: 128 alone, 16 in fours), out_proj += at 257
  // tokens (32 tiles: 16 alone, 16 in fours), 3 tiles of bf16 output (2 alone, 1 in a pair), the
  // 128-token tile (48 tiles: 16 alone), element stores (1 tile: 0 alone is the plain split); and
  // the dispatch at in_proj / qkv's 512 tokens without a scratch.
  add("wgmma_whole_in_proj_", {512, 12352, 2048, 4, O::StoreF32, 256, 2, false, 132}, seed++);
  add("wgmma_whole_qkv_", {512, 9216, 2048, 4, O::StoreF32, 256, 4, false, 128}, seed++);
  add("wgmma_whole_out_proj_", {257, 2048, 4096, 4, O::AccumulateF32, 256, 4, false, 16}, seed++);
  add("wgmma_whole_bf16_", {200, 300, 512, 4, O::StoreBF16, 256, 2, false, 2}, seed++);
  add("wgmma_whole_bt128_", {257, 2048, 4096, 4, O::AccumulateF32, 128, 2, false, 16}, seed++);
  add("in_proj_512_", {512, 12352, 2048, 4, O::StoreF32}, seed++);
  add("qkv_512_", {512, 9216, 2048, 4, O::StoreF32}, seed++);
  // The stream-K form (s35): in_proj at 256 tokens (97 tiles over the SMs: 2-3 pieces per tile),
  // qkv at 512, out_proj += at 257 tokens (two token tiles, the second of one token; ~4 pieces
  // per tile), one tile of 4 k-tiles (4 blocks: an owner and 3 contributors; element stores),
  // bf16 output, one k-tile (every block a whole tile, no contributors); and the dispatch with a
  // scratch at the real in_proj and qkv shapes (the stream-K form there under
  // LILAC_Q4_GEMM_STREAMK=auto, else the one-block form).
  add("streamk_in_proj_", {256, 12352, 2048, 4, O::StoreF32, 256, -1}, seed++);
  add("streamk_qkv_", {512, 9216, 2048, 4, O::StoreF32, 256, -1}, seed++);
  add("streamk_out_proj_", {257, 2048, 4096, 4, O::AccumulateF32, 256, -1}, seed++);
  add("streamk_awkward_", {33, 17, 256, 4, O::AccumulateF32, 256, -1}, seed++);
  add("streamk_bf16_", {200, 300, 512, 4, O::StoreBF16, 256, -1}, seed++);
  add("streamk_one_ktile_", {300, 392, 64, 4, O::StoreF32, 256, -1}, seed++);
  add("in_proj_", {256, 12352, 2048, 4, O::StoreF32, 0, 0, true}, seed++);
  add("qkv_", {512, 9216, 2048, 4, O::StoreF32, 0, 0, true}, seed++);
  // The small-M form (64-token blocks, wgmma n = 16 / 32 / 64 by M) at each split of K, up to 8:
  // out_proj +=, 17 rows (element stores) with one k-tile per rank at 8, bf16 output, n = 16.
  for (int sp : {1, 2, 4, 8}) {
    add("wgmma_small_out_proj_", {16, 2048, 4096, 4, O::AccumulateF32, 64, sp}, seed++);
    add("wgmma_small_awkward_", {33, 17, 512, 4, O::AccumulateF32, 64, sp}, seed++);
    add("wgmma_small_bf16_", {64, 300, 512, 4, O::StoreBF16, 64, sp}, seed++);
    add("wgmma_small_n16_", {5, 392, 1024, 4, O::StoreF32, 64, sp}, seed++);
  }
  // The narrow-stage forms (16 / 32-token blocks, M <= that) at each split of K: the batched
  // step's in_proj and out_proj +=, 17 rows (element stores) at one k-tile per rank at 8, bf16
  // output, and one token.
  for (int bt : {16, 32})
    for (int sp : {1, 2, 4, 8}) {
      add("wgmma_narrow_in_proj_", {bt, 12352, 2048, 4, O::StoreF32, bt, sp}, seed++);
      add("wgmma_narrow_out_proj_", {bt - 3, 2048, 4096, 4, O::AccumulateF32, bt, sp}, seed++);
      add("wgmma_narrow_awkward_", {bt / 2 + 1, 17, 512, 4, O::AccumulateF32, bt, sp}, seed++);
      add("wgmma_narrow_bf16_", {bt, 300, 512, 4, O::StoreBF16, bt, sp}, seed++);
      add("wgmma_narrow_one_", {1, 392, 1024, 4, O::StoreF32, bt, sp}, seed++);
    }
  return cases;
}

TEST(Q4Gemm, BadArgumentsThrow) {
  cuda::QMatrix q{reinterpret_cast<const uint32_t*>(uintptr_t(256)),
                  reinterpret_cast<const uint32_t*>(uintptr_t(256)), 16, 96, 4};
  auto* a = reinterpret_cast<const cuda::bf16*>(uintptr_t(256));
  auto* c = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(cuda::q_gemm(a, 4, q, c, cuda::GemmOut::StoreF32, nullptr), Error);  // K % 64
  q.cols = 128;
  EXPECT_THROW(cuda::q_gemm(a, 0, q, c, cuda::GemmOut::StoreF32, nullptr), Error);      // M
  EXPECT_THROW(cuda::q_gemm(a + 1, 4, q, c, cuda::GemmOut::StoreF32, nullptr), Error);  // align
  // q_gemm_wgmma's own: 4 bits only, a split that does not divide the k-tiles, a split it lacks,
  // a tile it lacks (all refused before anything reaches the device).
  const cuda::GemmOut f32 = cuda::GemmOut::StoreF32;
  cuda::QMatrix q8 = q;
  q8.bits = 8;
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 4, q8, c, f32, nullptr, 128, 1), Error);  // 8 bits
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 4, q, c, f32, nullptr, 128, 4), Error);   // 2 k-tiles / 4
  q.cols = 192;
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 4, q, c, f32, nullptr, 128, 3), Error);  // splits 3
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 4, q, c, f32, nullptr, 48, 1), Error);   // 48-token tile
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 65, q, c, f32, nullptr, 64, 1), Error);  // 64: M <= 64 only
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 33, q, c, f32, nullptr, 32, 1), Error);  // 32: M <= 32 only
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 17, q, c, f32, nullptr, 16, 1), Error);  // 16: M <= 16 only
  q.cols = 512;
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 4, q, c, f32, nullptr, 128, 8), Error);  // 8: 64 only
  // The stream-K form: without a scratch, at a tile other than 256, an unaligned scratch.
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, -1), Error);
  const cuda::QGemmScratch sk{reinterpret_cast<void*>(uintptr_t(256)), size_t(1) << 30};
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 128, -1, sk), Error);
  const cuda::QGemmScratch odd{reinterpret_cast<void*>(uintptr_t(260)), size_t(1) << 30};
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, -1, odd), Error);
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, -2, sk), Error);
  // Whole tiles: with one split, not a multiple of the splits, more than the tiles (300 tokens x
  // 16 rows at 256 tokens per block: 2 tiles), negative.
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, 1, {}, 2), Error);
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, 2, {}, 1), Error);
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, 2, {}, 4), Error);
  EXPECT_THROW(cuda::q_gemm_wgmma(a, 300, q, c, f32, nullptr, 256, 2, {}, -2), Error);
}

// dequant_ktile's two forms (q4_gemm_wgmma.cuh; QMatrix::small_scales picks the one-FMA form)
// rebuild exactly the twin's weights, RNE_bf16(s q + b), at edge scales and biases: +-0, +-the
// subnormals, the smallest normal, the largest |s| below 1/2, a bias of bf16's largest finite
// value. x is the identity (token t = column t), so y[t][r] = w[r][t] with no rounding: the f32
// sums add one product w * 1 to zeros. Through the 128-token form (a k-tile per barrier; its
// OneFma instantiation where small_scales) over two groups and the 64-token form (GroupLoop; a
// small-M form: two FMAs whatever the flag, as it has no OneFma instantiation) over one.
TEST(Q4Gemm, BothDequantisationsRebuildTheWeightsExactly) {
  LILAC_REQUIRE_GPU();
  if (!cuda::q_gemm_wgmma_available()) GTEST_SKIP() << "q_gemm_wgmma needs a 9.x GPU";
  const int N = 64, K = 128;
  HostQ W(N, K, 4, 1.f, 77);  // codes from the quantizer (every q in 0..15 occurs)
  const uint16_t scales[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3EFF,
                             0xBEFF, 0x3A83, 0xBCCD, 0x3C00, 0x3D4D};
  const uint16_t biases[] = {0x0000, 0x8000, 0x0001, 0x3E80, 0xC0E0, 0x7F7F, 0x3F80, 0xBA00};
  for (int r = 0; r < N; ++r)
    for (int g = 0; g < K / 64; ++g) {
      W.scales[size_t(r * (K / 64) + g)] = scales[size_t(r * 2 + g) % std::size(scales)];
      W.biases[size_t(r * (K / 64) + g)] = biases[size_t(r * 3 + 5 * g) % std::size(biases)];
    }
  W.upload_tiled();
  ASSERT_TRUE(W.small_scales) << "every edge scale is below 1/2";
  const std::vector<uint16_t> want = W.dequant_bf16();  // [N][K]
  std::vector<uint16_t> eye(size_t(K) * K, 0);
  for (int t = 0; t < K; ++t) eye[size_t(t) * K + size_t(t)] = 0x3F80;  // 1.0
  auto dx = upload_bf16(eye);
  for (const auto& [M, bt] : {std::pair{128, 128}, std::pair{64, 64}})
    for (bool one_fma : {true, false}) {
      SCOPED_TRACE(testing::Message()
                   << M << " tokens per block " << bt << ", one FMA " << one_fma);
      cuda::QMatrix q = W.q();
      q.small_scales = one_fma;
      cuda::DeviceBuffer<float> y(size_t(M) * N);
      poison(y);
      cuda::q_gemm_wgmma(dx.get(), M, q, y.get(), cuda::GemmOut::StoreF32, nullptr, bt, 1);
      const std::vector<float> got = download(y);
      size_t bad = 0;
      for (int t = 0; t < M; ++t)
        for (int r = 0; r < N; ++r) {
          const float w = bf16_to_f32(want[size_t(r) * K + size_t(t)]);
          const float g = got[size_t(t) * N + size_t(r)];
          if (!(g == w) && bad++ < 8)
            ADD_FAILURE() << "row " << r << " column " << t << ": " << g << ", twin " << w;
        }
      EXPECT_EQ(bad, 0u);
    }
}

// The small-M forms' placement (s45, docs/kernels.md "Forty-fifth session"): under the spread (the
// default) an un-clustered launch of at most one block per SM asks for more than half an SM's
// shared memory, so no two of its blocks can share an SM when they become resident under PDL
// beside the kernel before; without it the forms fit 3 (16 / 32 tokens) or 2 (64) blocks per SM.
// Fails where a GPU's shared memory per SM would let two spread blocks share one.
TEST(Q4Gemm, SmallFormsSpreadTakeAnSmPerBlock) {
  LILAC_REQUIRE_GPU();
  if (!cuda::q_gemm_wgmma_available()) GTEST_SKIP() << "q_gemm_wgmma needs a 9.x GPU";
  const bool spread = cuda::q_gemm_wgmma_small_spread();
  for (int bt : {16, 32, 64}) {
    SCOPED_TRACE("tokens per block " + std::to_string(bt));
    const int per_sm = cuda::q_gemm_wgmma_small_blocks_per_sm(bt);
    if (spread)
      EXPECT_EQ(per_sm, 1);
    else
      EXPECT_EQ(per_sm, bt == 64 ? 2 : 3);
  }
  EXPECT_EQ(cuda::q_gemm_wgmma_small_blocks_per_sm(128), 0);  // not a small-M form
}

// The stream-K form's scratch checks that need the device (its block count sizes the scratch): one
// byte short of what the form needs at the real in_proj shape is refused with a message, before
// any launch; the exact size runs. (s35's leftover: untested without a GPU.)
TEST(Q4Gemm, StreamKScratchTooSmallIsRefused) {
  LILAC_REQUIRE_GPU();
  if (!cuda::q_gemm_wgmma_available()) GTEST_SKIP() << "q_gemm_wgmma needs a 9.x GPU";
  const size_t need = cuda::q_gemm_scratch_bytes();
  ASSERT_GT(need, size_t(0));
  HostQ W(12352, 2048, 4, std::sqrt(3.f / 2048.f), 5);
  auto da = upload_bf16(random_bf16_bits(size_t(256) * 2048, 1.f, 6));
  cuda::DeviceBuffer<float> out(size_t(256) * 12352);
  cuda::DeviceBuffer<uint8_t> scratch(need);
  LILAC_CUDA_CHECK(cudaMemset(scratch.get(), 0, need));
  const cuda::QGemmScratch short_by_one{scratch.get(), need - 1};
  EXPECT_THROW(cuda::q_gemm_wgmma(da.get(), 256, W.q(), out.get(), cuda::GemmOut::StoreF32, nullptr,
                                  256, -1, short_by_one),
               Error);
  const cuda::QGemmScratch exact{scratch.get(), need};
  cuda::q_gemm_wgmma(da.get(), 256, W.q(), out.get(), cuda::GemmOut::StoreF32, nullptr, 256, -1,
                     exact);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_FALSE(cuda::q_gemm_scratch_failed(exact));
}

}  // namespace
}  // namespace lilac::test
