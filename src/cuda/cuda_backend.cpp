// CudaBackend: construction, sequences and their device state, the Backend API (forward, sampling
// steps), decode graphs, profiling and the factories. The launch sequences themselves (a layer, a
// decode step, a prefill chunk) are in cuda_backend_layers.cpp; see docs/cuda-design.md.
#include "cuda/cuda_backend.h"

#include "cuda/cuda_backend_state.h"

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
#include "cuda/gemv_rows.h"
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
#include "util/env_choice.h"
#include "util/error.h"
#include "util/half.h"

namespace lilac::cuda {

// ---- construction ---------------------------------------------------------------------------

CudaOptions CudaOptions::from_environment() {
  CudaOptions o;
  if (const char* gr = std::getenv("LILAC_CUDA_GRAPHS")) o.use_graphs = std::string(gr) != "0";
  if (const char* p = std::getenv("LILAC_PDL"))
    o.pdl = std::string(p) != "0" && std::string(p) != "off";
  if (const char* b = std::getenv("LILAC_BATCH_DECODE")) o.batch_decode = std::string(b) != "0";
  if (const char* m = std::getenv("LILAC_BATCH_MIN")) o.batch_min_rows = std::max(1, std::atoi(m));
  if (const char* b = std::getenv("LILAC_BATCH_PREFILL")) o.batch_prefill = std::string(b) != "0";
  if (const char* g = std::getenv("LILAC_BATCH_GROUPED_MOE"))
    o.batch_grouped_moe_min_rows = std::max(-1, std::atoi(g));
  if (const char* m = std::getenv("LILAC_SMALL_MOE_MAX"))
    o.small_moe_max_tokens = std::max(0, std::atoi(m));
  if (const char* m = std::getenv("LILAC_SMALL_MOE_PREFILL_MAX"))
    o.small_moe_prefill_max_tokens = std::max(0, std::atoi(m));
  if (const char* q = std::getenv("LILAC_Q_GEMV_STAGED"))
    o.staged_first_projection = std::string(q) != "0";
  if (const char* f = std::getenv("LILAC_MOE_SHARED_FUSED"))
    o.fused_shared_expert = std::string(f) != "0";
  if (const char* f = std::getenv("LILAC_COMBINE_NORM"))
    o.fused_combine_norm = std::string(f) != "0";
  if (const char* f = std::getenv("LILAC_PREFILL_COMBINE_NORM"))
    o.prefill_combine_norm = std::string(f) != "0";
  if (const char* f = std::getenv("LILAC_PREFILL_MOE_Y_BF16"))
    o.prefill_moe_y_bf16 = std::string(f) != "0";
  if (const char* f = std::getenv("LILAC_MOE_PDL")) o.moe_pdl = std::string(f) != "0";
  if (const char* f = std::getenv("LILAC_GEMV_ROWS_STAGED"))
    o.gemv_rows_staged = std::string(f) != "0";
  if (const char* m = std::getenv("LILAC_Q4_WGMMA_MIN"))
    o.q4_wgmma_min_rows = std::max(1, std::atoi(m));
  if (const char* g = std::getenv("LILAC_GDN_STATE")) o.gdn_state = parse_gdn_state_format(g);
  o.gdn_batch_kernel = env_enum("LILAC_GDN_BATCH_KERNEL", o.gdn_batch_kernel,
                                {{"split", GdnBatchKernel::split},
                                 {"head", GdnBatchKernel::head},
                                 {"auto", GdnBatchKernel::automatic},
                                 {"automatic", GdnBatchKernel::automatic}});
  o.small_moe_kernel = env_enum("LILAC_SMALL_MOE_KERNEL", o.small_moe_kernel,
                                {{"registers", MoeSmallKernel::registers},
                                 {"streamed", MoeSmallKernel::streamed},
                                 {"chained", MoeSmallKernel::chained},
                                 {"auto", MoeSmallKernel::automatic},
                                 {"automatic", MoeSmallKernel::automatic}});
  o.prompt_moe = env_enum("LILAC_PROMPT_MOE", o.prompt_moe,
                          {{"small", PromptMoe::small},
                           {"tile128", PromptMoe::tile128},
                           {"rows64", PromptMoe::rows64},
                           {"rows32", PromptMoe::rows32},
                           {"auto", PromptMoe::automatic},
                           {"automatic", PromptMoe::automatic}});
  return o;
}

CudaBackend::CudaBackend(std::shared_ptr<DeviceModel> model, CudaOptions options)
    : model_(std::move(model)), options_(options), ws_(std::make_unique<Workspace>()) {
  const ModelConfig& c = model_->config;
  // The one Gated DeltaNet decode kernel needs clusters (cc 9.0): say so now, not at the first
  // step.
  if (c.count_layers(LayerType::GatedDeltaNet) > 0 &&
      !gdn_decode_uses_cluster(int(c.gdn_key_heads), int(c.gdn_value_heads), int(c.gdn_key_dim),
                               int(c.gdn_value_dim)))
    fail(
        "cuda backend: the Gated DeltaNet decode kernel needs a compute capability 9.0 GPU "
        "(Hopper) and at most 8 blocks per key head (Hk {}, Hv {}, Dk {}, Dv {})",
        c.gdn_key_heads, c.gdn_value_heads, c.gdn_key_dim, c.gdn_value_dim);
  set_pdl_enabled(options_.pdl);
  set_moe_pdl_enabled(options_.moe_pdl);
  set_gemv_rows_staged_enabled(options_.gemv_rows_staged);
  // The stream-ordered pool keeps the memory that copied states give back (make_sequence's pooled
  // buffers): the next prompt-reuse snapshot takes it from there instead of from the driver.
  {
    int dev = 0;
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
      (void)
          cudaGetLastError();  // the pool then returns memory at each synchronisation: slower only
  }
  // q_gemm_wgmma picks its split of K from occupancy queries it caches: ask them now, outside any
  // graph capture (the batched step's capture may be its first call).
  if (q_gemm_wgmma_available()) {
    for (int bt : {128, 256})
      for (int splits : {1, 2, 4}) (void)q_gemm_wgmma_max_clusters(bt, splits);
    for (int bt : {64, 32, 16})
      for (int splits : {1, 2, 4, 8}) (void)q_gemm_wgmma_max_clusters(bt, splits);
  }
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
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
  w.small_moe_chain.resize(kMoeSmallChainCounts);
  LILAC_CUDA_CHECK(cudaMemset(w.small_moe_chain.get(), 0, w.small_moe_chain.bytes()));
  w.sample_ws.resize(sample_workspace_bytes(int(c.vocab)));
  LILAC_CUDA_CHECK(cudaMemset(w.sample_ws.get(), 0, w.sample_ws.bytes()));
  const int Hk = int(c.gdn_key_heads), Hv = int(c.gdn_value_heads), Dk = int(c.gdn_key_dim),
            Dv = int(c.gdn_value_dim);
  w.gdn_prefill_ws.resize(gdn_prefill_workspace_floats(w.max_T, Hk, Hv, Dk, Dv));
  if (w.max_T > 64 && q_gemm_streamk_auto()) {  // prompt chunks of more than 64 tokens
    w.gemm_scratch.resize(q_gemm_scratch_bytes());
    if (w.gemm_scratch.bytes() > 0)
      LILAC_CUDA_CHECK(cudaMemset(w.gemm_scratch.get(), 0, w.gemm_scratch.bytes()));
  }
  w.router_ws.resize(moe_router_workspace_bytes());
  LILAC_CUDA_CHECK(cudaMemsetAsync(w.router_ws.get(), 0, w.router_ws.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::set_options(const CudaOptions& o) {
  if (o.gdn_state != options_.gdn_state)
    fail("set_options: the Gated DeltaNet state format is fixed when the backend is made ({})",
         gdn_state_format_name(options_.gdn_state));
  options_ = o;
  set_pdl_enabled(options_.pdl);
  set_moe_pdl_enabled(options_.moe_pdl);
  set_gemv_rows_staged_enabled(options_.gemv_rows_staged);
}

CudaBackend::~CudaBackend() {
  batch_.reset();  // its graphs and buffers first
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
  return make_sequence(max_context, false);
}

// A state of max_context tokens. pooled (the copies: prompt-reuse snapshots and their restores,
// which the engine makes and drops between steps, two or more per request): its buffers from the
// stream-ordered pool, and not zeroed (the copy overwrites them). Otherwise cudaMalloc'd and
// zeroed.
std::unique_ptr<CudaSequenceState> CudaBackend::make_sequence(int64_t max_context, bool pooled) {
  const ModelConfig& c = model_->config;
  auto st = std::make_unique<CudaSequenceState>();
  st->max_ctx = max_context;
  st->n_attn = int(c.count_layers(LayerType::FullAttention));
  st->n_gdn = int(c.count_layers(LayerType::GatedDeltaNet));
  auto alloc = [&](auto& buf, size_t n) {
    if (pooled)
      buf.resize_pooled(n, stream_);
    else
      buf.resize(n);
  };
  alloc(st->kv,
        size_t(st->n_attn) * 2 * size_t(c.kv_heads) * size_t(max_context) * size_t(c.head_dim));
  alloc(st->conv, size_t(st->n_gdn) * size_t((c.gdn_conv_kernel - 1) * c.gdn_conv_channels()));
  const size_t rec_n =
      size_t(st->n_gdn) * size_t(c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim);
  if (options_.gdn_state == GdnStateFormat::bf16)
    alloc(st->rec_bf16, rec_n);
  else
    alloc(st->rec, rec_n);
  alloc(st->scalars, 1);
  alloc(st->sample_out, 1);
  alloc(st->sampler_params, 1);
  alloc(st->output_counts, size_t(c.vocab));
  alloc(st->seen, size_t(c.vocab));
  if (st->n_attn > 0)
    alloc(st->attn_partial, attention_decode_workspace_floats(int(c.heads), int(c.kv_heads),
                                                              int(c.head_dim), int(max_context)));
  if (pooled) return st;
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->conv.get(), 0, st->conv.bytes(), stream_));
  st->zero_rec_state(stream_);
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->scalars.get(), 0, st->scalars.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->sample_out.get(), 0, st->sample_out.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->output_counts.get(), 0, st->output_counts.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaMemsetAsync(st->seen.get(), 0, st->seen.bytes(), stream_));
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
  auto dst = make_sequence(max_context, /*pooled=*/true);
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
  if (src.rec.bytes())
    LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->rec.get(), src.rec.get(), src.rec.bytes(),
                                     cudaMemcpyDeviceToDevice, stream_));
  if (src.rec_bf16.bytes())
    LILAC_CUDA_CHECK(cudaMemcpyAsync(dst->rec_bf16.get(), src.rec_bf16.get(), src.rec_bf16.bytes(),
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
  return st.kv.bytes() + st.conv.bytes() + st.rec.bytes() + st.rec_bf16.bytes() +
         st.output_counts.bytes() + st.seen.bytes();
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
  // advance: the device records each sampled token in the penalty state.
  const DeviceSamplingParams p = device_sampling_params(params, 0, 1);
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
  return step_impl(state, ids, sample_index, nullptr);
}

StepResult CudaBackend::step_constrained(SequenceState& state, std::span<const int32_t> ids,
                                         uint64_t sample_index, TokenConstraint& constraint) {
  return step_impl(state, ids, sample_index, &constraint);
}

// The mask of `constraint` applied to the logits of the step just launched (the host computes it
// while the device works; the copy from pinned memory does not wait for the device).
void CudaBackend::launch_token_mask(TokenConstraint& constraint) {
  const size_t words = (size_t(sampling_vocab()) + 31) / 32;
  if (ws_->mask.size() < words) {
    ws_->mask.resize(words);
    ws_->mask_host = std::make_unique<PinnedWords>(words);
  }
  std::span<uint32_t> host(ws_->mask_host->data(), words);
  std::fill(host.begin(), host.end(), 0u);
  constraint.allowed_tokens(host);
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(ws_->mask.get(), host.data(), words * 4, cudaMemcpyHostToDevice, stream_));
  mask_logits(ws_->logits.get(), sampling_vocab(), ws_->mask.get(), stream_);
}

