// CudaBackend: assembles the kernel families of src/cuda into the forward pass. The order of
// operations per layer mirrors cpu/cpu_backend.cpp (the reference); see docs/cuda-design.md for
// layouts and the launchers' contracts.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>

#include "cuda/attention.h"
#include "cuda/gated_deltanet.h"
#include "cuda/gemm.h"
#include "cuda/launch.h"
#include "cuda/linear.h"
#include "cuda/moe_decode.h"
#include "cuda/moe_prefill.h"
#include "cuda/norm.h"
#include "cuda/position.h"
#include "cuda/q4_gemm.h"
#include "cuda/q4_linear.h"
#include "cuda/q4_moe.h"
#include "cuda/sampling.h"
#include "model/qwen36.h"
#include "util/error.h"
#include "util/half.h"

namespace lilac::cuda {

// ---- workspace and per-sequence state -------------------------------------------------------

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
  DeviceBuffer<float> gdn_decode_ws;   // gdn_decode scratch (counters kept at zero by the kernels)
  DeviceBuffer<uint8_t>
      router_ws;  // moe_router's counter (zeroed once, kept at zero by the kernel)
  DeviceBuffer<uint8_t> sample_ws;  // sample() workspace
  DeviceBuffer<uint8_t> argmax_ws;  // argmax() workspace (zeroed once; launches leave it zeroed)
};

class CudaSequenceState : public SequenceState {
 public:
  int64_t max_ctx = 0;
  int n_attn = 0, n_gdn = 0;
  DeviceBuffer<bf16> kv;          // [n_attn][2][kv_heads][max_ctx][hd]
  DeviceBuffer<float> conv;       // [n_gdn][K-1][C]
  DeviceBuffer<float> rec;        // [n_gdn][Hv][Dk][Dv]
  DeviceBuffer<int32_t> scalars;  // [0] position
  // The sampler's output; its first field is the token the next decode step embeds.
  DeviceBuffer<DeviceSampleResult> sample_out;
  DeviceBuffer<DeviceSamplingParams> sampler_params;
  DeviceBuffer<int32_t> output_counts;
  DeviceBuffer<uint8_t> seen;
  DeviceBuffer<float> attn_partial;  // attention_decode split-K workspace (depends on max_ctx)
  // Decode-step graphs: forward only (forward()), forward + argmax, forward + sampler.
  cudaGraphExec_t graph_plain = nullptr, graph_argmax = nullptr, graph_sample = nullptr;
  int32_t token_on_device = -1;  // the id scalars[1] holds (the last sampled token), or -1

