#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/half.h"
#include "util/json_parse.h"

namespace lilac {

using nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string TensorInfo::shape_string() const {
  return lilac::shape_string(shape);
}

namespace {

// Largest header safetensors itself accepts (100 MB); anything bigger is a corrupt length field.
constexpr uint64_t kMaxHeader = 100ull << 20;

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& v,
                       uint64_t data_size) {
  TensorInfo t;
  t.name = name;
  if (!v.is_object()) fail("{}: tensor '{}': header entry is not an object", path, name);
  if (!v.contains("dtype") || !v["dtype"].is_string())
    fail("{}: tensor '{}': missing or non-string \"dtype\"", path, name);
  auto dt = dtype_from_name(v["dtype"].get<std::string>());
  if (!dt) fail("{}: tensor '{}': unknown dtype '{}'", path, name, v["dtype"].get<std::string>());
  t.dtype = *dt;
  if (!v.contains("shape") || !v["shape"].is_array())
    fail("{}: tensor '{}': missing or non-array \"shape\"", path, name);
  uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail("{}: tensor '{}': shape has a non-integer or negative dimension", path, name);
    uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim)
      fail("{}: tensor '{}': shape {} overflows", path, name, v["shape"].dump());
    numel *= dim;
    t.shape.push_back(int64_t(dim));
  }
  const json* off = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
  if (!off || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    fail("{}: tensor '{}': \"data_offsets\" must be two non-negative integers", path, name);
  t.begin = (*off)[0].get<uint64_t>();
  t.end = (*off)[1].get<uint64_t>();
  if (t.end < t.begin)
    fail("{}: tensor '{}': data_offsets [{}, {}] end before begin", path, name, t.begin, t.end);
  if (t.end > data_size)
    fail(
        "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data ({} bytes; file "
        "truncated?)",
        path, name, t.begin, t.end, data_size);
  uint64_t expect = numel * dtype_size(t.dtype);
  if (t.end - t.begin != expect)
    fail("{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}", path, name,
         dtype_name(t.dtype), t.shape_string(), expect, t.begin, t.end, t.end - t.begin);
  return t;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->file_ = MappedFile(path);
  const uint8_t* p = f->file_.data();
  uint64_t size = f->file_.size();
  if (size < 8) fail("{}: file is {} bytes, too short for a safetensors header", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  if (n > kMaxHeader) fail("{}: header length {} is implausible (corrupt file?)", path, n);
  if (8 + n > size)
    fail("{}: header length {} runs past the end of the {}-byte file (truncated?)", path, n, size);

  // Duplicate keys are refused at every level: a tensor named twice, or a "dtype" or
  // "data_offsets" given twice inside one entry (nlohmann would silently keep the last).
  json header;
  try {
    header = parse_json(std::string_view(reinterpret_cast<const char*>(p + 8), size_t(n)),
                        JsonLimits{.max_depth = 16, .reject_duplicate_keys = true});
  } catch (const JsonParseError& e) {
    if (e.field.find_first_of(".[") == std::string::npos && !e.field.empty() &&
        std::string(e.what()).find("twice") != std::string::npos)
      fail("{}: tensor '{}' appears twice in the header", path, e.field);
    fail("{}: header is not valid JSON: {}{}", path, e.what(),
         e.field.empty() ? "" : " (at '" + e.field + "')");
  }
  if (!header.is_object()) fail("{}: header JSON is not an object", path);

  f->data_start_ = p + 8 + n;
  uint64_t data_size = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        f->metadata_[m.key()] =
            m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    f->tensors_.push_back(parse_entry(path, it.key(), it.value(), data_size));
  }
  // Ranges must not overlap (two tensors sharing bytes is a corrupt or hostile file).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f->tensors_)
    if (t.nbytes() > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail("{}: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}))", path,
           by_offset[i - 1]->name, by_offset[i]->name, by_offset[i - 1]->begin,
           by_offset[i - 1]->end, by_offset[i]->begin, by_offset[i]->end);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= uint64_t(d);
    if (numel * dtype_size(t.dtype) != t.bytes.size())
      fail("write_safetensors {}: tensor '{}' has {} bytes, shape needs {}", path, t.name,
           t.bytes.size(), numel * dtype_size(t.dtype));
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';
  FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, out) == 8 &&
            std::fwrite(text.data(), 1, text.size(), out) == text.size();
  for (const auto& t : tensors)
    ok = ok &&
         (t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), out) == t.bytes.size());
  ok = (std::fclose(out) == 0) && ok;
  if (!ok) fail("{}: write failed: {}", path, std::strerror(errno));
}

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) fail("{}: no tensor '{}'", f.path(), name);
  std::vector<float> out(size_t(t->numel()));
  const uint8_t* p = f.data(*t);
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t->dtype) {
      case DType::F32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case DType::BF16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_to_f32(b);
        break;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
        break;
      }
      default:
        fail("{}: tensor '{}' is {}, not a float type", f.path(), name, dtype_name(t->dtype));
    }
  }
  return out;
}

std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) fail("{}: no tensor '{}'", f.path(), name);
  std::vector<int32_t> out(size_t(t->numel()));
  const uint8_t* p = f.data(*t);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t->dtype == DType::I32) {
      std::memcpy(&out[i], p + 4 * i, 4);
    } else if (t->dtype == DType::I64) {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX)
        fail("{}: tensor '{}' value {} out of int32 range", f.path(), name, v);
      out[i] = int32_t(v);
    } else {
      fail("{}: tensor '{}' is {}, not I32/I64", f.path(), name, dtype_name(t->dtype));
    }
  }
  return out;
}

}  // namespace lilac
