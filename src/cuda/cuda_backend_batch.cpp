// CudaBackend::step_batch: B sequences decode one token each in one batched pass (one CUDA graph
// replay per pass, captured once per batch size B). The per-sequence state stays where it is (a
// CudaSequenceState per sequence); the pass reads it through a descriptor array (DecodeBatchRow:
// each row's KV cache, conv and recurrent state, position counter, position), uploaded with the B
// token ids in one host-to-device copy before the replay. Per layer (docs/cuda-design.md, "Batched
// decode"):
//   rms_norm over B rows -> the dense projection as a GEMM with M = B (each weight read once for
//   all rows) -> gdn_decode_batch / attention_decode_qkv_batch (grid z = the row, its own state
//   and length) -> out/o projection GEMM (+= h) -> rms_norm -> router GEMM -> router_topk over B
//   rows -> the decode MoE kernels with a grid row per token (moe_*_gemv with B).
// Then rms_norm + lm_head GEMM over B rows, argmax_batch (greedy rows), the position counters
// advanced on the device. Rows that need the full sampler (temperature, penalties, logprobs) run
// the per-sequence sampler on their logits row after the replay. The host reads back the B tokens.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <set>

#include "cuda/attention.h"
#include "cuda/cuda_backend_state.h"
#include "cuda/decode_batch.h"
#include "cuda/gated_deltanet.h"
#include "cuda/gemv_rows.h"
#include "cuda/launch.h"
#include "cuda/position.h"

namespace lilac::cuda {

namespace {

constexpr int kSortedMoeMinRows = 32;

// A dense projection over the B rows, each weight read once, the tokens as the MMA's n
// dimension: 4-bit weights through q_gemv_rows below options.q4_wgmma_min_rows rows, from there on
// Hopper through q_gemm_wgmma's small-M form (64-token blocks, 2 per SM, K split over a cluster of
// up to 8 when the row blocks are few; s7: q_gemv_rows' eight 8-token chunks per MMA row made
// in_proj 38 us at 64 rows; s18: the small-M form); 8-bit weights
// through q_gemv_rows; BF16 through gemv_rows up to 32 rows and for the layers' matrices; the GEMM
// for the lm_head (its tiles fill the GPU at any M) and from 33 rows (gemv_rows' per-chunk MMAs
// then cost more than the GEMM's tiles: run 6, docs/performance.md), except for the matrices of
// few row tiles (out_proj, o_proj: 2048 rows; the router) where gemv_rows' staged form applies:
// at M <= 64 the GEMM's 128-column tiles leave most SMs idle there (s13: out_proj 51 us, the
// router 23 us per 64-row call through the GEMM). The 4-bit GEMM multiplies
// the bf16-rounded weights (prefill's numerics) where q_gemv_rows has the decode kernels' exact
// ones: both within the batch tests' tolerance of the single-sequence step.
void rows_proj(const bf16* x, int B, int K, const DeviceMatrix& w, int N, float* y, bool accumulate,
               int q4_wgmma_min_rows, cudaStream_t s) {
  const GemvOut mode = accumulate ? GemvOut::Accumulate : GemvOut::Store;
  if (w.affine() && w.q.bits == 4 && B >= q4_wgmma_min_rows && q_gemm_wgmma_available())
    q_gemm_wgmma(x, B, w.q, y, accumulate ? GemmOut::AccumulateF32 : GemmOut::StoreF32, s);
  else if (w.affine())
    q_gemv_rows(w.q, x, B, y, mode, s);
  else if (K % 64 == 0 && N <= 65536 && (B <= 32 || (N <= 4096 && gemv_rows_staged_takes(N, K, B))))
    gemv_rows(w.dense, N, K, x, B, y, mode, s);
  else
    gemm(x, B, K, w.dense, N, y, accumulate ? GemmOut::AccumulateF32 : GemmOut::StoreF32, s);
}

// Device addresses of the descriptor's parts (no dereference of the device pointer).
const DecodeBatchRow* rows_of(BatchUpload* d) {
  return reinterpret_cast<const DecodeBatchRow*>(reinterpret_cast<const char*>(d) +
                                                 offsetof(BatchUpload, rows));
}
const int32_t* ids_of(BatchUpload* d) {
  return reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(d) +
                                          offsetof(BatchUpload, ids));
}

}  // namespace