  ~CudaSequenceState() override { drop_graphs(); }
  void drop_graphs() {
    for (cudaGraphExec_t* g : {&graph_plain, &graph_argmax, &graph_sample}) {
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
  float* rec_state(const ModelConfig& c, int slot) const {
    return rec.get() + size_t(slot) * size_t(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim);
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

namespace {

// Runs `launch`, then marks it on the timer when one is active.
template <typename F>
void timed(CudaBackend::Timer* timer, const char* name, F&& launch) {
  launch();
  if (timer) timer->mark(name);
}

}  // namespace

// ---- construction ---------------------------------------------------------------------------

CudaOptions CudaOptions::from_environment() {
  CudaOptions o;
  if (const char* g = std::getenv("LILAC_GDN_DECODE")) {
    std::string v = g;
    if (v == "cluster")
      o.gdn_decode_path = GdnDecodePath::Cluster;
    else if (v == "counter")
      o.gdn_decode_path = GdnDecodePath::Counter;
  }
  if (const char* a = std::getenv("LILAC_ATTN_DECODE"))
    o.fused_attention_decode = std::string(a) != "split";
  if (const char* gr = std::getenv("LILAC_CUDA_GRAPHS")) o.use_graphs = std::string(gr) != "0";
  return o;
}

CudaBackend::CudaBackend(std::shared_ptr<DeviceModel> model, CudaOptions options)
    : model_(std::move(model)), options_(options), ws_(std::make_unique<Workspace>()) {
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const ModelConfig& c = model_->config;
  const int H = int(c.hidden);
  Workspace& w = *ws_;
  w.max_T = int(std::max<int64_t>(1, options_.prefill_chunk));
  const int gdn_cols = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
  const int qkv_cols = int(c.q_proj_rows() + 2 * c.kv_dim());
  w.proj_cols = std::max(gdn_cols, qkv_cols);
  const size_t T = size_t(w.max_T), k = size_t(c.experts_per_token);
  w.ids.resize(T);
  w.h.resize(T * size_t(H));
  w.x.resize(T * size_t(H));
  w.proj.resize(T * size_t(w.proj_cols));
  w.mix.resize(T * size_t(std::max(c.gdn_v_channels(), c.heads * c.head_dim)));
  w.q.resize(T * size_t(c.heads * c.head_dim));
  w.gate.resize(T * size_t(c.heads * c.head_dim));
  w.router.resize(T * size_t(c.experts + 1));
  w.topk_idx.resize(k);
  w.topk_w.resize(k);
  w.routing.resize(moe_routing_workspace_bytes(w.max_T, int(c.experts), int(k)));
  w.act.resize(std::max(T * k, k + 1) *
               size_t(std::max(c.expert_intermediate, c.shared_intermediate)));
  w.y.resize(T * k * size_t(H));
  w.shared_act.resize(T * size_t(c.shared_intermediate));
  w.shared_out.resize(T * size_t(H));
  w.logit_rows = int(std::clamp<int64_t>((256ll << 20) / (4 * c.vocab), 1, w.max_T));
  w.logits.resize(size_t(w.logit_rows) * size_t(c.vocab));
  w.argmax_ws.resize(argmax_workspace_bytes(int(c.vocab)));
  LILAC_CUDA_CHECK(cudaMemset(w.argmax_ws.get(), 0, w.argmax_ws.bytes()));
  w.sample_ws.resize(sample_workspace_bytes(int(c.vocab)));
  LILAC_CUDA_CHECK(cudaMemset(w.sample_ws.get(), 0, w.sample_ws.bytes()));
  const int Hk = int(c.gdn_key_heads), Hv = int(c.gdn_value_heads), Dk = int(c.gdn_key_dim),
            Dv = int(c.gdn_value_dim);
  w.gdn_prefill_ws.resize(gdn_prefill_workspace_floats(w.max_T, Hk, Hv, Dk, Dv));
  w.gdn_decode_ws.resize(gdn_decode_workspace_floats(Hk, Hv, Dv));
  gdn_decode_workspace_init(w.gdn_decode_ws.get(), Hk, Hv, Dv, stream_);
  w.router_ws.resize(moe_router_workspace_bytes());
  LILAC_CUDA_CHECK(cudaMemsetAsync(w.router_ws.get(), 0, w.router_ws.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::device_description() const {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return "cuda";
  int sm_clock = 0, mem_clock = 0;
  cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&mem_clock, cudaDevAttrMemoryClockRate, dev);
  return fmt::format("{} ({} SMs, {:.0f} GB, sm_{}{}, max SM clock {} MHz, memory clock {} MHz)",
                     p.name, p.multiProcessorCount, double(p.totalGlobalMem) / 1e9, p.major,
                     p.minor, sm_clock / 1000, mem_clock / 1000);
}

std::unique_ptr<SequenceState> CudaBackend::new_sequence(int64_t max_context) {
  const ModelConfig& c = model_->config;
  auto st = std::make_unique<CudaSequenceState>();
  st->max_ctx = max_context;
  st->n_attn = int(c.count_layers(LayerType::FullAttention));
  st->n_gdn = int(c.count_layers(LayerType::GatedDeltaNet));
  st->kv.resize(size_t(st->n_attn) * 2 * size_t(c.kv_heads) * size_t(max_context) *
                size_t(c.head_dim));
  st->conv.resize(size_t(st->n_gdn) * size_t((c.gdn_conv_kernel - 1) * c.gdn_conv_channels()));
  st->rec.resize(size_t(st->n_gdn) * size_t(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim));
  st->scalars.resize(1);
  st->sample_out.resize(1);
  st->sampler_params.resize(1);
  st->output_counts.resize(size_t(c.vocab));
  st->seen.resize(size_t(c.vocab));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->conv.get(), 0, st->conv.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->rec.get(), 0, st->rec.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->scalars.get(), 0, st->scalars.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->sample_out.get(), 0, st->sample_out.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->output_counts.get(), 0, st->output_counts.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->seen.get(), 0, st->seen.bytes(), stream_));
  if (st->n_attn > 0)
    st->attn_partial.resize(attention_decode_workspace_floats(int(c.heads), int(c.kv_heads),
                                                              int(c.head_dim), int(max_context)));
  begin_sampling(*st, {}, SamplingParams{});
  return st;
}

std::unique_ptr<SequenceState> CudaBackend::clone(const SequenceState& state) {
  return clone_with_capacity(state, static_cast<const CudaSequenceState&>(state).max_ctx);
}

std::unique_ptr<SequenceState> CudaBackend::clone_with_capacity(const SequenceState& state,
                                                                int64_t max_context) {
  const auto& src = static_cast<const CudaSequenceState&>(state);
  if (max_context < src.position())
    fail("clone: capacity {} is below the sequence's {} tokens", max_context, src.position());
  auto dst = std::unique_ptr<CudaSequenceState>(
      static_cast<CudaSequenceState*>(new_sequence(max_context).release()));
  const ModelConfig& c = model_->config;
  // Only the filled rows [0, position) of each layer's K and V, per kv head (the two states'
  // capacities, hence their strides, may differ): one 2-D copy per layer and K/V.
  const size_t row_bytes = size_t(c.head_dim) * sizeof(bf16);
  if (src.position() > 0)
    for (int slot = 0; slot < src.n_attn; ++slot)
      for (bf16* (CudaSequenceState::*cache)(const ModelConfig&, int) const :
           {&CudaSequenceState::k_cache, &CudaSequenceState::v_cache})
        LILAC_CUDA_CHECK(cudaMemcpy2DAsync(
            (dst.get()->*cache)(c, slot), size_t(dst->max_ctx) * row_bytes, (src.*cache)(c, slot),
            size_t(src.max_ctx) * row_bytes, size_t(src.position()) * row_bytes, size_t(c.kv_heads),
            cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->conv.get(), src.conv.get(), src.conv.bytes(),
                                   cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->rec.get(), src.rec.get(), src.rec.bytes(),
                                   cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->scalars.get(), src.scalars.get(), src.scalars.bytes(),
                                   cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->sample_out.get(), src.sample_out.get(),
                                   src.sample_out.bytes(), cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->sampler_params.get(), src.sampler_params.get(),
                                   src.sampler_params.bytes(), cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->output_counts.get(), src.output_counts.get(),
                                   src.output_counts.bytes(), cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->seen.get(), src.seen.get(), src.seen.bytes(),
                                   cudaMemcpyDeviceToDevice, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  dst->set_position(src.position());
  dst->token_on_device = src.token_on_device;
  dst->sampling = src.sampling;
  dst->penalties = src.penalties;
  dst->penalties_active = src.penalties_active;
  return dst;
}

size_t CudaBackend::state_bytes(const SequenceState& state) const {
  const auto& st = static_cast<const CudaSequenceState&>(state);
  return st.kv.bytes() + st.conv.bytes() + st.rec.bytes() + st.output_counts.bytes() +
         st.seen.bytes();
}

// ---- tracing (tests and diffs only: synchronises and copies) -------------------------------

namespace {

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

}  // namespace

// ---- per-matrix format dispatch ---------------------------------------------------------------
// Each device matrix is BF16 (its pointer) or MLX affine 4/8-bit (its QMatrix in DeviceLayerQ /
// DeviceModelQ, the pointer null): these call the BF16 launcher or the q4_* one with the same
// contract. The call sites below differ from the BF16-only backend only in naming both.

namespace {

void proj_gemv(const bf16* w, const QMatrix& q, int rows, int cols, const bf16* x, float* y,
               GemvOut mode, cudaStream_t s) {
  if (q)
    q_gemv(q, x, y, mode, s);
  else
    gemv(w, rows, cols, x, y, mode, s);
}

void proj_gemm(const bf16* A, int M, int K, const bf16* w, const QMatrix& q, int N, void* C,
               GemmOut mode, cudaStream_t s) {
  if (q)
    q_gemm(A, M, q, C, mode, s);
  else
    gemm(A, M, K, w, N, C, mode, s);
}

void embed_rows(const int32_t* ids, const DeviceModel& m, float* h, int T, int H, cudaStream_t s) {
  if (m.q.embed)
    q_embed(ids, m.q.embed, h, T, s);
  else
    embed(ids, m.embed, h, T, H, s);
}

void moe_gate_up_decode(const DeviceLayer& L, const int32_t* idx, int k, const bf16* x, int H,
                        int I, int Is, bf16* act, cudaStream_t s) {
  if (L.q.gate_up)
    q_moe_gate_up_gemv(L.q.gate_up, L.q.shared_gate_up, idx, k, x, H, I, Is, act, s);
  else
    moe_gate_up_gemv(L.gate_up, L.shared_gate_up, idx, k, x, H, I, Is, act, s);
}

void moe_down_decode(const DeviceLayer& L, const int32_t* idx, const float* wt,
                     const float* shared_logit, const bf16* act, int k, int H, int I, int Is,
                     float* h, cudaStream_t s) {
  if (L.q.down)
    q_moe_down_gemv(L.q.down, L.q.shared_down, idx, wt, shared_logit, act, k, H, I, Is, h, s);
  else
    moe_down_gemv(L.down, L.shared_down, idx, wt, shared_logit, act, k, H, I, Is, h, s);
}

void moe_gate_up_prefill(const DeviceLayer& L, const bf16* x, int H, int I, const MoeRouting& r,
                         bf16* act, cudaStream_t s) {
  if (L.q.gate_up)
    q_moe_grouped_gate_up(x, H, L.q.gate_up, I, r, act, s);
  else
    moe_grouped_gate_up(x, H, L.gate_up, I, r, act, s);
}

void moe_down_prefill(const DeviceLayer& L, const bf16* act, int I, int H, const MoeRouting& r,
                      float* y, cudaStream_t s) {
  if (L.q.down)
    q_moe_grouped_down(act, I, L.q.down, H, r, y, s);
  else
    moe_grouped_down(act, I, L.down, H, r, y, s);
}

void moe_shared_gate_up_prefill(const DeviceLayer& L, const bf16* x, int T, int H, int Is,
                                bf16* act, cudaStream_t s) {
  if (L.q.shared_gate_up)
    q_moe_shared_gate_up(x, T, H, L.q.shared_gate_up, Is, act, s);
  else
    moe_shared_gate_up(x, T, H, L.shared_gate_up, Is, act, s);
}

}  // namespace

// ---- one layer ------------------------------------------------------------------------------

void CudaBackend::layer_prefill(CudaSequenceState& st, int64_t li, int T, int pos0, Timer* timer) {
  const ModelConfig& c = model_->config;
  const DeviceLayer& L = model_->layers[size_t(li)];
  Workspace& w = *ws_;
  const int H = int(c.hidden), slot = int(c.slot_of_layer(li));
  const float eps = c.rms_eps;
  cudaStream_t s = stream_;

  // With a trace observer: the same named intermediates the CPU backend emits (mixer and MoE
  // contributions to the residual, the mixer's output before its projection, the routing).
  const std::string tp = fmt::format("layer{}.", li);
  std::vector<float> h_before;
  auto trace_delta = [&](const std::string& name) {
    auto now = download_f32(w.h.get(), size_t(T) * size_t(H), s);
    std::vector<float> d(now.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = now[i] - h_before[i];
    trace_(name, d.data(), {T, H});
    h_before = std::move(now);
  };
  if (trace_) h_before = download_f32(w.h.get(), size_t(T) * size_t(H), s);

  timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.input_norm, w.x.get(), T, H, eps, s); });
  if (L.type == LayerType::GatedDeltaNet) {
    const int cols = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
    timed(timer, "gemm.gdn_in_proj", [&] {
      proj_gemm(w.x.get(), T, H, L.in_proj, L.q.in_proj, cols, w.proj.get(), GemmOut::StoreF32, s);
    });
    timed(timer, "gdn_prefill", [&] {
      gdn_prefill(w.proj.get(), T, L.conv, st.conv_state(c, slot), L.neg_exp_A, L.dt_bias,
                  L.gdn_norm, st.rec_state(c, slot), int(c.gdn_key_heads), int(c.gdn_value_heads),
                  int(c.gdn_key_dim), int(c.gdn_value_dim), int(c.gdn_conv_kernel), eps,
                  w.gdn_prefill_ws.get(), w.mix.get(), s);
    });
    if (trace_) {
      auto v = download_f32(w.mix.get(), size_t(T) * size_t(c.gdn_v_channels()), s);
      trace_(tp + "gdn.normed", v.data(), {T, c.gdn_v_channels()});
    }
    timed(timer, "gemm.gdn_out_proj", [&] {
      proj_gemm(w.mix.get(), T, int(c.gdn_v_channels()), L.out_proj, L.q.out_proj, H, w.h.get(),
                GemmOut::AccumulateF32, s);
    });
  } else {
    const int cols = int(c.q_proj_rows() + 2 * c.kv_dim());
    timed(timer, "gemm.attn_qkv", [&] {
      proj_gemm(w.x.get(), T, H, L.qkv_proj, L.q.qkv_proj, cols, w.proj.get(), GemmOut::StoreF32,
                s);
    });
    timed(timer, "qk_norm_rope_store", [&] {
      qk_norm_rope_store(w.proj.get(), T, st.d_pos(), L.q_norm, L.k_norm, model_->inv_freq,
                         int(c.heads), int(c.kv_heads), int(c.head_dim), int(c.rotary_dim), eps,
                         w.q.get(), w.gate.get(), st.k_cache(c, slot), st.v_cache(c, slot),
                         int(st.max_ctx), s);
    });
    timed(timer, "attention_prefill", [&] {
      attention_prefill(w.q.get(), w.gate.get(), st.k_cache(c, slot), st.v_cache(c, slot), pos0, T,
                        int(c.heads), int(c.kv_heads), int(c.head_dim), int(st.max_ctx),
                        w.mix.get(), s);
    });
    if (trace_) {
      auto v = download_f32(w.mix.get(), size_t(T) * size_t(c.heads * c.head_dim), s);
      trace_(tp + "attn.gated", v.data(), {T, c.heads * c.head_dim});
    }
    timed(timer, "gemm.attn_o_proj", [&] {
      proj_gemm(w.mix.get(), T, int(c.heads * c.head_dim), L.o_proj, L.q.o_proj, H, w.h.get(),
                GemmOut::AccumulateF32, s);
    });
  }
  if (trace_) trace_delta(tp + "mixer_out");
  const int E = int(c.experts), k = int(c.experts_per_token), I = int(c.expert_intermediate);
  const int Is = int(c.shared_intermediate);
  timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.post_norm, w.x.get(), T, H, eps, s); });
  timed(timer, "gemm.router", [&] {
    proj_gemm(w.x.get(), T, H, L.router, L.q.router, E + 1, w.router.get(), GemmOut::StoreF32, s);
  });
  MoeRouting r = moe_routing_layout(w.routing.get(), T, E, k);
  timed(timer, "moe_route", [&] { moe_route(w.router.get(), E + 1, T, E, k, r, s); });
  if (trace_) {
    auto ids = download_f32(r.topk_idx, size_t(T) * size_t(k), s);
    trace_(tp + "moe.topk_ids", ids.data(), {T, k});
    auto logits = download_f32(w.router.get(), size_t(T) * size_t(E + 1), s);
    std::vector<float> router(size_t(T) * size_t(E));
    for (int t = 0; t < T; ++t)
      std::copy_n(&logits[size_t(t) * size_t(E + 1)], E, &router[size_t(t) * size_t(E)]);
    trace_(tp + "moe.router_logits", router.data(), {T, E});
  }
  timed(timer, "moe_grouped_gate_up",
        [&] { moe_gate_up_prefill(L, w.x.get(), H, I, r, w.act.get(), s); });
  timed(timer, "moe_grouped_down",
        [&] { moe_down_prefill(L, w.act.get(), I, H, r, w.y.get(), s); });
  timed(timer, "moe_shared_gate_up",
        [&] { moe_shared_gate_up_prefill(L, w.x.get(), T, H, Is, w.shared_act.get(), s); });
  timed(timer, "gemm.shared_down", [&] {
    proj_gemm(w.shared_act.get(), T, Is, L.shared_down, L.q.shared_down, H, w.shared_out.get(),
              GemmOut::StoreF32, s);
  });
  timed(timer, "moe_combine", [&] {
    moe_combine(w.y.get(), r, w.router.get(), E + 1, w.shared_out.get(), H, w.h.get(), s);
  });
  if (trace_) trace_delta(tp + "moe_out");
}

void CudaBackend::layer_decode(CudaSequenceState& st, int64_t li, Timer* timer) {
  const ModelConfig& c = model_->config;
  const DeviceLayer& L = model_->layers[size_t(li)];
  Workspace& w = *ws_;
  const int H = int(c.hidden), slot = int(c.slot_of_layer(li));
  const float eps = c.rms_eps;
  cudaStream_t s = stream_;

  // The first projection of the layer, from the residual: BF16 weights fuse the input norm into
  // the GEMV (gemv_rms: each block normalises h); 4-bit weights normalise first, then q_gemv.
  auto first_projection = [&](const char* name, const bf16* wb, const QMatrix& wq, int rows) {
    if (wb) {
      timed(timer, name, [&] {
        gemv_rms(wb, rows, H, w.h.get(), L.input_norm, eps, w.proj.get(), GemvOut::Store, s);
      });
    } else {
      timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.input_norm, w.x.get(), 1, H, eps, s); });
      timed(timer, name,
            [&] { proj_gemv(wb, wq, rows, H, w.x.get(), w.proj.get(), GemvOut::Store, s); });
    }
  };
  if (L.type == LayerType::GatedDeltaNet) {
    const int rows = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
    first_projection("gemv_rms.gdn_in_proj", L.in_proj, L.q.in_proj, rows);
    timed(timer, "gdn_decode", [&] {
      gdn_decode(w.proj.get(), L.conv, st.conv_state(c, slot), L.neg_exp_A, L.dt_bias, L.gdn_norm,
                 st.rec_state(c, slot), int(c.gdn_key_heads), int(c.gdn_value_heads),
                 int(c.gdn_key_dim), int(c.gdn_value_dim), int(c.gdn_conv_kernel), eps,
                 w.gdn_decode_ws.get(), w.mix.get(), s, options_.gdn_decode_path);
    });
    timed(timer, "gemv.gdn_out_proj", [&] {
      proj_gemv(L.out_proj, L.q.out_proj, H, int(c.gdn_v_channels()), w.mix.get(), w.h.get(),
                GemvOut::Accumulate, s);
    });
  } else {
    const int rows = int(c.q_proj_rows() + 2 * c.kv_dim());
    first_projection("gemv_rms.attn_qkv", L.qkv_proj, L.q.qkv_proj, rows);
    if (options_.fused_attention_decode) {
      timed(timer, "attention_decode", [&] {  // qk norm + RoPE + cache store fused in
        attention_decode_qkv(w.proj.get(), st.d_pos(), L.q_norm, L.k_norm, model_->inv_freq,
                             int(c.heads), int(c.kv_heads), int(c.head_dim), int(c.rotary_dim), eps,
                             st.k_cache(c, slot), st.v_cache(c, slot), int(st.max_ctx),
                             st.attn_partial.get(), w.mix.get(), s);
      });
    } else {
      timed(timer, "qk_norm_rope_store", [&] {
        qk_norm_rope_store(w.proj.get(), 1, st.d_pos(), L.q_norm, L.k_norm, model_->inv_freq,
                           int(c.heads), int(c.kv_heads), int(c.head_dim), int(c.rotary_dim), eps,
                           w.q.get(), w.gate.get(), st.k_cache(c, slot), st.v_cache(c, slot),
                           int(st.max_ctx), s);
      });
      timed(timer, "attention_decode", [&] {
        attention_decode(w.q.get(), w.gate.get(), st.k_cache(c, slot), st.v_cache(c, slot),
                         st.d_pos(), int(c.heads), int(c.kv_heads), int(c.head_dim),
                         int(st.max_ctx), st.attn_partial.get(), w.mix.get(), s);
      });
    }
    timed(timer, "gemv.attn_o_proj", [&] {
      proj_gemv(L.o_proj, L.q.o_proj, H, int(c.heads * c.head_dim), w.mix.get(), w.h.get(),
                GemvOut::Accumulate, s);
    });
  }
  const int E = int(c.experts), k = int(c.experts_per_token), I = int(c.expert_intermediate);
  const int Is = int(c.shared_intermediate);
  if (L.router) {
    // The post norm, the router GEMV (E + 1 rows: the shared gate logit last) and the top-k in one
    // launch; it also leaves the normalised x for the experts' gate/up.
    timed(timer, "moe_router", [&] {
      moe_router(L.router, E, H, w.h.get(), L.post_norm, eps, k, w.router.get(), w.topk_idx.get(),
                 w.topk_w.get(), w.x.get(), w.router_ws.get(), s);
    });
  } else {
    timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.post_norm, w.x.get(), 1, H, eps, s); });
    timed(timer, "gemv.router", [&] {
      proj_gemv(L.router, L.q.router, E + 1, H, w.x.get(), w.router.get(), GemvOut::Store, s);
    });
    timed(timer, "router_topk", [&] {
      router_topk(w.router.get(), E + 1, 1, E, k, w.topk_idx.get(), w.topk_w.get(), s);
    });
  }
  if (trace_) {  // the routing, to tell a near-tie flip from a wrong step (tests)
    const std::string tp = fmt::format("decode.layer{}.", li);
    auto ids = download_f32(w.topk_idx.get(), size_t(k), s);
    trace_(tp + "moe.topk_ids", ids.data(), {1, k});
    auto logits = download_f32(w.router.get(), size_t(E), s);
    trace_(tp + "moe.router_logits", logits.data(), {1, E});
  }
  timed(timer, "moe_gate_up_gemv",
        [&] { moe_gate_up_decode(L, w.topk_idx.get(), k, w.x.get(), H, I, Is, w.act.get(), s); });
  timed(timer, "moe_down_gemv", [&] {
    moe_down_decode(L, w.topk_idx.get(), w.topk_w.get(), w.router.get() + E, w.act.get(), k, H, I,
                    Is, w.h.get(), s);
  });
}

