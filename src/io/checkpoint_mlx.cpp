// Binding an MLX affine-quantized checkpoint (format in checkpoint_mlx.h) to ModelWeights.
#include "io/checkpoint_mlx.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/mlx_affine.h"
#include "model/weight_table.h"
#include "util/error.h"
#include "util/half.h"
#include "util/json_parse.h"
#include "util/mapped_file.h"

namespace lilac {

using nlohmann::json;

namespace {
// Quantization parameters of one module: config.json's default or a per-path override.
struct QuantSpec {
  bool quantized = true;
  int bits = kMlxDefaultBits;
  int group_size = kMlxGroupSize;
  std::string source = "default";  // "default" or the override's key, for messages
};

// The `quantization` block of config.json (mlx-lm writes the same object as
// `quantization_config`; either is accepted, at the top level or inside text_config).
struct QuantConfig {
  QuantSpec base;
  std::map<std::string, QuantSpec> overrides;  // by canonical base ("layers.0.mlp.gate")
  bool ok = false;
};

QuantConfig read_quant_config(const std::string& dir, std::vector<std::string>& problems) {
  QuantConfig qc;
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  json cfg;
  try {
    cfg = parse_json(read_small_file(path, 16 << 20));
  } catch (const Error&) {
    cfg = nullptr;
  }
  if (!cfg.is_object()) {
    problems.push_back(fmt::format("{}: not valid JSON", path));
    return qc;
  }
  const json* q = nullptr;
  for (const json* scope : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
    if (!scope || !scope->is_object() || q) continue;
    for (const char* key : {"quantization", "quantization_config"})
      if (!q && scope->contains(key)) q = &(*scope)[key];
  }
  if (!q) {
    problems.push_back(
        fmt::format("{}: the checkpoint holds quantized tensors (*.scales) but config.json has no "
                    "\"quantization\" object",
                    path));
    return qc;
  }
  if (!q->is_object()) {
    problems.push_back(fmt::format("{}: \"quantization\" is not an object", path));
    return qc;
  }
  auto int_field = [&](const json& o, const char* key, const std::string& where, int fallback,
                       bool required) {
    if (!o.contains(key)) {
      if (required) problems.push_back(fmt::format("{}: {} has no \"{}\"", path, where, key));
      return fallback;
    }
    if (!o[key].is_number_integer()) {
      problems.push_back(fmt::format("{}: {} \"{}\" is not an integer", path, where, key));
      return fallback;
    }
    return o[key].get<int>();
  };
  auto check = [&](const QuantSpec& s, const std::string& where) {
    bool good = true;
    if (s.bits != 4 && s.bits != 8) {
      problems.push_back(fmt::format("{}: {} bits {}: only 4- and 8-bit affine codes are supported",
                                     path, where, s.bits));
      good = false;
    }
    if (s.group_size != 32 && s.group_size != 64 && s.group_size != 128) {
      problems.push_back(
          fmt::format("{}: {} group_size {}: MLX uses 32, 64 or 128", path, where, s.group_size));
      good = false;
    }
    return good;
  };
  size_t before = problems.size();
  qc.base.bits = int_field(*q, "bits", "quantization", kMlxDefaultBits, true);
  qc.base.group_size = int_field(*q, "group_size", "quantization", kMlxGroupSize, true);
  if (q->contains("mode") &&
      (!(*q)["mode"].is_string() || (*q)["mode"].get<std::string>() != "affine"))
    problems.push_back(fmt::format("{}: quantization mode {} is not supported (affine only)", path,
                                   (*q)["mode"].dump()));
  check(qc.base, "quantization");
  for (auto it = q->begin(); it != q->end(); ++it) {
    const std::string& key = it.key();
    if (key == "bits" || key == "group_size" || key == "mode" || key == "quant_method") continue;
    const std::string canon = canonical_tensor_name(key + ".weight");
    if (canon.empty()) continue;  // a vision module's override
    std::string base = canon.substr(0, canon.size() - std::string(".weight").size());
    QuantSpec s = qc.base;
    s.source = "override \"" + key + "\"";
    if (it.value().is_boolean()) {
      s.quantized = it.value().get<bool>();
    } else if (it.value().is_object()) {
      std::string where = "quantization[\"" + key + "\"]";
      s.bits = int_field(it.value(), "bits", where, qc.base.bits, false);
      s.group_size = int_field(it.value(), "group_size", where, qc.base.group_size, false);
      check(s, where);
    } else {
      problems.push_back(
          fmt::format("{}: quantization[\"{}\"] is neither an object nor a boolean", path, key));
      continue;
    }
    qc.overrides[base] = s;
  }
  qc.ok = problems.size() == before;
  return qc;
}

// Counts for `lilac inspect`: quantized matrices by bits, and everything left in float.
struct Stats {
  std::map<int, std::pair<int64_t, int64_t>> by_bits;  // bits -> (params, bytes)
  std::map<int, int64_t> tensors_by_bits;
  int64_t plain_matrices = 0;
};

class MlxBinder {
 public:
  MlxBinder(const Checkpoint& ck, LoadReport& rep) : rep_(rep) {
    int64_t vision = 0, mtp = 0;
    for (const auto& [name, t] : ck.tensors()) {
      std::string c = canonical_tensor_name(name);
      if (c.empty()) {
        ++vision;
        continue;
      }
      if (c.starts_with("mtp.")) {  // mlx-lm's sanitize drops them; lilac does the same
        ++mtp;
        continue;
      }
      if (!canon_.emplace(c, std::make_pair(name, t)).second)
        rep_.problems.push_back(
            fmt::format("tensor '{}' duplicates '{}' under another prefix", name, canon_[c].first));
    }
    if (vision) rep_.notes.push_back(fmt::format("skipped {} vision tensors", vision));
    if (mtp)
      rep_.notes.push_back(
          fmt::format("ignored {} mtp.* tensors (MLX checkpoints carry no MTP head)", mtp));
    qc_ = read_quant_config(ck.dir(), rep_.problems);
  }

