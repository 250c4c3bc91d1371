#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/checkpoint_mlx.h"
#include "model/weight_table.h"
#include "util/error.h"
#include "util/half.h"
#include "util/json_parse.h"
#include "util/mapped_file.h"

namespace fs = std::filesystem;

namespace lilac {

using nlohmann::json;

std::string format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::FP8:
      return "fp8";
    case WeightFormat::MLX4:
      return "mlx-4bit";
  }
  return "?";
}

std::string layout_name(ExpertLayout l) {
  switch (l) {
    case ExpertLayout::Fused:
      return "hub (fused gate_up_proj / down_proj)";
    case ExpertLayout::PerExpert:
      return "per-expert (experts.E.*.weight)";
    case ExpertLayout::Mixed:
      return "mixed (fused and per-expert layers)";
    case ExpertLayout::Stacked:
      return "stacked (switch_mlp)";
  }
  return "?";
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  auto ck = std::make_unique<Checkpoint>();
  ck->dir_ = dir;
  std::error_code dir_ec;
  if (!fs::is_directory(dir, dir_ec)) fail("{}: not a directory", dir);
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  // shard file name -> tensor names the index puts there
  std::map<std::string, std::vector<std::string>> shards;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    json index;
    try {
      index = parse_json(read_small_file(index_path.string()));
    } catch (const JsonParseError& e) {
      fail("{}: not valid JSON: {}", index_path.string(), e.what());
    }
    if (!index.is_object()) fail("{}: not valid JSON (not an object)", index_path.string());
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail("{}: missing \"weight_map\" object", index_path.string());
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail("{}: weight_map[\"{}\"] is not a file name", index_path.string(), it.key());
      std::string shard = it.value().get<std::string>();
      if (shard.size() > 255)  // NAME_MAX: the filesystem would refuse it
        fail("{}: weight_map[\"{}\"] names a file of {} characters (at most 255): \"{}...\"",
             index_path.string(), it.key(), shard.size(), shard.substr(0, 40));
      if (shard.empty() || shard.find('/') != std::string::npos ||
          shard.find('\0') != std::string::npos || shard == "." || shard == "..")
        fail("{}: weight_map[\"{}\"] = \"{}\" is not a plain file name", index_path.string(),
             it.key(), shard);
      shards[shard].push_back(it.key());
    }
    if (shards.empty()) fail("{}: weight_map is empty", index_path.string());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    shards["model.safetensors"] = {};
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }

  for (const auto& [shard, names] : shards) {
    fs::path p = fs::path(dir) / shard;
    if (!fs::exists(p, ec))
      fail("{}: missing shard '{}' (the index puts {} tensors there, e.g. '{}')", dir, shard,
           names.size(), names.empty() ? "" : names.front());
    auto file = SafetensorsFile::open(p.string());
    for (const auto& t : file->tensors()) {
      auto [it, inserted] = ck->tensors_.emplace(t.name, CheckpointTensor{file.get(), &t});
      if (!inserted)
        fail("{}: tensor '{}' appears in both {} and {}", dir, t.name, it->second.file->path(),
             file->path());
    }
    for (const auto& name : names) {
      if (!file->find(name))
        fail("{}: the index puts tensor '{}' in {}, but that file does not hold it", dir, name,
             p.string());
    }
    if (!names.empty()) {
      std::set<std::string> listed(names.begin(), names.end());
      for (const auto& t : file->tensors())
        if (!listed.count(t.name))
          fail("{}: {} holds tensor '{}', which the index does not list for that file", dir,
               p.string(), t.name);
    }
    ck->files_.push_back(std::move(file));
  }
  return ck;
}

WeightFormat Checkpoint::format() const {
  bool fp8 = false;
  for (const auto& [name, t] : tensors_) {
    if (name.size() > 7 && name.ends_with(".scales") && t.info->dtype != DType::F8_E4M3)
      return WeightFormat::MLX4;
    if (t.info->dtype == DType::F8_E4M3) fp8 = true;
  }
  return fp8 ? WeightFormat::FP8 : WeightFormat::BF16;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.info->nbytes();
  return n;
}