// ---- decode ---------------------------------------------------------------------------------

namespace {
// Greedy without penalties or logprobs: the token is an argmax, one launch.
bool argmax_only(const SequenceState& st) {
  return st.sampling.greedy() && !st.penalties_active && !st.sampling.logprobs &&
         st.sampling.top_logprobs == 0;
}
}  // namespace

void CudaBackend::sample_launches(CudaSequenceState& st, Timer* timer) {
  // Greedy without penalties or logprobs: one argmax launch writes the token in place (the
  // sampler's ten launches cost ~15 us; argmax ~3.5 us).
  if (argmax_only(st)) {
    timed(timer, "argmax", [&] {
      argmax(ws_->logits.get(), sampling_vocab(), ws_->argmax_ws.get(), st.d_token(), stream_);
    });
    return;
  }
  timed(timer, "sample", [&] {
    sample(ws_->logits.get(), sampling_vocab(), st.sampler_params.get(), st.output_counts.get(),
           st.seen.get(), ws_->sample_ws.get(), st.sample_out.get(), stream_);
  });
}

// Everything one decode step launches, reading the token and the position from device memory.
void CudaBackend::decode_launches(CudaSequenceState& st, bool sample, Timer* timer) {
  const ModelConfig& c = model_->config;
  Workspace& w = *ws_;
  const int H = int(c.hidden);
  // Per-kernel events between launches: no programmatic overlap while timing (launch.h).
  std::optional<ScopedPdl> no_pdl;
  if (timer) no_pdl.emplace(false);
  timed(timer, "embed", [&] { embed_rows(st.d_token(), *model_, w.h.get(), 1, H, stream_); });
  for (int64_t i = 0; i < c.layers; ++i) {
    if (trace_) {
      auto h = download_f32(w.h.get(), size_t(H), stream_);
      trace_(fmt::format("decode.hidden.{}", i), h.data(), {1, H});
    }
    layer_decode(st, i, timer);
  }
  if (trace_) {
    auto h = download_f32(w.h.get(), size_t(H), stream_);
    trace_(fmt::format("decode.hidden.{}", c.layers), h.data(), {1, H});
  }
  if (model_->lm_head) {
    timed(timer, "gemv_rms.lm_head", [&] {
      gemv_rms(model_->lm_head, int(c.vocab), H, w.h.get(), model_->final_norm, c.rms_eps,
               w.logits.get(), GemvOut::Store, stream_);
    });
  } else {
    timed(timer, "rms_norm",
          [&] { rms_norm(w.h.get(), model_->final_norm, w.x.get(), 1, H, c.rms_eps, stream_); });
    timed(timer, "gemv.lm_head", [&] {
      proj_gemv(model_->lm_head, model_->q.lm_head, int(c.vocab), H, w.x.get(), w.logits.get(),
                GemvOut::Store, stream_);
    });
  }
  if (sample) sample_launches(st, timer);
  timed(timer, "advance_position", [&] { advance_position(st.d_pos(), 1, stream_); });
}

