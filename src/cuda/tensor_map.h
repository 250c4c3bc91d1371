// TMA descriptors (CUtensorMap, Hopper's tensor memory accelerator): what a kernel's
// `cp.async.bulk.tensor` (bulk_copy.cuh, copy_tensor_3d) needs to copy a box of a strided global
// tensor into shared memory, laid out in the 128-byte swizzle that wgmma's sw128 descriptors read.
// The encoder is the driver's cuTensorMapEncodeTiled, fetched at run time through the CUDA runtime
// (no link against libcuda).
#pragma once

#include <cuda.h>  // CUtensorMap: the type only

#include <cstdint>

namespace lilac::cuda {

// A descriptor of the bf16 tensor at `base` with dims {d0, d1, d2} (d0 contiguous; strides of d1
// and d2 in bytes, multiples of 16), copied in boxes {b0, b1, b2} (b0 * 2 bytes <= 128: one
// swizzle span per box row; each <= 256) in the 128-byte swizzle; elements outside the dims read
// as zeros. base must be 16-byte aligned. Throws lilac::Error naming what the driver refused.
CUtensorMap bf16_tensor_map_3d(const void* base, const uint64_t (&dims)[3],
                               const uint64_t (&strides_bytes)[2], const uint32_t (&box)[3]);

}  // namespace lilac::cuda
