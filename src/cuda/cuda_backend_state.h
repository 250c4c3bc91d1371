// CudaBackend's internals shared by its two source files (cuda_backend.cpp: construction,
// sequences, the Backend API, graphs and profiling; cuda_backend_layers.cpp: the launch sequences
// of a layer, a decode step and a prefill chunk): the workspace, the per-sequence device state,
// the launch timer and the per-matrix format dispatch. Not part of the public API.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/decode_batch.h"
#include "cuda/gemm.h"
#include "cuda/gemv_rows.h"
#include "cuda/linear.h"
#include "cuda/moe_decode.h"
#include "cuda/moe_prefill.h"
#include "cuda/norm.h"
#include "cuda/q4_gemm.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_moe.h"
#include "cuda/sampling.h"
#include "cuda/token_mask.h"
#include "util/env_choice.h"
#include "util/error.h"
#include "util/half.h"

namespace lilac::cuda {

// ---- workspace and per-sequence state -------------------------------------------------------

// Page-locked host words (cudaMallocHost): a copy from them to the device is asynchronous.
class PinnedWords {
 public:
  explicit PinnedWords(size_t n) {
    void* p = nullptr;
    LILAC_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(uint32_t)));
    data_ = static_cast<uint32_t*>(p);
  }
  ~PinnedWords() { cudaFreeHost(data_); }
  PinnedWords(const PinnedWords&) = delete;
  PinnedWords& operator=(const PinnedWords&) = delete;
  uint32_t* data() const { return data_; }

 private:
  uint32_t* data_ = nullptr;
};

// Activation buffers shared by every sequence of this backend (one stream: launches never
// overlap). Sized for `max_T` tokens per prefill chunk; decode uses row 0.
struct Workspace {
  int max_T = 0;
  int proj_cols = 0;  // widest projection output (GDN in_proj or attention qkv)
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> h;           // [max_T, H] residual stream
  DeviceBuffer<bf16> x;            // [max_T, H] normed activations
  DeviceBuffer<float> proj;        // [max_T, proj_cols]
  DeviceBuffer<bf16> mix;          // [max_T, max(Hv*Dv, heads*hd)] mixer output before out/o_proj
  DeviceBuffer<bf16> q, gate;      // [max_T, heads*hd]
  DeviceBuffer<float> router;      // [max_T, E+1]
  DeviceBuffer<int32_t> topk_idx;  // decode [k]
  DeviceBuffer<float> topk_w;      // decode [k]
  DeviceBuffer<uint8_t> routing;   // moe_prefill routing workspace for max_T
  DeviceBuffer<bf16> act;          // [max(max_T*k, k+1), I]
  DeviceBuffer<float> y;           // [max_T*k, H]
  DeviceBuffer<bf16> shared_act;   // [max_T, Is]
  DeviceBuffer<float> shared_out;  // [max_T, H]
  DeviceBuffer<float> logits;      // [logit_rows, V]
  int logit_rows = 0;
  DeviceBuffer<float> gdn_prefill_ws;  // gdn_prefill workspace for max_T tokens
  DeviceBuffer<uint8_t>
      router_ws;  // moe_router's counter (zeroed once, kept at zero by the kernel)
  DeviceBuffer<uint8_t> sample_ws;  // sample() workspace
  DeviceBuffer<uint8_t> argmax_ws;  // argmax() workspace (zeroed once; launches leave it zeroed)
  // The chained small-M expert pairs' counters (kMoeSmallChainCounts; zeroed once, every pair
  // leaves them at zero)
  DeviceBuffer<int32_t> small_moe_chain;
  // q_gemm's stream-K scratch (prompt chunks; zeroed once, launches leave it reusable)
  DeviceBuffer<uint8_t> gemm_scratch;
  // Structured output (step_constrained): the token mask, (sampling vocab + 31) / 32 words.
  DeviceBuffer<uint32_t> mask;
  std::unique_ptr<PinnedWords> mask_host;
};

// The batched decode pass's own buffers (cuda_backend_batch.cpp; allocated at the first
// step_batch): the per-step descriptor (rows and ids, uploaded in one copy from pinned memory),
// the per-row routing, expert activations, attention partials, argmax slices and tokens, and one
// graph per batch size. The activations h, x, proj, mix, router and logits are Workspace's rows
// 0..B-1.
struct BatchUpload {
  DecodeBatchRow rows[CudaBackend::kMaxBatchRows];
  int32_t ids[CudaBackend::kMaxBatchRows];
};

