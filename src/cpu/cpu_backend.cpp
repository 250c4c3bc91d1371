#include "cpu/cpu_backend.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/attention.h"
#include "cpu/gated_deltanet.h"
#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu/norm.h"
#include "util/error.h"

namespace lilac::cpu {

CpuBackend::CpuBackend(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool)
    : cfg_(config),
      w_(weights),
      pool_(pool),
      inv_freq_(rope_inv_freq(config.rope_theta, config.rotary_dim, config.rope_inv_freq_bf16)) {}

std::string CpuBackend::device_description() const {
  return fmt::format("cpu: {} threads", pool_.size());
}

// A KV cache of max_context tokens (floats_per_token f32 values each) that could never fit in
// this machine's memory is refused before anything is reserved: the reservation would throw
// bad_alloc, or abort the process under AddressSanitizer.
static void check_kv_fits(int64_t max_context, size_t floats_per_token) {
  const double bytes = double(max_context) * double(floats_per_token) * sizeof(float);
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (max_context < 0 || (ram > 0 && bytes > ram))
    fail(
        "a sequence of {} tokens needs {:.1f} MiB of KV cache, more than this machine's {:.1f} MiB",
        max_context, bytes / (1 << 20), ram / (1 << 20));
}

// The state's KV rows reserved for max_context tokens in each of its caches (address space; pages
// are touched as the cache fills), so state_bytes() reports what the sequence may grow to and an
// impossible size fails here, at start-up for the engine's slots, not in the middle of a request.
static void reserve_kv(CpuSequenceState& st, int64_t max_context, size_t kv_row) {
  st.max_context = max_context;
  check_kv_fits(max_context, kv_row * (st.k_cache.size() + st.v_cache.size()));
  for (auto* cache : {&st.k_cache, &st.v_cache})
    for (auto& v : *cache) v.reserve(size_t(max_context) * kv_row);
}

// Before any state changes: `T` more tokens fit the state's context and every id is in the vocab.
static void check_step(const CpuSequenceState& st, std::span<const int32_t> ids, int64_t V,
                       const char* what) {
  const int64_t T = int64_t(ids.size());
  if (st.position() + T > st.max_context)
    fail("context overflow: {} {} + {} new > context size {}", st.position(), what, T,
         st.max_context);
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("token id {} out of range [0, {})", id, V);
}

std::unique_ptr<SequenceState> CpuBackend::new_sequence(int64_t max_context) {
  auto st = std::make_unique<CpuSequenceState>();
  const int64_t n_attn = cfg_.count_layers(LayerType::FullAttention);
  const int64_t n_gdn = cfg_.count_layers(LayerType::GatedDeltaNet);
  st->k_cache.resize(static_cast<size_t>(n_attn));
  st->v_cache.resize(static_cast<size_t>(n_attn));
  reserve_kv(*st, max_context, size_t(cfg_.kv_heads * cfg_.head_dim));
  st->conv_state.assign(
      size_t(n_gdn),
      std::vector<float>(size_t((cfg_.gdn_conv_kernel - 1) * cfg_.gdn_conv_channels()), 0.f));
  st->recurrent.assign(
      size_t(n_gdn),
      std::vector<float>(size_t(cfg_.gdn_value_heads * cfg_.gdn_key_dim * cfg_.gdn_value_dim),
                         0.f));
  return st;
}

std::unique_ptr<SequenceState> CpuBackend::clone(const SequenceState& state) {
  return std::make_unique<CpuSequenceState>(static_cast<const CpuSequenceState&>(state));
}

std::unique_ptr<SequenceState> CpuBackend::clone_with_capacity(const SequenceState& state,
                                                               int64_t max_context) {
  const auto& src = static_cast<const CpuSequenceState&>(state);
  if (max_context < src.position())
    fail("clone: capacity {} is below the sequence's {} tokens", max_context, src.position());
  auto st = std::make_unique<CpuSequenceState>(src);  // vector copies: capacity = size
  reserve_kv(*st, max_context, size_t(cfg_.kv_heads * cfg_.head_dim));
  return st;
}

size_t CpuBackend::state_bytes(const SequenceState& state) const {
  const auto& st = static_cast<const CpuSequenceState&>(state);
  size_t n = 0;
  for (const auto* group : {&st.k_cache, &st.v_cache, &st.conv_state, &st.recurrent})
    for (const auto& v : *group) n += v.capacity() * sizeof(float);
  return n;
}

void CpuBackend::full_attention(const FullAttentionWeights& a, int64_t slot,
                                const std::string& name, const float* x, int64_t R,
                                std::span<const Segment> segs, float* out) {
  const int64_t H = cfg_.hidden, nh = cfg_.heads, kvh = cfg_.kv_heads, hd = cfg_.head_dim;
  const std::string p = name + ".attn.";

  // The projections and norms act on every row alike; rope, the cache and the attention itself
  // per sequence.
  std::vector<float> qg(size_t(R * nh * 2 * hd)), q(size_t(R * nh * hd)), gate(size_t(R * nh * hd));
  std::vector<float> k(size_t(R * kvh * hd)), v(size_t(R * kvh * hd));
  matmul(a.q_proj, x, R, H, qg.data(), nh * 2 * hd, pool_);
  matmul(a.k_proj, x, R, H, k.data(), kvh * hd, pool_);
  matmul(a.v_proj, x, R, H, v.data(), kvh * hd, pool_);
  split_query_gate(qg.data(), R, nh, hd, q.data(), gate.data());
  for (int64_t i = 0; i < R * nh; ++i)
    rms_norm(&q[size_t(i * hd)], a.q_norm_scale.data(), hd, cfg_.rms_eps, &q[size_t(i * hd)]);
  for (int64_t i = 0; i < R * kvh; ++i)
    rms_norm(&k[size_t(i * hd)], a.k_norm_scale.data(), hd, cfg_.rms_eps, &k[size_t(i * hd)]);
  for (const Segment& s : segs) {
    const int64_t pos0 = s.st->position();
    rope(&q[size_t(s.row0 * nh * hd)], s.T, nh, hd, cfg_.rotary_dim, pos0, inv_freq_.data());
    rope(&k[size_t(s.row0 * kvh * hd)], s.T, kvh, hd, cfg_.rotary_dim, pos0, inv_freq_.data());
  }
  round_bf16(q.data(), q.size());
  round_bf16(gate.data(), gate.size());
  round_bf16(k.data(), k.size());
  round_bf16(v.data(), v.size());
  emit(p + "q", q.data(), {R, nh, hd});
  emit(p + "k", k.data(), {R, kvh, hd});
  emit(p + "v", v.data(), {R, kvh, hd});

  std::vector<float> o(size_t(R * nh * hd));
  for (const Segment& s : segs) {
    const int64_t pos0 = s.st->position(), T = s.T;
    auto& kc = s.st->k_cache[size_t(slot)];
    auto& vc = s.st->v_cache[size_t(slot)];
    kc.resize(size_t((pos0 + T) * kvh * hd));
    vc.resize(size_t((pos0 + T) * kvh * hd));
    std::memcpy(&kc[size_t(pos0 * kvh * hd)], &k[size_t(s.row0 * kvh * hd)],
                size_t(T * kvh * hd) * 4);
    std::memcpy(&vc[size_t(pos0 * kvh * hd)], &v[size_t(s.row0 * kvh * hd)],
                size_t(T * kvh * hd) * 4);
    attention(&q[size_t(s.row0 * nh * hd)], kc.data(), vc.data(), pos0, T, nh, kvh, hd,
              &o[size_t(s.row0 * nh * hd)], pool_);
  }
  for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]);
  round_bf16(o.data(), o.size());
  emit(p + "gated", o.data(), {R, nh * hd});
  matmul(a.o_proj, o.data(), R, nh * hd, out, H, pool_);
}