BatchWorkspace& CudaBackend::batch_ws() {
  if (batch_) return *batch_;
  const ModelConfig& c = model_->config;
  auto b = std::make_unique<BatchWorkspace>();
  b->max_B = std::min({kMaxBatchRows, ws_->max_T, ws_->logit_rows});
  const size_t B = size_t(b->max_B), k = size_t(c.experts_per_token);
  b->upload.resize(1);
  void* host = nullptr;
  LILAC_CUDA_CHECK(cudaMallocHost(&host, sizeof(BatchUpload)));
  b->upload_host = new (host) BatchUpload();
  LILAC_CUDA_CHECK(cudaMallocHost(&host, B * sizeof(int32_t)));
  b->tokens_host = static_cast<int32_t*>(host);
  b->tokens.resize(B);
  b->topk_idx.resize(B * k);
  b->topk_w.resize(B * k);
  b->order.resize(B * k);
  b->act.resize(B * (k * size_t(c.expert_intermediate) + size_t(c.shared_intermediate)));
  if (c.count_layers(LayerType::GatedDeltaNet) > 0)
    b->gdn_ws.resize(gdn_decode_batch_workspace_floats(b->max_B, int(c.gdn_key_heads),
                                                       int(c.gdn_value_heads), int(c.gdn_key_dim),
                                                       int(c.gdn_value_dim)));
  if (c.count_layers(LayerType::FullAttention) > 0)
    b->attn_partial.resize(attention_decode_batch_workspace_floats(
        b->max_B, int(c.heads), int(c.kv_heads), int(c.head_dim)));
  b->argmax_ws.resize(B * argmax_workspace_bytes(int(c.vocab)));
  LILAC_CUDA_CHECK(cudaMemsetAsync(b->argmax_ws.get(), 0, b->argmax_ws.bytes(), stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  batch_ = std::move(b);
  return *batch_;
}

// ---- the launches of one pass -----------------------------------------------------------------

// `normed`: the previous layer's combine already wrote this layer's input norm into x. Returns
// whether this layer's combine wrote the next one's (the next layer's input norm, or the final
// norm after the last layer).
bool CudaBackend::batch_layer(int64_t li, int B, bool grouped_moe, bool normed, Timer* timer) {
  const ModelConfig& c = model_->config;
  const DeviceLayer& L = model_->layers[size_t(li)];
  Workspace& w = *ws_;
  BatchWorkspace& bw = *batch_;
  const DecodeBatchRow* rows = rows_of(bw.upload.get());
  const int H = int(c.hidden), slot = int(c.slot_of_layer(li));
  const float eps = c.rms_eps;
  cudaStream_t s = stream_;

  if (!normed)
    timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.input_norm, w.x.get(), B, H, eps, s); });
  if (L.type == LayerType::GatedDeltaNet) {
    const int cols = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
    timed(timer, "proj.gdn_in_proj", [&] {
      rows_proj(w.x.get(), B, H, L.in_proj, cols, w.proj.get(), false, options_.q4_wgmma_min_rows,
                s);
    });
    timed(timer, "gdn_decode_batch", [&] {
      gdn_decode_batch(w.proj.get(), B, rows, slot, L.conv, L.neg_exp_A, L.dt_bias, L.gdn_norm,
                       int(c.gdn_key_heads), int(c.gdn_value_heads), int(c.gdn_key_dim),
                       int(c.gdn_value_dim), int(c.gdn_conv_kernel), eps, bw.gdn_ws.get(),
                       w.mix.get(), s, options_.gdn_state, options_.gdn_batch_kernel);
    });
    timed(timer, "proj.gdn_out_proj", [&] {
      rows_proj(w.mix.get(), B, int(c.gdn_v_channels()), L.out_proj, H, w.h.get(), true,
                options_.q4_wgmma_min_rows, s);
    });
  } else {
    const int cols = int(c.q_proj_rows() + 2 * c.kv_dim());
    timed(timer, "proj.attn_qkv", [&] {
      rows_proj(w.x.get(), B, H, L.qkv_proj, cols, w.proj.get(), false, options_.q4_wgmma_min_rows,
                s);
    });
    timed(timer, "attention_decode_batch", [&] {
      attention_decode_qkv_batch(w.proj.get(), B, rows, slot, L.q_norm, L.k_norm, model_->inv_freq,
                                 int(c.heads), int(c.kv_heads), int(c.head_dim), int(c.rotary_dim),
                                 eps, bw.attn_partial.get(), w.mix.get(), s);
    });
    timed(timer, "proj.attn_o_proj", [&] {
      rows_proj(w.mix.get(), B, int(c.heads * c.head_dim), L.o_proj, H, w.h.get(), true,
                options_.q4_wgmma_min_rows, s);
    });
  }
  const int E = int(c.experts), k = int(c.experts_per_token), I = int(c.expert_intermediate);
  const int Is = int(c.shared_intermediate);
  timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.post_norm, w.x.get(), B, H, eps, s); });
  timed(timer, "proj.router", [&] {
    rows_proj(w.x.get(), B, H, L.router, E + 1, w.router.get(), false, options_.q4_wgmma_min_rows,
              s);
  });
  if (grouped_moe) {  // as prefill: tokens grouped by expert, each touched expert read once
    MoeRouting r = moe_routing_layout(w.routing.get(), B, E, k);
    timed(timer, "moe_route", [&] { moe_route(w.router.get(), E + 1, B, E, k, r, s); });
    moe_experts(L, c, w, B, r, options_.small_moe_max_tokens, options_.small_moe_kernel,
                options_.fused_shared_expert, timer, s);
    // The next norm (the next layer's input norm, or the final one) in the combine's blocks.
    const float* next_norm =
        li + 1 < c.layers ? model_->layers[size_t(li) + 1].input_norm : model_->final_norm;
    const bool fuse = options_.fused_combine_norm &&
                      moe_combine_norm_supported(H, w.h.get(), next_norm, w.x.get());
    timed(timer, fuse ? "moe_combine+rms_norm" : "moe_combine", [&] {
      moe_combine(w.y.get(), r, w.router.get(), E + 1, w.shared_out.get(), H, w.h.get(), s,
                  fuse ? next_norm : nullptr, w.x.get(), eps);
    });
    return fuse;
  }
  timed(timer, "router_topk", [&] {
    router_topk(w.router.get(), E + 1, B, E, k, bw.topk_idx.get(), bw.topk_w.get(), s);
  });
  if (L.gate_up.affine()) {
    // From 32 rows on, the pairs in expert order (a shared expert's weights come from L2); below,
    // the sort costs more than the repeats it saves (run 3: docs/performance.md).
    const bool sorted = B >= kSortedMoeMinRows;
    if (sorted)
      timed(timer, "moe_sort_pairs",
            [&] { moe_sort_pairs(bw.topk_idx.get(), B * k, bw.order.get(), s); });
    timed(timer, "moe_gate_up_rows", [&] {
      q_moe_gate_up_gemv(L.gate_up.q, L.shared_gate_up.q, bw.topk_idx.get(), k, w.x.get(), H, I, Is,
                         bw.act.get(), s, B, sorted ? bw.order.get() : nullptr);
    });
  } else
    timed(timer, "moe_gate_up_rows", [&] {
      moe_gate_up_gemv(L.gate_up.dense, L.shared_gate_up.dense, bw.topk_idx.get(), k, w.x.get(), H,
                       I, Is, bw.act.get(), s, B);
    });
  if (L.down.affine())
    timed(timer, "moe_down_rows", [&] {
      q_moe_down_gemv(L.down.q, L.shared_down.q, bw.topk_idx.get(), bw.topk_w.get(),
                      w.router.get() + E, bw.act.get(), k, H, I, Is, w.h.get(), s, B, E + 1);
    });
  else
    timed(timer, "moe_down_rows", [&] {
      moe_down_gemv(L.down.dense, L.shared_down.dense, bw.topk_idx.get(), bw.topk_w.get(),
                    w.router.get() + E, bw.act.get(), k, H, I, Is, w.h.get(), s, B, E + 1);
    });
  return false;
}