// Maps a checkpoint name to the text model's canonical name (see checkpoint.h).
std::string canonical_tensor_name(const std::string& name) {
  static const char* kSkip[] = {"model.visual.", "visual.", "vision_tower.", "model.vision_tower."};
  for (const char* s : kSkip)
    if (name.starts_with(s)) return "";
  static const std::pair<const char*, const char*> kPrefixes[] = {
      {"model.language_model.", ""},
      {"language_model.model.", ""},
      {"language_model.lm_head.", "lm_head."},
      {"model.mtp.", "mtp."},
      {"model.", ""}};
  for (const auto& [from, to] : kPrefixes)
    if (name.starts_with(from)) return to + name.substr(std::string(from).size());
  return name;
}

namespace {
class Binder {
 public:
  Binder(const Checkpoint& ck, LoadReport& rep) : rep_(rep) {
    for (const auto& [name, t] : ck.tensors()) {
      std::string c = canonical_tensor_name(name);
      if (c.empty()) {
        ++skipped_;
        continue;
      }
      if (!canon_.emplace(c, std::make_pair(name, t)).second)
        rep_.problems.push_back(
            fmt::format("tensor '{}' duplicates '{}' under another prefix", name, canon_[c].first));
    }
    if (skipped_) rep_.notes.push_back(fmt::format("skipped {} vision tensors", skipped_));
  }

  bool has(const std::string& c) const { return canon_.count(c) > 0; }

  const CheckpointTensor* get(const std::string& c, const std::vector<int64_t>& shape,
                              bool float_only = true) {
    auto it = canon_.find(c);
    if (it == canon_.end()) {
      rep_.problems.push_back(fmt::format("missing tensor '{}'", c));
      return nullptr;
    }
    used_.insert(c);
    const auto& [orig, t] = it->second;
    if (float_only && !is_float_weight(t.info->dtype)) {
      rep_.problems.push_back(fmt::format("tensor '{}' ({}): dtype {} is not BF16, F16 or F32",
                                          orig, t.file->path(), dtype_name(t.info->dtype)));
      return nullptr;
    }
    if (t.info->shape != shape) {
      rep_.problems.push_back(
          fmt::format("tensor '{}' ({}): shape {}, expected {} from config.json", orig,
                      t.file->path(), shape_string(t.info->shape), shape_string(shape)));
      return nullptr;
    }
    rep_.tensors_used++;
    rep_.parameters += t.info->numel();
    rep_.bytes += t.info->nbytes();
    return &t;
  }

  // A [rows, cols] weight: BF16 / F16 / F32, or FP8 E4M3 with its block scales c + "_scale_inv"
  // (F32 / BF16 / F16, [ceil(rows / block_rows), ceil(cols / block_cols)]).
  Matrix matrix(const std::string& c, int64_t rows, int64_t cols) {
    Matrix m;
    m.name = c;
    m.rows = rows;
    m.cols = cols;
    const CheckpointTensor* t = get(c, {rows, cols}, /*float_only=*/false);
    if (!t) return m;
    m.name = t->info->name;
    if (t->info->dtype == DType::F8_E4M3) {
      const std::vector<int64_t> grid = {(rows + block_rows_ - 1) / block_rows_,
                                         (cols + block_cols_ - 1) / block_cols_};
      const CheckpointTensor* s = get(c + "_scale_inv", grid);
      if (!s) return m;
      rep_.parameters -= s->info->numel();  // scales, not parameters
      m.block_scale = s->data();
      m.block_scale_dtype = s->info->dtype;
      m.block_rows = block_rows_;
      m.block_cols = block_cols_;
    } else if (!is_float_weight(t->info->dtype)) {
      rep_.problems.push_back(
          fmt::format("tensor '{}' ({}): dtype {} is not BF16, F16, F32 or F8_E4M3", t->info->name,
                      t->file->path(), dtype_name(t->info->dtype)));
      return m;
    }
    m.data = t->data();
    m.dtype = t->info->dtype;
    return m;
  }