void CpuBackend::gated_deltanet(int64_t layer, const float* x, int64_t T,
                                std::span<const Segment> segs, float* out) {
  const auto& g = w_.layers[size_t(layer)].gdn;
  const int64_t H = cfg_.hidden, C = cfg_.gdn_conv_channels(), K = cfg_.gdn_conv_kernel;
  const int64_t Hk = cfg_.gdn_key_heads, Hv = cfg_.gdn_value_heads, Dk = cfg_.gdn_key_dim,
                Dv = cfg_.gdn_value_dim;
  const int64_t slot = cfg_.slot_of_layer(layer);
  const std::string p = fmt::format("layer{}.gdn.", layer);

  std::vector<float> qkv(size_t(T * C)), z(size_t(T * Hv * Dv)), a(size_t(T * Hv)),
      b(size_t(T * Hv));
  matmul(g.in_proj_qkv, x, T, H, qkv.data(), C, pool_);
  matmul(g.in_proj_z, x, T, H, z.data(), Hv * Dv, pool_);
  matmul(g.in_proj_b, x, T, H, b.data(), Hv, pool_);
  matmul(g.in_proj_a, x, T, H, a.data(), Hv, pool_);

  // The convolution and the recurrence run per sequence (its own states), the rest per row.
  std::vector<float> conv(size_t(T * C));
  for (const Segment& s : segs) {
    std::vector<float>& cs = s.st->conv_state[size_t(slot)];
    if (s.st->checkpointing) checkpoint_conv(*s.st, slot, cs, &qkv[size_t(s.row0 * C)], s.T);
    causal_conv_silu(&qkv[size_t(s.row0 * C)], s.T, C, K, g.conv.data(), cs.data(),
                     &conv[size_t(s.row0 * C)]);
  }
  emit(p + "conv", conv.data(), {T, C});

  std::vector<float> q(size_t(T * Hk * Dk)), k(size_t(T * Hk * Dk)), v(size_t(T * Hv * Dv));
  for (int64_t t = 0; t < T; ++t) {
    const float* c = &conv[size_t(t * C)];
    std::memcpy(&q[size_t(t * Hk * Dk)], c, size_t(Hk * Dk) * 4);
    std::memcpy(&k[size_t(t * Hk * Dk)], c + Hk * Dk, size_t(Hk * Dk) * 4);
    std::memcpy(&v[size_t(t * Hv * Dv)], c + 2 * Hk * Dk, size_t(Hv * Dv) * 4);
  }
  const float q_scale = 1.f / std::sqrt(float(Dk));
  for (int64_t i = 0; i < T * Hk; ++i) {
    l2_norm(&q[size_t(i * Dk)], Dk, 1e-6f, q_scale);
    l2_norm(&k[size_t(i * Dk)], Dk, 1e-6f, 1.f);
  }
  std::vector<float> gl(size_t(T * Hv)), beta(size_t(T * Hv));
  gdn_gates(a.data(), b.data(), T, Hv, g.neg_exp_A.data(), g.dt_bias.data(), gl.data(),
            beta.data());
  emit(p + "g", gl.data(), {T, Hv});
  emit(p + "beta", beta.data(), {T, Hv});

  std::vector<float> core(size_t(T * Hv * Dv));
  for (const Segment& s : segs) {
    // A checkpointing pass runs its rows one by one (the recurrence is a per-row loop: the same
    // bits as one call) and keeps the state after each.
    const int64_t step = s.st->checkpointing ? 1 : s.T;
    for (int64_t r = 0; r < s.T; r += step) {
      const int64_t row = s.row0 + r;
      std::vector<float>& rec = s.st->recurrent[size_t(slot)];
      gdn_recurrence(&q[size_t(row * Hk * Dk)], &k[size_t(row * Hk * Dk)],
                     &v[size_t(row * Hv * Dv)], &gl[size_t(row * Hv)], &beta[size_t(row * Hv)],
                     step, Hk, Hv, Dk, Dv, rec.data(), &core[size_t(row * Hv * Dv)], pool_);
      if (s.st->checkpointing) {
        float* kept = &s.st->checkpoints.rec[size_t(slot)][size_t(r) * rec.size()];
        for (size_t i = 0; i < rec.size(); ++i)
          kept[i] = gdn_state_ == GdnStateFormat::bf16 ? round_to_bf16(rec[i]) : rec[i];
      }
    }
  }
  // The state is stored: in bf16 precision when asked (the tokens of this call carried it in f32).
  if (gdn_state_ == GdnStateFormat::bf16)
    for (const Segment& s : segs)
      for (float& r : s.st->recurrent[size_t(slot)]) r = round_to_bf16(r);
  emit(p + "core", core.data(), {T, Hv, Dv});
  for (int64_t i = 0; i < T * Hv; ++i)
    gated_rms_norm(&core[size_t(i * Dv)], &z[size_t(i * Dv)], g.norm_scale.data(), Dv, cfg_.rms_eps,
                   &core[size_t(i * Dv)]);
  round_bf16(core.data(), core.size());
  emit(p + "normed", core.data(), {T, Hv * Dv});
  matmul(g.out_proj, core.data(), T, Hv * Dv, out, H, pool_);
}