void CudaBackend::batch_launches(int B, bool grouped_moe, Timer* timer) {
  const ModelConfig& c = model_->config;
  Workspace& w = *ws_;
  BatchWorkspace& bw = *batch_;
  const int H = int(c.hidden), V = int(c.vocab);
  timed(timer, "embed",
        [&] { embed_rows(ids_of(bw.upload.get()), *model_, w.h.get(), B, H, stream_); });
  bool normed = false;
  for (int64_t i = 0; i < c.layers; ++i) normed = batch_layer(i, B, grouped_moe, normed, timer);
  if (!normed)
    timed(timer, "rms_norm",
          [&] { rms_norm(w.h.get(), model_->final_norm, w.x.get(), B, H, c.rms_eps, stream_); });
  timed(timer, "proj.lm_head", [&] {
    rows_proj(w.x.get(), B, H, model_->lm_head, V, w.logits.get(), false,
              options_.q4_wgmma_min_rows, stream_);
  });
  timed(timer, "argmax_batch", [&] {
    argmax_batch(w.logits.get(), sampling_vocab(), size_t(V), B, bw.argmax_ws.get(),
                 bw.tokens.get(), stream_);
  });
  timed(timer, "finish_decode_batch",
        [&] { finish_decode_batch(rows_of(bw.upload.get()), B, stream_); });
}

