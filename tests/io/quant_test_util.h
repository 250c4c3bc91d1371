// Helpers shared by the quantization tests: writable model directories, safetensors rewriting,
// `lilac quantize` into a temp dir, and an FP8 E4M3 encoder for writing FP8 test checkpoints.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../test_data.h"
#include "io/checkpoint.h"
#include "io/quantize.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/fp8.h"
#include "util/half.h"

namespace lilac::test {

inline std::string slurp_file(const std::string& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Tensors of a directory's safetensors files, read into memory (small test models only).
struct TensorSet {
  std::vector<std::string> names;
  std::vector<TensorInfo> infos;
  std::vector<std::vector<uint8_t>> bytes;

  explicit TensorSet(const std::string& dir = "") {
    if (dir.empty()) return;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".safetensors" || e.path().filename() == "reference.safetensors")
        continue;
      auto f = SafetensorsFile::open(e.path().string());
      for (const auto& t : f->tensors()) add(t.name, t.dtype, t.shape, f->data(t), t.nbytes());
    }
  }
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const uint8_t* p,
           size_t n) {
    names.push_back(name);
    TensorInfo info;
    info.name = name;
    info.dtype = dtype;
    info.shape = std::move(shape);
    infos.push_back(info);
    bytes.emplace_back(p, p + n);
  }
  int find(const std::string& name) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return int(i);
    return -1;
  }
  const std::vector<uint8_t>& at(const std::string& name) const {
    int i = find(name);
    if (i < 0) throw Error("no tensor " + name);
    return bytes[size_t(i)];
  }
  const TensorInfo& info(const std::string& name) const {
    int i = find(name);
    if (i < 0) throw Error("no tensor " + name);
    return infos[size_t(i)];
  }
  void erase(const std::string& name) {
    int i = find(name);
    if (i < 0) throw Error("no tensor " + name);
    names.erase(names.begin() + i);
    infos.erase(infos.begin() + i);
    bytes.erase(bytes.begin() + i);
  }
  // Writes all tensors as one model.safetensors (and no index).
  void write(const std::string& dir) const {
    std::vector<TensorToWrite> ts;
    for (size_t i = 0; i < names.size(); ++i)
      ts.push_back({names[i], infos[i].dtype, infos[i].shape, bytes[i]});
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors" ||
          e.path().filename() == "model.safetensors.index.json")
        std::filesystem::remove(e.path());
    write_safetensors(dir + "/model.safetensors", ts);
  }
};

inline void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(slurp_file(path));
  edit(j);
  std::ofstream(path) << j.dump(2);
}

inline std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Copies the non-weight files (config.json, generation_config.json) of a fixture into `dir`.
inline void copy_configs(const std::string& fixture, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(data_path(fixture)))
    if (e.path().extension() == ".json" && e.path().filename() != "model.safetensors.index.json")
      std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string());
}

// `lilac quantize` of `in` into `out` (library call); returns the summary.
inline QuantizeSummary quantize_dir(const std::string& in, const std::string& out,
                                    uint64_t max_shard = 5ull << 30) {
  QuantizeOptions o;
  o.input = in;
  o.output = out;
  o.max_shard_bytes = max_shard;
  return quantize_checkpoint(o);
}

// f32 -> FP8 E4M3, round to nearest with ties to the even code, saturating at +-448. Positive
// codes 0x00..0x7E increase with their value, so the nearest is found by bisection over them.
inline uint8_t fp8_e4m3_encode(float x) {
  static const std::vector<float> table = [] {
    std::vector<float> t(127);
    for (int c = 0; c < 127; ++c) t[size_t(c)] = fp8_e4m3_to_f32(uint8_t(c));
    return t;
  }();
  const float a = std::fabs(x);
  size_t hi = size_t(std::lower_bound(table.begin(), table.end(), a) - table.begin());
  uint8_t code;
  if (hi == table.size())
    code = 126;  // beyond 448: saturate
  else if (hi == 0 || table[hi] == a)
    code = uint8_t(hi);
  else {
    const float dl = a - table[hi - 1], dh = table[hi] - a;
    code = uint8_t(dl < dh ? hi - 1 : dh < dl ? hi : (hi % 2 == 0 ? hi : hi - 1));
  }
  return std::signbit(x) ? uint8_t(code | 0x80) : code;
}

