// The CUDA backend: the forward pass of docs/model.md section 2 in the hand-written kernels of
// src/cuda (docs/cuda-design.md), over a DeviceModel. A decode step is one CUDA graph replay
// (embed -> 40 layers -> lm_head -> sampling -> position advance) that reads the token and the
// position from device memory, so no host round trip happens inside a step; prefill runs in
// chunks with GEMMs on tensor cores and device-side grouping of tokens by expert.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "cuda/device_model.h"
#include "cuda/gated_deltanet.h"
#include "cuda/q4_moe.h"
#include "model/backend.h"

namespace lilac::cuda {

// The backend's runtime choices. Each kernel has one production version (the losing ones live in
// the kernel lab, bench/lab, with no switch here); what remains are choices that depend on the
// workload or are A/B checks of the launch machinery. Only the runtime reads them from the
// environment (from_environment, the one place that reads LILAC_* switches for the backend).
// How the 4-bit experts of a prompt chunk run (CudaOptions::prompt_moe).
enum class PromptMoe { automatic, small, tile128, rows64, rows32 };
// The form a chunk of T >= 64 prompt tokens takes: `forced` unless it is automatic (small past
// small_max_tokens: tile128); automatic: the measured rule (cuda_backend_layers.cpp).
PromptMoe prompt_moe_form(PromptMoe forced, int T, int small_max_tokens);

struct CudaOptions {
  int64_t prefill_chunk = 4096;  // tokens per prefill launch sequence (workspace sized for it)
  bool use_graphs = true;        // decode steps as CUDA graph replays; LILAC_CUDA_GRAPHS=0
  // Programmatic dependent launch (launch.h) for the kernels built for it; LILAC_PDL=0 turns it
  // off. Process-wide: the backend applies it when it is made (and in set_options).
  bool pdl = true;
  // step_batch: decode items of at least `batch_min_rows` sequences advance in one batched pass
  // (cuda_backend_batch.cpp); fewer go through step() one by one. LILAC_BATCH_DECODE=0 turns the
  // batched pass off (A/B), LILAC_BATCH_MIN=n sets the threshold.
  bool batch_decode = true;
  int batch_min_rows = 2;
  // step_batch: the prompt pieces of several sequences (no constraint, at most prefill_chunk
  // tokens together) run as one forward over their concatenated tokens (the dense projections and
  // experts see all of them at once; the mixers run per sequence). LILAC_BATCH_PREFILL=0: one
  // sequence at a time (A/B).
  bool batch_prefill = true;
  // Batched passes of at least this many rows run the MoE as prefill does (moe_route, grouped
  // GEMMs over the tokens of each expert: every touched expert read once) instead of the decode
  // MoE kernels with a grid row per token (each token reads its own experts). 0: never; -1:
  // the measured default (16 with BF16 experts; with 4-bit ones 8 when the small-M kernels take
  // them, else never: docs/performance.md, docs/kernels.md version 5).
  // LILAC_BATCH_GROUPED_MOE=n.
  int batch_grouped_moe_min_rows = -1;
  // Grouped batched passes of at most this many rows run the small-M kernels over 4/8-bit experts
  // (q4_moe_small.cu: a warp per expert tile, tokens as the MMA's n) instead of the 128-token-tile
  // ones; prefill chunks of 64 to small_moe_prefill_max_tokens tokens do too. 0: never.
  // LILAC_SMALL_MOE_MAX=n, LILAC_SMALL_MOE_PREFILL_MAX=n.
  int small_moe_max_tokens = 64;
  int small_moe_prefill_max_tokens = 512;
  // Which implementation of the small-M kernels (q4_moe.h): automatic = streamed (bulk copies
  // into shared memory) for 4-bit prompt chunks on Hopper, else the register pair chained per
  // tile through the backend's counters (s41-s44); registers = the register pair unchained
  // everywhere; chained = automatic, failing without counters.
  // LILAC_SMALL_MOE_KERNEL=registers|streamed|chained|auto (A/B runs).
  MoeSmallKernel small_moe_kernel = MoeSmallKernel::automatic;
  // The 4-bit experts of a prompt chunk of at least 64 tokens on Hopper (q4_moe.h): the small-M
  // kernels (up to small_moe_prefill_max_tokens), or the grouped wgmma kernels with 128-row
  // token tiles (tile128) or in passes of 64 / 32 rows (rows64 / rows32). automatic: by T
  // (prompt_moe_form, cuda_backend_layers.cpp). LILAC_PROMPT_MOE=small|tile128|rows64|rows32|auto.
  PromptMoe prompt_moe = PromptMoe::automatic;
  // The batched pass's Gated DeltaNet state kernel (gated_deltanet.h): automatic = head
  // (version 6) but split (version 3) for an f32 state at <= 16 rows.
  // LILAC_GDN_BATCH_KERNEL=split|head|auto (A/B runs).
  GdnBatchKernel gdn_batch_kernel = GdnBatchKernel::automatic;
  // One-row decode: the layer's first 4/8-bit projection (in_proj, qkv) runs q_gemv_rms_staged
  // (its input norm fused, its weights requested before it waits for the previous kernel;
  // q4_linear.h) where the device has it. Bit for bit rms_norm + q_gemv. Measured +2-4% at one
  // stream; staging out_proj and the router as well did not gain (docs/kernels.md, "Tenth
  // session"). LILAC_Q_GEMV_STAGED=0: rms_norm + q_gemv (A/B).
  bool staged_first_projection = true;
  // BF16 grouped MoE passes (batched decode from 16 rows, prefill chunks) and 4-bit ones on the
  // wgmma kernels (prompt chunks on Hopper, since s20): the shared expert's tiles run inside the
  // routed experts' grouped gate_up and down launches (moe_prefill.h MoeSharedPart, q4_moe.h
  // QMoeSharedPart) instead of launches of its own. LILAC_MOE_SHARED_FUSED=0: separate (A/B).
  bool fused_shared_expert = true;
  // Grouped batched passes: the MoE combine also writes the next layer's input norm (or the
  // final norm) in its blocks, bit for bit rms_norm's. LILAC_COMBINE_NORM=0: rms_norm (A/B).
  bool fused_combine_norm = true;
  // The same in prompt chunks (the next layer's input norm only; s32, H100: prefill +0.5% at
  // 256 / 512 tokens, +0.6% at 4,096). LILAC_PREFILL_COMBINE_NORM=0: rms_norm (A/B).
  bool prefill_combine_norm = true;
  // Prompt chunks on the fused 4-bit wgmma expert kernels: the routed experts' down outputs
  // stored as bf16 (each rounded once) instead of f32, halving the chunk's largest write and
  // read (268 MB each per layer at 4,096 tokens); moe_combine widens them back (s32, H100:
  // prefill +0.1 / +0.9 / +3.3 / +2.1 / +1.0% at 256-16,384 tokens). Off until s36: as the
  // default in s34 (run 2, H100) it moved two tests past their tolerances (a layer-3 router near
  // tie flipped in Q4Backend.SyntheticFullSizeFirstLayersMatchTheCpu, which judges prompt chunks'
  // near ties since; BatchBackend.PromptPiecesPrefillTogetherQ4's median; docs/kernels.md s34,
  // s36). LILAC_PREFILL_MOE_Y_BF16=0: f32 rows (A/B).
  bool prefill_moe_y_bf16 = true;
  // moe_route (one block), the grouped GEMMs and moe_combine launched with PDL (moe_prefill.h):
  // each then starts while the previous kernel ends. LILAC_MOE_PDL=0: plain launches (A/B).
  bool moe_pdl = true;
  // gemv_rows (BF16 batched projections) in its staged form where it applies: x in shared memory,
  // a cluster per 8 row tiles (gemv_rows.h). LILAC_GEMV_ROWS_STAGED=0: the other form (A/B).
  bool gemv_rows_staged = true;
  // The batched pass's 4-bit projections take q_gemm_wgmma (its small-M form up to 64 rows) from
  // this many rows on, q_gemv_rows below (cuda_backend_batch.cpp rows_proj). 9 until s22; the
  // 16-token form made 2-8 rows faster on it too (s22 run 3: c = 2 / 4 / 8 2.51 / 3.16 / 3.58 ->
  // 2.42 / 3.05 / 3.45 ms per step). LILAC_Q4_WGMMA_MIN=n (A/B runs).
  int q4_wgmma_min_rows = 2;
  // How sequences keep the Gated DeltaNet recurrent state (model/state_format.h): f32, or bf16
  // (half the bytes the batched decode step moves for it). Fixed when the backend is made:
  // set_options refuses to change it (every sequence and captured graph has one format).
  // LILAC_GDN_STATE=f32|bf16; the CLI's --gdn-state.
  GdnStateFormat gdn_state = GdnStateFormat::f32;
  static CudaOptions from_environment();
};

class CudaSequenceState;
struct DeviceSampleResult;
struct Workspace;
struct BatchWorkspace;

class CudaBackend : public Backend {
 public:
  CudaBackend(std::shared_ptr<DeviceModel> model, CudaOptions options = {});
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device_description() const override;
  const ModelConfig& config() const override { return model_->config; }
  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override;
  void forward(SequenceState& state, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits) override;
  void begin_sampling(SequenceState& state, std::span<const int32_t> prompt,
                      const SamplingParams& params) override;
  StepResult step(SequenceState& state, std::span<const int32_t> ids,
                  uint64_t sample_index) override;
  // step() with the grammar's mask: the step is launched without its sampler, the mask computed
  // on the host while the device runs it, then uploaded (pinned, async), applied to the logits
  // (cuda::mask_logits) and the device sampler run: one host synchronisation, as in step().
  StepResult step_constrained(SequenceState& state, std::span<const int32_t> ids,
                              uint64_t sample_index, TokenConstraint& constraint) override;
  // Decode items (one id, sampling, no constraint) of distinct sequences run as batched passes of
  // up to kMaxBatchRows rows (one graph replay per pass, per batch size); other items (prompt
  // pieces, constrained items) run first, one by one, through forward() / step().
  std::vector<StepResult> step_batch(std::span<const BatchItem> items) override;
  static constexpr int kMaxBatchRows = 64;
  std::unique_ptr<SequenceState> clone(const SequenceState& state) override;
  std::unique_ptr<SequenceState> clone_with_capacity(const SequenceState& state,
                                                     int64_t max_context) override;
  size_t state_bytes(const SequenceState& state) const override;
  // Captures and uploads the batched pass's graph for every batch size from batch_min_rows to
  // min(max_sequences, kMaxBatchRows) that step_batch would replay (none without graphs or the
  // batched pass; otherwise captured at a size's first step), then runs one prefill chunk of
  // prompt pieces of up to 4 scratch sequences from the memory pool (loads the chunk path's
  // kernels; the pool keeps the memory for the first prompt-reuse copies).
  void prepare_batches(int max_sequences) override;