bool CudaBackend::batch_grouped_moe(int B) const {
  int min_grouped = options_.batch_grouped_moe_min_rows;
  if (min_grouped < 0) {  // the default: measured crossovers (docs/performance.md)
    const bool q4_experts = !model_->layers.empty() && model_->layers[0].gate_up.affine();
    if (!q4_experts)
      min_grouped = 16;
    else  // the small-M kernels from 8 rows (run 7); without them the per-token kernels always
      min_grouped = small_moe(model_->layers[0], B, options_.small_moe_max_tokens) ? 8 : 0;
  }
  return min_grouped > 0 && B >= min_grouped;
}

cudaGraphExec_t CudaBackend::batch_graph(int B) {
  BatchWorkspace& bw = batch_ws();
  const bool grouped = batch_grouped_moe(B);
  cudaGraphExec_t& exec = bw.graphs[{B, grouped}];
  if (!exec) {
    cudaGraph_t graph;
    LILAC_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      batch_launches(B, grouped, nullptr);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      bw.graphs.erase({B, grouped});
      throw;
    }
    LILAC_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    LILAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
  }
  return exec;
}

void CudaBackend::run_batch_graph(int B) {
  if (!options_.use_graphs) {
    batch_launches(B, batch_grouped_moe(B), nullptr);
    return;
  }
  LILAC_CUDA_CHECK(cudaGraphLaunch(batch_graph(B), stream_));
}

size_t CudaBackend::batch_graph_count() const {
  return batch_ ? batch_->graphs.size() : 0;
}

// The batched pass needs the batched Gated DeltaNet kernel (the cluster kernel, cc 9.0).
bool CudaBackend::batched_pass_available() const {
  const ModelConfig& c = model_->config;
  return c.count_layers(LayerType::GatedDeltaNet) == 0 ||
         gdn_decode_uses_cluster(int(c.gdn_key_heads), int(c.gdn_value_heads), int(c.gdn_key_dim),
                                 int(c.gdn_value_dim));
}