StepResult CudaBackend::step_impl(SequenceState& state, std::span<const int32_t> ids,
                                  uint64_t sample_index, TokenConstraint* constraint) {
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
    if (constraint) {  // the step without its sampler, then the mask, then the sampler
      run_decode(st, /*sample=*/false);
      launch_token_mask(*constraint);
      sample_launches(st, nullptr);
    } else {
      run_decode(st, /*sample=*/true);
    }
    st.set_position(st.position() + 1);
  } else {
    const int64_t chunk = ws_->max_T;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int n = int(std::min(chunk, T - t0));
      const bool last = t0 + n == T;
      prefill_chunk(st, ids.data() + t0, n, nullptr, false, nullptr);
      if (last) launch_row_sample(st, n - 1, sample_index, constraint);
    }
  }
  DeviceSampleResult out;
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(&out, st.sample_out.get(), sizeof(out), cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return take_sample(st, out);
}

void CudaBackend::launch_row_sample(CudaSequenceState& st, int row, uint64_t sample_index,
                                    TokenConstraint* constraint) {
  const ModelConfig& c = model_->config;
  const int H = int(c.hidden);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(
      reinterpret_cast<uint8_t*>(st.sampler_params.get()) + offsetof(DeviceSamplingParams, step),
      &sample_index, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
  rms_norm(ws_->h.get() + size_t(row) * size_t(H), model_->final_norm, ws_->x.get(), 1, H,
           c.rms_eps, stream_);
  proj_gemv(model_->lm_head, int(c.vocab), H, ws_->x.get(), ws_->logits.get(), GemvOut::Store,
            stream_);
  if (constraint) launch_token_mask(*constraint);
  sample_launches(st, nullptr);
}

StepResult CudaBackend::take_sample(CudaSequenceState& st, const DeviceSampleResult& out) {
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
  std::vector<uint16_t> rec16(st.rec_bf16.bytes() ? rec.size() : 0);  // bf16 bits
  st.with_rec_state(c, slot, [&](auto* p) {
    void* dst = rec16.empty() ? static_cast<void*>(rec.data()) : rec16.data();
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(dst, p, rec.size() * sizeof(*p), cudaMemcpyDeviceToHost, stream_));
  });
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < rec16.size(); ++i) rec[i] = bf16_to_f32(rec16[i]);
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
  // A short prompt (every expert sees ~8 tokens) and a long one. Distinct token ids: with one
  // repeated id every token routes to the same experts and the MoE looks far cheaper than it is.
  for (const int64_t want : {int64_t(256), int64_t(4096)}) {
    const int T = int(std::min<int64_t>(ws_->max_T, want));
    auto seq = new_sequence(T + 1);
    auto& st = static_cast<CudaSequenceState&>(*seq);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int i = 0; i < T; ++i)
      ids[size_t(i)] = int32_t((1 + int64_t(i) * 7919) % sampling_vocab());
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

std::unique_ptr<CudaBackend> make_cuda_backend(const ModelConfig& config,
                                               const ModelWeights& weights,
                                               const std::string& checkpoint_dir, bool quantize,
                                               const CudaOptions& options) {
  return std::make_unique<CudaBackend>(
      std::shared_ptr<DeviceModel>(upload_model(config, weights, checkpoint_dir, quantize)),
      options);
}

std::unique_ptr<CudaBackend> make_synthetic_backend(const std::string& weights, uint64_t seed,
                                                    SyntheticRouter router,
                                                    const CudaOptions& options) {
  if (weights != "bf16" && weights != "q4")
    fail("--weights {}: the synthetic model is bf16 or q4", weights);
  auto backend =
      std::make_unique<CudaBackend>(std::shared_ptr<DeviceModel>(synthetic_device_model(
                                        qwen36_35b_a3b_config(), seed, weights == "q4", router)),
                                    options);
  backend->set_sampling_vocab(kQwen36RealTokens);
  return backend;
}

}  // namespace lilac::cuda