  // Per-kernel times of one decode step and one prefill chunk (CUDA events around each launch,
  // un-graphed), measured on a scratch sequence at the context of the last forward call.
  std::vector<std::string> kernel_breakdown();

  const DeviceModel& model() const { return *model_; }
  const CudaOptions& options() const { return options_; }
  void set_options(const CudaOptions& o);

  // One decode layer of `state`'s next token, launched on stream() exactly as a decode step
  // launches it (the step runs this code for each of its layers: CudaBackend::layer_decode): it
  // reads and updates the residual row of the backend's workspace (the embedded token, in a
  // step), the layer's caches or states at the sequence's position. Capturable in a CUDA graph;
  // for benchmarks (lilac_cuda_bench_kernels times it per layer kind).
  void decode_layer(SequenceState& state, int64_t layer);
  cudaStream_t stream() const { return stream_; }

  // Tests and benchmarks: the number of batched passes run so far, and the f32 logits [V] of row
  // `row` of the last batched pass (its rows in the order of the decode items).
  int64_t batched_passes() const { return batched_passes_; }
  // Tests: the number of multi-sequence prefill chunks run so far (step_batch's prompt pieces).
  int64_t batched_prefills() const { return batched_prefills_; }
  // Batched-pass graphs captured so far (one per batch size).
  size_t batch_graph_count() const;
  std::vector<float> last_batch_logits(int row);
  // Benchmarks: the GPU time of one batched pass over `states` (each decoding one token; their
  // positions advance by `replays`), as the median of `replays` graph replays.
  double time_batched_pass(std::span<SequenceState* const> states, int replays);
  // Per-kernel times of one batched pass over `states` (un-graphed, CUDA events around each
  // launch; the sequences advance by one token).
  std::vector<std::string> batch_kernel_breakdown(std::span<SequenceState* const> states);