void CudaBackend::run_decode(CudaSequenceState& st, bool sample) {
  if (!options_.use_graphs || trace_) {
    decode_launches(st, sample, nullptr);
    return;
  }
  const bool fast_greedy = argmax_only(st);
  cudaGraphExec_t& exec = !sample       ? st.graph_plain
                          : fast_greedy ? st.graph_argmax
                                        : st.graph_sample;
  if (!exec) {
    cudaGraph_t graph;
    LILAC_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      decode_launches(st, sample, nullptr);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      throw;
    }
    LILAC_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
  }
  LILAC_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

// ---- prefill --------------------------------------------------------------------------------

void CudaBackend::prefill_chunk(CudaSequenceState& st, const int32_t* ids, int T, float* logits,
                                bool all_logits, Timer* timer) {
  const ModelConfig& c = model_->config;
  Workspace& w = *ws_;
  const int H = int(c.hidden), V = int(c.vocab);
  const int pos0 = int(st.position());
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(w.ids.get(), ids, size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
  timed(timer, "embed", [&] { embed_rows(w.ids.get(), *model_, w.h.get(), T, H, stream_); });
  auto emit_rows = [&](const std::string& name, const float* d, int rows, int cols) {
    std::vector<float> host(size_t(rows) * size_t(cols));
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), d, host.size() * 4, cudaMemcpyDeviceToHost, stream_));
    LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    trace_(name, host.data(), {rows, cols});
  };
  if (trace_) emit_rows("hidden.0", w.h.get(), T, H);
  for (int64_t i = 0; i < c.layers; ++i) {
    layer_prefill(st, i, T, pos0, timer);
    if (trace_) emit_rows(fmt::format("hidden.{}", i + 1), w.h.get(), T, H);
  }
  timed(timer, "advance_position", [&] { advance_position(st.d_pos(), T, stream_); });
  st.set_position(pos0 + T);
  st.token_on_device = -1;
  if (!logits && !all_logits) return;
  // lm_head: the last row (into ws.logits row 0), or every row in groups of logit_rows.
  const int first = all_logits ? 0 : T - 1;
  for (int r0 = first; r0 < T; r0 += w.logit_rows) {
    const int n = std::min(w.logit_rows, T - r0);
    timed(timer, "rms_norm", [&] {
      rms_norm(w.h.get() + size_t(r0) * size_t(H), model_->final_norm, w.x.get(), n, H, c.rms_eps,
               stream_);
    });
    if (n == 1)
      timed(timer, "gemv.lm_head", [&] {
        proj_gemv(model_->lm_head, model_->q.lm_head, V, H, w.x.get(), w.logits.get(),
                  GemvOut::Store, stream_);
      });
    else
      timed(timer, "gemm.lm_head", [&] {
        proj_gemm(w.x.get(), n, H, model_->lm_head, model_->q.lm_head, V, w.logits.get(),
                  GemmOut::StoreF32, stream_);
      });
    if (trace_) {
      std::vector<float> xf(size_t(n) * size_t(H));
      std::vector<uint16_t> xb(xf.size());
      LILAC_CUDA_CHECK(
          cudaMemcpyAsync(xb.data(), w.x.get(), xb.size() * 2, cudaMemcpyDeviceToHost, stream_));
      LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t j = 0; j < xf.size(); ++j) xf[j] = bf16_to_f32(xb[j]);
      trace_("final_norm", xf.data(), {n, H});
    }
    if (logits) {
      float* dst = logits + (all_logits ? size_t(r0) * size_t(V) : 0);
      LILAC_CUDA_CHECK(cudaMemcpyAsync(dst, w.logits.get(), size_t(n) * size_t(V) * 4,
                                       cudaMemcpyDeviceToHost, stream_));
    }
  }
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- Backend API ----------------------------------------------------------------------------

