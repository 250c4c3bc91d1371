#include "cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "util/error.h"

namespace lilac::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      fail("TMA: the driver has no cuTensorMapEncodeTiled ({})", cudaGetErrorString(e));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap bf16_tensor_map_3d(const void* base, const uint64_t (&dims)[3],
                               const uint64_t (&strides_bytes)[2], const uint32_t (&box)[3]) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    fail("TMA: tensor base {} is not 16-byte aligned", base);
  if (box[0] * 2 > 128) fail("TMA: a box row of {} bf16 exceeds the 128-byte swizzle span", box[0]);
  CUtensorMap map;
  const cuuint64_t global_dims[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t global_strides[2] = {strides_bytes[0], strides_bytes[1]};
  const cuuint32_t box_dims[3] = {box[0], box[1], box[2]};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), global_dims,
                global_strides, box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail(
        "TMA: cuTensorMapEncodeTiled refused dims {{{}, {}, {}}}, strides {{{}, {}}} bytes, box "
        "{{{}, {}, {}}} (CUresult {})",
        dims[0], dims[1], dims[2], strides_bytes[0], strides_bytes[1], box[0], box[1], box[2],
        int(r));
  return map;
}

}  // namespace lilac::cuda