  // Tests: the Gated DeltaNet conv state [K-1, C] and recurrent state [Hv, Dk, Dv] of layer
  // `layer` (f32, copied to the host), to compare with the CPU backend's.
  std::pair<std::vector<float>, std::vector<float>> gdn_state(const SequenceState& state,
                                                              int64_t layer);

  // Per-launch timing for kernel_breakdown (defined in cuda_backend.cpp).
  struct Timer;

 private:
  std::unique_ptr<CudaSequenceState> make_sequence(int64_t max_context, bool pooled);
  friend class CudaSequenceState;
  void prefill_chunk(CudaSequenceState& st, const int32_t* ids, int T, float* logits,
                     bool all_logits, Timer* timer);
  void decode_launches(CudaSequenceState& st, bool sample, Timer* timer);
  void run_decode(CudaSequenceState& st, bool sample);
  // step() and step_constrained() (constraint null: no mask).
  StepResult step_impl(SequenceState& state, std::span<const int32_t> ids, uint64_t sample_index,
                       TokenConstraint* constraint);
  void launch_token_mask(TokenConstraint& constraint);
  // One sequence's rows of a (multi-sequence) prefill chunk: rows [row0, row0 + T) of the
  // workspace are its tokens at positions pos0, pos0 + 1, ... (cuda_backend_layers.cpp).
  struct PrefillSegment {
    CudaSequenceState* st = nullptr;
    int row0 = 0, T = 0, pos0 = 0;
  };
  // Every layer over the T rows of the segments (which tile [0, T)), their states advanced; the
  // residual stream of row r is left in the workspace (ws.h row r).
  void prefill_segments(std::span<const PrefillSegment> segs, const int32_t* ids, int T,
                        Timer* timer);
  // `normed`: the previous layer's combine already wrote this layer's input norm into ws.x.
  // Returns whether this layer's combine wrote the next layer's.
  bool layer_prefill(std::span<const PrefillSegment> segs, int64_t layer, int T, Timer* timer,
                     bool normed);
  // Whether segments may start at any row: every per-row buffer a mixer kernel reads or writes at
  // a segment's offset stays 16-byte aligned.
  bool segments_aligned() const;
  // The sampler of `st` on the residual row `row` of the workspace: final norm, lm_head, the
  // constraint's mask, the sampler (its Philox counter set to sample_index); launches only.
  void launch_row_sample(CudaSequenceState& st, int row, uint64_t sample_index,
                         TokenConstraint* constraint);
  // The host side of a sample whose DeviceSampleResult reached the host.
  StepResult take_sample(CudaSequenceState& st, const DeviceSampleResult& out);
  // step_batch's prompt pieces of distinct sequences, as few multi-sequence chunks as fit.
  void prefill_items(std::span<const BatchItem> items, std::span<const size_t> which,
                     std::span<StepResult> out);
  void layer_decode(CudaSequenceState& st, int64_t layer, Timer* timer);
  void sample_launches(CudaSequenceState& st, Timer* timer);
  // The batched decode pass (cuda_backend_batch.cpp).
  bool batch_layer(int64_t layer, int B, bool grouped_moe, bool normed, Timer* timer);
  void batch_launches(int B, bool grouped_moe, Timer* timer);
  bool batch_grouped_moe(int B) const;
  bool batched_pass_available() const;
  cudaGraphExec_t batch_graph(int B);  // the batched pass's graph for B rows, captured once
  void run_batch_graph(int B);
  void upload_batch(std::span<CudaSequenceState* const> seqs, std::span<const int32_t> ids);
  void decode_batch(std::span<CudaSequenceState* const> seqs, std::span<const int32_t> ids,
                    std::span<const uint64_t> sample_index, std::span<StepResult> out);
  BatchWorkspace& batch_ws();

