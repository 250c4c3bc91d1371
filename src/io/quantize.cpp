// `lilac quantize` and in-memory quantization (see quantize.h): a plan of output modules built and
// validated from the input checkpoint, then executed one module at a time into a ShardedWriter.
#include "io/quantize.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors_writer.h"
#include "model/mlx_affine.h"
#include "model/weight_rows.h"
#include "util/error.h"
#include "util/fp8.h"
#include "util/half.h"
#include "util/json_parse.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace fs = std::filesystem;

namespace lilac {

using nlohmann::json;

namespace {
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Reads element i of a BF16 / F16 / F32 tensor as f32.
float float_at(const CheckpointTensor& t, size_t i) {
  const uint8_t* p = t.data();
  if (t.info->dtype == DType::F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t.info->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// The MLX name of a canonical tensor name ("norm.weight" -> "language_model.model.norm.weight").
std::string mlx_tensor_name(const std::string& c) {
  return c.starts_with("lm_head") ? "language_model." + c : "language_model.model." + c;
}

// One input weight matrix W [rows, cols], read row by row as the values a BF16 checkpoint would
// hold (f32 numbers that are exact bf16): BF16 as is, F16 / F32 rounded to nearest even, FP8 E4M3
// decoded, multiplied by its block's scale_inv in f32 (W = fp8(Wq) * scale_inv[i / br, j / bc]),
// then rounded.
struct Source {
  const CheckpointTensor* w = nullptr;
  const CheckpointTensor* scale_inv = nullptr;  // FP8 only: [ceil(rows / br), ceil(cols / bc)]
  size_t offset = 0;  // element of W[0, 0] in w (a slice of a fused tensor)
  int64_t rows = 0, cols = 0, block_rows = 128, block_cols = 128;

  void row(int64_t r, float* out) const {
    const size_t base = offset + size_t(r) * size_t(cols);
    if (w->info->dtype == DType::F8_E4M3) {
      const uint8_t* q = w->data() + base;
      const size_t srow = size_t(r / block_rows) * size_t(ceil_div(cols, block_cols));
      for (int64_t j = 0; j < cols; ++j)
        out[j] = round_to_bf16(fp8_e4m3_to_f32(q[j]) *
                               float_at(*scale_inv, srow + size_t(j / block_cols)));
      return;
    }
    for (int64_t j = 0; j < cols; ++j) out[j] = round_to_bf16(float_at(*w, base + size_t(j)));
  }
  void drop_pages() const {
    w->file->drop_pages(*w->info);
    if (scale_inv) scale_inv->file->drop_pages(*scale_inv->info);
  }
};

// One output module: a Linear / Embedding (one Source, or E stacked experts) or a float tensor.
struct Job {
  std::string base;  // linears: canonical module ("layers.0.mlp.gate"); tensors: canonical name
  int64_t layer = -1;
  std::vector<Source> sources;
  bool stacked = false;
  int64_t rows = 0, cols = 0;
  int bits = 0;                              // 0: written as BF16
  const CheckpointTensor* tensor = nullptr;  // float tensors
  std::vector<int64_t> out_shape;
  bool add_one = false;     // zero-centred norm: write bf16(1 + w)
  bool keep_dtype = false;  // A_log: mlx-lm's cast_predicate leaves it in its dtype

  bool is_linear() const { return tensor == nullptr; }
  DType tensor_dtype() const { return keep_dtype ? tensor->info->dtype : DType::BF16; }
  std::vector<PlannedTensor> outputs() const {
    if (!is_linear()) return {{mlx_tensor_name(base), tensor_dtype(), out_shape}};
    std::vector<int64_t> lead =
        stacked ? std::vector<int64_t>{int64_t(sources.size())} : std::vector<int64_t>{};
    auto shape = [&](int64_t c) {
      auto s = lead;
      s.push_back(rows);
      s.push_back(c);
      return s;
    };
    const std::string path = mlx_module_path(base);
    if (bits == 0) return {{path + ".weight", DType::BF16, shape(cols)}};
    return {{path + ".weight", DType::U32, shape(cols * bits / 32)},
            {path + ".scales", DType::BF16, shape(cols / kMlxGroupSize)},
            {path + ".biases", DType::BF16, shape(cols / kMlxGroupSize)}};
  }
  int64_t parameters() const {
    return is_linear() ? int64_t(sources.size()) * rows * cols : tensor->info->numel();
  }
};

// Resolves every output module's inputs by canonical name, validating like the loader does:
// dtypes, shapes against config.json, FP8 block scales, missing and unexpected tensors.
class Planner {
 public:
  Planner(const Checkpoint& ck, const ModelConfig& cfg, int64_t block_rows, int64_t block_cols)
      : cfg_(cfg), br_(block_rows), bc_(block_cols) {
    int64_t vision = 0;
    for (const auto& [name, t] : ck.tensors()) {
      std::string c = canonical_tensor_name(name);
      if (c.empty()) {
        ++vision;
        continue;
      }
      if (!canon_.emplace(c, std::make_pair(name, t)).second)
        problems.push_back(
            fmt::format("tensor '{}' duplicates '{}' under another prefix", name, canon_[c].first));
    }
    if (vision) notes.push_back(fmt::format("dropped {} vision tensors", vision));
  }

  void plan() {
    const int64_t H = cfg_.hidden;
    linear("embed_tokens", cfg_.vocab, H, -1);
    for (int64_t i = 0; i < cfg_.layers; ++i) layer(i);
    vector("norm.weight", {H}, {H}, -1, true);
    if (cfg_.tie_word_embeddings) {
      if (canon_.count("lm_head.weight")) {  // mlx-lm's sanitize pops it when tied
        used_.insert("lm_head.weight");
        notes.push_back(
            "tie_word_embeddings: lm_head.weight dropped (the embedding serves as the head)");
      }
    } else {
      linear("lm_head", cfg_.vocab, H, -1);
    }
    int64_t mtp = 0;
    for (const auto& [c, entry] : canon_) {
      if (used_.count(c)) continue;
      if (c.starts_with("mtp."))
        ++mtp;
      else
        problems.push_back(
            fmt::format("unexpected tensor '{}' ({}): not part of this config's text model",
                        entry.first, entry.second.file->path()));
    }
    if (mtp)
      notes.push_back(
          fmt::format("dropped {} mtp.* tensors (MLX checkpoints carry no MTP head)", mtp));
  }

  std::vector<Job> jobs;
  std::vector<std::string> problems, notes;
  int fused_layers = 0, per_expert_layers = 0;
  bool any_fp8 = false;

 private:
  const CheckpointTensor* take(const std::string& c) {
    auto it = canon_.find(c);
    if (it == canon_.end()) {
      problems.push_back(fmt::format("missing tensor '{}'", c));
      return nullptr;
    }
    used_.insert(c);
    return &it->second.second;
  }
  bool expect(const CheckpointTensor* t, const std::vector<int64_t>& shape, bool allow_fp8) {
    if (!t) return false;
    const DType d = t->info->dtype;
    if (!is_float_weight(d) && !(allow_fp8 && d == DType::F8_E4M3)) {
      problems.push_back(fmt::format("tensor '{}' ({}): dtype {} is not BF16, F16, F32{}",
                                     t->info->name, t->file->path(), dtype_name(d),
                                     allow_fp8 ? " or F8_E4M3" : ""));
      return false;
    }
    if (t->info->shape != shape) {
      problems.push_back(fmt::format("tensor '{}' ({}): shape {}, expected {} from config.json",
                                     t->info->name, t->file->path(), shape_string(t->info->shape),
                                     shape_string(shape)));
      return false;
    }
    return true;
  }
  // A [rows, cols] matrix named c ("....weight"): float, or FP8 with c + "_scale_inv".
  bool source(const std::string& c, int64_t rows, int64_t cols, Source& s) {
    s = Source{take(c), nullptr, 0, rows, cols, br_, bc_};
    if (!expect(s.w, {rows, cols}, true)) return false;
    if (s.w->info->dtype != DType::F8_E4M3) return true;
    any_fp8 = true;
    s.scale_inv = take(c + "_scale_inv");
    return expect(s.scale_inv, {ceil_div(rows, br_), ceil_div(cols, bc_)}, false);
  }
  void linear(const std::string& base, int64_t rows, int64_t cols, int64_t layer) {
    Job j{base, layer};
    j.rows = rows;
    j.cols = cols;
    j.bits = mlx_bits_for(base, cols);
    j.sources.resize(1);
    if (source(base + ".weight", rows, cols, j.sources[0])) jobs.push_back(std::move(j));
  }
  void vector(const std::string& c, const std::vector<int64_t>& in_shape,
              std::vector<int64_t> out_shape, int64_t layer, bool add_one,
              bool keep_dtype = false) {
    Job j{c, layer};
    j.tensor = take(c);
    j.out_shape = std::move(out_shape);
    j.add_one = add_one;
    j.keep_dtype = keep_dtype;
    if (expect(j.tensor, in_shape, false)) jobs.push_back(std::move(j));
  }
  // Experts of one layer as three stacked modules, from the hub's fused tensors or per expert.
  void experts(const std::string& p, int64_t layer) {
    const int64_t E = cfg_.experts, I = cfg_.expert_intermediate, H = cfg_.hidden;
    Job gate{p + "switch_mlp.gate_proj", layer}, up{p + "switch_mlp.up_proj", layer},
        down{p + "switch_mlp.down_proj", layer};
    for (Job* j : {&gate, &up, &down}) {
      j->stacked = true;
      j->rows = j == &down ? H : I;
      j->cols = j == &down ? I : H;
      j->bits = mlx_bits_for(j->base, j->cols);
      j->sources.resize(size_t(E));
    }
    bool ok = true;
    if (canon_.count(p + "experts.gate_up_proj") || canon_.count(p + "experts.down_proj")) {
      fused_layers++;
      const CheckpointTensor* gu = take(p + "experts.gate_up_proj");
      const CheckpointTensor* dn = take(p + "experts.down_proj");
      ok = expect(gu, {E, 2 * I, H}, false) & expect(dn, {E, H, I}, false);
      for (int64_t e = 0; ok && e < E; ++e) {
        gate.sources[size_t(e)] = {gu, nullptr, size_t(e * 2 * I * H), I, H};
        up.sources[size_t(e)] = {gu, nullptr, size_t(e * 2 * I * H + I * H), I, H};
        down.sources[size_t(e)] = {dn, nullptr, size_t(e * H * I), H, I};
      }
    } else {
      per_expert_layers++;
      for (int64_t e = 0; e < E; ++e) {
        std::string x = p + "experts." + std::to_string(e) + ".";
        ok &= source(x + "gate_proj.weight", I, H, gate.sources[size_t(e)]);
        ok &= source(x + "up_proj.weight", I, H, up.sources[size_t(e)]);
        ok &= source(x + "down_proj.weight", H, I, down.sources[size_t(e)]);
      }
    }
    if (!ok) return;
    jobs.push_back(std::move(gate));
    jobs.push_back(std::move(up));
    jobs.push_back(std::move(down));
  }
  void layer(int64_t i) {
    const int64_t H = cfg_.hidden;
    const std::string p = fmt::format("layers.{}.", i);
    vector(p + "input_layernorm.weight", {H}, {H}, i, true);
    if (cfg_.layer_types[size_t(i)] == LayerType::FullAttention) {
      const std::string s = p + "self_attn.";
      linear(s + "q_proj", cfg_.q_proj_rows(), H, i);
      linear(s + "k_proj", cfg_.kv_dim(), H, i);
      linear(s + "v_proj", cfg_.kv_dim(), H, i);
      linear(s + "o_proj", H, cfg_.heads * cfg_.head_dim, i);
      vector(s + "q_norm.weight", {cfg_.head_dim}, {cfg_.head_dim}, i, true);
      vector(s + "k_norm.weight", {cfg_.head_dim}, {cfg_.head_dim}, i, true);
    } else {
      const std::string s = p + "linear_attn.";
      const int64_t C = cfg_.gdn_conv_channels(), Hv = cfg_.gdn_value_heads,
                    K = cfg_.gdn_conv_kernel;
      linear(s + "in_proj_qkv", C, H, i);
      linear(s + "in_proj_z", cfg_.gdn_v_channels(), H, i);
      linear(s + "in_proj_b", Hv, H, i);
      linear(s + "in_proj_a", Hv, H, i);
      vector(s + "conv1d.weight", {C, 1, K}, {C, K, 1}, i, false);  // mlx-lm's moveaxis(2, 1)
      vector(s + "A_log", {Hv}, {Hv}, i, false, true);
      vector(s + "dt_bias", {Hv}, {Hv}, i, false);
      vector(s + "norm.weight", {cfg_.gdn_value_dim}, {cfg_.gdn_value_dim}, i, false);  // plain w
      linear(s + "out_proj", H, cfg_.gdn_v_channels(), i);
    }
    vector(p + "post_attention_layernorm.weight", {H}, {H}, i, true);
    const std::string m = p + "mlp.";
    linear(m + "gate", cfg_.experts, H, i);
    experts(m, i);
    linear(m + "shared_expert.gate_proj", cfg_.shared_intermediate, H, i);
    linear(m + "shared_expert.up_proj", cfg_.shared_intermediate, H, i);
    linear(m + "shared_expert.down_proj", H, cfg_.shared_intermediate, i);
    linear(m + "shared_expert_gate", 1, H, i);
  }

  const ModelConfig& cfg_;
  int64_t br_, bc_;
  std::map<std::string, std::pair<std::string, CheckpointTensor>> canon_;
  std::set<std::string> used_;
};

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

// Quantizes `n_rows` rows (row(r, buf) fills one) of `cols` values into codes / scales / biases
// (bits > 0) or bf16 (bits == 0), threaded over rows. Throws naming `what` on a non-finite value.
void quantize_rows(const std::function<void(int64_t, float*)>& row, int64_t n_rows, int64_t cols,
                   int bits, const std::string& what, uint32_t* codes, uint16_t* scales,
                   uint16_t* biases, uint16_t* plain, ThreadPool& pool) {
  std::atomic<int64_t> bad{-1};
  const int64_t words = bits ? cols * bits / 32 : 0, groups = cols / kMlxGroupSize;
  pool.parallel_for(size_t(n_rows), [&](size_t r0, size_t r1) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (size_t r = r0; r < r1; ++r) {
      row(int64_t(r), buf.data());
      for (float v : buf)
        if (!std::isfinite(v)) {
          int64_t expect = -1;
          bad.compare_exchange_strong(expect, int64_t(r));
          break;
        }
      if (bits == 0) {
        for (int64_t j = 0; j < cols; ++j)
          plain[r * size_t(cols) + size_t(j)] = f32_to_bf16(buf[size_t(j)]);
      } else {
        mlx_quantize_row(buf.data(), cols, bits, kMlxGroupSize, codes + r * size_t(words),
                         scales + r * size_t(groups), biases + r * size_t(groups));
      }
    }
  });
  if (bad >= 0)
    fail("{}: row {} holds a non-finite value (inf or NaN); refusing to quantize it", what,
         bad.load());
}

// Runs one job and hands its output tensors to the writer.
void run_job(const Job& j, ShardedWriter& writer, ThreadPool& pool) {
  const auto outs = j.outputs();
  if (!j.is_linear()) {
    const CheckpointTensor& t = *j.tensor;
    const size_t n = size_t(t.info->numel());
    if (j.keep_dtype) {
      writer.write(outs[0].name, {t.data(), t.info->nbytes()});
    } else {
      std::vector<uint16_t> out(n);
      for (size_t i = 0; i < n; ++i) {
        const float v = float_at(t, i);
        out[i] =
            f32_to_bf16(j.add_one ? 1.0f + v : v);  // mlx-lm: bf16 w + 1.0 in f32, rounded once
      }
      writer.write(outs[0].name, as_bytes(out));
    }
    t.file->drop_pages(*t.info);
    return;
  }
  const int64_t n = int64_t(j.sources.size()), rows = j.rows, cols = j.cols;
  auto row = [&](int64_t r, float* out) { j.sources[size_t(r / rows)].row(r % rows, out); };
  const std::string what = fmt::format("tensor '{}'", j.sources[0].w->info->name);
  if (j.bits == 0) {
    std::vector<uint16_t> plain(size_t(n * rows * cols));
    quantize_rows(row, n * rows, cols, 0, what, nullptr, nullptr, nullptr, plain.data(), pool);
    writer.write(outs[0].name, as_bytes(plain));
  } else {
    std::vector<uint32_t> codes(size_t(n * rows * cols * j.bits / 32));
    std::vector<uint16_t> scales(size_t(n * rows * cols / kMlxGroupSize)), biases(scales.size());
    quantize_rows(row, n * rows, cols, j.bits, what, codes.data(), scales.data(), biases.data(),
                  nullptr, pool);
    writer.write(outs[0].name, as_bytes(codes));
    writer.write(outs[1].name, as_bytes(scales));
    writer.write(outs[2].name, as_bytes(biases));
  }
  for (const auto& s : j.sources) s.drop_pages();
}

json read_json(const std::string& path) {
  json j;
  try {
    j = parse_json(read_small_file(path, 16 << 20));
  } catch (const JsonParseError& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("{}: not valid JSON (not an object)", path);
  return j;
}

}  // namespace

QuantizeSummary quantize_checkpoint(const QuantizeOptions& o) {
  QuantizeSummary sum;
  const ModelConfig cfg = load_model_config(o.input);
  json config = read_json((fs::path(o.input) / "config.json").string());
  auto ck = Checkpoint::open(o.input);
  sum.input_format = ck->format();
  if (sum.input_format == WeightFormat::MLX4)
    fail("{}: already an MLX quantized checkpoint (it has *.scales tensors)", o.input);
  Planner planner(*ck, cfg, cfg.fp8_block_rows, cfg.fp8_block_cols);
  planner.plan();
  if (!planner.problems.empty()) {
    std::string msg =
        fmt::format("{}: cannot quantize ({} problems):", o.input, planner.problems.size());
    for (size_t i = 0; i < planner.problems.size() && i < 20; ++i)
      msg += "\n  " + planner.problems[i];
    if (planner.problems.size() > 20)
      msg += fmt::format("\n  ... and {} more", planner.problems.size() - 20);
    throw Error(msg);
  }
  if (planner.any_fp8) sum.input_format = WeightFormat::FP8;
  sum.input_layout = layout_name(planner.per_expert_layers == 0 ? ExpertLayout::Fused
                                 : planner.fused_layers == 0    ? ExpertLayout::PerExpert
                                                                : ExpertLayout::Mixed);
  sum.notes = planner.notes;
  sum.input_bytes = ck->total_bytes();

  if (fs::exists(o.output) && (!fs::is_directory(o.output) || !fs::is_empty(o.output)))
    fail("{}: exists and is not an empty directory", o.output);
  fs::create_directories(o.output);

  std::vector<PlannedTensor> plan;
  json quant = {{"group_size", kMlxGroupSize}, {"bits", kMlxDefaultBits}, {"mode", "affine"}};
  for (const Job& j : planner.jobs) {
    for (auto& t : j.outputs()) plan.push_back(t);
    sum.parameters += j.parameters();
    if (j.is_linear() && j.bits) {
      sum.quantized_weights += j.parameters();
      for (const auto& t : j.outputs()) sum.quantized_bytes += t.nbytes();
      if (j.bits != kMlxDefaultBits) {  // mlx-lm records the predicate's dict per module path
        quant[mlx_module_path(j.base)] = {{"group_size", kMlxGroupSize}, {"bits", j.bits}};
        sum.overrides++;
      }
    }
  }
  sum.tensors = int64_t(plan.size());
  ShardedWriter writer(o.output, plan, o.max_shard_bytes);
  ThreadPool& pool = ThreadPool::global();
  for (const Job& j : planner.jobs) {
    run_job(j, writer, pool);
    if (o.progress)
      o.progress({writer.bytes_written(), writer.total_bytes(), j.layer, cfg.layers, j.base});
  }
  writer.finish(sum.parameters);
  sum.shards = writer.shard_count();
  sum.output_bytes = writer.total_bytes();

  // config.json as mlx-lm's save_config leaves it: quantization (twice), no vision_config.
  config.erase("_name_or_path");
  config.erase("vision_config");
  if (config.contains("text_config") && config["text_config"].is_object())
    config["text_config"].erase("quantization_config");
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  {
    std::ofstream out(fs::path(o.output) / "config.json");
    out << config.dump(4) << "\n";
    if (!out) fail("{}/config.json: write failed", o.output);
  }
  // Tokenizer, chat template, generation config and the like travel unchanged.
  for (const auto& e : fs::directory_iterator(o.input)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name.starts_with(".") || e.path().extension() == ".safetensors" ||
        name == "config.json" || name == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), fs::path(o.output) / name, fs::copy_options::overwrite_existing);
    sum.copied_files.push_back(name);
  }
  return sum;
}

void quantize_model_in_memory(Model& model) {
  ModelWeights& w = model.weights;
  if (has_quantized_weights(w))
    fail("{}: the model is already quantized", model.checkpoint ? model.checkpoint->dir() : "");
  ThreadPool& pool = ThreadPool::global();
  int64_t quantized = 0;
  // n elements of T in a new owned byte buffer (new[]'s alignment suits any T here; a data pointer
  // stays valid when `owned` grows: moving a vector keeps its buffer).
  auto alloc = [&]<typename T>(int64_t n) {
    return reinterpret_cast<T*>(model.owned.emplace_back(size_t(n) * sizeof(T)).data());
  };
  // The same bits (mlx_bits_for on the same module names) and row arithmetic as the file path.
  auto quantize = [&](const std::string& base, Matrix& W) {
    if (!W.data) return;
    const int bits = mlx_bits_for(base, W.cols);
    const Matrix src = W;
    auto row = [&](int64_t r, float* out) {
      widen_row(src, r, out);
      for (int64_t j = 0; j < src.cols; ++j) out[j] = round_to_bf16(out[j]);
    };
    const std::string what = fmt::format("tensor '{}'", src.name);
    if (bits == 0) {
      uint16_t* plain = alloc.operator()<uint16_t>(W.rows * W.cols);
      quantize_rows(row, W.rows, W.cols, 0, what, nullptr, nullptr, nullptr, plain, pool);
      W.data = plain;
      W.dtype = DType::BF16;
      W.block_scale = nullptr;  // an FP8 source's scales are applied
      return;
    }
    const int64_t groups = W.rows * (W.cols / kMlxGroupSize);
    uint32_t* codes = alloc.operator()<uint32_t>(W.rows * W.cols * bits / 32);
    uint16_t* scales = alloc.operator()<uint16_t>(groups);
    uint16_t* biases = alloc.operator()<uint16_t>(groups);
    quantize_rows(row, W.rows, W.cols, bits, what, codes, scales, biases, nullptr, pool);
    W.data = codes;
    W.dtype = DType::U32;
    W.block_scale = nullptr;
    W.bits = bits;
    W.group_size = kMlxGroupSize;
    W.scales = scales;
    W.biases = biases;
    quantized += W.rows * W.cols;
  };
  auto round_all = [](std::vector<float>& v) {
    for (float& x : v) x = round_to_bf16(x);  // the multiplier 1 + w (or w) as the bf16 MLX stores
  };
  const bool tied = w.lm_head.data == w.embed.data;
  quantize("embed_tokens", w.embed);
  if (tied)
    w.lm_head = w.embed;
  else
    quantize("lm_head", w.lm_head);
  round_all(w.final_norm_scale);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& L = w.layers[i];
    const std::string p = fmt::format("layers.{}.", i);
    round_all(L.input_norm_scale);
    round_all(L.post_attention_norm_scale);
    if (L.type == LayerType::FullAttention) {
      quantize(p + "self_attn.q_proj", L.attn.q_proj);
      quantize(p + "self_attn.k_proj", L.attn.k_proj);
      quantize(p + "self_attn.v_proj", L.attn.v_proj);
      quantize(p + "self_attn.o_proj", L.attn.o_proj);
      round_all(L.attn.q_norm_scale);
      round_all(L.attn.k_norm_scale);
    } else {
      quantize(p + "linear_attn.in_proj_qkv", L.gdn.in_proj_qkv);
      quantize(p + "linear_attn.in_proj_z", L.gdn.in_proj_z);
      quantize(p + "linear_attn.in_proj_b", L.gdn.in_proj_b);
      quantize(p + "linear_attn.in_proj_a", L.gdn.in_proj_a);
      quantize(p + "linear_attn.out_proj", L.gdn.out_proj);
      round_all(L.gdn.conv);
      round_all(L.gdn.dt_bias);
      round_all(L.gdn.norm_scale);  // neg_exp_A stays: A_log keeps its dtype
    }
    quantize(p + "mlp.gate", L.moe.router);
    for (auto& e : L.moe.experts) {
      quantize(p + "mlp.switch_mlp.gate_proj", e.gate);
      quantize(p + "mlp.switch_mlp.up_proj", e.up);
      quantize(p + "mlp.switch_mlp.down_proj", e.down);
    }
    quantize(p + "mlp.shared_expert.gate_proj", L.moe.shared_gate);
    quantize(p + "mlp.shared_expert.up_proj", L.moe.shared_up);
    quantize(p + "mlp.shared_expert.down_proj", L.moe.shared_down);
    quantize(p + "mlp.shared_expert_gate", L.moe.shared_expert_gate);
  }
  w.mtp.reset();
  model.report.quantization = fmt::format(
      "mlx affine quantized in memory at load, group size {}, {}-bit default, 8-bit router and "
      "shared_expert_gate ({:.3f} M weights)",
      kMlxGroupSize, kMlxDefaultBits, double(quantized) / 1e6);
}

}  // namespace lilac
