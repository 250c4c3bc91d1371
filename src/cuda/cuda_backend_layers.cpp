// CudaBackend's launch sequences: one layer (prefill over T tokens, or one decode token), a whole
// decode step (and its graph), a prefill chunk. The order of operations per layer mirrors
// cpu/cpu_backend.cpp (the reference); see docs/cuda-design.md for layouts and the launchers'
// contracts.
#include <algorithm>
#include <optional>

#include "cuda/attention.h"
#include "cuda/cuda_backend_state.h"
#include "cuda/gated_deltanet.h"
#include "cuda/launch.h"
#include "cuda/position.h"

namespace lilac::cuda {

// ---- one layer ------------------------------------------------------------------------------

// The form of a prompt chunk's 4-bit experts (T >= 64 tokens, Hopper): `forced` unless automatic.
// automatic (s21 runs 9-10, rows32 / rows64 on PairLoop, the shared expert inside the grouped
// launches; prefill tok/s small / rows32 / rows64, 3 rounds): 128 tokens 9,953-9,976 / 9,892 /
// 8,913; 144 10,298 / 10,363 / 9,350; 192 13,040-13,097 / 13,408-13,511 / 12,182-12,211; 512
// 21,686 / 24,596 / 23,077; 768 (small is tile128 there) 22,511 / 28,625 / 27,855; 832 - / 29,928 /
// 29,439; 896 - / 30,984 / 30,928; 960 - / 31,626 / 31,999; 1024 27,435 / 32,344 / 33,437. So the
// small-M kernels below 144 tokens, rows32 up to 896, rows64 above (s20's rule, measured before
// the pairs: small below 256, rows32 to 512).
PromptMoe prompt_moe_form(PromptMoe forced, int T, int small_max) {
  if (forced == PromptMoe::small) return T <= small_max ? PromptMoe::small : PromptMoe::tile128;
  if (forced != PromptMoe::automatic) return forced;
  if (T < 144 && T <= small_max) return PromptMoe::small;
  return T <= 896 ? PromptMoe::rows32 : PromptMoe::rows64;
}

// The mixers (Gated DeltaNet, attention) run once per segment on its rows and its own state; the
// rest (norms, projections, router, experts) over all T rows at once.
bool CudaBackend::layer_prefill(std::span<const PrefillSegment> segs, int64_t li, int T,
                                Timer* timer, bool normed) {
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

  if (!normed)
    timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.input_norm, w.x.get(), T, H, eps, s); });
  if (L.type == LayerType::GatedDeltaNet) {
    const int cols = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
    timed(timer, "gemm.gdn_in_proj", [&] {
      proj_gemm(w.x.get(), T, H, L.in_proj, cols, w.proj.get(), GemmOut::StoreF32, s,
                gemm_scratch(w));
    });
    const size_t vch = size_t(c.gdn_v_channels());
    timed(timer, "gdn_prefill", [&] {
      for (const PrefillSegment& g : segs)
        g.st->with_rec_state(c, slot, [&](auto* rec) {
          gdn_prefill(w.proj.get() + size_t(g.row0) * size_t(cols), g.T, L.conv,
                      g.st->conv_state(c, slot), L.neg_exp_A, L.dt_bias, L.gdn_norm, rec,
                      int(c.gdn_key_heads), int(c.gdn_value_heads), int(c.gdn_key_dim),
                      int(c.gdn_value_dim), int(c.gdn_conv_kernel), eps, w.gdn_prefill_ws.get(),
                      w.mix.get() + size_t(g.row0) * vch, s);
        });
    });
    if (trace_) {
      auto v = download_f32(w.mix.get(), size_t(T) * size_t(c.gdn_v_channels()), s);
      trace_(tp + "gdn.normed", v.data(), {T, c.gdn_v_channels()});
    }
    timed(timer, "gemm.gdn_out_proj", [&] {
      proj_gemm(w.mix.get(), T, int(c.gdn_v_channels()), L.out_proj, H, w.h.get(),
                GemmOut::AccumulateF32, s, gemm_scratch(w));
    });
  } else {
    const int cols = int(c.q_proj_rows() + 2 * c.kv_dim());
    timed(timer, "gemm.attn_qkv", [&] {
      proj_gemm(w.x.get(), T, H, L.qkv_proj, cols, w.proj.get(), GemmOut::StoreF32, s,
                gemm_scratch(w));
    });
    const size_t qd = size_t(c.heads * c.head_dim);
    timed(timer, "qk_norm_rope_store", [&] {
      for (const PrefillSegment& g : segs) {
        CudaSequenceState& st = *g.st;
        qk_norm_rope_store(w.proj.get() + size_t(g.row0) * size_t(cols), g.T, st.d_pos(), L.q_norm,
                           L.k_norm, model_->inv_freq, int(c.heads), int(c.kv_heads),
                           int(c.head_dim), int(c.rotary_dim), eps, w.q.get() + size_t(g.row0) * qd,
                           w.gate.get() + size_t(g.row0) * qd, st.k_cache(c, slot),
                           st.v_cache(c, slot), int(st.max_ctx), s);
      }
    });
    timed(timer, "attention_prefill", [&] {
      for (const PrefillSegment& g : segs) {
        CudaSequenceState& st = *g.st;
        attention_prefill(w.q.get() + size_t(g.row0) * qd, w.gate.get() + size_t(g.row0) * qd,
                          st.k_cache(c, slot), st.v_cache(c, slot), g.pos0, g.T, int(c.heads),
                          int(c.kv_heads), int(c.head_dim), int(st.max_ctx),
                          w.mix.get() + size_t(g.row0) * qd, s);
      }
    });
    if (trace_) {
      auto v = download_f32(w.mix.get(), size_t(T) * size_t(c.heads * c.head_dim), s);
      trace_(tp + "attn.gated", v.data(), {T, c.heads * c.head_dim});
    }
    timed(timer, "gemm.attn_o_proj", [&] {
      proj_gemm(w.mix.get(), T, int(c.heads * c.head_dim), L.o_proj, H, w.h.get(),
                GemmOut::AccumulateF32, s, gemm_scratch(w));
    });
  }
  if (trace_) trace_delta(tp + "mixer_out");
  const int E = int(c.experts), k = int(c.experts_per_token);
  timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.post_norm, w.x.get(), T, H, eps, s); });
  timed(timer, "gemm.router",
        [&] { proj_gemm(w.x.get(), T, H, L.router, E + 1, w.router.get(), GemmOut::StoreF32, s); });
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
  // Prompt chunks of 64 to small_moe_prefill_max_tokens (512) tokens may take the small-M kernels
  // (256 tokens 7,160 -> 8,252 tok/s in run 7 of the third session; 512 tokens 12,222 -> 14,263
  // in s5 run 2, once their blocks loop over passes); shorter ones keep the tile kernels, whose
  // bf16-weight numerics the CPU twin of the prefill tests follows. 4-bit experts on Hopper: the
  // form options_.prompt_moe (or prompt_moe_form's rule by T) names: since s21 the small-M kernels
  // only below 144 tokens, the grouped wgmma kernels in passes of 32 / 64 rows above.
  int small_max = T >= 64 ? options_.small_moe_prefill_max_tokens : 0;
  QMoeWgmmaTile tile = QMoeWgmmaTile::adaptive;
  if (T >= 64 && L.gate_up.affine() && L.gate_up.q.bits == 4 && q_moe_grouped_wgmma_available()) {
    const PromptMoe form = prompt_moe_form(options_.prompt_moe, T, small_max);
    if (form != PromptMoe::small) small_max = 0;
    if (form == PromptMoe::rows64) tile = QMoeWgmmaTile::rows64;
    if (form == PromptMoe::rows32) tile = QMoeWgmmaTile::rows32;
  }
  const bool y_bf16 =
      moe_experts(L, c, w, T, r, small_max, options_.small_moe_kernel, options_.fused_shared_expert,
                  timer, s, tile, options_.prefill_moe_y_bf16);
  // The next layer's input norm in the combine's blocks (rms_norm's function: the same bits, and
  // one launch and one read of h fewer per layer); not the final norm, which prefill_chunk runs
  // on the rows it takes logits of.
  const float* next_norm = li + 1 < c.layers ? model_->layers[size_t(li) + 1].input_norm : nullptr;
  const bool fuse = next_norm && options_.prefill_combine_norm &&
                    moe_combine_norm_supported(H, w.h.get(), next_norm, w.x.get());
  timed(timer, fuse ? "moe_combine+rms_norm" : "moe_combine", [&] {
    moe_combine(w.y.get(), r, w.router.get(), E + 1, w.shared_out.get(), H, w.h.get(), s,
                fuse ? next_norm : nullptr, w.x.get(), eps, y_bf16);
  });
  if (trace_) trace_delta(tp + "moe_out");
  return fuse;
}

