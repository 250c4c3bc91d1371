// safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
// data. Offsets are relative to the end of the header.
//
// SafetensorsFile::open maps a file and validates everything a broken or hostile file could get
// wrong before any tensor is touched: header length within the file, JSON well-formed, every entry
// with a known dtype, non-negative shape, byte range equal to numel * dtype size, ranges inside the
// file and not overlapping each other. Each error names the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "util/mapped_file.h"

namespace lilac {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string shape_string() const;  // "[16, 128, 64]"
};

// A shape as error messages print it: "[16, 128, 64]".
std::string shape_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Maps and validates; throws lilac::Error naming the file (and tensor) on any defect.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Pointer to a tensor's bytes inside the mapping.
  const uint8_t* data(const TensorInfo& t) const { return data_start_ + t.begin; }
  // Lets the OS drop the tensor's pages from this process (streaming conversion; see MappedFile).
  void drop_pages(const TensorInfo& t) const {
    file_.drop_pages(size_t(data_start_ - file_.data()) + t.begin, t.nbytes());
  }

 private:
  MappedFile file_;
  const uint8_t* data_start_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: name, dtype, shape and its bytes (numel * dtype size of them).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes a safetensors file (tensors in the given order, 8-byte aligned header). Throws on I/O
// error.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a whole tensor as float32 (from F32, F16, BF16) or int32 (from I32, I64); throws on
// another dtype or a missing name.
std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name);
std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name);

}  // namespace lilac
