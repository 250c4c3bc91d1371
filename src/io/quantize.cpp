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
#include "model/weight_table.h"
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
    linear(weight_entry(WeightRole::Embed), -1);
    for (int64_t i = 0; i < cfg_.layers; ++i) layer(i);
    vector(weight_entry(WeightRole::FinalNorm), -1);
    if (cfg_.tie_word_embeddings) {
      if (canon_.count("lm_head.weight")) {  // mlx-lm's sanitize pops it when tied
        used_.insert("lm_head.weight");
        notes.push_back(
            "tie_word_embeddings: lm_head.weight dropped (the embedding serves as the head)");
      }
    } else {
      linear(weight_entry(WeightRole::LmHead), -1);
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
  // A Matrix entry of the weight table: read under its HF name, written under its MLX module path
  // with the entry's bits.
  void linear(const WeightEntry& e, int64_t layer) {
    Job j{weight_name(e, NameLayout::Mlx, layer), layer};
    const std::vector<int64_t> shape = e.shape(cfg_);
    j.rows = shape[0];
    j.cols = shape[1];
    j.bits = q4_bits_for(e, j.cols);
    j.sources.resize(1);
    if (source(weight_name(e, NameLayout::Hf, layer), j.rows, j.cols, j.sources[0]))
      jobs.push_back(std::move(j));
  }
  // A Vector entry: written BF16 in the MLX shape, zero-centred norms as bf16(1 + w), A_log in its
  // input dtype (mlx-lm's cast predicate leaves it).
  void vector(const WeightEntry& e, int64_t layer) {
    const std::string c = weight_name(e, NameLayout::Hf, layer);
    Job j{c, layer};
    j.tensor = take(c);
    j.out_shape = stored_shape(e, NameLayout::Mlx, cfg_);
    j.add_one = e.vector_rule == VectorRule::ZeroCentred;
    j.keep_dtype = e.vector_rule == VectorRule::NegExp;
    if (expect(j.tensor, e.shape(cfg_), false)) jobs.push_back(std::move(j));
  }
  // Experts of one layer as three stacked modules (the Expert entries' MLX switch_mlp), from the
  // hub's fused tensors (the Fused entries) or per expert.
  void experts(int64_t layer) {
    const int64_t E = cfg_.experts, I = cfg_.expert_intermediate, H = cfg_.hidden;
    const WeightEntry& eg = weight_entry(WeightRole::ExpertGate);
    const WeightEntry& eu = weight_entry(WeightRole::ExpertUp);
    const WeightEntry& ed = weight_entry(WeightRole::ExpertDown);
    Job gate{weight_name(eg, NameLayout::Mlx, layer), layer},
        up{weight_name(eu, NameLayout::Mlx, layer), layer},
        down{weight_name(ed, NameLayout::Mlx, layer), layer};
    for (auto [j, e] : {std::pair{&gate, &eg}, {&up, &eu}, {&down, &ed}}) {
      const std::vector<int64_t> shape = e->shape(cfg_);
      j->stacked = true;
      j->rows = shape[0];
      j->cols = shape[1];
      j->bits = q4_bits_for(*e, j->cols);
      j->sources.resize(size_t(E));
    }
    bool ok = true;
    const WeightEntry& fgu = weight_entry(WeightRole::ExpertsGateUp);
    const WeightEntry& fdn = weight_entry(WeightRole::ExpertsDown);
    const std::string gu_name = weight_name(fgu, NameLayout::Hf, layer),
                      dn_name = weight_name(fdn, NameLayout::Hf, layer);
    if (canon_.count(gu_name) || canon_.count(dn_name)) {
      fused_layers++;
      const CheckpointTensor* gu = take(gu_name);
      const CheckpointTensor* dn = take(dn_name);
      ok = expect(gu, fgu.shape(cfg_), false) & expect(dn, fdn.shape(cfg_), false);
      for (int64_t e = 0; ok && e < E; ++e) {
        gate.sources[size_t(e)] = {gu, nullptr, size_t(e * 2 * I * H), I, H};
        up.sources[size_t(e)] = {gu, nullptr, size_t(e * 2 * I * H + I * H), I, H};
        down.sources[size_t(e)] = {dn, nullptr, size_t(e * H * I), H, I};
      }
    } else {
      per_expert_layers++;
      for (int64_t e = 0; e < E; ++e) {
        ok &= source(weight_name(eg, NameLayout::Hf, layer, e), I, H, gate.sources[size_t(e)]);
        ok &= source(weight_name(eu, NameLayout::Hf, layer, e), I, H, up.sources[size_t(e)]);
        ok &= source(weight_name(ed, NameLayout::Hf, layer, e), H, I, down.sources[size_t(e)]);
      }
    }
    if (!ok) return;
    jobs.push_back(std::move(gate));
    jobs.push_back(std::move(up));
    jobs.push_back(std::move(down));
  }
  // One layer: its weight table entries in table order (the order mlx-lm writes a layer).
  void layer(int64_t i) {
    const LayerType type = cfg_.layer_types[size_t(i)];
    for (const WeightEntry& e : weight_table()) {
      if (!in_layer(e, type) || e.kind == WeightKind::Fused) continue;
      if (e.kind == WeightKind::Vector)
        vector(e, i);
      else if (e.scope != WeightScope::Expert)
        linear(e, i);
      else if (e.role == WeightRole::ExpertGate)  // the three stacks at the first of them
        experts(i);
    }
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
  // The same bits (the weight table's, for the same entries) and row arithmetic as the file path.
  auto quantize = [&](const WeightEntry& e, Matrix& W) {
    if (!W.data) return;
    const int bits = q4_bits_for(e, W.cols);
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
  // The multiplier 1 + w (or w) as the bf16 MLX stores; A_log (neg_exp_A) keeps its dtype.
  auto round_vector = [](const WeightEntry& e, std::vector<float>& v) {
    if (e.vector_rule == VectorRule::NegExp) return;
    for (float& x : v) x = round_to_bf16(x);
  };
  const bool tied = w.lm_head.data == w.embed.data;
  quantize(weight_entry(WeightRole::Embed), w.embed);
  if (tied)
    w.lm_head = w.embed;
  else
    quantize(weight_entry(WeightRole::LmHead), w.lm_head);
  round_vector(weight_entry(WeightRole::FinalNorm), w.final_norm_scale);
  for (LayerWeights& L : w.layers) {
    for (const WeightEntry& e : weight_table()) {
      if (!in_layer(e, L.type) || e.kind == WeightKind::Fused) continue;
      if (e.kind == WeightKind::Vector)
        round_vector(e, *layer_vector(L, e.role));
      else if (e.scope == WeightScope::Expert)
        for (auto& x : L.moe.experts) quantize(e, *expert_matrix(x, e.role));
      else
        quantize(e, *layer_matrix(L, e.role));
    }
  }
  w.mtp.reset();
  model.report.quantization = fmt::format(
      "mlx affine quantized in memory at load, group size {}, {}-bit default, 8-bit router and "
      "shared_expert_gate ({:.3f} M weights)",
      kMlxGroupSize, kMlxDefaultBits, double(quantized) / 1e6);
}

}  // namespace lilac