void CpuBackend::forward(SequenceState& state, std::span<const int32_t> ids,
                         std::span<float> logits, bool all_logits) {
  auto& st = static_cast<CpuSequenceState&>(state);
  const int64_t T = int64_t(ids.size()), H = cfg_.hidden, V = cfg_.vocab;
  if (T == 0) return;
  const int64_t n_out = all_logits ? T : 1;
  if (!logits.empty() && int64_t(logits.size()) < n_out * V)
    fail("forward: logits buffer holds {} floats, needs {}", logits.size(), n_out * V);
  std::vector<float> h;
  trunk(st, ids, h);
  if (logits.empty()) return;
  forward_head(&h[size_t((T - n_out) * H)], n_out, logits.data());
}

void CpuBackend::trunk(CpuSequenceState& st, std::span<const int32_t> ids, std::vector<float>& h) {
  const int64_t T = int64_t(ids.size()), H = cfg_.hidden;
  check_step(st, ids, cfg_.vocab, "tokens in the sequence");
  if (st.checkpointing) {  // room for the states after each row
    auto& c = st.checkpoints;
    c.pos0 = st.position();
    c.rows = T;
    c.conv.resize(st.conv_state.size());
    c.rec.resize(st.recurrent.size());
    for (size_t i = 0; i < st.conv_state.size(); ++i) {
      c.conv[i].assign(size_t(T) * st.conv_state[i].size(), 0.f);
      c.rec[i].assign(size_t(T) * st.recurrent[i].size(), 0.f);
    }
  } else {
    st.checkpoints = {};
  }
  h.assign(size_t(T * H), 0.f);
  for (int64_t t = 0; t < T; ++t)
    widen_row(w_.embed, ids[size_t(t)], &h[size_t(t * H)]);  // dequantises one row when quantized
  emit("hidden.0", h.data(), {T, H});
  const Segment seg{&st, 0, T};
  for (int64_t i = 0; i < cfg_.layers; ++i) layer(i, h.data(), T, std::span(&seg, 1));
  st.advance(T);
}