// tiny-a (per-expert layout) in Qwen's FP8 layout, written to `fp8_dir`: per-expert, attention
// and GDN projections as F8_E4M3 with F32 weight_scale_inv over 128x128 blocks (block amax ->
// 448); embeddings, lm_head, router, shared_expert_gate, in_proj_a/b and the float tensors stay
// BF16. `bf16_dir` gets its BF16 equivalent: every FP8 weight as bf16(fp8 * scale_inv), the
// values a loader of the FP8 file reads. Returns the FP8 tensors (to write broken variants).
inline TensorSet write_fp8_tiny_a(const std::string& fp8_dir, const std::string& bf16_dir) {
  TensorSet src(data_path("tiny-a-per-expert")), fp8, bf16;
  for (size_t i = 0; i < src.names.size(); ++i) {
    const std::string& n = src.names[i];
    const auto& info = src.infos[i];
    const bool stays =
        n.find("embed_tokens") != std::string::npos || n.starts_with("lm_head") ||
        n.ends_with("mlp.gate.weight") || n.find("shared_expert_gate") != std::string::npos ||
        n.find("in_proj_a") != std::string::npos || n.find("in_proj_b") != std::string::npos ||
        info.shape.size() != 2 || n.find("visual") != std::string::npos;
    if (stays) {
      fp8.add(n, info.dtype, info.shape, src.bytes[i].data(), src.bytes[i].size());
      bf16.add(n, info.dtype, info.shape, src.bytes[i].data(), src.bytes[i].size());
      continue;
    }
    const int64_t rows = info.shape[0], cols = info.shape[1], sr = (rows + 127) / 128,
                  sc = (cols + 127) / 128;
    std::vector<float> w(size_t(rows * cols)), scale(size_t(sr * sc), 0.f);
    for (size_t k = 0; k < w.size(); ++k) {
      uint16_t h;
      std::memcpy(&h, &src.bytes[i][2 * k], 2);
      w[k] = bf16_to_f32(h);
      float& s = scale[size_t((int64_t(k) / cols / 128) * sc + (int64_t(k) % cols) / 128)];
      s = std::max(s, std::fabs(w[k]) / 448.0f);  // block amax -> 448
    }
    std::vector<uint8_t> q(w.size());
    std::vector<uint16_t> deq(w.size());
    for (size_t k = 0; k < w.size(); ++k) {
      const float s = scale[size_t((int64_t(k) / cols / 128) * sc + (int64_t(k) % cols) / 128)];
      q[k] = fp8_e4m3_encode(s > 0 ? w[k] / s : 0.f);
      deq[k] = f32_to_bf16(fp8_e4m3_to_f32(q[k]) * s);  // the block scale multiplies
    }
    fp8.add(n, DType::F8_E4M3, info.shape, q.data(), q.size());
    fp8.add(n + "_scale_inv", DType::F32, {sr, sc}, reinterpret_cast<const uint8_t*>(scale.data()),
            scale.size() * 4);
    bf16.add(n, DType::BF16, info.shape, reinterpret_cast<const uint8_t*>(deq.data()),
             deq.size() * 2);
  }
  copy_configs("tiny-a-per-expert", fp8_dir);
  copy_configs("tiny-a-per-expert", bf16_dir);
  edit_json(fp8_dir + "/config.json", [](auto& j) {
    j["quantization_config"] = {
        {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  });
  fp8.write(fp8_dir);
  bf16.write(bf16_dir);
  return fp8;
}

}  // namespace lilac::test