struct BatchWorkspace {
  int max_B = 0;
  DeviceBuffer<BatchUpload> upload;    // [1]
  BatchUpload* upload_host = nullptr;  // pinned
  int32_t* tokens_host = nullptr;      // pinned [max_B]
  DeviceBuffer<int32_t> tokens;        // [max_B] argmax of each row
  DeviceBuffer<int32_t> topk_idx;      // [max_B, k]
  DeviceBuffer<float> topk_w;          // [max_B, k]
  DeviceBuffer<int32_t> order;         // [max_B * k] the pairs sorted by expert (4-bit MoE)
  DeviceBuffer<bf16> act;              // [max_B, k * I + Is]
  DeviceBuffer<float> attn_partial;    // attention_decode_batch_workspace_floats(max_B, ...)
  DeviceBuffer<float> gdn_ws;          // gdn_decode_batch_workspace_floats(max_B, ...)
  DeviceBuffer<uint8_t> argmax_ws;     // [max_B] slices of 256 bytes, zeroed once
  // (batch size, grouped MoE) -> forward + argmax + position advance
  std::map<std::pair<int, bool>, cudaGraphExec_t> graphs;

  ~BatchWorkspace() {
    for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
    if (upload_host) cudaFreeHost(upload_host);
    if (tokens_host) cudaFreeHost(tokens_host);
  }
};

class CudaSequenceState : public SequenceState {
 public:
  int64_t max_ctx = 0;
  int n_attn = 0, n_gdn = 0;
  DeviceBuffer<bf16> kv;     // [n_attn][2][kv_heads][max_ctx][hd]
  DeviceBuffer<float> conv;  // [n_gdn][K-1][C]
  // [n_gdn][Hv][Dk][Dv] in the backend's format (CudaOptions::gdn_state): one of the two is
  // allocated, the other empty.
  DeviceBuffer<float> rec;
  DeviceBuffer<bf16> rec_bf16;
  DeviceBuffer<int32_t> scalars;  // [0] position
  // The sampler's output; its first field is the token the next decode step embeds.
  DeviceBuffer<DeviceSampleResult> sample_out;
  DeviceBuffer<DeviceSamplingParams> sampler_params;
  DeviceBuffer<int32_t> output_counts;
  DeviceBuffer<uint8_t> seen;
  DeviceBuffer<float> attn_partial;  // attention_decode split-K workspace (depends on max_ctx)
  // Decode-step graphs: forward only (forward()), forward + argmax, forward + sampler (general
  // path), forward + sampler (small top_k path: cuda::SamplerPath).
  cudaGraphExec_t graph_plain = nullptr, graph_argmax = nullptr, graph_sample = nullptr,
                  graph_sample_small_k = nullptr;
  int32_t token_on_device = -1;  // the id scalars[1] holds (the last sampled token), or -1

  ~CudaSequenceState() override { drop_graphs(); }
  void drop_graphs() {
    for (cudaGraphExec_t* g : {&graph_plain, &graph_argmax, &graph_sample, &graph_sample_small_k}) {
      if (*g) cudaGraphExecDestroy(*g);
      *g = nullptr;
    }
  }
  void set_position(int64_t p) { position_ = p; }

  int32_t* d_pos() const { return scalars.get(); }
  int32_t* d_token() const { return reinterpret_cast<int32_t*>(sample_out.get()); }
  bf16* k_cache(const ModelConfig& c, int slot) const {
    return kv.get() + size_t(slot) * 2 * size_t(c.kv_heads) * size_t(max_ctx) * size_t(c.head_dim);
  }
  bf16* v_cache(const ModelConfig& c, int slot) const {
    return k_cache(c, slot) + size_t(c.kv_heads) * size_t(max_ctx) * size_t(c.head_dim);
  }
  float* conv_state(const ModelConfig& c, int slot) const {
    return conv.get() + size_t(slot) * size_t((c.gdn_conv_kernel - 1) * c.gdn_conv_channels());
  }
  // f(p) with p the layer slot's recurrent state: float* or bf16*, whichever this state holds.
  template <class F>
  void with_rec_state(const ModelConfig& c, int slot, F&& f) const {
    const size_t off = size_t(slot) * size_t(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim);
    if (rec_bf16.size())
      f(rec_bf16.get() + off);
    else
      f(rec.get() + off);
  }
  void zero_rec_state(cudaStream_t s) const {
    if (rec.bytes()) LILAC_CUDA_CHECK(cudaMemsetAsync(rec.get(), 0, rec.bytes(), s));
    if (rec_bf16.bytes()) LILAC_CUDA_CHECK(cudaMemsetAsync(rec_bf16.get(), 0, rec_bf16.bytes(), s));
  }
};

