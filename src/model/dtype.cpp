#include "model/dtype.h"

#include <array>
#include <utility>

namespace lilac {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 13> kDTypes{{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::I64, "I64", 8},
    {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},
    {DType::U32, "U32", 4},
    {DType::U16, "U16", 2},
    {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
    {DType::F64, "F64", 8},
}};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

}  // namespace lilac