  std::shared_ptr<DeviceModel> model_;
  CudaOptions options_;
  std::unique_ptr<Workspace> ws_;
  cudaStream_t stream_ = nullptr;
  int64_t last_context_ = 0;
  std::unique_ptr<BatchWorkspace> batch_;
  int64_t batched_passes_ = 0;
  int64_t batched_prefills_ = 0;
};

// Backends for the CLI: from a loaded checkpoint (quantize: `--weights q4` on a float
// checkpoint, quantized on the GPU at load; MLX quantized checkpoints run as they are), or the
// full-size synthetic model (weights "bf16" or "q4", router uniform or zipf).
// `checkpoint_dir` names the weights' source in messages. `options`: the defaults unless the
// caller says otherwise; only the runtime (cli, server) reads them from the environment
// (CudaOptions::from_environment), so a test runs the same kernels whatever its environment.
std::unique_ptr<CudaBackend> make_cuda_backend(const ModelConfig& config,
                                               const ModelWeights& weights,
                                               const std::string& checkpoint_dir,
                                               bool quantize = false,
                                               const CudaOptions& options = {});
std::unique_ptr<CudaBackend> make_synthetic_backend(
    const std::string& weights, uint64_t seed, SyntheticRouter router = SyntheticRouter::Uniform,
    const CudaOptions& options = {});

}  // namespace lilac::cuda
