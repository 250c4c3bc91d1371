// Quantization on the GPU: MLX affine round-to-nearest of bf16 weights (the device twin of
// lilac::mlx_quantize_row, bit for bit), and the repack of MLX-format codes / scales / biases into
// the tiled layout the q4 kernels read (q4_layout.h). Used at load: `--weights q4` on a BF16
// checkpoint, the synthetic q4 model, and MLX 4-bit checkpoints (repack only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.h"

namespace lilac::cuda {

// MLX format of W bf16 [rows, cols] (row-major, 16-byte aligned): codes uint32 [rows, cols * bits
// / 32], scales / biases bf16 bits [rows, cols / 64]. bits 4 or 8, cols a positive multiple of 64.
// Exactly mlx_quantize_row (group 64) on every row: f32 min / max, IEEE divisions, rint (half to
// even), clamp, RNE to bf16. One thread per group. Twin: lilac::mlx_quantize_row.
void quantize_mlx(const bf16* w, int64_t rows, int cols, int bits, uint32_t* codes,
                  uint16_t* scales, uint16_t* biases, cudaStream_t stream);

// MLX format (as above) -> tiled layout: tiled_codes [q_code_words(rows, cols, bits)], sb
// [q_sb_words(rows, cols)] (rows padded to 16 with zeros). The inputs and outputs must not overlap.
void repack_mlx(const uint32_t* codes, const uint16_t* scales, const uint16_t* biases, int64_t rows,
                int cols, int bits, uint32_t* tiled_codes, uint32_t* sb, cudaStream_t stream);

// Whether every scale of a tiled sb array [sb_words] (the low bf16 of each word) has |s| < 1/2
// (bits & 0x7FFF below 0x3F00; a NaN or infinite scale answers false): QMatrix::small_scales.
// Reads the whole array and synchronises the device (a load-time check). With
// LILAC_Q4_PREFILL_DEQUANT=two-fma in the environment it answers false without looking (the A/B
// switch of dequant_ktile's two forms).
bool q_scales_below_half(const uint32_t* sb, size_t sb_words);

}  // namespace lilac::cuda