void CpuBackend::forward_normed(SequenceState& state, std::span<const int32_t> ids, float* normed,
                                float* logits) {
  auto& st = static_cast<CpuSequenceState&>(state);
  const int64_t T = int64_t(ids.size()), H = cfg_.hidden, V = cfg_.vocab;
  if (T == 0) return;
  std::vector<float> h, own;
  trunk(st, ids, h);
  if (!normed && logits) {
    own.resize(size_t(T * H));
    normed = own.data();
  }
  if (normed) final_norm(h.data(), T, normed);
  if (logits) {
    matmul(w_.lm_head, normed, T, H, logits, V, pool_);
    emit("logits", logits, {T, V});
  }
}

void CpuBackend::forward_checkpointed(SequenceState& state, std::span<const int32_t> ids,
                                      float* normed, float* logits) {
  auto& st = static_cast<CpuSequenceState&>(state);
  st.checkpointing = true;
  try {
    forward_normed(st, ids, normed, logits);
  } catch (...) {
    st.checkpointing = false;
    st.checkpoints = {};
    throw;
  }
  st.checkpointing = false;
}

// The conv state after each of a checkpointing pass's T rows: after row r, the last K - 1 rows of
// [state before the pass (K - 1 rows); qkv rows 0..r] (causal_conv_silu's new state).
void CpuBackend::checkpoint_conv(CpuSequenceState& st, int64_t slot,
                                 const std::vector<float>& state, const float* qkv, int64_t T) {
  const int64_t C = cfg_.gdn_conv_channels(), K = cfg_.gdn_conv_kernel;
  auto row = [&](int64_t r) { return r < K - 1 ? state.data() + r * C : qkv + (r - (K - 1)) * C; };
  float* kept = st.checkpoints.conv[size_t(slot)].data();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < K - 1; ++r)
      std::memcpy(kept + (t * (K - 1) + r) * C, row(t + 1 + r), size_t(C) * 4);
}