void CudaBackend::layer_decode(CudaSequenceState& st, int64_t li, Timer* timer) {
  const ModelConfig& c = model_->config;
  const DeviceLayer& L = model_->layers[size_t(li)];
  Workspace& w = *ws_;
  const int H = int(c.hidden), slot = int(c.slot_of_layer(li));
  const float eps = c.rms_eps;
  cudaStream_t s = stream_;

  // The first projection of the layer, from the residual: BF16 weights fuse the input norm into
  // the GEMV (gemv_rms: each block normalises h), and so does the staged 4/8-bit GEMV
  // (q_gemv_rms_staged, which also requests its weights before it waits); otherwise the norm
  // runs first, then q_gemv.
  auto first_projection = [&](const char* name, const DeviceMatrix& W, int rows) {
    if (W.format == DeviceFormat::Bf16) {
      timed(timer, name, [&] {
        gemv_rms(W.dense, rows, H, w.h.get(), L.input_norm, eps, w.proj.get(), GemvOut::Store, s);
      });
    } else if (options_.staged_first_projection && q_gemv_staged_available(W.q)) {
      timed(timer, name,
            [&] { q_gemv_rms_staged(W.q, w.h.get(), L.input_norm, eps, w.proj.get(), s); });
    } else {
      timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.input_norm, w.x.get(), 1, H, eps, s); });
      timed(timer, name,
            [&] { proj_gemv(W, rows, H, w.x.get(), w.proj.get(), GemvOut::Store, s); });
    }
  };
  if (L.type == LayerType::GatedDeltaNet) {
    const int rows = int(c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads);
    first_projection("gemv_rms.gdn_in_proj", L.in_proj, rows);
    timed(timer, "gdn_decode", [&] {
      st.with_rec_state(c, slot, [&](auto* rec) {
        gdn_decode(w.proj.get(), L.conv, st.conv_state(c, slot), L.neg_exp_A, L.dt_bias, L.gdn_norm,
                   rec, int(c.gdn_key_heads), int(c.gdn_value_heads), int(c.gdn_key_dim),
                   int(c.gdn_value_dim), int(c.gdn_conv_kernel), eps, w.mix.get(), s);
      });
    });
    timed(timer, "gemv.gdn_out_proj", [&] {
      proj_gemv(L.out_proj, H, int(c.gdn_v_channels()), w.mix.get(), w.h.get(), GemvOut::Accumulate,
                s);
    });
  } else {
    const int rows = int(c.q_proj_rows() + 2 * c.kv_dim());
    first_projection("gemv_rms.attn_qkv", L.qkv_proj, rows);
    timed(timer, "attention_decode", [&] {  // qk norm + RoPE + cache store fused in
      attention_decode_qkv(w.proj.get(), st.d_pos(), L.q_norm, L.k_norm, model_->inv_freq,
                           int(c.heads), int(c.kv_heads), int(c.head_dim), int(c.rotary_dim), eps,
                           st.k_cache(c, slot), st.v_cache(c, slot), int(st.max_ctx),
                           st.attn_partial.get(), w.mix.get(), s);
    });
    timed(timer, "gemv.attn_o_proj", [&] {
      proj_gemv(L.o_proj, H, int(c.heads * c.head_dim), w.mix.get(), w.h.get(), GemvOut::Accumulate,
                s);
    });
  }
  const int E = int(c.experts), k = int(c.experts_per_token), I = int(c.expert_intermediate);
  const int Is = int(c.shared_intermediate);
  if (L.router.format == DeviceFormat::Bf16) {
    // A BF16 router: the post norm, the router GEMV (E + 1 rows: the shared gate logit last) and
    // the top-k in one launch (moe_router); it also leaves the normalised x for the experts'
    // gate/up. A 4/8-bit router (below): rms_norm, q_gemv, router_topk.
    timed(timer, "moe_router", [&] {
      moe_router(L.router.dense, E, H, w.h.get(), L.post_norm, eps, k, w.router.get(),
                 w.topk_idx.get(), w.topk_w.get(), w.x.get(), w.router_ws.get(), s);
    });
  } else {
    timed(timer, "rms_norm", [&] { rms_norm(w.h.get(), L.post_norm, w.x.get(), 1, H, eps, s); });
    timed(timer, "gemv.router",
          [&] { proj_gemv(L.router, E + 1, H, w.x.get(), w.router.get(), GemvOut::Store, s); });
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

void CudaBackend::decode_layer(SequenceState& state, int64_t layer) {
  if (layer < 0 || layer >= model_->config.layers)
    fail("decode_layer: layer {} of {}", layer, model_->config.layers);
  layer_decode(static_cast<CudaSequenceState&>(state), layer, nullptr);
}

// ---- decode ---------------------------------------------------------------------------------

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
           st.seen.get(), ws_->sample_ws.get(), st.sample_out.get(), stream_,
           sampler_path(st.sampling.top_k));
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
  if (model_->lm_head.format == DeviceFormat::Bf16) {  // the final norm fused into the GEMV
    timed(timer, "gemv_rms.lm_head", [&] {
      gemv_rms(model_->lm_head.dense, int(c.vocab), H, w.h.get(), model_->final_norm, c.rms_eps,
               w.logits.get(), GemvOut::Store, stream_);
    });
  } else {
    timed(timer, "rms_norm",
          [&] { rms_norm(w.h.get(), model_->final_norm, w.x.get(), 1, H, c.rms_eps, stream_); });
    timed(timer, "gemv.lm_head", [&] {
      proj_gemv(model_->lm_head, int(c.vocab), H, w.x.get(), w.logits.get(), GemvOut::Store,
                stream_);
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
  // The sampler's two paths record different launches: one graph each (a request's top_k picks).
  const bool small_k = sampler_path(st.sampling.top_k) == SamplerPath::SmallTopK;
  cudaGraphExec_t& exec = !sample       ? st.graph_plain
                          : fast_greedy ? st.graph_argmax
                          : small_k     ? st.graph_sample_small_k
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

bool CudaBackend::segments_aligned() const {
  const ModelConfig& c = model_->config;
  const int64_t gdn_cols = c.gdn_conv_channels() + c.gdn_v_channels() + 2 * c.gdn_value_heads;
  const int64_t attn_cols = c.q_proj_rows() + 2 * c.kv_dim();
  // f32 rows (proj): 4 floats per 16 bytes; bf16 rows (mix, q, gate): 8 values.
  return gdn_cols % 4 == 0 && attn_cols % 4 == 0 && c.gdn_v_channels() % 8 == 0 &&
         (c.heads * c.head_dim) % 8 == 0;
}

void CudaBackend::prefill_segments(std::span<const PrefillSegment> segs, const int32_t* ids, int T,
                                   Timer* timer) {
  const ModelConfig& c = model_->config;
  Workspace& w = *ws_;
  const int H = int(c.hidden);
  LILAC_CUDA_CHECK(
      cudaMemcpyAsync(w.ids.get(), ids, size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
  timed(timer, "embed", [&] { embed_rows(w.ids.get(), *model_, w.h.get(), T, H, stream_); });
  // With a trace observer (one segment: step_batch does not batch traced prefills), the hidden
  // state after the embedding and after each layer.
  auto emit_rows = [&](const std::string& name, const float* d, int rows, int cols) {
    std::vector<float> host(size_t(rows) * size_t(cols));
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), d, host.size() * 4, cudaMemcpyDeviceToHost, stream_));
    LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    trace_(name, host.data(), {rows, cols});
  };
  if (trace_) emit_rows("hidden.0", w.h.get(), T, H);
  bool normed = false;  // ws.x already holds layer i's input norm
  for (int64_t i = 0; i < c.layers; ++i) {
    normed = layer_prefill(segs, i, T, timer, normed);
    if (trace_) emit_rows(fmt::format("hidden.{}", i + 1), w.h.get(), T, H);
  }
  for (const PrefillSegment& g : segs) {
    timed(timer, "advance_position", [&] { advance_position(g.st->d_pos(), g.T, stream_); });
    g.st->set_position(g.pos0 + g.T);
    g.st->token_on_device = -1;
  }
}

void CudaBackend::prefill_chunk(CudaSequenceState& st, const int32_t* ids, int T, float* logits,
                                bool all_logits, Timer* timer) {
  const ModelConfig& c = model_->config;
  Workspace& w = *ws_;
  const int H = int(c.hidden), V = int(c.vocab);
  const PrefillSegment seg{&st, 0, T, int(st.position())};
  prefill_segments(std::span<const PrefillSegment>(&seg, 1), ids, T, timer);
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
        proj_gemv(model_->lm_head, V, H, w.x.get(), w.logits.get(), GemvOut::Store, stream_);
      });
    else
      timed(timer, "gemm.lm_head", [&] {
        proj_gemm(w.x.get(), n, H, model_->lm_head, V, w.logits.get(), GemmOut::StoreF32, stream_);
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

}  // namespace lilac::cuda
