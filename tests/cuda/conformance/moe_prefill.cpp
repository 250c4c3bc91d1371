// Conformance cases of the MoE prefill on the GPU against the CPU twin:
//  * moe_route exactly against cpu::router_top_k + a plain counting sort (offsets, stable order,
//    positions, tile table), with ties and skew, over chunk boundaries (T up to 8192);
//  * the whole block (route, grouped gate_up, grouped down, shared expert, combine; the shared
//    expert on its own and inside the grouped launches) against
//    cpu::moe_forward on bf16 inputs, at the real sizes (E 256, k 8, I 512, H 2048) and a tiny
//    config (E 16, k 4, I 64, H 128), T = 1, 5, 300, 2048, uniform and heavily skewed routing,
//    both the mma.sync and the wgmma kernels, the combine with and without the next norm fused
//    (bit for bit against rms_norm); the intermediates act and y are also checked
//    against double-precision dot products with tight tolerances. Outputs poisoned first.
#include "cuda/moe_prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../cuda_test_util.h"
#include "../prefill_test_util.h"
#include "conformance.h"
#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cuda/gemm.h"
#include "cuda/norm.h"

namespace lilac::test {
namespace {

// ---- routing reference
// -----------------------------------------------------------------------------

struct RouteRef {
  std::vector<int32_t> idx, offsets, sorted_token, pair_position, tile_expert, tile_row0;
  std::vector<float> w, sorted_weight;
  int num_tiles = 0;
};

// cpu::router_top_k per token, then a sequential counting sort (stable by construction).
RouteRef route_ref(const std::vector<float>& logits, int stride, int T, int E, int k) {
  RouteRef r;
  const size_t P = size_t(T) * k;
  r.idx.resize(P);
  r.w.resize(P);
  for (int t = 0; t < T; ++t)
    cpu::router_top_k(&logits[size_t(t) * stride], E, k, &r.idx[size_t(t) * k],
                      &r.w[size_t(t) * k]);
  std::vector<int32_t> count(size_t(E), 0);
  for (int32_t e : r.idx) ++count[size_t(e)];
  r.offsets.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) r.offsets[size_t(e) + 1] = r.offsets[size_t(e)] + count[size_t(e)];
  std::vector<int32_t> cursor(r.offsets.begin(), r.offsets.end() - 1);
  r.sorted_token.resize(P);
  r.sorted_weight.resize(P);
  r.pair_position.resize(P);
  for (size_t p = 0; p < P; ++p) {
    const int32_t pos = cursor[size_t(r.idx[p])]++;
    r.sorted_token[size_t(pos)] = int32_t(p / size_t(k));
    r.sorted_weight[size_t(pos)] = r.w[p];
    r.pair_position[p] = pos;
  }
  for (int e = 0; e < E; ++e)
    for (int i = 0; i * cuda::kMoeTileRows < count[size_t(e)]; ++i) {
      r.tile_expert.push_back(e);
      r.tile_row0.push_back(r.offsets[size_t(e)] + i * cuda::kMoeTileRows);
    }
  r.num_tiles = int(r.tile_expert.size());
  return r;
}

::testing::AssertionResult same_ints(const std::vector<int32_t>& got,
                                     const std::vector<int32_t>& want, const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << what << ": first difference at [" << i << "]: gpu "
                                           << got[i] << " vs cpu " << want[i];
  return ::testing::AssertionSuccess();
}

// Downloads r's outputs and compares them with the reference exactly (weights to f32 rounding:
// the GPU's expf and summation order differ from the CPU's in the last bits).
void expect_routing(const cuda::MoeRouting& r, const RouteRef& ref, const std::string& what) {
  const size_t P = size_t(r.T) * r.k;
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_ints(download_n(r.topk_idx, P), ref.idx, what + " topk_idx"));
  EXPECT_TRUE(same_ints(download_n(r.expert_offsets, size_t(r.E) + 1), ref.offsets,
                        what + " expert_offsets"));
  EXPECT_TRUE(same_ints(download_n(r.sorted_token, P), ref.sorted_token, what + " sorted_token"));
  EXPECT_TRUE(
      same_ints(download_n(r.pair_position, P), ref.pair_position, what + " pair_position"));
  const int num_tiles = download_n(r.num_tiles, 1)[0];
  EXPECT_EQ(num_tiles, ref.num_tiles) << what << " num_tiles";
  EXPECT_LE(num_tiles, r.max_tiles) << what;
  if (num_tiles == ref.num_tiles) {
    EXPECT_TRUE(same_ints(download_n(r.tile_expert, size_t(num_tiles)), ref.tile_expert,
                          what + " tile_expert"));
    EXPECT_TRUE(
        same_ints(download_n(r.tile_row0, size_t(num_tiles)), ref.tile_row0, what + " tile_row0"));
  }
  const auto w = download_n(r.topk_weight, P), sw = download_n(r.sorted_weight, P);
  EXPECT_TRUE(all_close(w, ref.w, 1e-7, 4e-6, what + " topk_weight"));
  EXPECT_TRUE(all_close(sw, ref.sorted_weight, 1e-7, 4e-6, what + " sorted_weight"));
}