void CpuBackend::rollback(SequenceState& state, int64_t n) {
  auto& st = static_cast<CpuSequenceState&>(state);
  const auto& c = st.checkpoints;
  if (c.rows == 0) fail("rollback: no verify pass to roll back (forward_checkpointed)");
  if (st.position() != c.pos0 + c.rows) fail("rollback: the sequence moved since its verify pass");
  if (n < 1 || n > c.rows)
    fail("rollback: keep {} of the pass's {} rows (1..{})", n, c.rows, c.rows);
  const size_t kv_row = size_t(cfg_.kv_heads * cfg_.head_dim);
  for (auto* cache : {&st.k_cache, &st.v_cache})
    for (auto& v : *cache) v.resize(size_t(c.pos0 + n) * kv_row);
  for (size_t i = 0; i < st.conv_state.size(); ++i) {
    const size_t cn = st.conv_state[i].size(), rn = st.recurrent[i].size();
    std::memcpy(st.conv_state[i].data(), &c.conv[i][size_t(n - 1) * cn], cn * 4);
    std::memcpy(st.recurrent[i].data(), &c.rec[i][size_t(n - 1) * rn], rn * 4);
  }
  st.set_position(c.pos0 + n);
  st.checkpoints = {};
}

std::unique_ptr<SequenceState> CpuBackend::new_mtp_sequence(int64_t max_context) {
  if (!has_mtp()) fail("this checkpoint has no MTP head");
  auto st = std::make_unique<CpuSequenceState>();
  st->k_cache.resize(w_.mtp->layers.size());
  st->v_cache.resize(w_.mtp->layers.size());
  reserve_kv(*st, max_context, size_t(cfg_.kv_heads * cfg_.head_dim));
  return st;
}