// A fresh server's first busy seconds otherwise pay for what the warm-up's one tiny step did not
// touch (s9 runs 2-4: a fresh server's HTTP run at 16 clients took 33 ms longer than the same run
// again): a graph capture at each new batch size (the ramp as clients arrive, the tail as they
// finish) and each graph's upload at its first replay; the kernels of a full multi-sequence
// prefill chunk, loaded at their first launch; and the memory of the first prompt-reuse copies,
// which the stream-ordered pool then takes from the driver.
void CudaBackend::prepare_batches(int max_sequences) {
  if (options_.use_graphs && options_.batch_decode && batched_pass_available()) {
    const int hi = std::min(max_sequences, batch_ws().max_B);
    for (int B = std::max(2, options_.batch_min_rows); B <= hi; ++B)
      LILAC_CUDA_CHECK(cudaGraphUpload(batch_graph(B), stream_));
  }
  // One prefill chunk of pieces of up to 4 sequences, each sampling its next token; the
  // sequences' buffers come from the pool and go back to it.
  const int n = std::clamp(max_sequences, 1, 4);
  const int piece = int(std::max<int64_t>(1, ws_->max_T / n));
  const std::vector<int32_t> ids(static_cast<size_t>(piece), 0);
  std::vector<std::unique_ptr<CudaSequenceState>> seqs;
  std::vector<BatchItem> items;
  for (int i = 0; i < n; ++i) {
    seqs.push_back(make_sequence(piece + 1, /*pooled=*/true));
    CudaSequenceState& st = *seqs.back();
    LILAC_CUDA_CHECK(cudaMemsetAsync(st.conv.get(), 0, st.conv.bytes(), stream_));
    st.zero_rec_state(stream_);
    LILAC_CUDA_CHECK(cudaMemsetAsync(st.scalars.get(), 0, st.scalars.bytes(), stream_));
    begin_sampling(st, {}, SamplingParams{});
    items.push_back({&st, ids, 0, true, nullptr});
  }
  step_batch(items);
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::upload_batch(std::span<CudaSequenceState* const> seqs,
                               std::span<const int32_t> ids) {
  BatchWorkspace& bw = batch_ws();
  BatchUpload& u = *bw.upload_host;
  for (size_t b = 0; b < seqs.size(); ++b) {
    CudaSequenceState& st = *seqs[b];
    DecodeBatchRow r;
    r.kv = st.kv.get();
    r.conv = st.conv.get();
    r.rec = st.rec.get();
    r.rec_bf16 = st.rec_bf16.get();
    // The pass's kernels take one format, the backend's (set_options cannot change it).
    if ((options_.gdn_state == GdnStateFormat::bf16) != (r.rec_bf16 != nullptr))
      fail("step_batch: a sequence's recurrent state is not in the backend's format ({})",
           gdn_state_format_name(options_.gdn_state));
    r.d_pos = st.d_pos();
    r.max_ctx = int32_t(st.max_ctx);
    r.pos = int32_t(st.position());
    u.rows[b] = r;
    u.ids[b] = ids[b];
  }
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(bw.upload.get(), &u, sizeof(BatchUpload), cudaMemcpyHostToDevice, stream_));
}

