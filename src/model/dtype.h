// Element types that appear in checkpoints, with their safetensors names and sizes.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace lilac {

enum class DType { F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U32, U16, U8, BOOL, F64 };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
// Floating dtypes the CPU backend reads as weights directly.
inline bool is_float_weight(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace lilac