namespace {

void check_ids(std::span<const int32_t> ids, int64_t vocab) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail("token id {} out of range [0, {})", id, vocab);
}

}  // namespace

void CudaBackend::forward(SequenceState& state, std::span<const int32_t> ids,
                          std::span<float> logits, bool all_logits) {
  auto& st = static_cast<CudaSequenceState&>(state);
  const ModelConfig& c = model_->config;
  const int64_t T = int64_t(ids.size()), V = c.vocab;
  if (T == 0) return;
  if (st.position() + T > st.max_ctx)
    fail("context overflow: {} tokens in the sequence + {} new > context size {}", st.position(), T,
         st.max_ctx);
  const int64_t n_out = all_logits ? T : 1;
  if (!logits.empty() && int64_t(logits.size()) < n_out * V)
    fail("forward: logits buffer holds {} floats, needs {}", logits.size(), n_out * V);
  check_ids(ids, V);
  last_context_ = st.position() + T;

  if (T == 1) {  // a decode step (un-graphed when traced: the same launches)
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.d_token(), ids.data(), 4, cudaMemcpyHostToDevice, stream_));
    run_decode(st, /*sample=*/false);
    st.set_position(st.position() + 1);
    st.token_on_device = -1;
    if (!logits.empty())
      LILAC_CUDA_CHECK(cudaMemcpyAsync(logits.data(), ws_->logits.get(), size_t(V) * 4,
                                       cudaMemcpyDeviceToHost, stream_));
    LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  const int64_t chunk = ws_->max_T;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int n = int(std::min(chunk, T - t0));
    const bool last = t0 + n == T;
    float* out = nullptr;
    if (!logits.empty() && (all_logits || last))
      out = logits.data() + (all_logits ? size_t(t0) * size_t(V) : 0);
    prefill_chunk(st, ids.data() + t0, n, out, all_logits && out, nullptr);
  }
}

