// Building DeviceModel: one plan of every device tensor (name, size, synthetic value range, and
// where its bytes come from in ModelWeights), then either an upload or a synthetic fill.
#include "cuda/device_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "cuda/common.h"
#include "cuda/q4_quantize.h"
#include "cuda/synthetic.h"
#include "cuda/synthetic_fill.h"
#include "model/mlx_affine.h"
#include "model/rope.h"
#include "model/weight_rows.h"
#include "model/weight_table.h"
#include "util/error.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace lilac::cuda {

DeviceModel::~DeviceModel() {
  if (arena) cudaFree(arena);
  for (void* p : owned) cudaFree(p);
}

namespace {

// One device tensor. Upload sources: `parts` (matrices whose rows are concatenated, bf16
// target) or `vec` (f32 target). Synthetic: uniform in [centre - a, centre + a).
// Matrices land in *matrix: bf16 at `offset`, or (bits 4 / 8) in the tiled layout (q4_layout.h):
// codes at `offset`, scale / bias words at `sb_offset`. Vectors land in *target.
// `roles`: the weight table entries (model/weight_table.h) the tensor holds, in row order (a
// vector: its one entry; a stack: the parts of one expert); they give its shape and q4 bits.
struct Planned {
  std::string name;
  std::vector<WeightRole> roles;
  bool is_bf16 = true;
  size_t count = 0;
  float centre = 0.f, a = 0.f;
  std::vector<const Matrix*> parts;
  const std::vector<float>* vec = nullptr;
  const void** target = nullptr;
  int64_t layer = -1;  // the layer it belongs to; -1: embed, lm_head, final norm
  size_t offset = 0;   // in the arena
  // Matrices only:
  int64_t rows = 0, cols = 0;
  int64_t rows_per_stack = 0;  // stacked experts: rows of one expert (a multiple of 16 when
                               // quantized); 0: one matrix (any rows: the last tile is padded)
  int bits = 0;                // 0: bf16
  DeviceMatrix* matrix = nullptr;
  size_t sb_offset = 0;
};

// How the matrices of a plan are stored.
enum class Format {
  Bf16,         // every matrix bf16 (float checkpoints, the bf16 synthetic model)
  FromWeights,  // as the checkpoint holds them (MLX quantized matrices stay quantized)
  Quantize,     // quantized at load with device_q4_bits (--weights q4, the q4 synthetic model)
};

float uniform_bound(int64_t fan_in) {
  return std::sqrt(3.0f / float(fan_in));
}  // std 1/sqrt(fan_in)

// The bits `--weights q4` gives a device matrix: its table entries' (the router fuses the router
// and the shared expert gate, both 8-bit), which must agree since they become one matrix.
int device_q4_bits(const std::string& name, const std::vector<WeightRole>& roles, int64_t cols) {
  const int bits = q4_bits_for(weight_entry(roles.at(0)), cols);
  for (WeightRole r : roles)
    if (q4_bits_for(weight_entry(r), cols) != bits)
      fail("{}: its parts quantize to different bit widths; the CUDA backend fuses them", name);
  return bits;
}

// The bits a matrix is stored with: Bf16 -> 0; Quantize -> device_q4_bits; FromWeights -> the
// parts' bits (all parts alike, group 64), 0 for float parts.
int matrix_bits(Format f, const std::string& name, const std::vector<WeightRole>& roles,
                int64_t cols, const std::vector<const Matrix*>& parts) {
  if (f == Format::Bf16) return 0;
  if (f == Format::Quantize) return device_q4_bits(name, roles, cols);
  if (parts.empty() || !parts[0]->quantized()) {
    for (const Matrix* m : parts)
      if (m->quantized()) fail("{}: mixes quantized ({}) and float parts", name, m->name);
    return 0;
  }
  const int bits = parts[0]->bits;
  for (const Matrix* m : parts) {
    if (!m->quantized() || m->bits != bits)
      fail(
          "{}: its parts have different formats ({} at {} bits, {} at {} bits); the CUDA backend "
          "fuses them into one matrix",
          name, parts[0]->name, bits, m->name, m->bits);
    if (m->group_size != kQGroup)
      fail("{}: group size {}: the CUDA 4-bit kernels support group size {} only", m->name,
           m->group_size, kQGroup);
  }
  return bits;
}

// Rows and columns of a device matrix made of the table entries `roles` (rows concatenated), E
// times over for an expert stack.
std::pair<int64_t, int64_t> fused_shape(const ModelConfig& c, const std::vector<WeightRole>& roles,
                                        bool expert_stack) {
  int64_t rows = 0;
  const int64_t cols = weight_entry(roles.at(0)).shape(c).at(1);
  for (WeightRole r : roles) {
    const std::vector<int64_t> s = weight_entry(r).shape(c);
    if (s.size() != 2 || s[1] != cols)
      fail("device plan: the {} does not fuse with the {}", weight_entry(r).what,
           weight_entry(roles[0]).what);
    rows += s[0];
  }
  return {expert_stack ? c.experts * rows : rows, cols};
}

int64_t numel(const ModelConfig& c, WeightRole role) {
  int64_t n = 1;
  for (int64_t d : weight_entry(role).shape(c)) n *= d;
  return n;
}

// Every tensor of the device layout, in arena order. `w` may be null (synthetic).
std::vector<Planned> plan(const ModelConfig& c, const ModelWeights* w, DeviceModel& dm,
                          Format format) {
  std::vector<Planned> p;
  using R = WeightRole;
  // A matrix of the table entries `roles` (an expert stack: E times [the roles' rows]).
  auto mat = [&](std::string name, std::vector<WeightRole> roles, DeviceMatrix* target,
                 std::vector<const Matrix*> parts, bool expert_stack = false) {
    const auto [rows, cols] = fused_shape(c, roles, expert_stack);
    Planned t{
        std::move(name),  std::move(roles), true,   size_t(rows * cols), 0.f, uniform_bound(cols),
        std::move(parts), nullptr,          nullptr};
    t.matrix = target;
    t.rows = rows;
    t.cols = cols;
    t.rows_per_stack = expert_stack ? rows / c.experts : 0;
    t.bits = matrix_bits(format, t.name, t.roles, cols, t.parts);
    p.push_back(std::move(t));
  };
  auto vec = [&](std::string name, WeightRole role, float centre, float a, const float** target,
                 const std::vector<float>* src) {
    p.push_back({std::move(name),
                 {role},
                 false,
                 size_t(numel(c, role)),
                 centre,
                 a,
                 {},
                 src,
                 reinterpret_cast<const void**>(target)});
  };
  mat("embed", {R::Embed}, &dm.embed,
      w ? std::vector<const Matrix*>{&w->embed} : std::vector<const Matrix*>{});
  p.back().a = 1.0f;  // embedding rows: activations of unit-ish scale
  mat("lm_head", {R::LmHead}, &dm.lm_head,
      w ? std::vector<const Matrix*>{&w->lm_head} : std::vector<const Matrix*>{});
  vec("final_norm", R::FinalNorm, 1.f, 0.1f, &dm.final_norm, w ? &w->final_norm_scale : nullptr);
  dm.layers.resize(size_t(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) {
    DeviceLayer& L = dm.layers[size_t(i)];
    const LayerWeights* lw = w ? &w->layers[size_t(i)] : nullptr;
    L.type = c.layer_types[size_t(i)];
    const size_t first = p.size();
    std::string s = "layers." + std::to_string(i) + ".";
    vec(s + "input_norm", R::InputNorm, 1.f, 0.1f, &L.input_norm,
        lw ? &lw->input_norm_scale : nullptr);
    vec(s + "post_norm", R::PostAttentionNorm, 1.f, 0.1f, &L.post_norm,
        lw ? &lw->post_attention_norm_scale : nullptr);
    if (L.type == LayerType::GatedDeltaNet) {
      const auto* g = lw ? &lw->gdn : nullptr;
      mat(s + "in_proj", {R::GdnInProjQkv, R::GdnInProjZ, R::GdnInProjB, R::GdnInProjA}, &L.in_proj,
          g ? std::vector<const Matrix*>{&g->in_proj_qkv, &g->in_proj_z, &g->in_proj_b,
                                         &g->in_proj_a}
            : std::vector<const Matrix*>{});
      vec(s + "conv", R::GdnConv1d, 0.f, 0.5f, &L.conv, g ? &g->conv : nullptr);
      vec(s + "neg_exp_A", R::GdnALog, -2.25f, 1.75f, &L.neg_exp_A, g ? &g->neg_exp_A : nullptr);
      vec(s + "dt_bias", R::GdnDtBias, 0.f, 1.f, &L.dt_bias, g ? &g->dt_bias : nullptr);
      vec(s + "gdn_norm", R::GdnNorm, 1.f, 0.1f, &L.gdn_norm, g ? &g->norm_scale : nullptr);
      mat(s + "out_proj", {R::GdnOutProj}, &L.out_proj,
          g ? std::vector<const Matrix*>{&g->out_proj} : std::vector<const Matrix*>{});
    } else {
      const auto* a = lw ? &lw->attn : nullptr;
      mat(s + "qkv_proj", {R::AttnQProj, R::AttnKProj, R::AttnVProj}, &L.qkv_proj,
          a ? std::vector<const Matrix*>{&a->q_proj, &a->k_proj, &a->v_proj}
            : std::vector<const Matrix*>{});
      vec(s + "q_norm", R::AttnQNorm, 1.f, 0.1f, &L.q_norm, a ? &a->q_norm_scale : nullptr);
      vec(s + "k_norm", R::AttnKNorm, 1.f, 0.1f, &L.k_norm, a ? &a->k_norm_scale : nullptr);
      mat(s + "o_proj", {R::AttnOProj}, &L.o_proj,
          a ? std::vector<const Matrix*>{&a->o_proj} : std::vector<const Matrix*>{});
    }
    const auto* m = lw ? &lw->moe : nullptr;
    mat(s + "router", {R::Router, R::SharedExpertGate}, &L.router,
        m ? std::vector<const Matrix*>{&m->router, &m->shared_expert_gate}
          : std::vector<const Matrix*>{});
    std::vector<const Matrix*> gate_up, down;
    if (m)
      for (const auto& e : m->experts) {
        gate_up.push_back(&e.gate);
        gate_up.push_back(&e.up);
        down.push_back(&e.down);
      }
    mat(s + "gate_up", {R::ExpertGate, R::ExpertUp}, &L.gate_up, gate_up, true);
    mat(s + "down", {R::ExpertDown}, &L.down, down, true);
    mat(s + "shared_gate_up", {R::SharedGate, R::SharedUp}, &L.shared_gate_up,
        m ? std::vector<const Matrix*>{&m->shared_gate, &m->shared_up}
          : std::vector<const Matrix*>{});
    mat(s + "shared_down", {R::SharedDown}, &L.shared_down,
        m ? std::vector<const Matrix*>{&m->shared_down} : std::vector<const Matrix*>{});
    for (size_t j = first; j < p.size(); ++j) p[j].layer = i;
  }
  size_t offset = 0;
  auto take = [&](size_t bytes) {
    const size_t at = offset;
    offset += (bytes + 255) / 256 * 256;
    return at;
  };
  for (auto& t : p) {
    if (t.bits == 0) {
      t.offset = take(t.count * (t.is_bf16 ? 2 : 4));
      continue;
    }
    if (t.rows_per_stack % kQTileRows != 0)  // 0 (one matrix) passes
      fail("{}: {} rows per expert: the 4-bit expert kernels need a multiple of {}", t.name,
           t.rows_per_stack, kQTileRows);
    t.offset = take(q_code_words(t.rows, t.cols, t.bits) * 4);
    t.sb_offset = take(q_sb_words(t.rows, t.cols) * 4);
    ++dm.quantized_matrices;
  }
  dm.bytes = offset;
  return p;
}

// Device scratch for building quantized matrices: MLX-format codes / scales / biases of the
// largest quantized matrix, and its bf16 values when it is quantized here.
struct Staging {
  DeviceBuffer<uint32_t> codes;
  DeviceBuffer<uint16_t> scales, biases;
  DeviceBuffer<bf16> values;
  size_t bytes = 0;

  Staging(const std::vector<Planned>& p, bool need_values) {
    size_t words = 0, groups = 0, elems = 0;
    for (const auto& t : p) {
      if (t.bits == 0) continue;
      words = std::max(words, size_t(t.rows * t.cols * t.bits / 32));
      groups = std::max(groups, size_t(t.rows * (t.cols / kQGroup)));
      elems = std::max(elems, size_t(t.rows * t.cols));
    }
    bytes = words * 4 + groups * 4 + (need_values ? elems * 2 : 0);
    sizes[0] = words;
    sizes[1] = groups;
    sizes[2] = need_values ? elems : 0;
  }
  void allocate() {
    codes.resize(sizes[0]);
    scales.resize(sizes[1]);
    biases.resize(sizes[1]);
    values.resize(sizes[2]);
  }
  size_t sizes[3] = {0, 0, 0};
};

// MLX staging -> the tiled matrix in the arena, and its description.
void finish_quantized(DeviceModel& dm, const Planned& t, Staging& st) {
  uint8_t* base = static_cast<uint8_t*>(dm.arena);
  uint32_t* codes = reinterpret_cast<uint32_t*>(base + t.offset);
  uint32_t* sb = reinterpret_cast<uint32_t*>(base + t.sb_offset);
  repack_mlx(st.codes.get(), st.scales.get(), st.biases.get(), t.rows, int(t.cols), t.bits, codes,
             sb, nullptr);
  QMatrix q{codes, sb, int(t.rows), int(t.cols), t.bits};
  q.small_scales = q_scales_below_half(sb, q.sb_words());
  *t.matrix = DeviceMatrix{DeviceFormat::Affine, nullptr, q};
}

void allocate(DeviceModel& dm, std::vector<Planned>& p, size_t staging_bytes = 0) {
  size_t free_b = 0, total_b = 0;
  LILAC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (dm.bytes + staging_bytes + (1ull << 30) > free_b)
    fail(
        "the model needs {:.2f} GB of GPU memory (+ {:.2f} GB while loading) but only {:.2f} GB "
        "are free",
        double(dm.bytes) / 1e9, double(staging_bytes) / 1e9, double(free_b) / 1e9);
  LILAC_CUDA_CHECK(cudaMalloc(&dm.arena, dm.bytes));
  for (auto& t : p) {
    const uint8_t* at = static_cast<uint8_t*>(dm.arena) + t.offset;
    if (!t.matrix)
      *t.target = at;
    else if (t.bits == 0)  // quantized ones are set by finish_quantized
      *t.matrix = DeviceMatrix{DeviceFormat::Bf16, reinterpret_cast<const bf16*>(at), QMatrix{}};
  }
}

// A float part's elements as bf16 into `dst` (device): BF16 as is; F16 / F32 rounded to nearest
// even; FP8 dequantized (fp8 * its block's scale, widen_row) and rounded: the values a BF16
// checkpoint would hold, as `lilac quantize` reads them. Rows are converted by the thread pool.
void upload_bf16_part(const Matrix& m, bf16* dst, std::vector<uint16_t>& staging) {
  const size_t n = size_t(m.numel());
  if (m.dtype == DType::BF16) {
    LILAC_CUDA_CHECK(cudaMemcpy(dst, m.data, n * 2, cudaMemcpyHostToDevice));
    return;
  }
  staging.resize(n);
  const size_t cols = size_t(m.cols);
  ThreadPool::global().parallel_for(size_t(m.rows), [&](size_t r0, size_t r1) {
    std::vector<float> row(cols);
    for (size_t r = r0; r < r1; ++r) {
      widen_row(m, int64_t(r), row.data());
      for (size_t c = 0; c < cols; ++c) staging[r * cols + c] = f32_to_bf16(row[c]);
    }
  });
  LILAC_CUDA_CHECK(cudaMemcpy(dst, staging.data(), n * 2, cudaMemcpyHostToDevice));
}

// inv_freq is tiny and computed on the host exactly as the CPU backend does.
void set_inv_freq(DeviceModel& dm) {
  auto f = rope_inv_freq(dm.config.rope_theta, dm.config.rotary_dim, dm.config.rope_inv_freq_bf16);
  float* d = nullptr;
  LILAC_CUDA_CHECK(cudaMalloc(&d, f.size() * 4));
  LILAC_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  dm.inv_freq = d;
  dm.owned.push_back(d);
}

}  // namespace

std::unique_ptr<DeviceModel> upload_model(const ModelConfig& config, const ModelWeights& weights,
                                          const std::string& checkpoint_dir, bool quantize) {
  auto dm = std::make_unique<DeviceModel>();
  dm->config = config;
  if (quantize && has_quantized_weights(weights))
    fail("upload: --weights q4 asks to quantize {}, which is already quantized", checkpoint_dir);
  const Format format = quantize ? Format::Quantize : Format::FromWeights;
  auto p = plan(config, &weights, *dm, format);
  dm->source = "checkpoint " + checkpoint_dir;
  if (quantize)
    dm->source += " (quantized to 4-bit on the GPU at load)";
  else if (dm->quantized_matrices)
    dm->source += " (MLX affine quantized)";
  Staging st(p, quantize);
  allocate(*dm, p, st.bytes);
  st.allocate();
  std::vector<uint16_t> staging;
  std::vector<float> rounded;
  for (const auto& t : p) {
    uint8_t* dst = static_cast<uint8_t*>(dm->arena) + t.offset;
    if (!t.is_bf16) {
      if (!t.vec || t.vec->size() != t.count)
        fail("upload: {} has {} values, expected {}", t.name, t.vec ? t.vec->size() : 0, t.count);
      const float* src = t.vec->data();
      // quantize_model_in_memory rounds every vector but A_log (neg_exp_A) to bf16, as MLX stores
      // it.
      if (quantize && weight_entry(t.roles[0]).vector_rule != VectorRule::NegExp) {
        rounded.assign(t.vec->begin(), t.vec->end());
        for (float& v : rounded) v = round_to_bf16(v);
        src = rounded.data();
      }
      LILAC_CUDA_CHECK(cudaMemcpy(dst, src, t.count * 4, cudaMemcpyHostToDevice));
      continue;
    }
    int64_t done = 0;  // rows
    for (const Matrix* m : t.parts) {
      if (m->cols != t.cols)
        fail("upload: {} has {} columns, expected {}", m->name, m->cols, t.cols);
      if (t.bits == 0) {
        upload_bf16_part(*m, reinterpret_cast<bf16*>(dst) + size_t(done * t.cols), staging);
      } else if (quantize) {
        upload_bf16_part(*m, st.values.get() + size_t(done * t.cols), staging);
      } else {  // MLX codes, scales and biases, rows concatenated
        const int64_t G = t.cols / kQGroup;
        LILAC_CUDA_CHECK(cudaMemcpy(st.codes.get() + size_t(done * t.cols * t.bits / 32), m->data,
                                    size_t(m->rows * m->cols * t.bits / 8),
                                    cudaMemcpyHostToDevice));
        LILAC_CUDA_CHECK(cudaMemcpy(st.scales.get() + size_t(done * G), m->scales,
                                    size_t(m->rows * G) * 2, cudaMemcpyHostToDevice));
        LILAC_CUDA_CHECK(cudaMemcpy(st.biases.get() + size_t(done * G), m->biases,
                                    size_t(m->rows * G) * 2, cudaMemcpyHostToDevice));
      }
      done += m->rows;
    }
    if (done != t.rows) fail("upload: {} got {} rows, expected {}", t.name, done, t.rows);
    if (t.bits == 0) continue;
    if (quantize)
      quantize_mlx(st.values.get(), t.rows, int(t.cols), t.bits, st.codes.get(), st.scales.get(),
                   st.biases.get(), nullptr);
    finish_quantized(*dm, t, st);
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  set_inv_freq(*dm);
  return dm;
}

std::unique_ptr<DeviceModel> synthetic_device_model(const ModelConfig& config, uint64_t seed,
                                                    bool q4, SyntheticRouter router) {
  auto dm = std::make_unique<DeviceModel>();
  dm->config = config;
  dm->source =
      std::string(q4 ? "synthetic q4" : "synthetic") + " (seed " + std::to_string(seed) + ")";
  auto p = plan(config, nullptr, *dm, q4 ? Format::Quantize : Format::Bf16);
  Staging st(p, true);
  allocate(*dm, p, st.bytes);
  st.allocate();
  for (const auto& t : p) {
    uint64_t key = synthetic::tensor_key(seed, t.name.c_str());
    uint8_t* dst = static_cast<uint8_t*>(dm->arena) + t.offset;
    const auto row_a = synthetic_row_amplitudes(router, t.name, key, t.rows, t.a);
    auto fill_bf16 = [&](bf16* values) {
      if (row_a.empty())
        fill_synthetic_bf16(values, t.count, key, t.centre, t.a, nullptr);
      else
        fill_synthetic_bf16_rows(values, t.cols, key, t.centre, row_a, nullptr);
    };
    if (t.bits) {
      fill_bf16(st.values.get());
      quantize_mlx(st.values.get(), t.rows, int(t.cols), t.bits, st.codes.get(), st.scales.get(),
                   st.biases.get(), nullptr);
      finish_quantized(*dm, t, st);
    } else if (t.is_bf16) {
      fill_bf16(reinterpret_cast<bf16*>(dst));
    } else {
      fill_synthetic_f32(reinterpret_cast<float*>(dst), t.count, key, t.centre, t.a, nullptr);
    }
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  set_inv_freq(*dm);
  return dm;
}

std::unique_ptr<HostSyntheticModel> synthetic_host_model(const ModelConfig& config, uint64_t seed,
                                                         int64_t layers, bool q4,
                                                         SyntheticRouter router) {
  auto hm = std::make_unique<HostSyntheticModel>();
  hm->config = config;
  hm->config.layers = layers;
  hm->config.layer_types.resize(static_cast<size_t>(layers));
  // Plan the truncated model's device layout, generate each tensor on the host, then point the
  // ModelWeights views into the fused host buffers exactly as the device layout fuses them.
  DeviceModel shape_only;
  shape_only.layers.resize(size_t(layers));
  auto p = plan(hm->config, nullptr, shape_only, q4 ? Format::Quantize : Format::Bf16);
  struct HostQ {
    const uint32_t* codes;
    const uint16_t *scales, *biases;
    int bits;
  };
  std::map<std::string, const uint16_t*> bf;
  std::map<std::string, HostQ> qm;
  std::map<std::string, std::vector<float>> f32;
  hm->bf16_storage.reserve(3 * p.size());
  hm->code_storage.reserve(p.size());
  for (const auto& t : p) {
    uint64_t key = synthetic::tensor_key(seed, t.name.c_str());
    if (t.is_bf16) {
      std::vector<uint16_t> v(t.count);
      const auto row_a = synthetic_row_amplitudes(router, t.name, key, t.rows, t.a);
      ThreadPool::global().parallel_for(
          t.count,
          [&](size_t b, size_t e) {
            for (size_t i = b; i < e; ++i)
              v[i] = f32_to_bf16(synthetic::value(key, i, t.centre,
                                                  row_a.empty() ? t.a : row_a[i / size_t(t.cols)]));
          },
          1 << 16);
      if (t.bits == 0) {
        bf[t.name] = hm->bf16_storage.emplace_back(std::move(v)).data();
        continue;
      }
      // The device quantizes these bf16 values with cuda::quantize_mlx: the same codes.
      const int64_t G = t.cols / kQGroup, wpr = t.cols * t.bits / 32;
      auto& codes = hm->code_storage.emplace_back(size_t(t.rows * wpr));
      auto& scales = hm->bf16_storage.emplace_back(size_t(t.rows * G));
      auto& biases = hm->bf16_storage.emplace_back(size_t(t.rows * G));
      ThreadPool::global().parallel_for(size_t(t.rows), [&](size_t b, size_t e) {
        std::vector<float> row(static_cast<size_t>(t.cols));
        for (size_t r = b; r < e; ++r) {
          for (int64_t j = 0; j < t.cols; ++j)
            row[size_t(j)] = bf16_to_f32(v[r * size_t(t.cols) + size_t(j)]);
          mlx_quantize_row(row.data(), t.cols, t.bits, kQGroup, &codes[r * size_t(wpr)],
                           &scales[r * size_t(G)], &biases[r * size_t(G)]);
        }
      });
      qm[t.name] = HostQ{codes.data(), scales.data(), biases.data(), t.bits};
    } else {
      auto& v = f32[t.name];
      v.resize(t.count);
      for (size_t i = 0; i < t.count; ++i) v[i] = synthetic::value(key, i, t.centre, t.a);
    }
  }
  shape_only.arena = nullptr;
  const ModelConfig& c = hm->config;
  auto view = [&](const std::string& name, int64_t row0, int64_t rows, int64_t cols) {
    auto it = qm.find(name);
    if (it == qm.end())
      return Matrix{bf.at(name) + size_t(row0 * cols), DType::BF16, rows, cols, name};
    const HostQ& q = it->second;
    const int64_t G = cols / kQGroup;
    Matrix m{q.codes + size_t(row0 * cols * q.bits / 32), DType::U32, rows, cols, name};
    m.bits = q.bits;
    m.group_size = kQGroup;
    m.scales = q.scales + size_t(row0 * G);
    m.biases = q.biases + size_t(row0 * G);
    return m;
  };
  // Each planned tensor's parts, in row order (an expert stack: the parts of expert 0, then of
  // expert 1, ...), viewed into the fields of ModelWeights their table entries name.
  ModelWeights& w = hm->weights;
  w.layers.resize(size_t(layers));
  for (int64_t i = 0; i < layers; ++i) {
    w.layers[size_t(i)].type = c.layer_types[size_t(i)];
    w.layers[size_t(i)].moe.experts.resize(size_t(c.experts));
  }
  for (const auto& t : p) {
    LayerWeights* L = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    if (!t.matrix) {
      const WeightRole r = t.roles[0];
      *(L ? layer_vector(*L, r) : model_vector(w, r)) = f32.at(t.name);
      continue;
    }
    const int64_t stacks = t.rows_per_stack ? t.rows / t.rows_per_stack : 1;
    int64_t row0 = 0;
    for (int64_t e = 0; e < stacks; ++e)
      for (WeightRole r : t.roles) {
        const std::vector<int64_t> shape = weight_entry(r).shape(c);
        Matrix* dst = weight_entry(r).scope == WeightScope::Expert
                          ? expert_matrix(L->moe.experts[size_t(e)], r)
                      : L ? layer_matrix(*L, r)
                          : model_matrix(w, r);
        *dst = view(t.name, row0, shape[0], shape[1]);
        row0 += shape[0];
      }
  }
  return hm;
}

}  // namespace lilac::cuda