// One pass over seqs.size() <= max_B distinct sequences, each consuming ids[b].
void CudaBackend::decode_batch(std::span<CudaSequenceState* const> seqs,
                               std::span<const int32_t> ids, std::span<const uint64_t> sample_index,
                               std::span<StepResult> out) {
  const ModelConfig& c = model_->config;
  const int B = int(seqs.size());
  const size_t V = size_t(c.vocab);
  upload_batch(seqs, ids);
  BatchWorkspace& bw = *batch_;
  run_batch_graph(B);
  // Rows that need the full sampler: the per-sequence sampler on their logits row.
  std::vector<DeviceSampleResult> sampled(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    CudaSequenceState& st = *seqs[size_t(b)];
    if (argmax_only(st)) continue;
    LILAC_CUDA_CHECK(cudaMemcpyAsync(
        reinterpret_cast<uint8_t*>(st.sampler_params.get()) + offsetof(DeviceSamplingParams, step),
        &sample_index[size_t(b)], sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
    sample(ws_->logits.get() + size_t(b) * V, sampling_vocab(), st.sampler_params.get(),
           st.output_counts.get(), st.seen.get(), ws_->sample_ws.get(), st.sample_out.get(),
           stream_, sampler_path(st.sampling.top_k));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(&sampled[size_t(b)], st.sample_out.get(),
                                     sizeof(DeviceSampleResult), cudaMemcpyDeviceToHost, stream_));
  }
  LILAC_CUDA_CHECK(cudaMemcpyAsync(bw.tokens_host, bw.tokens.get(), size_t(B) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ++batched_passes_;
  for (int b = 0; b < B; ++b) {
    CudaSequenceState& st = *seqs[size_t(b)];
    StepResult& r = out[size_t(b)];
    if (argmax_only(st)) {
      r.token = bw.tokens_host[b];
    } else {
      const DeviceSampleResult& d = sampled[size_t(b)];
      r.token = d.token;
      r.logprob = d.logprob;
      for (int i = 0; i < d.n_top; ++i) r.top.emplace_back(d.top_ids[i], d.top_logprobs[i]);
    }
    st.set_position(st.position() + 1);
    st.token_on_device = -1;  // the next step() uploads its token
    if (st.penalties_active) st.penalties.add_output(r.token);
    last_context_ = std::max(last_context_, st.position());
  }
}

// ---- the Backend API --------------------------------------------------------------------------

// The prompt pieces `which` of `items` (distinct sequences, no constraint) in multi-sequence
// chunks: consecutive pieces while their tokens fit one chunk (ws.max_T); a piece longer than a
// chunk, or a chunk of one piece, takes step() / forward() as before. Each chunk is one forward
// over the concatenated tokens (prefill_segments), then the sampler of every piece that ends its
// prompt on its own last row; one synchronisation per chunk. Every piece is checked before any
// state moves.
void CudaBackend::prefill_items(std::span<const BatchItem> items, std::span<const size_t> which,
                                std::span<StepResult> out) {
  const ModelConfig& c = model_->config;
  for (size_t i : which) {
    const BatchItem& it = items[i];
    const auto& st = static_cast<const CudaSequenceState&>(*it.state);
    if (it.ids.empty()) fail("step: no input ids");
    if (st.position() + int64_t(it.ids.size()) > st.max_ctx)
      fail("context overflow: {} tokens in the sequence + {} new > context size {}", st.position(),
           it.ids.size(), st.max_ctx);
    for (int32_t id : it.ids)
      if (id < 0 || id >= c.vocab) fail("token id {} out of range [0, {})", id, c.vocab);
  }
  const size_t max_T = size_t(ws_->max_T);
  auto alone = [&](size_t i) {
    const BatchItem& it = items[i];
    if (it.sample)
      out[i] = step(*it.state, it.ids, it.sample_index);
    else
      forward(*it.state, it.ids, {}, false);
  };
  std::vector<int32_t> ids;
  std::vector<PrefillSegment> segs;
  std::vector<size_t> seg_item;
  auto flush = [&] {
    if (segs.size() == 1) alone(seg_item[0]);
    if (segs.size() >= 2) {
      prefill_segments(segs, ids.data(), int(ids.size()), nullptr);
      std::vector<DeviceSampleResult> res(segs.size());
      for (size_t j = 0; j < segs.size(); ++j) {
        const BatchItem& it = items[seg_item[j]];
        CudaSequenceState& st = *segs[j].st;
        last_context_ = std::max(last_context_, st.position());
        if (!it.sample) continue;
        launch_row_sample(st, segs[j].row0 + segs[j].T - 1, it.sample_index, nullptr);
        LILAC_CUDA_CHECK(cudaMemcpyAsync(&res[j], st.sample_out.get(), sizeof(DeviceSampleResult),
                                         cudaMemcpyDeviceToHost, stream_));
      }
      LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t j = 0; j < segs.size(); ++j)
        if (items[seg_item[j]].sample) out[seg_item[j]] = take_sample(*segs[j].st, res[j]);
      ++batched_prefills_;
    }
    ids.clear();
    segs.clear();
    seg_item.clear();
  };
  for (size_t i : which) {
    const BatchItem& it = items[i];
    if (it.ids.size() > max_T) {
      alone(i);
      continue;
    }
    if (ids.size() + it.ids.size() > max_T) flush();
    auto& st = static_cast<CudaSequenceState&>(*it.state);
    segs.push_back({&st, int(ids.size()), int(it.ids.size()), int(st.position())});
    seg_item.push_back(i);
    ids.insert(ids.end(), it.ids.begin(), it.ids.end());
  }
  flush();
}

std::vector<StepResult> CudaBackend::step_batch(std::span<const BatchItem> items) {
  const ModelConfig& c = model_->config;
  const bool gdn_ok = batched_pass_available();
  std::vector<size_t> decode, prompt;
  std::set<const SequenceState*> states;
  bool distinct = true;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (!it.state) fail("step_batch: item {} has no sequence", i);
    distinct = distinct && states.insert(it.state).second;
    if (it.sample && !it.constraint && it.ids.size() == 1)
      decode.push_back(i);
    else if (!it.constraint || !it.sample)
      prompt.push_back(i);
  }
  const int min_rows = std::max(1, options_.batch_min_rows);
  const bool batch_decode = options_.batch_decode && gdn_ok && int(decode.size()) >= min_rows;
  const bool batch_prefill = options_.batch_prefill && prompt.size() >= 2 && segments_aligned();
  if (trace_ || !distinct || (!batch_decode && !batch_prefill)) return Backend::step_batch(items);

  std::vector<StepResult> out(items.size());
  std::vector<bool> taken(items.size(), false);
  // Prompt pieces together (multi-sequence chunks), then constrained items and whatever is left
  // one by one (their own paths), then the decode items in batched passes.
  if (batch_prefill) {
    prefill_items(items, prompt, out);
    for (size_t i : prompt) taken[i] = true;
  }
  if (batch_decode)
    for (size_t i : decode) taken[i] = true;
  for (size_t i = 0; i < items.size(); ++i) {
    if (taken[i]) continue;
    const BatchItem& it = items[i];
    if (it.sample && it.constraint)
      out[i] = step_constrained(*it.state, it.ids, it.sample_index, *it.constraint);
    else if (it.sample)
      out[i] = step(*it.state, it.ids, it.sample_index);
    else
      forward(*it.state, it.ids, {}, false);
  }
  if (!batch_decode) return out;
  // The decode items: checked first (a bad item fails the call before any state moves), then
  // passes of at most max_B rows; a remainder below min_rows takes step().
  for (size_t i : decode) {
    const auto& st = static_cast<const CudaSequenceState&>(*items[i].state);
    if (st.position() + 1 > st.max_ctx)
      fail("context overflow: {} tokens in the sequence + 1 new > context size {}", st.position(),
           st.max_ctx);
    const int32_t id = items[i].ids[0];
    if (id < 0 || id >= c.vocab) fail("token id {} out of range [0, {})", id, c.vocab);
  }
  const size_t max_B = size_t(batch_ws().max_B);
  for (size_t d0 = 0; d0 < decode.size(); d0 += max_B) {
    const size_t n = std::min(max_B, decode.size() - d0);
    if (int(n) < min_rows) {
      for (size_t j = d0; j < d0 + n; ++j) {
        const BatchItem& it = items[decode[j]];
        out[decode[j]] = step(*it.state, it.ids, it.sample_index);
      }
      continue;
    }
    std::vector<CudaSequenceState*> seqs(n);
    std::vector<int32_t> ids(n);
    std::vector<uint64_t> index(n);
    std::vector<StepResult> res(n);
    for (size_t j = 0; j < n; ++j) {
      const BatchItem& it = items[decode[d0 + j]];
      seqs[j] = static_cast<CudaSequenceState*>(it.state);
      ids[j] = it.ids[0];
      index[j] = it.sample_index;
    }
    decode_batch(seqs, ids, index, res);
    for (size_t j = 0; j < n; ++j) out[decode[d0 + j]] = std::move(res[j]);
  }
  return out;
}

std::vector<float> CudaBackend::last_batch_logits(int row) {
  const size_t V = size_t(model_->config.vocab);
  if (!batch_ || row < 0 || row >= batch_->max_B) fail("last_batch_logits: row {}", row);
  std::vector<float> host(V);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(host.data(), ws_->logits.get() + size_t(row) * V, V * 4,
                                   cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

double CudaBackend::time_batched_pass(std::span<SequenceState* const> states, int replays) {
  const int B = int(states.size());
  if (B < 1 || B > batch_ws().max_B) fail("time_batched_pass: {} sequences", B);
  std::vector<CudaSequenceState*> seqs(static_cast<size_t>(B));
  // A different token per row: with one shared token the rows route to nearly the same experts
  // and the grouped MoE reads far fewer of them than a real batch does.
  const int64_t V = model_->config.vocab;
  std::vector<int32_t> ids(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) ids[size_t(b)] = int32_t((1 + int64_t(b) * 7919) % V);
  for (int b = 0; b < B; ++b) {
    seqs[size_t(b)] = static_cast<CudaSequenceState*>(states[size_t(b)]);
    if (seqs[size_t(b)]->position() + 1 > seqs[size_t(b)]->max_ctx)
      fail("time_batched_pass: sequence {} is full", b);
  }
  // Every replay decodes the same position again (the descriptor is uploaded once): the same
  // bytes as a real step; afterwards each sequence has advanced by one token.
  upload_batch(seqs, ids);
  run_batch_graph(B);  // capture and warm-up
  std::vector<cudaEvent_t> ev(static_cast<size_t>(replays) + 1);
  for (auto& e : ev) LILAC_CUDA_CHECK(cudaEventCreate(&e));
  LILAC_CUDA_CHECK(cudaEventRecord(ev[0], stream_));
  for (int i = 0; i < replays; ++i) {
    run_batch_graph(B);
    LILAC_CUDA_CHECK(cudaEventRecord(ev[size_t(i) + 1], stream_));
  }
  LILAC_CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<float> ms(static_cast<size_t>(replays));
  for (int i = 0; i < replays; ++i)
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto* st : seqs) {
    st->set_position(st->position() + 1);
    st->token_on_device = -1;
  }
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

std::vector<std::string> CudaBackend::batch_kernel_breakdown(
    std::span<SequenceState* const> states) {
  const int B = int(states.size());
  if (B < 1 || B > batch_ws().max_B) fail("batch_kernel_breakdown: {} sequences", B);
  std::vector<CudaSequenceState*> seqs(static_cast<size_t>(B));
  std::vector<int32_t> ids(static_cast<size_t>(B), 1);
  for (int b = 0; b < B; ++b) seqs[size_t(b)] = static_cast<CudaSequenceState*>(states[size_t(b)]);
  const bool grouped = batch_grouped_moe(B);
  upload_batch(seqs, ids);
  batch_launches(B, grouped, nullptr);  // warm-up (the same position is decoded again below)
  std::vector<std::tuple<std::string, double, int>> totals;
  {
    ScopedPdl no_pdl(false);  // per-kernel events: no programmatic overlap
    Timer t(stream_);
    batch_launches(B, grouped, &t);
    totals = t.totals();
  }
  for (auto* st : seqs) {
    st->set_position(st->position() + 1);
    st->token_on_device = -1;
  }
  double sum = 0;
  for (auto& [n, ms, count] : totals) sum += ms;
  std::vector<std::string> lines;
  lines.push_back(
      fmt::format("batched pass of {} rows{} (un-graphed, per-kernel events): {:.1f} us", B,
                  grouped ? ", grouped MoE" : "", sum * 1e3));
  std::sort(totals.begin(), totals.end(),
            [](auto& a, auto& b) { return std::get<1>(a) > std::get<1>(b); });
  for (auto& [n, ms, count] : totals)
    lines.push_back(fmt::format("  {:<24} {:>10.1f} us {:>5.1f}%  ({} launches)", n, ms * 1e3,
                                100 * ms / sum, count));
  return lines;
}

}  // namespace lilac::cuda