void CudaBackend::begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                                 const SamplingParams& params) {
  Backend::begin_sampling(state, prompt, params);
  auto& st = static_cast<CudaSequenceState&>(state);
  DeviceSamplingParams p;
  p.temperature = params.temperature;
  p.top_k = params.top_k;
  p.top_p = params.top_p;
  p.min_p = params.min_p;
  p.presence_penalty = params.presence_penalty;
  p.frequency_penalty = params.frequency_penalty;
  p.repetition_penalty = params.repetition_penalty;
  p.top_logprobs = std::clamp(params.top_logprobs, 0, kMaxTopLogprobs);
  p.seed = params.seed;
  p.step = 0;
  p.advance = 1;  // the device records each sampled token in the penalty state
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(st.sampler_params.get(), &p, sizeof(p), cudaMemcpyHostToDevice, stream_));
  if (st.penalties_active) {
    std::vector<int32_t> counts(size_t(model_->config.vocab), 0);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.output_counts.get(), counts.data(), counts.size() * 4,
                                     cudaMemcpyHostToDevice, stream_));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.seen.get(), st.penalties.seen.data(),
                                     st.penalties.seen.size(), cudaMemcpyHostToDevice, stream_));
  }
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

StepResult CudaBackend::step(SequenceState& state, std::span<const int32_t> ids,
                             uint64_t sample_index) {
  auto& st = static_cast<CudaSequenceState&>(state);
  const ModelConfig& c = model_->config;
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("step: no input ids");
  if (st.position() + T > st.max_ctx)
    fail("context overflow: {} tokens in the sequence + {} new > context size {}", st.position(), T,
         st.max_ctx);
  check_ids(ids, c.vocab);
  last_context_ = st.position() + T;
  // The Philox counter of this sample.
  LILAC_CUDA_CHECK(cudaMemcpyAsync(
      reinterpret_cast<uint8_t*>(st.sampler_params.get()) + offsetof(DeviceSamplingParams, step),
      &sample_index, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
  if (T == 1 && !trace_) {
    // The previous sampled token is already in device memory: no copy, the graph reads it.
    if (ids[0] != st.token_on_device)
      LILAC_CUDA_CHECK(
          cudaMemcpyAsync(st.d_token(), ids.data(), 4, cudaMemcpyHostToDevice, stream_));
    run_decode(st, /*sample=*/true);
    st.set_position(st.position() + 1);
  } else {
    const int64_t chunk = ws_->max_T;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int n = int(std::min(chunk, T - t0));
      const bool last = t0 + n == T;
      prefill_chunk(st, ids.data() + t0, n, nullptr, false, nullptr);
      if (last) {
        // lm_head on the last row, then the device sampler.
        const int H = int(c.hidden);
        rms_norm(ws_->h.get() + size_t(n - 1) * size_t(H), model_->final_norm, ws_->x.get(), 1, H,
                 c.rms_eps, stream_);
        proj_gemv(model_->lm_head, model_->q.lm_head, int(c.vocab), H, ws_->x.get(),
                  ws_->logits.get(), GemvOut::Store, stream_);
        sample_launches(st, nullptr);
      }
    }
  }
  DeviceSampleResult out;
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(&out, st.sample_out.get(), sizeof(out), cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  st.token_on_device = out.token;
  StepResult r;
  r.token = out.token;
  // The argmax fast path writes only the token (its logprob was not asked for).
  const bool fast_greedy = argmax_only(st);
  if (!fast_greedy) {
    r.logprob = out.logprob;
    for (int i = 0; i < out.n_top; ++i) r.top.emplace_back(out.top_ids[i], out.top_logprobs[i]);
  }
  if (st.penalties_active) st.penalties.add_output(r.token);
  return r;
}

std::pair<std::vector<float>, std::vector<float>> CudaBackend::gdn_state(const SequenceState& state,
                                                                         int64_t layer) {
  const auto& st = static_cast<const CudaSequenceState&>(state);
  const ModelConfig& c = model_->config;
  if (c.layer_types[size_t(layer)] != LayerType::GatedDeltaNet)
    fail("layer {} is not a Gated DeltaNet layer", layer);
  const int slot = int(c.slot_of_layer(layer));
  std::vector<float> conv(size_t((c.gdn_conv_kernel - 1) * c.gdn_conv_channels()));
  std::vector<float> rec(size_t(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(conv.data(), st.conv_state(c, slot), conv.size() * 4,
                                   cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(rec.data(), st.rec_state(c, slot), rec.size() * 4,
                                   cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return {conv, rec};
}

// ---- profiling ------------------------------------------------------------------------------

std::vector<std::string> CudaBackend::kernel_breakdown() {
  const ModelConfig& c = model_->config;
  std::vector<std::string> lines;
  auto report = [&](const std::string& title, const Timer& t) {
    auto totals = t.totals();
    double sum = 0;
    for (auto& [n, ms, count] : totals) sum += ms;
    lines.push_back(
        fmt::format("{}: {:.1f} us in {} kernel kinds", title, sum * 1e3, totals.size()));
    std::sort(totals.begin(), totals.end(),
              [](auto& a, auto& b) { return std::get<1>(a) > std::get<1>(b); });
    for (auto& [n, ms, count] : totals)
      lines.push_back(fmt::format("  {:<24} {:>10.1f} us {:>5.1f}%  ({} launches)", n, ms * 1e3,
                                  100 * ms / sum, count));
  };
  const int64_t ctx = std::max<int64_t>(last_context_, 256);
  {
    auto seq = new_sequence(ctx + 2);
    auto& st = static_cast<CudaSequenceState&>(*seq);
    // Timing only: the cache rows up to ctx hold zeros, which costs the same bytes as real keys.
    const int32_t pos = int32_t(ctx);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.d_pos(), &pos, 4, cudaMemcpyHostToDevice, stream_));
    decode_launches(st, true, nullptr);  // warm-up
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.d_pos(), &pos, 4, cudaMemcpyHostToDevice, stream_));
    Timer t(stream_);
    decode_launches(st, true, &t);
    report(fmt::format("decode step at context {} (un-graphed, per-kernel events)", ctx), t);
  }
  {
    // The step as decoding runs it (one graph replay, greedy), replayed back to back: the GPU's
    // time per step without the host round trip that separates the steps of step().
    constexpr int kReplays = 20;
    auto seq = new_sequence(ctx + 2 + kReplays);
    auto& st = static_cast<CudaSequenceState&>(*seq);
    SamplingParams greedy;
    greedy.temperature = 0;
    begin_sampling(st, {}, greedy);
    const int32_t pos = int32_t(ctx);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.d_pos(), &pos, 4, cudaMemcpyHostToDevice, stream_));
    run_decode(st, true);  // capture and warm-up
    LILAC_CUDA_CHECK(cudaMemcpyAsync(st.d_pos(), &pos, 4, cudaMemcpyHostToDevice, stream_));
    cudaEvent_t a, b;
    LILAC_CUDA_CHECK(cudaEventCreate(&a));
    LILAC_CUDA_CHECK(cudaEventCreate(&b));
    LILAC_CUDA_CHECK(cudaEventRecord(a, stream_));
    for (int i = 0; i < kReplays; ++i) run_decode(st, true);
    LILAC_CUDA_CHECK(cudaEventRecord(b, stream_));
    LILAC_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    lines.push_back(fmt::format(
        "decode step at context {} as a graph replay, {} back to back: {:.1f} us ({:.1f} tok/s; "
        "GPU time, no host round trip between steps)",
        ctx, kReplays, 1e3 * ms / kReplays, kReplays / (1e-3 * ms)));
  }
  {
    const int T = int(std::min<int64_t>(ws_->max_T, 4096));
    auto seq = new_sequence(T + 1);
    auto& st = static_cast<CudaSequenceState&>(*seq);
    std::vector<int32_t> ids = std::vector<int32_t>(size_t(T), 1);
    prefill_chunk(st, ids.data(), T, nullptr, false, nullptr);  // warm-up
    auto seq2 = new_sequence(T + 1);
    Timer t(stream_);
    prefill_chunk(static_cast<CudaSequenceState&>(*seq2), ids.data(), T, nullptr, false, &t);
    report(fmt::format("prefill chunk of {} tokens at position 0", T), t);
  }
  (void)c;
  return lines;
}

// ---- factories ------------------------------------------------------------------------------

std::unique_ptr<CudaBackend> make_cuda_backend(const Model& model, bool quantize) {
  return std::make_unique<CudaBackend>(std::shared_ptr<DeviceModel>(upload_model(model, quantize)),
                                       CudaOptions::from_environment());
}

std::unique_ptr<CudaBackend> make_synthetic_backend(const std::string& weights, uint64_t seed) {
  if (weights != "bf16" && weights != "q4")
    fail("--weights {}: the synthetic model is bf16 or q4", weights);
  auto backend = std::make_unique<CudaBackend>(std::shared_ptr<DeviceModel>(synthetic_device_model(
                                                   qwen36_35b_a3b_config(), seed, weights == "q4")),
                                               CudaOptions::from_environment());
  backend->set_sampling_vocab(kQwen36RealTokens);
  return backend;
}

}  // namespace lilac::cuda