// Optional per-launch timing (kernel_breakdown): an event after each named launch.
struct CudaBackend::Timer {
  cudaStream_t stream;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  explicit Timer(cudaStream_t s) : stream(s) { mark("start"); }
  ~Timer() {
    for (auto& m : marks) cudaEventDestroy(m.second);
  }
  void mark(const std::string& name) {
    cudaEvent_t e;
    LILAC_CUDA_CHECK(cudaEventCreate(&e));
    LILAC_CUDA_CHECK(cudaEventRecord(e, stream));
    marks.emplace_back(name, e);
  }
  // name -> (total ms, launches), in first-seen order.
  std::vector<std::tuple<std::string, double, int>> totals() const {
    LILAC_CUDA_CHECK(cudaEventSynchronize(marks.back().second));
    std::vector<std::tuple<std::string, double, int>> out;
    std::map<std::string, size_t> index;
    for (size_t i = 1; i < marks.size(); ++i) {
      float ms = 0;
      LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
      auto [it, fresh] = index.emplace(marks[i].first, out.size());
      if (fresh) out.emplace_back(marks[i].first, 0.0, 0);
      std::get<1>(out[it->second]) += ms;
      std::get<2>(out[it->second]) += 1;
    }
    return out;
  }
};

// Runs `launch`, then marks it on the timer when one is active.
template <typename F>
inline void timed(CudaBackend::Timer* timer, const char* name, F&& launch) {
  launch();
  if (timer) timer->mark(name);
}

// ---- tracing (tests and diffs only: synchronises and copies) -------------------------------

template <typename T>
std::vector<float> download_f32(const T* d, size_t n, cudaStream_t s) {
  std::vector<T> raw(n);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(raw.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      uint16_t b;
      std::memcpy(&b, &raw[i], 2);
      out[i] = bf16_to_f32(b);
    } else {
      out[i] = float(raw[i]);
    }
  }
  return out;
}

// ---- per-matrix format dispatch ---------------------------------------------------------------
// Each device matrix is a DeviceMatrix tagged BF16 (`dense`) or MLX affine 4/8-bit (`q`): these
// call the BF16 launcher or the q4_* one with the same contract, by the tag. An expert stack and
// its layer's shared expert are stored alike (the loader quantizes both or neither), so the MoE
// helpers dispatch on the stack's tag.

inline void proj_gemv(const DeviceMatrix& w, int rows, int cols, const bf16* x, float* y,
                      GemvOut mode, cudaStream_t s) {
  if (w.affine())
    q_gemv(w.q, x, y, mode, s);
  else
    gemv(w.dense, rows, cols, x, y, mode, s);
}

