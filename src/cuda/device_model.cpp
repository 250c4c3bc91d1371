// Building DeviceModel: one plan of every device tensor (name, size, synthetic value range, and
// where its bytes come from in ModelWeights), then either an upload or a synthetic fill.
#include "cuda/device_model.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "cpu/attention.h"
#include "cuda/common.h"
#include "cuda/synthetic.h"
#include "cuda/synthetic_fill.h"
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
struct Planned {
  std::string name;
  bool is_bf16 = true;
  size_t count = 0;
  float centre = 0.f, a = 0.f;
  std::vector<const Matrix*> parts;
  const std::vector<float>* vec = nullptr;
  const void** target = nullptr;
  size_t offset = 0;  // in the arena
};

float uniform_bound(int64_t fan_in) { return std::sqrt(3.0f / float(fan_in)); }  // std 1/sqrt(fan_in)

// Every tensor of the device layout, in arena order. `w` may be null (synthetic).
std::vector<Planned> plan(const ModelConfig& c, const ModelWeights* w, DeviceModel& dm) {
  std::vector<Planned> p;
  const int64_t H = c.hidden, V = c.vocab;
  auto mat = [&](std::string name, int64_t rows, int64_t cols, const bf16** target, std::vector<const Matrix*> parts) {
    p.push_back({std::move(name), true, size_t(rows * cols), 0.f, uniform_bound(cols), std::move(parts), nullptr,
                 reinterpret_cast<const void**>(target)});
  };
  auto vec = [&](std::string name, int64_t n, float centre, float a, const float** target, const std::vector<float>* src) {
    p.push_back({std::move(name), false, size_t(n), centre, a, {}, src, reinterpret_cast<const void**>(target)});
  };
  mat("embed", V, H, &dm.embed, w ? std::vector<const Matrix*>{&w->embed} : std::vector<const Matrix*>{});
  p.back().a = 1.0f;  // embedding rows: activations of unit-ish scale
  mat("lm_head", V, H, &dm.lm_head, w ? std::vector<const Matrix*>{&w->lm_head} : std::vector<const Matrix*>{});
  vec("final_norm", H, 1.f, 0.1f, &dm.final_norm, w ? &w->final_norm_scale : nullptr);
  dm.layers.resize(size_t(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) {
    DeviceLayer& L = dm.layers[size_t(i)];
    const LayerWeights* lw = w ? &w->layers[size_t(i)] : nullptr;
    L.type = c.layer_types[size_t(i)];
    std::string s = "layers." + std::to_string(i) + ".";
    vec(s + "input_norm", H, 1.f, 0.1f, &L.input_norm, lw ? &lw->input_norm_scale : nullptr);
    vec(s + "post_norm", H, 1.f, 0.1f, &L.post_norm, lw ? &lw->post_attention_norm_scale : nullptr);
    if (L.type == LayerType::GatedDeltaNet) {
      const int64_t C = c.gdn_conv_channels(), Hv = c.gdn_value_heads, Vd = c.gdn_v_channels();
      const auto* g = lw ? &lw->gdn : nullptr;
      mat(s + "in_proj", C + Vd + 2 * Hv, H, &L.in_proj,
          g ? std::vector<const Matrix*>{&g->in_proj_qkv, &g->in_proj_z, &g->in_proj_b, &g->in_proj_a}
            : std::vector<const Matrix*>{});
      vec(s + "conv", C * c.gdn_conv_kernel, 0.f, 0.5f, &L.conv, g ? &g->conv : nullptr);
      vec(s + "neg_exp_A", Hv, -2.25f, 1.75f, &L.neg_exp_A, g ? &g->neg_exp_A : nullptr);
      vec(s + "dt_bias", Hv, 0.f, 1.f, &L.dt_bias, g ? &g->dt_bias : nullptr);
      vec(s + "gdn_norm", c.gdn_value_dim, 1.f, 0.1f, &L.gdn_norm, g ? &g->norm_scale : nullptr);
      mat(s + "out_proj", H, Vd, &L.out_proj, g ? std::vector<const Matrix*>{&g->out_proj} : std::vector<const Matrix*>{});
    } else {
      const auto* a = lw ? &lw->attn : nullptr;
      mat(s + "qkv_proj", c.q_proj_rows() + 2 * c.kv_dim(), H, &L.qkv_proj,
          a ? std::vector<const Matrix*>{&a->q_proj, &a->k_proj, &a->v_proj} : std::vector<const Matrix*>{});
      vec(s + "q_norm", c.head_dim, 1.f, 0.1f, &L.q_norm, a ? &a->q_norm_scale : nullptr);
      vec(s + "k_norm", c.head_dim, 1.f, 0.1f, &L.k_norm, a ? &a->k_norm_scale : nullptr);
      mat(s + "o_proj", H, c.heads * c.head_dim, &L.o_proj,
          a ? std::vector<const Matrix*>{&a->o_proj} : std::vector<const Matrix*>{});
    }
    const auto* m = lw ? &lw->moe : nullptr;
    const int64_t E = c.experts, I = c.expert_intermediate, Is = c.shared_intermediate;
    mat(s + "router", E + 1, H, &L.router,
        m ? std::vector<const Matrix*>{&m->router, &m->shared_expert_gate} : std::vector<const Matrix*>{});
    std::vector<const Matrix*> gate_up, down;
    if (m)
      for (const auto& e : m->experts) {
        gate_up.push_back(&e.gate);
        gate_up.push_back(&e.up);
        down.push_back(&e.down);
      }
    mat(s + "gate_up", E * 2 * I, H, &L.gate_up, gate_up);
    mat(s + "down", E * H, I, &L.down, down);
    mat(s + "shared_gate_up", 2 * Is, H, &L.shared_gate_up,
        m ? std::vector<const Matrix*>{&m->shared_gate, &m->shared_up} : std::vector<const Matrix*>{});
    mat(s + "shared_down", H, Is, &L.shared_down, m ? std::vector<const Matrix*>{&m->shared_down} : std::vector<const Matrix*>{});
  }
  size_t offset = 0;
  for (auto& t : p) {
    t.offset = offset;
    offset += (t.count * (t.is_bf16 ? 2 : 4) + 255) / 256 * 256;
  }
  dm.bytes = offset;
  return p;
}

void allocate(DeviceModel& dm, std::vector<Planned>& p) {
  size_t free_b = 0, total_b = 0;
  LILAC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (dm.bytes + (1ull << 30) > free_b)
    fail("the model needs {:.2f} GB of GPU memory but only {:.2f} GB are free", double(dm.bytes) / 1e9,
         double(free_b) / 1e9);
  LILAC_CUDA_CHECK(cudaMalloc(&dm.arena, dm.bytes));
  for (auto& t : p) *t.target = static_cast<uint8_t*>(dm.arena) + t.offset;
}

// inv_freq is tiny and computed on the host exactly as the CPU backend does.
void set_inv_freq(DeviceModel& dm) {
  auto f = cpu::rope_inv_freq(dm.config.rope_theta, dm.config.rotary_dim, dm.config.rope_inv_freq_bf16);
  float* d = nullptr;
  LILAC_CUDA_CHECK(cudaMalloc(&d, f.size() * 4));
  LILAC_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  dm.inv_freq = d;
  dm.owned.push_back(d);
}

}  // namespace