  bool has(const std::string& c) const { return canon_.count(c) > 0; }

  // A float vector (norm multipliers as stored, conv taps, A_log, dt_bias) converted to f32.
  std::vector<float> vec(const std::string& c, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> out(static_cast<size_t>(n), 0.f);
    const CheckpointTensor* t = take(c);
    if (!t) return out;
    if (!is_float_weight(t->info->dtype)) {
      bad(c, fmt::format("dtype {} is not BF16, F16 or F32", dtype_name(t->info->dtype)));
      return out;
    }
    if (t->info->shape != shape) {
      bad(c, fmt::format("shape {}, expected {} from config.json", shape_string(t->info->shape),
                         shape_string(shape)));
      return out;
    }
    count(*t);
    const uint8_t* p = t->data();
    for (int64_t i = 0; i < n; ++i) {
      if (t->info->dtype == DType::F32) {
        std::memcpy(&out[size_t(i)], p + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[size_t(i)] = t->info->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return out;
  }

  // A Linear / Embedding `base` ("layers.0.mlp.gate") of [rows, cols], quantized or plain; with
  // lead > 0 a stack of `lead` such matrices (switch_mlp), returned one Matrix per slice.
  std::vector<Matrix> linear(const std::string& base, int64_t lead, int64_t rows, int64_t cols) {
    const int64_t n = std::max<int64_t>(lead, 1);
    std::vector<Matrix> out(static_cast<size_t>(n));
    const std::string wname = base + ".weight";
    for (auto& m : out)
      m = Matrix{nullptr, DType::BF16, rows, cols, mlx_module_path(base) + ".weight"};
    std::vector<int64_t> prefix = lead > 0 ? std::vector<int64_t>{lead} : std::vector<int64_t>{};
    auto with = [&](std::vector<int64_t> tail) {
      std::vector<int64_t> s = prefix;
      s.insert(s.end(), tail.begin(), tail.end());
      return s;
    };
    QuantSpec spec = qc_.base;
    auto ov = qc_.overrides.find(base);
    if (ov != qc_.overrides.end()) {
      spec = ov->second;
      used_overrides_.insert(base);
    } else {
      auto w = canon_.find(wname);
      spec.quantized = has(base + ".scales") ||
                       (w != canon_.end() && w->second.second.info->dtype == DType::U32);
    }

    const CheckpointTensor* w = take(wname);
    if (!spec.quantized) {
      if (!w) return out;
      if (!is_float_weight(w->info->dtype)) {
        bad(wname, fmt::format("dtype {}, expected BF16, F16 or F32: unquantized (no .scales{})",
                               dtype_name(w->info->dtype),
                               ov != qc_.overrides.end() ? ", config.json " + spec.source : ""));
        return out;
      }
      if (w->info->shape != with({rows, cols})) {
        bad(wname, fmt::format("shape {}, expected {} from config.json",
                               shape_string(w->info->shape), shape_string(with({rows, cols}))));
        return out;
      }
      count(*w);
      stats_.plain_matrices++;
      const size_t slice = size_t(rows * cols) * dtype_size(w->info->dtype);
      for (int64_t e = 0; e < n; ++e) {
        out[size_t(e)].data = w->data() + size_t(e) * slice;
        out[size_t(e)].dtype = w->info->dtype;
        out[size_t(e)].name = w->info->name;
      }
      return out;
    }

    const CheckpointTensor* s = take(base + ".scales");
    const CheckpointTensor* b = take(base + ".biases");
    if (spec.bits != 4 && spec.bits != 8) return out;  // reported with the config
    bool good = w && s && b;
    if (cols % spec.group_size != 0) {
      bad(wname, fmt::format("input dim {} is not a multiple of the group size {} ({})", cols,
                             spec.group_size, spec.source));
      return out;
    }
    const int64_t words = cols * spec.bits / 32, groups = cols / spec.group_size;
    if (w) {
      if (w->info->dtype != DType::U32) {
        bad(wname, fmt::format("dtype {}, expected U32 codes ({}-bit, config.json {})",
                               dtype_name(w->info->dtype), spec.bits, spec.source));
        good = false;
      } else if (w->info->shape != with({rows, words})) {
        std::string hint;
        if (w->info->shape.size() == prefix.size() + 2 && w->info->shape.back() * 32 % cols == 0)
          hint = fmt::format(": that is {}-bit codes", w->info->shape.back() * 32 / cols);
        bad(wname,
            fmt::format(
                "shape {}, expected {} for {}-bit codes of a [{}, {}] matrix (config.json {}){}",
                shape_string(w->info->shape), shape_string(with({rows, words})), spec.bits, rows,
                cols, spec.source, hint));
        good = false;
      }
    }
    for (const CheckpointTensor* sb : {s, b}) {
      if (!sb) continue;
      const std::string c = sb == s ? base + ".scales" : base + ".biases";
      if (sb->info->dtype != DType::BF16) {
        bad(c, fmt::format("dtype {}, expected BF16", dtype_name(sb->info->dtype)));
        good = false;
      } else if (sb->info->shape != with({rows, groups})) {
        bad(c, fmt::format("shape {}, expected {} (group size {}, config.json {})",
                           shape_string(sb->info->shape), shape_string(with({rows, groups})),
                           spec.group_size, spec.source));
        good = false;
      }
    }
    if (!good) return out;
    for (const CheckpointTensor* t : {w, s, b}) count(*t, 0);
    rep_.parameters += n * rows * cols;  // the matrix's weights, not the code words
    auto& st = stats_.by_bits[spec.bits];
    st.first += n * rows * cols;
    st.second += int64_t(w->info->nbytes() + s->info->nbytes() + b->info->nbytes());
    stats_.tensors_by_bits[spec.bits]++;
    for (int64_t e = 0; e < n; ++e) {
      Matrix& m = out[size_t(e)];
      m.data = w->data() + size_t(e * rows * words) * 4;
      m.dtype = DType::U32;
      m.name = w->info->name;
      m.bits = spec.bits;
      m.group_size = spec.group_size;
      m.scales = reinterpret_cast<const uint16_t*>(s->data()) + size_t(e * rows * groups);
      m.biases = reinterpret_cast<const uint16_t*>(b->data()) + size_t(e * rows * groups);
    }
    return out;
  }

  Matrix matrix(const std::string& base, int64_t rows, int64_t cols) {
    return linear(base, 0, rows, cols)[0];
  }

  void finish(const ModelConfig& cfg) {
    for (const auto& [c, entry] : canon_)
      if (!used_.count(c))
        rep_.problems.push_back(fmt::format("unexpected tensor '{}' ({}): {}", entry.first,
                                            entry.second.file->path(),
                                            explain_unused_tensor(c, NameLayout::Mlx, cfg)));
    for (const auto& [base, spec] : qc_.overrides)
      if (!used_overrides_.count(base))
        rep_.problems.push_back(
            fmt::format("config.json quantization {} names no module of this model", spec.source));
    describe();
  }

 private:
  // Looks a canonical name up (marking it used), or reports it missing under its MLX name.
  const CheckpointTensor* take(const std::string& c) {
    auto it = canon_.find(c);
    if (it == canon_.end()) {
      std::string full =
          c.starts_with("lm_head.") ? "language_model." + c : "language_model.model." + c;
      rep_.problems.push_back(fmt::format("missing tensor '{}'", full));
      return nullptr;
    }
    used_.insert(c);
    return &it->second.second;
  }
  void bad(const std::string& c, const std::string& what) {
    const auto& [orig, t] = canon_.at(c);
    rep_.problems.push_back(fmt::format("tensor '{}' ({}): {}", orig, t.file->path(), what));
  }
  void count(const CheckpointTensor& t, int64_t params = -1) {
    rep_.tensors_used++;
    rep_.parameters += params < 0 ? t.info->numel() : params;
    rep_.bytes += t.info->nbytes();
  }
  void describe() {
    std::string d = fmt::format("mlx affine, group size {}, {}-bit default", qc_.base.group_size,
                                qc_.base.bits);
    std::map<std::string, int> ov;
    for (const auto& [base, s] : qc_.overrides) {
      std::string kind = base.substr(base.find_last_of('.') + 1);
      ov[fmt::format("{} {}", s.quantized ? std::to_string(s.bits) + "-bit" : "unquantized",
                     kind)]++;
    }
    if (!ov.empty()) {
      d += fmt::format("; {} override{} (", qc_.overrides.size(),
                       qc_.overrides.size() == 1 ? "" : "s");
      bool first = true;
      for (const auto& [k, n] : ov)
        d += fmt::format("{}{} x{}", first ? "" : ", ", k, n), first = false;
      d += ")";
    }
    int64_t params = 0, bytes = 0;
    for (const auto& [bits, pb] : stats_.by_bits) {
      d += fmt::format("; {}-bit: {} tensors, {:.3f} M weights", bits, stats_.tensors_by_bits[bits],
                       double(pb.first) / 1e6);
      params += pb.first;
      bytes += pb.second;
    }
    if (params)
      d += fmt::format("; {:.3f} bits per quantized weight (codes + scales + biases)",
                       8.0 * double(bytes) / double(params));
    if (stats_.plain_matrices)
      d += fmt::format("; {} matrices left unquantized", stats_.plain_matrices);
    rep_.quantization = d;
  }

  LoadReport& rep_;
  QuantConfig qc_;
  std::map<std::string, std::pair<std::string, CheckpointTensor>> canon_;
  std::set<std::string> used_, used_overrides_;
  Stats stats_;
};

// One decoder layer of `type`: every weight table entry the layer has, under its MLX name. Norms
// are stored as bf16(1 + w) by mlx-lm's sanitize: the multiplier itself, kept as stored.
LayerWeights bind_layer(MlxBinder& b, const ModelConfig& cfg, int64_t index, LayerType type) {
  LayerWeights L;
  L.type = type;
  L.moe.experts.resize(size_t(cfg.experts));
  for (const WeightEntry& e : weight_table()) {
    if (!in_layer(e, type) || !e.mlx) continue;  // the HF hub's fused experts have no MLX name
    const std::string name = weight_name(e, NameLayout::Mlx, index);
    if (e.kind == WeightKind::Vector) {
      std::vector<float> v = b.vec(name, stored_shape(e, NameLayout::Mlx, cfg));
      if (e.vector_rule == VectorRule::NegExp)
        for (float& x : v) x = -std::exp(x);
      *layer_vector(L, e.role) = std::move(v);
      continue;
    }
    const std::vector<int64_t> s = e.shape(cfg);
    if (e.scope == WeightScope::Expert) {  // switch_mlp: [E, rows, cols], viewed per expert
      auto stack = b.linear(name, cfg.experts, s[0], s[1]);
      for (int64_t x = 0; x < cfg.experts; ++x)
        *expert_matrix(L.moe.experts[size_t(x)], e.role) = stack[size_t(x)];
    } else {
      *layer_matrix(L, e.role) = b.matrix(name, s[0], s[1]);
    }
  }
  return L;
}

}  // namespace

ModelWeights bind_weights_mlx(const Checkpoint& ck, const ModelConfig& cfg, LoadReport& rep) {
  ModelWeights w;
  MlxBinder b(ck, rep);
  auto mlx = [](WeightRole r) { return weight_name(weight_entry(r), NameLayout::Mlx); };
  auto shape = [&](WeightRole r) { return weight_entry(r).shape(cfg); };
  w.embed =
      b.matrix(mlx(WeightRole::Embed), shape(WeightRole::Embed)[0], shape(WeightRole::Embed)[1]);
  if (b.has(mlx(WeightRole::LmHead) + ".weight") || !cfg.tie_word_embeddings)
    w.lm_head = b.matrix(mlx(WeightRole::LmHead), shape(WeightRole::LmHead)[0],
                         shape(WeightRole::LmHead)[1]);
  else
    w.lm_head = w.embed;
  w.final_norm_scale = b.vec(mlx(WeightRole::FinalNorm), shape(WeightRole::FinalNorm));
  for (int64_t i = 0; i < cfg.layers; ++i)
    w.layers.push_back(bind_layer(b, cfg, i, cfg.layer_types[size_t(i)]));
  if (cfg.mtp_layers > 0) rep.notes.push_back("MLX checkpoints carry no MTP head (MTP off)");
  b.finish(cfg);
  rep.layout = ExpertLayout::Stacked;
  return w;
}

}  // namespace lilac