// Quantized matrices of few rows (out_proj, o_proj: 2048; the router: 257) at prompt chunks of up
// to 256 tokens went through q_gemv_rows in slabs of 64 tokens: q_gemm's 256-row x 128-token block
// tiles give such a matrix 16 blocks at 256 tokens (run 1 of 2026-12-02, per launch at 256 tokens:
// gdn_out_proj 134 us, attn_o_proj 122 us, the router 61 us; q_gemv_rows at 64 tokens: 18, 18 and
// 11 us). Wide matrices (in_proj 12352, qkv 9216 rows) fill the GPU with q_gemm's tiles. Since s7
// 4-bit weights on Hopper take q_gemm_wgmma at every M: it splits K over a cluster when the tiles
// are few (out_proj at 512 tokens 20.9 us; the slabs took ~78 us at 256); the slabs stay for
// 8-bit weights (the router) and other GPUs, since s7 in one launch (grid z over the slabs).
// Up to s25 the slabs stopped at 256 tokens, and above it the 8-bit router went to q_gemm, whose
// 256-row x 128-token tiles give its 257 rows 8 blocks at 512 tokens (s26's chunk timeline: 58 us
// per layer, 2.3 ms of a 20.5 ms chunk; at most 64 blocks below 4,096 tokens) where the slabs
// took 11 us at 256. s26 run C (H200, 4-bit, prefill tok/s at 512 / 768 / 1,024 / 2,048 / 4,096
// tokens, two runs): limit 256 25,020 / 29,194 / 33,844 / 40,486 / 43,652; 2,048 27,278 / 30,998
// / 35,493 / 41,262 / 43,738; 4,096 and above the same within the runs' spread.
// The 8-bit limit only: 4-bit matrices take the slabs on GPUs without wgmma, not measured there
// above 256. LILAC_SLAB_MAX_TOKENS (A/B) moves the 8-bit limit.
constexpr int kSlabMaxRows = 4096, kSlabMaxTokens4 = 256, kSlabMaxTokens8 = 2048;

inline int slab_max_tokens(int bits) {
  if (bits != 8) return kSlabMaxTokens4;
  static const int v =
      env_choice("LILAC_SLAB_MAX_TOKENS", {256, 512, 1024, 2048, 4096, 8192, 16384, 65536});
  return v ? v : kSlabMaxTokens8;
}

inline QGemmScratch gemm_scratch(Workspace& w) {
  return {w.gemm_scratch.get(), w.gemm_scratch.bytes()};
}

// scratch: q_gemm's stream-K scratch (the workspace's; empty: no stream-K form).
inline void proj_gemm(const bf16* A, int M, int K, const DeviceMatrix& w, int N, void* C,
                      GemmOut mode, cudaStream_t s, const QGemmScratch& scratch = {}) {
  if (w.affine() && mode != GemmOut::StoreBF16 && N <= kSlabMaxRows &&
      M <= slab_max_tokens(w.q.bits) && !(w.q.bits == 4 && q_gemm_wgmma_available()) &&
      q_gemv_rows_available()) {
    const GemvOut out = mode == GemmOut::AccumulateF32 ? GemvOut::Accumulate : GemvOut::Store;
    q_gemv_rows(w.q, A, M, static_cast<float*>(C), out, s);  // 64-token slabs in one launch
  } else if (w.affine())
    q_gemm(A, M, w.q, C, mode, s, scratch);
  else
    gemm(A, M, K, w.dense, N, C, mode, s);
}

inline void embed_rows(const int32_t* ids, const DeviceModel& m, float* h, int T, int H,
                       cudaStream_t s) {
  if (m.embed.affine())
    q_embed(ids, m.embed.q, h, T, s);
  else
    embed(ids, m.embed.dense, h, T, H, s);
}

inline void moe_gate_up_decode(const DeviceLayer& L, const int32_t* idx, int k, const bf16* x,
                               int H, int I, int Is, bf16* act, cudaStream_t s) {
  if (L.gate_up.affine())
    q_moe_gate_up_gemv(L.gate_up.q, L.shared_gate_up.q, idx, k, x, H, I, Is, act, s);
  else
    moe_gate_up_gemv(L.gate_up.dense, L.shared_gate_up.dense, idx, k, x, H, I, Is, act, s);
}

inline void moe_down_decode(const DeviceLayer& L, const int32_t* idx, const float* wt,
                            const float* shared_logit, const bf16* act, int k, int H, int I, int Is,
                            float* h, cudaStream_t s) {
  if (L.down.affine())
    q_moe_down_gemv(L.down.q, L.shared_down.q, idx, wt, shared_logit, act, k, H, I, Is, h, s);
  else
    moe_down_gemv(L.down.dense, L.shared_down.dense, idx, wt, shared_logit, act, k, H, I, Is, h, s);
}

// tile: the 4-bit wgmma kernels' token tile (q4_moe.h) where they run.
inline void moe_gate_up_prefill(const DeviceLayer& L, const bf16* x, int H, int I,
                                const MoeRouting& r, bf16* act, cudaStream_t s,
                                QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive) {
  if (L.gate_up.affine())
    q_moe_grouped_gate_up(x, H, L.gate_up.q, I, r, act, s, tile);
  else
    moe_grouped_gate_up(x, H, L.gate_up.dense, I, r, act, s);
}