std::unique_ptr<DeviceModel> upload_model(const Model& model) {
  auto dm = std::make_unique<DeviceModel>();
  dm->config = model.config;
  dm->source = "checkpoint " + model.checkpoint->dir();
  auto p = plan(model.config, &model.weights, *dm);
  allocate(*dm, p);
  std::vector<uint16_t> staging;
  for (const auto& t : p) {
    uint8_t* dst = static_cast<uint8_t*>(dm->arena) + t.offset;
    if (!t.is_bf16) {
      if (!t.vec || t.vec->size() != t.count) fail("upload: {} has {} values, expected {}", t.name, t.vec ? t.vec->size() : 0, t.count);
      LILAC_CUDA_CHECK(cudaMemcpy(dst, t.vec->data(), t.count * 4, cudaMemcpyHostToDevice));
      continue;
    }
    size_t done = 0;
    for (const Matrix* m : t.parts) {
      const size_t n = size_t(m->numel());
      if (m->dtype == DType::BF16) {
        LILAC_CUDA_CHECK(cudaMemcpy(dst + done * 2, m->data, n * 2, cudaMemcpyHostToDevice));
      } else {
        staging.resize(n);
        for (size_t i = 0; i < n; ++i) {
          float v;
          if (m->dtype == DType::F32) std::memcpy(&v, static_cast<const uint8_t*>(m->data) + 4 * i, 4);
          else {
            uint16_t h;
            std::memcpy(&h, static_cast<const uint8_t*>(m->data) + 2 * i, 2);
            v = f16_to_f32(h);
          }
          staging[i] = f32_to_bf16(v);
        }
        LILAC_CUDA_CHECK(cudaMemcpy(dst + done * 2, staging.data(), n * 2, cudaMemcpyHostToDevice));
      }
      done += n;
    }
    if (done != t.count) fail("upload: {} got {} elements, expected {}", t.name, done, t.count);
  }
  set_inv_freq(*dm);
  return dm;
}