struct Workspace {
  cuda::DeviceBuffer<uint8_t> buf;
  cuda::MoeRouting r;
  Workspace(int T, int E, int k) : buf(cuda::moe_routing_workspace_bytes(T, E, k)) {
    r = cuda::moe_routing_layout(buf.get(), T, E, k);
  }
  void poison() { test::poison(buf); }
};

// Synthetic router logits [T, stride] (columns >= E are other outputs): random; with `skew`,
// expert 3 is +10 for every token and the upper half of the experts -10 (most experts then get
// few or no tokens); exact ties at the k-th / (k+1)-th place (every 5th token) and between the
// two largest (every 7th) exercise the lower-index rule.
std::vector<float> synthetic_logits(int T, int E, int k, int stride, bool skew, uint64_t seed) {
  std::vector<float> L(size_t(T) * stride);
  for (size_t i = 0; i < L.size(); ++i) L[i] = hash_uniform(seed, i, 3.f);
  for (int t = 0; t < T; ++t) {
    float* l = &L[size_t(t) * stride];
    if (skew) {
      l[3 % E] += 10.f;
      for (int e = E / 2; e < E; ++e) l[e] -= 10.f;
    }
    if (k < E && (t % 5 == 1 || t % 7 == 2)) {
      std::vector<int> order(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      if (t % 5 == 1) l[order[size_t(k)]] = l[order[size_t(k - 1)]];
      if (t % 7 == 2) l[order[1]] = l[order[0]];
    }
    if (E >= 3 && t % 11 == 3) {  // a tie of -0 (lower index) and +0 at the top: -0 first
      for (int e = 0; e < E; ++e) l[e] -= 20.f;
      l[1] = -0.f;
      l[E - 1] = 0.f;
    }
  }
  return L;
}

struct RouteCase {
  int T, E, k, stride;
  bool skew;
  bool cluster = true;  // moe_route_cluster_enabled (65-512 rows, E <= 256, sm_90: one cluster)
};

void check_route(const RouteCase& c, uint64_t seed) {
  const std::string what = "T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " k " +
                           std::to_string(c.k) + (c.skew ? " skewed" : " uniform") +
                           (c.cluster ? "" : " no cluster");
  const bool saved = cuda::moe_route_cluster_enabled();
  cuda::set_moe_route_cluster(c.cluster);
  struct Restore {
    bool on;
    ~Restore() { cuda::set_moe_route_cluster(on); }
  } restore{saved};
  const auto L = synthetic_logits(c.T, c.E, c.k, c.stride, c.skew, seed);
  const RouteRef ref = route_ref(L, c.stride, c.T, c.E, c.k);
  auto d_logits = upload(L);
  Workspace ws(c.T, c.E, c.k);
  ws.poison();
  cuda::moe_route(d_logits.get(), c.stride, c.T, c.E, c.k, ws.r, nullptr);
  expect_routing(ws.r, ref, what);
}

// ---- whole block
// ------------------------------------------------------------------------------------

struct MoeShape {
  const char* name;
  int E, k, I, Is, H;
};
const MoeShape kModel{"model", 256, 8, 512, 512, 2048};
const MoeShape kTiny{"tiny", 16, 4, 64, 64, 128};

// Expert and shared weights of one shape (host bits, row norms, device copies); the router is per
// case. Scales give gate/up pre-activations and outputs of order 1.
struct MoeModel {
  MoeShape s;
  std::vector<uint16_t> gate_up, down, sgu, sdown;
  std::vector<double> gate_up_norm, down_norm, sgu_norm, sdown_norm;
  cuda::DeviceBuffer<cuda::bf16> d_gate_up, d_down, d_sgu, d_sdown;

  explicit MoeModel(const MoeShape& shape) : s(shape) {
    const float sh = std::sqrt(3.f / float(s.H)), si = std::sqrt(3.f / float(s.I)),
                sis = std::sqrt(3.f / float(s.Is));
    gate_up = random_bf16_bits(size_t(s.E) * 2 * s.I * s.H, sh, 1001);
    down = random_bf16_bits(size_t(s.E) * s.H * s.I, si, 1002);
    sgu = random_bf16_bits(size_t(2) * s.Is * s.H, sh, 1003);
    sdown = random_bf16_bits(size_t(s.H) * s.Is, sis, 1004);
    gate_up_norm = row_norms(gate_up.data(), int64_t(s.E) * 2 * s.I, s.H);
    down_norm = row_norms(down.data(), int64_t(s.E) * s.H, s.I);
    sgu_norm = row_norms(sgu.data(), int64_t(2) * s.Is, s.H);
    sdown_norm = row_norms(sdown.data(), s.H, s.Is);
    d_gate_up = upload_bf16(gate_up);
    d_down = upload_bf16(down);
    d_sgu = upload_bf16(sgu);
    d_sdown = upload_bf16(sdown);
  }
};

const MoeModel& model_of(const MoeShape& s) {
  static std::map<std::string, std::unique_ptr<MoeModel>> cache;
  auto& m = cache[s.name];
  if (!m) m = std::make_unique<MoeModel>(s);
  return *m;
}

Matrix bf16_matrix(const uint16_t* data, int64_t rows, int64_t cols, const char* name) {
  Matrix m;
  m.data = data;
  m.dtype = DType::BF16;
  m.rows = rows;
  m.cols = cols;
  m.name = name;
  return m;
}

double dot_f64(const uint16_t* a, const float* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(bf16_to_f32(a[i])) * double(x[i]);
  return s;
}
double silu_f64(double g) {
  return g / (1.0 + std::exp(-g));
}

// Rows to check of a [rows, ...] intermediate: all, or `must` plus random ones up to `limit`.
std::vector<int> pick_rows(int rows, const std::set<int>& must, int limit, uint32_t seed) {
  if (rows <= limit) {
    std::vector<int> all(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) all[size_t(i)] = i;
    return all;
  }
  std::set<int> s = must;
  std::mt19937 rng(seed);
  while (int(s.size()) < limit) s.insert(int(rng() % uint32_t(rows)));
  return {s.begin(), s.end()};
}

// act[row, i] = bf16(silu(x_tok . gate_i) * (x_tok . up_i)) for gate/up stacked [2I, H] rows `w`.
::testing::AssertionResult check_act(const std::vector<int>& rows, const std::vector<int>& token_of,
                                     const std::vector<int>& expert_of, const std::vector<float>& x,
                                     const uint16_t* w, const std::vector<double>& w_norm, int I,
                                     int H, const std::vector<float>& act,
                                     const std::string& what) {
  const size_t R = rows.size();
  std::vector<double> want(R * size_t(I)), tol(R * size_t(I));
  const double gamma = dot_tolerance(H);
  ThreadPool::global().parallel_for(R, [&](size_t b, size_t e) {
    for (size_t ri = b; ri < e; ++ri) {
      const int t = token_of[size_t(rows[ri])], ex = expert_of[size_t(rows[ri])];
      const float* xt = &x[size_t(t) * H];
      double xn = 0;
      for (int j = 0; j < H; ++j) xn += double(xt[j]) * xt[j];
      xn = std::sqrt(xn);
      const size_t base = size_t(ex) * 2 * I;
      for (int i = 0; i < I; ++i) {
        const double g = dot_f64(w + (base + size_t(i)) * H, xt, H);
        const double u = dot_f64(w + (base + size_t(I + i)) * H, xt, H);
        const double v = silu_f64(g) * u;
        const double dg = gamma * xn * w_norm[base + size_t(i)],
                     du = gamma * xn * w_norm[base + size_t(I + i)];
        want[ri * I + size_t(i)] = v;
        // bf16 rounding of the result, plus the propagated f32 accumulation error of g and u
        // (|d silu / dg| <= 1.1).
        tol[ri * I + size_t(i)] = std::ldexp(std::fabs(v), -8) + 1.1 * std::fabs(u) * dg +
                                  std::fabs(silu_f64(g)) * du + (dg * du) + 1e-30;
      }
    }
  });
  return within(
      R * size_t(I), [&](size_t i) { return act[size_t(rows[i / I]) * I + i % I]; },
      [&](size_t i) { return want[i]; }, [&](size_t i) { return tol[i]; },
      [&](size_t i) {
        return "row " + std::to_string(rows[i / I]) + ", col " + std::to_string(i % I);
      },
      what);
}

struct BlockCase {
  int T;
  bool skew;
};

void run_block(const MoeShape& s, const BlockCase& c, uint64_t seed) {
  const MoeModel& m = model_of(s);
  const int T = c.T, E = s.E, k = s.k, I = s.I, Is = s.Is, H = s.H, stride = E + 1;
  const size_t P = size_t(T) * k;
  const std::string what = std::string(s.name) + " T " + std::to_string(T) +
                           (c.skew ? " skewed" : " uniform") + " routing";
  SCOPED_TRACE(what);

  // Inputs: x with an optional common direction b (entries +-1); the router's expert-3 row
  // leans on b (+10 on its logit for every token), the upper half away from it (-10).
  std::vector<float> x(size_t(T) * H);
  for (size_t i = 0; i < x.size(); ++i) {
    float v = hash_uniform(seed, i, std::sqrt(3.f));
    if (c.skew) v += 0.5f * (splitmix64(i % size_t(H) + 77) & 1 ? 1.f : -1.f);
    x[i] = v;
  }
  const auto x_bits = to_bf16_rounding(x);
  std::vector<float> router_f(size_t(E + 1) * H);
  for (size_t i = 0; i < router_f.size(); ++i) {
    float v = hash_uniform(seed + 1, i, std::sqrt(3.f / float(H)));
    const int e = int(i / size_t(H));
    const float b = splitmix64(i % size_t(H) + 77) & 1 ? 1.f : -1.f;
    if (c.skew && e == 3) v += 20.f * b / float(H);
    if (c.skew && e >= E / 2 && e < E) v -= 20.f * b / float(H);
    router_f[i] = v;
  }
  const auto router_bits = to_bf16_rounding(router_f);

  // CPU: logits exactly as cpu::moe_forward computes them (same matmul, same rows), the routing
  // reference, and the block output.
  const Matrix router_all = bf16_matrix(router_bits.data(), E + 1, H, "router");
  std::vector<float> logits(size_t(T) * stride);
  cpu::matmul(router_all, x.data(), T, H, logits.data(), stride, ThreadPool::global());
  const RouteRef ref = route_ref(logits, stride, T, E, k);

  MoeWeights w;
  w.router = bf16_matrix(router_bits.data(), E, H, "router");
  w.shared_expert_gate =
      bf16_matrix(router_bits.data() + size_t(E) * H, 1, H, "shared_expert_gate");
  w.experts.resize(size_t(E));
  for (int e = 0; e < E; ++e) {
    const uint16_t* gu = m.gate_up.data() + size_t(e) * 2 * I * H;
    w.experts[size_t(e)].gate = bf16_matrix(gu, I, H, "gate");
    w.experts[size_t(e)].up = bf16_matrix(gu + size_t(I) * H, I, H, "up");
    w.experts[size_t(e)].down = bf16_matrix(m.down.data() + size_t(e) * H * I, H, I, "down");
  }
  w.shared_gate = bf16_matrix(m.sgu.data(), Is, H, "shared_gate");
  w.shared_up = bf16_matrix(m.sgu.data() + size_t(Is) * H, Is, H, "shared_up");
  w.shared_down = bf16_matrix(m.sdown.data(), H, Is, "shared_down");
  ModelConfig cfg;
  cfg.hidden = H;
  cfg.experts = E;
  cfg.experts_per_token = k;
  cfg.expert_intermediate = I;
  cfg.shared_intermediate = Is;
  std::vector<float> out(size_t(T) * H);
  cpu::moe_forward(w, cfg, x.data(), T, out.data(), ThreadPool::global(), nullptr, "moe");

  std::vector<float> h0(size_t(T) * H);
  for (size_t i = 0; i < h0.size(); ++i) h0[i] = hash_uniform(seed + 2, i, 2.f);

  // Which sorted rows / tokens get the double-precision intermediate checks.
  std::set<int> edges;
  for (int e = 0; e < E; ++e)
    if (ref.offsets[size_t(e) + 1] > ref.offsets[size_t(e)]) {
      edges.insert(ref.offsets[size_t(e)]);
      edges.insert(ref.offsets[size_t(e) + 1] - 1);
    }
  const std::vector<int> rows = pick_rows(int(P), edges, 768, uint32_t(seed));
  const std::vector<int> toks = pick_rows(T, {0, T - 1}, 256, uint32_t(seed + 1));
  std::vector<int> expert_of(P), identity(static_cast<size_t>(T)), zeros(static_cast<size_t>(T), 0);
  for (int e = 0; e < E; ++e)
    for (int r = ref.offsets[size_t(e)]; r < ref.offsets[size_t(e) + 1]; ++r)
      expert_of[size_t(r)] = e;
  for (int t = 0; t < T; ++t) identity[size_t(t)] = t;
  const std::vector<int> sorted_token(ref.sorted_token.begin(), ref.sorted_token.end());

  // Device buffers.
  auto d_x = upload_bf16(x_bits);
  auto d_logits = upload(logits);
  Workspace ws(T, E, k);
  cuda::DeviceBuffer<cuda::bf16> d_act(P * I), d_act_s(size_t(T) * Is);
  cuda::DeviceBuffer<float> d_y(P * H), d_shared(size_t(T) * H);
  std::vector<int32_t> act_s_bits[2];
  // A norm scale (1 + w) for the combine's fused norm, and its outputs.
  std::vector<float> scale(static_cast<size_t>(H));
  for (int i = 0; i < H; ++i) scale[size_t(i)] = 1.f + hash_uniform(seed + 3, size_t(i), 0.5f);
  auto d_scale = upload(scale);
  cuda::DeviceBuffer<cuda::bf16> d_norm_x(size_t(T) * H),
      d_norm_ref(size_t(T) * H);  // each engine's separate pass's shared act (Is even)

  // Each tile engine with the shared expert on its own (moe_shared_gate_up + a GEMM) and inside
  // the grouped launches (MoeSharedPart): both must give the same act bit for bit (the same
  // tile kernel) and a shared output within the dot-product tolerance.
  for (const auto& [wg, fused] :
       {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    const std::string path =
        std::string(wg ? "wgmma" : "mma.sync") + (fused ? ", shared expert fused" : "");
    SCOPED_TRACE(path);
    ws.poison();
    poison(d_act);
    poison(d_act_s);
    poison(d_y);
    poison(d_shared);
    auto d_h = upload(h0);
    cuda::moe_route(d_logits.get(), stride, T, E, k, ws.r, nullptr);
    const cuda::MoeSharedPart part{m.d_sgu.get(), m.d_sdown.get(), d_act_s.get(), d_shared.get()};
    const cuda::MoeSharedPart* shared = fused ? &part : nullptr;
    cuda::moe_grouped_gate_up(d_x.get(), H, m.d_gate_up.get(), I, ws.r, d_act.get(), nullptr, wg,
                              shared);
    cuda::moe_grouped_down(d_act.get(), I, m.d_down.get(), H, ws.r, d_y.get(), nullptr, wg, shared);
    if (!fused) {
      cuda::moe_shared_gate_up(d_x.get(), T, H, m.d_sgu.get(), Is, d_act_s.get(), nullptr, wg);
      cuda::gemm(d_act_s.get(), T, Is, m.d_sdown.get(), H, d_shared.get(), cuda::GemmOut::StoreF32,
                 nullptr);
    }
    // The fused passes also take the next norm in the combine's blocks (H % 8 == 0 here): x
    // must equal rms_norm of the combined h bit for bit.
    if (fused) {
      poison(d_norm_x);
      cuda::moe_combine(d_y.get(), ws.r, d_logits.get(), stride, d_shared.get(), H, d_h.get(),
                        nullptr, d_scale.get(), d_norm_x.get(), 1e-6f);
      poison(d_norm_ref);
      cuda::rms_norm(d_h.get(), d_scale.get(), d_norm_ref.get(), T, H, 1e-6f, nullptr);
      LILAC_CUDA_CHECK(cudaDeviceSynchronize());
      const auto a =
          download_n(reinterpret_cast<const int32_t*>(d_norm_x.get()), size_t(T) * H / 2);
      const auto b =
          download_n(reinterpret_cast<const int32_t*>(d_norm_ref.get()), size_t(T) * H / 2);
      EXPECT_TRUE(same_ints(a, b, "combine's fused norm vs rms_norm (" + path + ")"));
    } else {
      cuda::moe_combine(d_y.get(), ws.r, d_logits.get(), stride, d_shared.get(), H, d_h.get(),
                        nullptr);
    }
    LILAC_CUDA_CHECK(cudaDeviceSynchronize());

    expect_routing(ws.r, ref, what + " " + path);

    const auto act = download_bf16_as_f32(d_act);
    EXPECT_TRUE(check_act(rows, sorted_token, expert_of, x, m.gate_up.data(), m.gate_up_norm, I, H,
                          act, "act (" + path + ")"));
    const auto act_s = download_bf16_as_f32(d_act_s);
    EXPECT_TRUE(check_act(toks, identity, zeros, x, m.sgu.data(), m.sgu_norm, Is, H, act_s,
                          "shared act (" + path + ")"));
    if (fused)  // the separate pass of the same engine ran before
      EXPECT_TRUE(
          same_ints(act_s_bits[wg],
                    download_n(reinterpret_cast<const int32_t*>(d_act_s.get()), size_t(T) * Is / 2),
                    "shared act fused vs separate (" + path + ")"));
    else
      act_s_bits[wg] =
          download_n(reinterpret_cast<const int32_t*>(d_act_s.get()), size_t(T) * Is / 2);
    // The shared expert's output against double-precision products of the GPU's own act.
    {
      const auto sh = download(d_shared);
      const size_t R = toks.size();
      std::vector<double> want(R * size_t(H)), tol(R * size_t(H));
      const double gamma = dot_tolerance(Is);
      ThreadPool::global().parallel_for(R, [&](size_t b, size_t e) {
        for (size_t ri = b; ri < e; ++ri) {
          const float* a = &act_s[size_t(toks[ri]) * Is];
          double an = 0;
          for (int i = 0; i < Is; ++i) an += double(a[i]) * a[i];
          an = std::sqrt(an);
          for (int cidx = 0; cidx < H; ++cidx) {
            want[ri * H + size_t(cidx)] = dot_f64(m.sdown.data() + size_t(cidx) * Is, a, Is);
            tol[ri * H + size_t(cidx)] = gamma * an * m.sdown_norm[size_t(cidx)] + 1e-30;
          }
        }
      });
      EXPECT_TRUE(within(
          R * size_t(H), [&](size_t i) { return sh[size_t(toks[i / H]) * H + i % H]; },
          [&](size_t i) { return want[i]; }, [&](size_t i) { return tol[i]; },
          [&](size_t i) {
            return "token " + std::to_string(toks[i / H]) + ", col " + std::to_string(i % H);
          },
          "shared out (" + path + ")"));
    }

    // y[s] = act[s] . down_e^T on the GPU's own act (bf16 values exactly as the kernel read them).
    const auto y = download(d_y);
    {
      const size_t R = rows.size();
      std::vector<double> want(R * size_t(H)), tol(R * size_t(H));
      const double gamma = dot_tolerance(I);
      ThreadPool::global().parallel_for(R, [&](size_t b, size_t e) {
        for (size_t ri = b; ri < e; ++ri) {
          const int r = rows[ri], ex = expert_of[size_t(r)];
          const float* a = &act[size_t(r) * I];
          double an = 0;
          for (int i = 0; i < I; ++i) an += double(a[i]) * a[i];
          an = std::sqrt(an);
          for (int cidx = 0; cidx < H; ++cidx) {
            const size_t wrow = size_t(ex) * H + size_t(cidx);
            want[ri * H + size_t(cidx)] = dot_f64(m.down.data() + wrow * I, a, I);
            tol[ri * H + size_t(cidx)] = gamma * an * m.down_norm[wrow] + 1e-30;
          }
        }
      });
      EXPECT_TRUE(within(
          R * size_t(H), [&](size_t i) { return y[size_t(rows[i / H]) * H + i % H]; },
          [&](size_t i) { return want[i]; }, [&](size_t i) { return tol[i]; },
          [&](size_t i) {
            return "sorted row " + std::to_string(rows[i / H]) + ", col " + std::to_string(i % H);
          },
          "y (" + path + ")"));
    }

    // h = h0 + block output. The GPU rounds act (routed and shared) to bf16, the CPU keeps f32:
    // per element an error of about 2^-9 / sqrt(3) * rms of the token's output (random signs
    // over I terms), 1.1e-3 rms; the bound 2^-6 * rms(out[t]) is 14 of those standard deviations
    // yet 20x smaller than one expert's share (~w * rms(y) ~ 0.35 rms(out)) missing or doubled.
    const auto h = download(d_h);
    std::vector<double> rms(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
      double s2 = 0;
      for (int cidx = 0; cidx < H; ++cidx)
        s2 += double(out[size_t(t) * H + cidx]) * out[size_t(t) * H + cidx];
      rms[size_t(t)] = std::sqrt(s2 / H);
    }
    EXPECT_TRUE(within(
        size_t(T) * H, [&](size_t i) { return h[i]; },
        [&](size_t i) { return double(h0[i]) + double(out[i]); },
        [&](size_t i) {
          return std::ldexp(rms[i / size_t(H)], -6) +
                 std::ldexp(std::fabs(double(h0[i]) + out[i]), -20) + 1e-30;
        },
        [&](size_t i) {
          return "token " + std::to_string(i / size_t(H)) + ", col " +
                 std::to_string(i % size_t(H));
        },
        "h (" + path + ")"));
  }
}

// moe_shared_swiglu: act = bf16(silu(g) * u) against the f32 expression on the host (the device
// silu's __expf differs from expf by a few ulp: one bf16 ulp of the result allowed), T rows of
// [gate | up] uniform in +-8 (silu's tails), the 16 bf16 past act untouched.
void check_shared_swiglu(int T, int Is, uint64_t seed) {
  std::vector<float> gu(size_t(T) * 2 * Is);
  for (size_t i = 0; i < gu.size(); ++i) gu[i] = hash_uniform(seed, i, 8.f);
  auto d_gu = upload(gu);
  cuda::DeviceBuffer<cuda::bf16> act(size_t(T) * Is + 16);
  poison(act);
  cuda::moe_shared_swiglu(d_gu.get(), T, Is, act.get(), nullptr);
  const std::vector<float> got = download_bf16_as_f32(act);
  for (size_t i = size_t(T) * Is; i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << i;
  EXPECT_TRUE(within(
      size_t(T) * Is, [&](size_t i) { return double(got[i]); },
      [&](size_t i) {
        const size_t t = i / size_t(Is), c = i % size_t(Is);
        const float g = gu[t * 2 * Is + c], u = gu[t * 2 * Is + Is + c];
        return double(g / (1.f + std::exp(-g)) * u);
      },
      [&](size_t i) {
        const size_t t = i / size_t(Is), c = i % size_t(Is);
        const float g = gu[t * 2 * Is + c], u = gu[t * 2 * Is + Is + c];
        return std::fabs(double(g / (1.f + std::exp(-g)) * u)) / 128 + 1e-30;
      },
      [&](size_t i) { return "row " + std::to_string(i / size_t(Is)); }, "moe_shared_swiglu"));
}

LILAC_CONFORMANCE_CASES(moe_prefill) {
  std::vector<OpCase> cases;
  const RouteCase routes[] = {
      {1, 256, 8, 257, false},
      {5, 256, 8, 257, true},
      {300, 256, 8, 257, false},
      {300, 256, 8, 257, true},
      {2048, 256, 8, 257, true},
      {8192, 256, 8, 257, false},
      {8192, 256, 8, 257, true},
      {37, 16, 4, 17, false},
      {1000, 16, 4, 17, true},
      {777, 100, 6, 103, false},
      {513, 512, 32, 513, true},
      {64, 8, 1, 9, false},
      // The one-block path (T <= 8, E <= 256: {1, 5} above and 8 here), the top-k kernel then
      // the block (9-128 rows, T k <= 1024; 2 pairs per thread up to 2,048 pairs: 129, 256), and
      // the four kernels past 2,048 pairs (300, 1000, 777, 2048 above; 512, 513).
      {8, 256, 8, 257, true},
      {9, 256, 8, 257, false},
      {16, 256, 8, 257, false},
      {32, 256, 8, 257, true},
      {33, 256, 8, 257, true},
      {32, 16, 4, 17, false},
      {64, 256, 8, 257, true},
      {64, 256, 8, 257, false},
      {128, 256, 8, 257, false},
      {129, 256, 8, 257, false},
      {200, 100, 5, 103, true},
      {256, 256, 8, 257, false},
      {256, 256, 8, 257, true},
      {512, 256, 8, 257, false},
      {512, 256, 8, 257, true},
      {513, 256, 8, 257, true},
      // The cluster (65-512 rows, E <= 256 on sm_90: the cases of 65-512 rows above, again
      // without it below): 16 blocks with a last block of 15 rows, 15 blocks with one, k = 32
      // (every lane a pair), E not a multiple of 32, the smallest cluster's rows (65), the first
      // of 32 rows per block (257) and 13 of them with E = 100.
      {255, 256, 8, 257, false},
      {225, 256, 8, 257, true},
      {80, 64, 32, 64, true},
      {97, 33, 3, 40, false},
      {65, 256, 8, 257, true},
      {257, 256, 8, 257, false},
      {400, 100, 6, 103, true}};
  uint64_t seed = 7;
  for (const RouteCase& c : routes) {
    const std::string name = "T" + std::to_string(c.T) + "_E" + std::to_string(c.E) + "_k" +
                             std::to_string(c.k) + (c.skew ? "_skewed" : "_uniform");
    cases.push_back({"moe_route", name, "f32", "cpu::router_top_k + counting sort",
                     [c, seed] { check_route(c, seed); }});
    if (c.T >= 65 && c.T <= 512 && c.E <= 256) {  // the same rows without the cluster
      RouteCase b = c;
      b.cluster = false;
      cases.push_back({"moe_route", name + "_no_cluster", "f32",
                       "cpu::router_top_k + counting sort", [b, seed] { check_route(b, seed); }});
    }
    ++seed;
  }
  // The whole block: tiny config from seed 300, the model's from 400; each T uniform then skewed.
  for (const MoeShape* s : {&kTiny, &kModel}) {
    seed = s == &kTiny ? 300 : 400;
    for (int T : {1, 5, 300, 2048})
      for (bool skew : {false, true}) {
        const BlockCase c{T, skew};
        cases.push_back({"moe_prefill",
                         std::string(s->name) + "_E" + std::to_string(s->E) + "_k" +
                             std::to_string(s->k) + "_I" + std::to_string(s->I) + "_H" +
                             std::to_string(s->H) + "_T" + std::to_string(T) +
                             (skew ? "_skewed" : "_uniform"),
                         "bf16", "cpu::moe_forward", [s, c, seed] { run_block(*s, c, seed); }});
        ++seed;
      }
  }
  for (const auto& [T, Is] : {std::pair{1, 512}, {16, 512}, {64, 512}, {37, 64}})
    cases.push_back({"moe_shared_swiglu", "T" + std::to_string(T) + "_Is" + std::to_string(Is),
                     "f32", "bf16(silu(g) * u) in f32",
                     [T = T, Is = Is] { check_shared_swiglu(T, Is, 900 + uint64_t(T)); }});
  return cases;
}

// The workspace bound holds for the worst case (every expert non-empty with a partial tile).
TEST(MoeRoute, WorkspaceLayout) {
  for (int T : {1, 5, 300, 8192}) {
    const size_t bytes = cuda::moe_routing_workspace_bytes(T, 256, 8);
    std::vector<uint8_t> fake(bytes + 256);
    void* base =
        reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(fake.data()) + 255) & ~uintptr_t(255));
    const cuda::MoeRouting r = cuda::moe_routing_layout(base, T, 256, 8);
    const int P = T * 8;
    // sum over experts of ceil(n_e / BM) with sum n_e = P and at most min(E, P) non-empty experts.
    const int nonempty = std::min(256, P);
    const int worst =
        (P - nonempty) / cuda::kMoeTileRows + nonempty;  // each non-empty expert one partial tile
    EXPECT_GE(r.max_tiles, worst) << "T " << T;
    const auto end = reinterpret_cast<uintptr_t>(r.num_tiles) + 4;
    EXPECT_LE(end, reinterpret_cast<uintptr_t>(base) + bytes) << "T " << T;
  }
}

}  // namespace
}  // namespace lilac::test