inline void moe_down_prefill(const DeviceLayer& L, const bf16* act, int I, int H,
                             const MoeRouting& r, float* y, cudaStream_t s,
                             QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive) {
  if (L.down.affine())
    q_moe_grouped_down(act, I, L.down.q, H, r, y, s, tile);
  else
    moe_grouped_down(act, I, L.down.dense, H, r, y, s);
}

inline void moe_shared_gate_up_prefill(const DeviceLayer& L, const bf16* x, int T, int H, int Is,
                                       bf16* act, cudaStream_t s,
                                       QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive) {
  if (L.shared_gate_up.affine())
    q_moe_shared_gate_up(x, T, H, L.shared_gate_up.q, Is, act, s, tile);
  else
    moe_shared_gate_up(x, T, H, L.shared_gate_up.dense, Is, act, s);
}

// The small-M MoE kernels (q4_moe_small.cu) take a grouped pass of T tokens: 4/8-bit experts
// and shared expert, T <= the options' bound.
inline bool small_moe(const DeviceLayer& L, int T, int max_tokens) {
  return max_tokens > 0 && T <= max_tokens && L.gate_up.affine() && L.down.affine() &&
         L.shared_gate_up.affine() && L.shared_down.affine() &&
         q_moe_small_supported(L.gate_up.q, L.down.q, L.shared_gate_up.q, L.shared_down.q);
}