void CpuBackend::mtp_forward(SequenceState& state, const float* hidden,
                             std::span<const int32_t> next_ids, float* out, float* logits) {
  if (!has_mtp()) fail("this checkpoint has no MTP head");
  auto& st = static_cast<CpuSequenceState&>(state);
  const MtpWeights& m = *w_.mtp;
  const int64_t T = int64_t(next_ids.size()), H = cfg_.hidden, V = cfg_.vocab;
  if (T == 0) return;
  if (st.k_cache.size() != m.layers.size() || !st.conv_state.empty())
    fail("mtp_forward: the state is not an MTP head's (new_mtp_sequence)");
  check_step(st, next_ids, V, "positions in the MTP head");
  // x = fc . concat(Norm(embed[next id]), Norm(hidden)): the embedding half first.
  std::vector<float> cat(size_t(T * 2 * H)), e(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    widen_row(w_.embed, next_ids[size_t(t)], e.data());
    float* row = &cat[size_t(t * 2 * H)];
    rms_norm(e.data(), m.pre_fc_norm_embedding_scale.data(), H, cfg_.rms_eps, row);
    rms_norm(hidden + t * H, m.pre_fc_norm_hidden_scale.data(), H, cfg_.rms_eps, row + H);
  }
  round_bf16(cat.data(), cat.size());
  std::vector<float> h(size_t(T * H));
  matmul(m.fc, cat.data(), T, 2 * H, h.data(), H, pool_);
  emit("mtp.fc", h.data(), {T, H});
  // The head's layers at RoPE positions p (each its own KV cache slot), then mtp.norm.
  const Segment seg{&st, 0, T};
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (m.layers[l].type != LayerType::FullAttention)
      fail("MTP layer {} is not a full-attention layer", l);
    decoder_layer(m.layers[l], int64_t(l), -1, fmt::format("mtp.layer{}", l), h.data(), T,
                  std::span(&seg, 1));
  }
  st.advance(T);
  for (int64_t t = 0; t < T; ++t)
    rms_norm(&h[size_t(t * H)], m.final_norm_scale.data(), H, cfg_.rms_eps, out + t * H);
  round_bf16(out, size_t(T * H));
  emit("mtp.norm", out, {T, H});
  if (logits) {
    matmul(w_.lm_head, out, T, H, logits, V, pool_);
    emit("mtp.logits", logits, {T, V});
  }
}

void CpuBackend::forward_layer(int64_t i, float* h, int64_t T, SequenceState& state) {
  const Segment seg{&static_cast<CpuSequenceState&>(state), 0, T};
  layer(i, h, T, std::span(&seg, 1));
}

void CpuBackend::layer(int64_t i, float* h, int64_t T, std::span<const Segment> segs) {
  const LayerWeights& L = w_.layers[size_t(i)];
  decoder_layer(L, cfg_.slot_of_layer(i), i, fmt::format("layer{}", i), h, T, segs);
  emit(fmt::format("hidden.{}", i + 1), h, {T, cfg_.hidden});
}