std::unique_ptr<DeviceModel> synthetic_device_model(const ModelConfig& config, uint64_t seed) {
  auto dm = std::make_unique<DeviceModel>();
  dm->config = config;
  dm->source = "synthetic (seed " + std::to_string(seed) + ")";
  auto p = plan(config, nullptr, *dm);
  allocate(*dm, p);
  for (const auto& t : p) {
    uint64_t key = synthetic::tensor_key(seed, t.name.c_str());
    uint8_t* dst = static_cast<uint8_t*>(dm->arena) + t.offset;
    if (t.is_bf16) fill_synthetic_bf16(reinterpret_cast<bf16*>(dst), t.count, key, t.centre, t.a, nullptr);
    else fill_synthetic_f32(reinterpret_cast<float*>(dst), t.count, key, t.centre, t.a, nullptr);
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  set_inv_freq(*dm);
  return dm;
}

std::unique_ptr<HostSyntheticModel> synthetic_host_model(const ModelConfig& config, uint64_t seed, int64_t layers) {
  auto hm = std::make_unique<HostSyntheticModel>();
  hm->config = config;
  hm->config.layers = layers;
  hm->config.layer_types.resize(static_cast<size_t>(layers));
  // Plan the truncated model's device layout, generate each tensor on the host, then point the
  // ModelWeights views into the fused host buffers exactly as the device layout fuses them.
  DeviceModel shape_only;
  auto p = plan(hm->config, nullptr, shape_only);
  std::map<std::string, const uint16_t*> bf;
  std::map<std::string, std::vector<float>> f32;
  hm->bf16_storage.reserve(p.size());
  for (const auto& t : p) {
    uint64_t key = synthetic::tensor_key(seed, t.name.c_str());
    if (t.is_bf16) {
      auto& v = hm->bf16_storage.emplace_back(t.count);
      ThreadPool::global().parallel_for(
          t.count,
          [&](size_t b, size_t e) {
            for (size_t i = b; i < e; ++i) v[i] = f32_to_bf16(synthetic::value(key, i, t.centre, t.a));
          },
          1 << 16);
      bf[t.name] = v.data();
    } else {
      auto& v = f32[t.name];
      v.resize(t.count);
      for (size_t i = 0; i < t.count; ++i) v[i] = synthetic::value(key, i, t.centre, t.a);
    }
  }
  shape_only.arena = nullptr;
  const ModelConfig& c = hm->config;
  const int64_t H = c.hidden;
  auto view = [&](const std::string& name, int64_t row0, int64_t rows, int64_t cols) {
    return Matrix{bf.at(name) + size_t(row0 * cols), DType::BF16, rows, cols, name};
  };
  ModelWeights& w = hm->weights;
  w.embed = view("embed", 0, c.vocab, H);
  w.lm_head = view("lm_head", 0, c.vocab, H);
  w.final_norm_scale = f32.at("final_norm");
  for (int64_t i = 0; i < layers; ++i) {
    std::string s = "layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.type = c.layer_types[size_t(i)];
    L.input_norm_scale = f32.at(s + "input_norm");
    L.post_attention_norm_scale = f32.at(s + "post_norm");
    if (L.type == LayerType::GatedDeltaNet) {
      const int64_t C = c.gdn_conv_channels(), Hv = c.gdn_value_heads, Vd = c.gdn_v_channels();
      L.gdn.in_proj_qkv = view(s + "in_proj", 0, C, H);
      L.gdn.in_proj_z = view(s + "in_proj", C, Vd, H);
      L.gdn.in_proj_b = view(s + "in_proj", C + Vd, Hv, H);
      L.gdn.in_proj_a = view(s + "in_proj", C + Vd + Hv, Hv, H);
      L.gdn.out_proj = view(s + "out_proj", 0, H, Vd);
      L.gdn.conv = f32.at(s + "conv");
      L.gdn.neg_exp_A = f32.at(s + "neg_exp_A");
      L.gdn.dt_bias = f32.at(s + "dt_bias");
      L.gdn.norm_scale = f32.at(s + "gdn_norm");
    } else {
      L.attn.q_proj = view(s + "qkv_proj", 0, c.q_proj_rows(), H);
      L.attn.k_proj = view(s + "qkv_proj", c.q_proj_rows(), c.kv_dim(), H);
      L.attn.v_proj = view(s + "qkv_proj", c.q_proj_rows() + c.kv_dim(), c.kv_dim(), H);
      L.attn.o_proj = view(s + "o_proj", 0, H, c.heads * c.head_dim);
      L.attn.q_norm_scale = f32.at(s + "q_norm");
      L.attn.k_norm_scale = f32.at(s + "k_norm");
    }
    const int64_t E = c.experts, I = c.expert_intermediate, Is = c.shared_intermediate;
    L.moe.router = view(s + "router", 0, E, H);
    L.moe.shared_expert_gate = view(s + "router", E, 1, H);
    for (int64_t e = 0; e < E; ++e)
      L.moe.experts.push_back({view(s + "gate_up", e * 2 * I, I, H), view(s + "gate_up", e * 2 * I + I, I, H),
                               view(s + "down", e * H, H, I)});
    L.moe.shared_gate = view(s + "shared_gate_up", 0, Is, H);
    L.moe.shared_up = view(s + "shared_gate_up", Is, Is, H);
    L.moe.shared_down = view(s + "shared_down", 0, H, Is);
    w.layers.push_back(std::move(L));
  }
  return hm;
}

}  // namespace lilac::cuda