  // A float vector of n values converted to f32 (+1 for zero-centred norm weights).
  std::vector<float> vec(const std::string& c, const std::vector<int64_t>& shape, float add = 0.f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> out(size_t(n), add);
    if (const CheckpointTensor* t = get(c, shape)) {
      const uint8_t* p = t->data();
      for (int64_t i = 0; i < n; ++i) {
        float v = 0;
        if (t->info->dtype == DType::F32)
          std::memcpy(&v, p + 4 * i, 4);
        else {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          v = t->info->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        out[size_t(i)] = add + v;
      }
    }
    return out;
  }

  // A weight table entry's tensor `c` (the HF name of one of its occurrences).
  Matrix matrix(const WeightEntry& e, const std::string& c, const ModelConfig& cfg) {
    const std::vector<int64_t> s = e.shape(cfg);
    return matrix(c, s[0], s[1]);
  }
  // A Vector entry's values as the model uses them: zero-centred norms as 1 + w, A_log as
  // -exp(A_log).
  std::vector<float> vec(const WeightEntry& e, const std::string& c, const ModelConfig& cfg) {
    std::vector<float> v =
        vec(c, e.shape(cfg), e.vector_rule == VectorRule::ZeroCentred ? 1.f : 0.f);
    if (e.vector_rule == VectorRule::NegExp)
      for (float& x : v) x = -std::exp(x);
    return v;
  }

  // A Fused entry: ExpertsGateUp [E, 2I, H] viewed as each expert's gate and up, ExpertsDown
  // [E, H, I] as each expert's down.
  void fused_experts(const WeightEntry& entry, const std::string& c, const ModelConfig& cfg,
                     MoeWeights& moe) {
    const int64_t I = cfg.expert_intermediate, H = cfg.hidden;
    const bool gate_up = entry.role == WeightRole::ExpertsGateUp;
    const CheckpointTensor* t = get(c, entry.shape(cfg));
    for (size_t e = 0; e < moe.experts.size(); ++e) {
      auto& x = moe.experts[e];
      if (gate_up) {
        x.gate = {nullptr, DType::BF16, I, H, c};
        x.up = {nullptr, DType::BF16, I, H, c};
      } else {
        x.down = {nullptr, DType::BF16, H, I, c};
      }
      if (!t) continue;
      const size_t es = dtype_size(t->info->dtype);
      const uint8_t* base = t->data() + e * size_t(entry.shape(cfg)[1] * entry.shape(cfg)[2]) * es;
      if (gate_up) {
        x.gate.data = base;
        x.up.data = base + size_t(I * H) * es;
        x.gate.dtype = x.up.dtype = t->info->dtype;
      } else {
        x.down.data = base;
        x.down.dtype = t->info->dtype;
      }
    }
  }

  void report_unused(const ModelConfig& cfg) {
    for (const auto& [c, entry] : canon_)
      if (!used_.count(c))
        rep_.problems.push_back(fmt::format("unexpected tensor '{}' ({}): {}", entry.first,
                                            entry.second.file->path(),
                                            explain_unused_tensor(c, NameLayout::Hf, cfg)));
  }

  int fused_layers = 0, per_expert_layers = 0;
  int64_t block_rows_ = 128, block_cols_ = 128;  // FP8 weight_scale_inv blocks (config.json)

 private:
  LoadReport& rep_;
  std::map<std::string, std::pair<std::string, CheckpointTensor>> canon_;
  std::set<std::string> used_;
  int64_t skipped_ = 0;
};

// One decoder layer (or MTP layer: `mtp`) of `type`: every weight table entry the layer has, under
// its HF name; the experts from the hub's fused tensors when the layer has them, else per expert.
LayerWeights bind_layer(Binder& b, const ModelConfig& cfg, int64_t index, bool mtp,
                        LayerType type) {
  LayerWeights L;
  L.type = type;
  auto name = [&](const WeightEntry& e, int64_t expert = -1) {
    return weight_name(e, NameLayout::Hf, index, expert, mtp);
  };
  const bool fused = b.has(name(weight_entry(WeightRole::ExpertsGateUp))) ||
                     b.has(name(weight_entry(WeightRole::ExpertsDown)));
  (fused ? b.fused_layers : b.per_expert_layers)++;
  L.moe.experts.resize(size_t(cfg.experts));
  for (const WeightEntry& e : weight_table()) {
    if (!in_layer(e, type)) continue;
    if (e.kind == WeightKind::Vector) {
      *layer_vector(L, e.role) = b.vec(e, name(e), cfg);
    } else if (e.kind == WeightKind::Fused) {
      if (fused) b.fused_experts(e, name(e), cfg, L.moe);
    } else if (e.scope == WeightScope::Expert) {
      if (!fused)
        for (int64_t x = 0; x < cfg.experts; ++x)
          *expert_matrix(L.moe.experts[size_t(x)], e.role) = b.matrix(e, name(e, x), cfg);
    } else {
      *layer_matrix(L, e.role) = b.matrix(e, name(e), cfg);
    }
  }
  return L;
}

}  // namespace

ModelWeights bind_weights(const Checkpoint& ck, const ModelConfig& cfg, LoadReport& rep) {
  if (ck.format() == WeightFormat::MLX4) return bind_weights_mlx(ck, cfg, rep);
  ModelWeights w;
  Binder b(ck, rep);
  b.block_rows_ = cfg.fp8_block_rows;
  b.block_cols_ = cfg.fp8_block_cols;
  if (ck.format() == WeightFormat::FP8)
    rep.notes.push_back(fmt::format(
        "FP8 E4M3 weights with {}x{} block scales: the CPU dequantizes them as it reads them, the "
        "GPU to BF16 at load; --weights q4 quantizes them to 4-bit at load",
        cfg.fp8_block_rows, cfg.fp8_block_cols));
  auto entry = [](WeightRole r) -> const WeightEntry& { return weight_entry(r); };
  auto hf = [](const WeightEntry& e) { return weight_name(e, NameLayout::Hf); };
  const WeightEntry& embed = entry(WeightRole::Embed);
  const WeightEntry& lm_head = entry(WeightRole::LmHead);
  w.embed = b.matrix(embed, hf(embed), cfg);
  if (b.has(hf(lm_head)) || !cfg.tie_word_embeddings)
    w.lm_head = b.matrix(lm_head, hf(lm_head), cfg);
  else
    w.lm_head = w.embed;
  w.final_norm_scale = b.vec(entry(WeightRole::FinalNorm), hf(entry(WeightRole::FinalNorm)), cfg);
  for (int64_t i = 0; i < cfg.layers; ++i)
    w.layers.push_back(bind_layer(b, cfg, i, false, cfg.layer_types[size_t(i)]));

  if (b.has(hf(entry(WeightRole::MtpFc)))) {
    MtpWeights m;
    for (const WeightEntry& e : weight_table()) {
      if (e.scope != WeightScope::Mtp) continue;
      if (e.kind == WeightKind::Matrix)
        *mtp_matrix(m, e.role) = b.matrix(e, hf(e), cfg);
      else
        *mtp_vector(m, e.role) = b.vec(e, hf(e), cfg);
    }
    int64_t n = std::max<int64_t>(cfg.mtp_layers, 1);
    for (int64_t i = 0; i < n; ++i)
      m.layers.push_back(bind_layer(b, cfg, i, true, LayerType::FullAttention));
    w.mtp = std::move(m);
  } else if (cfg.mtp_layers > 0) {
    rep.notes.push_back(
        "config has mtp_num_hidden_layers but the checkpoint has no mtp.* tensors (MTP off)");
  }
  b.report_unused(cfg);
  rep.layout = b.per_expert_layers == 0 ? ExpertLayout::Fused
               : b.fused_layers == 0    ? ExpertLayout::PerExpert
                                        : ExpertLayout::Mixed;
  return w;
}

std::unique_ptr<Model> load_model(const std::string& dir) {
  auto m = std::make_unique<Model>();
  m->config = load_model_config(dir);
  m->checkpoint = Checkpoint::open(dir);
  m->weights = bind_weights(*m->checkpoint, m->config, m->report);
  if (!m->report.problems.empty()) {
    std::string msg = fmt::format("{}: checkpoint does not match config.json ({} problems):", dir,
                                  m->report.problems.size());
    size_t shown = 0;
    for (const auto& p : m->report.problems) {
      if (++shown > 20) {
        msg += fmt::format("\n  ... and {} more (run `lilac inspect --model {}`)",
                           m->report.problems.size() - 20, dir);
        break;
      }
      msg += "\n  " + p;
    }
    throw Error(msg);
  }
  return m;
}

}  // namespace lilac