void CpuBackend::decoder_layer(const LayerWeights& L, int64_t slot, int64_t gdn_layer,
                               const std::string& name, float* h, int64_t T,
                               std::span<const Segment> segs) {
  const int64_t H = cfg_.hidden;
  std::vector<float> xn(size_t(T * H)), mix(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    rms_norm(h + t * H, L.input_norm_scale.data(), H, cfg_.rms_eps, &xn[size_t(t * H)]);
  round_bf16(xn.data(), xn.size());
  if (L.type == LayerType::FullAttention)
    full_attention(L.attn, slot, name, xn.data(), T, segs, mix.data());
  else
    gated_deltanet(gdn_layer, xn.data(), T, segs, mix.data());
  emit(name + ".mixer_out", mix.data(), {T, H});
  for (size_t j = 0; j < mix.size(); ++j) h[j] += mix[j];
  for (int64_t t = 0; t < T; ++t)
    rms_norm(h + t * H, L.post_attention_norm_scale.data(), H, cfg_.rms_eps, &xn[size_t(t * H)]);
  round_bf16(xn.data(), xn.size());
  moe_forward(L.moe, cfg_, xn.data(), T, mix.data(), pool_, trace_ ? &trace_ : nullptr,
              name + ".moe", bf16_activations_);
  emit(name + ".moe_out", mix.data(), {T, H});
  for (size_t j = 0; j < mix.size(); ++j) h[j] += mix[j];
}

std::vector<StepResult> CpuBackend::step_batch(std::span<const BatchItem> items) {
  if (items.size() < 2 || trace_) return Backend::step_batch(items);
  const int64_t H = cfg_.hidden, V = cfg_.vocab;
  // Everything is checked before any state changes.
  std::vector<Segment> segs;
  int64_t R = 0;
  for (const BatchItem& it : items) {
    auto* st = static_cast<CpuSequenceState*>(it.state);
    const int64_t T = int64_t(it.ids.size());
    if (!st || T == 0) fail("step_batch: an item without a state or ids");
    for (const Segment& s : segs)
      if (s.st == st) fail("step_batch: one sequence appears in two items");
    if (st->position() + T > st->max_context)
      fail("context overflow: {} tokens in the sequence + {} new > context size {}", st->position(),
           T, st->max_context);
    for (int32_t id : it.ids)
      if (id < 0 || id >= V) fail("token id {} out of range [0, {})", id, V);
    segs.push_back({st, R, T});
    R += T;
  }
  std::vector<float> h(size_t(R * H));
  for (size_t j = 0; j < items.size(); ++j)
    for (int64_t t = 0; t < segs[j].T; ++t)
      widen_row(w_.embed, items[j].ids[size_t(t)], &h[size_t((segs[j].row0 + t) * H)]);
  for (int64_t i = 0; i < cfg_.layers; ++i) layer(i, h.data(), R, segs);
  for (const Segment& s : segs) s.st->advance(s.T);

  // The sampling items' last rows through the head, then each samples as step() would.
  std::vector<size_t> sampling;
  for (size_t j = 0; j < items.size(); ++j)
    if (items[j].sample) sampling.push_back(j);
  std::vector<StepResult> out(items.size());
  if (sampling.empty()) return out;
  std::vector<float> last(sampling.size() * size_t(H)), logits(sampling.size() * size_t(V));
  for (size_t k = 0; k < sampling.size(); ++k) {
    const Segment& s = segs[sampling[k]];
    std::memcpy(&last[k * size_t(H)], &h[size_t((s.row0 + s.T - 1) * H)], size_t(H) * 4);
  }
  forward_head(last.data(), int64_t(sampling.size()), logits.data());
  const int32_t n = sampling_vocab();
  for (size_t k = 0; k < sampling.size(); ++k) {
    const BatchItem& it = items[sampling[k]];
    float* row = &logits[k * size_t(V)];
    if (it.constraint) {  // as step_constrained: disallowed tokens to -inf
      std::vector<uint32_t> allowed((size_t(n) + 31) / 32, 0u);
      it.constraint->allowed_tokens(allowed);
      for (int32_t t = 0; t < n; ++t)
        if (!(allowed[size_t(t) / 32] >> (t % 32) & 1u))
          row[t] = -std::numeric_limits<float>::infinity();
    }
    SequenceState& st = *it.state;
    out[sampling[k]] = sample_token(row, n, st.sampling,
                                    st.penalties_active ? &st.penalties : nullptr, it.sample_index);
    if (st.penalties_active) st.penalties.add_output(out[sampling[k]].token);
  }
  return out;
}

void CpuBackend::forward_head(const float* h, int64_t rows, float* logits) {
  const int64_t H = cfg_.hidden, V = cfg_.vocab;
  std::vector<float> xn(size_t(rows * H));
  final_norm(h, rows, xn.data());
  matmul(w_.lm_head, xn.data(), rows, H, logits, V, pool_);
  emit("logits", logits, {rows, V});
}

void CpuBackend::final_norm(const float* h, int64_t rows, float* xn) {
  const int64_t H = cfg_.hidden;
  for (int64_t t = 0; t < rows; ++t)
    rms_norm(h + t * H, w_.final_norm_scale.data(), H, cfg_.rms_eps, xn + t * H);
  round_bf16(xn, size_t(rows * H));
  emit("final_norm", xn, {rows, H});
}

}  // namespace lilac::cpu