// The experts of a grouped MoE pass over T tokens routed in r: act and y in sorted rows, the
// shared expert's shared_act and shared_out (w's buffers). The small-M kernels when they take the
// pass (two launches); with `fused_shared`, 4-bit experts on Hopper the grouped wgmma kernels
// (token tile `tile`) and BF16 ones the 128-token-tile grouped kernels, each with the shared
// expert's tiles inside them (two launches); else those kernels, then the shared
// expert on its own (gemv_rows or a GEMM). tile: the 4-bit grouped wgmma kernels' token tile.
// y_bf16: where the fused 4-bit wgmma kernels run, their routed rows of y in bf16
// (q_moe_grouped_down_wgmma's y_bf16). Returns whether y holds bf16 rows (for moe_combine).
inline bool moe_experts(const DeviceLayer& L, const ModelConfig& c, Workspace& w, int T,
                        const MoeRouting& r, int small_max_tokens, MoeSmallKernel small_kernel,
                        bool fused_shared, CudaBackend::Timer* timer, cudaStream_t s,
                        QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive, bool y_bf16 = false) {
  const int H = int(c.hidden), I = int(c.expert_intermediate), Is = int(c.shared_intermediate);
  if (small_moe(L, T, small_max_tokens)) {
    // The pair's counters for automatic and chained: the register pair runs chained per tile
    // (s41-s44; docs/kernels.md, "Forty-fourth session"); `registers` and `streamed` never chain.
    int32_t* const chain =
        small_kernel == MoeSmallKernel::automatic || small_kernel == MoeSmallKernel::chained
            ? w.small_moe_chain.get()
            : nullptr;
    timed(timer, "moe_small_gate_up", [&] {
      q_moe_small_gate_up(w.x.get(), T, H, L.gate_up.q, I, L.shared_gate_up.q, Is, r, w.act.get(),
                          w.shared_act.get(), s, small_kernel, chain);
    });
    timed(timer, "moe_small_down", [&] {
      q_moe_small_down(w.act.get(), I, w.shared_act.get(), Is, L.down.q, L.shared_down.q, H, r,
                       w.y.get(), w.shared_out.get(), s, small_kernel, chain);
    });
    return false;
  }
  if (fused_shared && L.gate_up.affine() && L.down.affine() && L.shared_gate_up.affine() &&
      L.shared_down.affine() && L.gate_up.q.bits == 4 && L.down.q.bits == 4 &&
      L.shared_gate_up.q.bits == 4 && L.shared_down.q.bits == 4 &&
      q_moe_grouped_wgmma_available()) {
    // 4-bit on Hopper: the shared expert's blocks inside the grouped wgmma launches (s20).
    const QMoeSharedPart shared{L.shared_gate_up.q, L.shared_down.q, w.shared_act.get(),
                                w.shared_out.get()};
    timed(timer, "moe_grouped_gate_up+shared", [&] {
      q_moe_grouped_gate_up_wgmma(w.x.get(), H, L.gate_up.q, I, r, w.act.get(), s, tile, &shared);
    });
    timed(timer, "moe_grouped_down+shared", [&] {
      q_moe_grouped_down_wgmma(w.act.get(), I, L.down.q, H, r, w.y.get(), s, tile, &shared, 0,
                               y_bf16);
    });
    return y_bf16;
  }
  if (fused_shared && !L.gate_up.affine() && !L.down.affine() && !L.shared_gate_up.affine() &&
      !L.shared_down.affine() && Is == I) {
    const MoeSharedPart shared{L.shared_gate_up.dense, L.shared_down.dense, w.shared_act.get(),
                               w.shared_out.get()};
    timed(timer, "moe_grouped_gate_up+shared", [&] {
      moe_grouped_gate_up(w.x.get(), H, L.gate_up.dense, I, r, w.act.get(), s, true, &shared);
    });
    timed(timer, "moe_grouped_down+shared", [&] {
      moe_grouped_down(w.act.get(), I, L.down.dense, H, r, w.y.get(), s, true, &shared);
    });
    return false;
  }
  timed(timer, "moe_grouped_gate_up",
        [&] { moe_gate_up_prefill(L, w.x.get(), H, I, r, w.act.get(), s, tile); });
  timed(timer, "moe_grouped_down",
        [&] { moe_down_prefill(L, w.act.get(), I, H, r, w.y.get(), s, tile); });
  if (!L.shared_gate_up.affine() && !L.shared_down.affine() && T <= kGemvRowsMax && H % 64 == 0 &&
      Is % 64 == 0 && 2 * Is <= H) {
    // Few tokens, BF16 (a batched decode step): the shared expert as two plain products, gate|up
    // into shared_out (f32 [T, 2 Is], free until the down projection overwrites it), then the
    // SwiGLU. The 128-token-tile kernel gave the 4 MB gate|up matrix a few blocks: 34 us per layer
    // at 16 and at 64 rows (s6 run 4). Up to 32 rows gemv_rows reads each weight once for all rows
    // (s7 run 2 at 16 rows: gate|up 14 us, down 7.7 us against 9.2 on the GEMM); above, its eight
    // 8-token chunks per MMA row cost more than the BF16 GEMM's tiles (64 rows: 27 and 14.3 us).
    const bool rows = T <= 32;
    timed(timer, rows ? "rows.shared_gate_up" : "gemm.shared_gate_up", [&] {
      if (rows)
        gemv_rows(L.shared_gate_up.dense, 2 * Is, H, w.x.get(), T, w.shared_out.get(),
                  GemvOut::Store, s);
      else
        gemm(w.x.get(), T, H, L.shared_gate_up.dense, 2 * Is, w.shared_out.get(), GemmOut::StoreF32,
             s);
      moe_shared_swiglu(w.shared_out.get(), T, Is, w.shared_act.get(), s);
    });
    timed(timer, rows ? "rows.shared_down" : "gemm.shared_down", [&] {
      if (rows)
        gemv_rows(L.shared_down.dense, H, Is, w.shared_act.get(), T, w.shared_out.get(),
                  GemvOut::Store, s);
      else
        gemm(w.shared_act.get(), T, Is, L.shared_down.dense, H, w.shared_out.get(),
             GemmOut::StoreF32, s);
    });
    return false;
  }
  timed(timer, "moe_shared_gate_up",
        [&] { moe_shared_gate_up_prefill(L, w.x.get(), T, H, Is, w.shared_act.get(), s, tile); });
  timed(timer, "gemm.shared_down", [&] {
    proj_gemm(w.shared_act.get(), T, Is, L.shared_down, H, w.shared_out.get(), GemmOut::StoreF32,
              s);
  });
  return false;
}

// Greedy without penalties or logprobs: the token is an argmax, one launch.
inline bool argmax_only(const SequenceState& st) {
  return st.sampling.greedy() && !st.penalties_active && !st.sampling.logprobs &&
         st.sampling.top_logprobs == 0;
}

}  // namespace lilac::cuda
