// MLX affine 4-bit / 8-bit weights on the GPU: the device layout every q4_* kernel reads.
// Host-safe (no CUDA headers): the index functions below are used by the repack kernel, by the
// embedding lookup, and by the tests (which check the repack against the MLX layout element by
// element through the same functions, and the kernels against CPU twins).
//
// The arithmetic is MLX's (docs/quantization.md): w[r, k] = scale[r, g] * q + bias[r, g],
// g = k / 64, q the unsigned code (4 or 8 bits), scale and bias bf16.
//
// Layout ("tiled"). A matrix W [rows, cols] (cols = 64 G) is cut into tiles of 16 rows (rows are
// padded to a multiple of 16 with zero codes and zero scale/bias) and groups of 64 columns. For
// each (tile, group) block:
//   codes: `planes` x 512 bytes (planes = bits / 4; an 8-bit code is split into its low nibble,
//          plane 0, and its high nibble, plane 1, each stored like a 4-bit matrix), laid out
//          as 32 lanes x 4 uint32 words; word kb (0..3) of lane l = 4 g + t (g = l / 4, t = l % 4)
//          holds the 8 nibbles that lane l's A fragment of mma.m16n8k16 (row-major A = the 16
//          rows x 16 columns [16 kb, 16 kb + 16) of the group) needs:
//            nibble i (bits [4i, 4i + 4))     = element (row g + 8 (i & 1), col 2t + 8 (i >> 1))
//            nibble i + 4 (bits [16 + 4i, ..)) = the next column (col + 1) of the same row
//          so (word >> 4i) & 0x000F000F, OR-ed with the bf16 bit pattern of 128.0 (0x4300 in
//          each half), is the bf16x2 pair (128 + q(col), 128 + q(col + 1)) of fragment
//          register a_i: one SHF + one LOP3 per register, no per-element conversion.
//          One 16-byte load gives a lane the four k16 fragments (64 columns x 2 rows / 4 lanes
//          = 32 codes) of the group; a warp's 32 loads are one contiguous 512-byte block.
//   sb:    16 uint32 (64 bytes): slot 2 j + h (j < 8, h < 2) is row j + 8 h of the tile,
//          bf16 scale in the low half, bf16 bias in the high half. A lane of fragment row g
//          reads (row g, row g + 8) as one 8-byte load at slot 2 g.
// Block order: codes [tile][group][plane][lane][word], sb [tile][group][slot]. Rows of a fused
// projection (in_proj = qkv | z | b | a, ...) are simply consecutive rows; stacked experts are one
// matrix of E * rows_per_expert rows (the kernels need rows_per_expert % 16 == 0, so expert e
// starts at tile e * rows_per_expert / 16).
// Bytes: (512 * planes + 64) per 16 x 64 block = 4.5 bits per weight at 4 bits, 8.5 at 8 bits:
// the same as MLX's codes + scales + biases.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define LILAC_QHD __host__ __device__ __forceinline__
#else
#define LILAC_QHD inline
#endif

namespace lilac::cuda {

constexpr int kQGroup = 64;     // columns per scale/bias group (MLX group_size; the only one run)
constexpr int kQTileRows = 16;  // rows per tile (m16 of mma.m16n8k16)
constexpr int kQBlockWords = 128;  // uint32 code words per (tile, group, plane) block: 512 bytes
constexpr int kQSbWords = 16;      // uint32 sb words per (tile, group) block: 64 bytes

// A quantized matrix (or a stack of equal matrices, e.g. experts) in the tiled layout.
struct QMatrix {
  const uint32_t* codes = nullptr;
  const uint32_t* sb = nullptr;
  int rows = 0;  // logical rows (all experts of a stack together)
  int cols = 0;  // a multiple of 64
  int bits = 0;  // 4 or 8; 0: not quantized (this slot is unused)
  // Every scale has |s| < 1/2 (q_scales_below_half, set where the matrix is built): the wgmma
  // prefill kernels may rebuild its 4-bit weights with one FMA per pair (q4_gemm_wgmma.cuh
  // dequant_ktile); false keeps the two-FMA form, which takes any scale. Same bits either way.
  bool small_scales = false;

  LILAC_QHD explicit operator bool() const { return codes != nullptr; }
  LILAC_QHD int groups() const { return cols / kQGroup; }
  LILAC_QHD int tiles() const { return (rows + kQTileRows - 1) / kQTileRows; }
  LILAC_QHD int planes() const { return bits / 4; }
  LILAC_QHD size_t code_words() const {
    return size_t(tiles()) * size_t(groups()) * size_t(planes()) * kQBlockWords;
  }
  LILAC_QHD size_t sb_words() const { return size_t(tiles()) * size_t(groups()) * kQSbWords; }
};

// Code words and sb words of a rows x cols matrix at `bits`.
LILAC_QHD size_t q_code_words(int64_t rows, int64_t cols, int bits) {
  return size_t((rows + kQTileRows - 1) / kQTileRows) * size_t(cols / kQGroup) * size_t(bits / 4) *
         kQBlockWords;
}
LILAC_QHD size_t q_sb_words(int64_t rows, int64_t cols) {
  return size_t((rows + kQTileRows - 1) / kQTileRows) * size_t(cols / kQGroup) * kQSbWords;
}

// Where element (r, k) of plane p lives: word index into `codes` and the bit shift of its
// nibble. G = cols / 64, planes = bits / 4.
LILAC_QHD void q_code_position(int G, int planes, int64_t r, int k, int p, size_t& word,
                               int& shift) {
  const int64_t tile = r / kQTileRows;
  const int rr = int(r % kQTileRows);
  const int grp = k / kQGroup, kk = k % kQGroup;
  const int kb = kk / 16, c = kk % 16;
  const int g = rr & 7, hi_row = rr >> 3;
  const int t = (c & 7) >> 1, half = c & 1, upper = c >> 3;
  const int lane = 4 * g + t;
  const int i = hi_row + 2 * upper;  // fragment register a_i
  word = ((size_t(tile) * size_t(G) + size_t(grp)) * size_t(planes) + size_t(p)) * kQBlockWords +
         size_t(lane) * 4 + size_t(kb);
  shift = 4 * (i + 4 * half);
}

// Index into `sb` of (row r, group grp).
LILAC_QHD size_t q_sb_position(int G, int64_t r, int grp) {
  const int64_t tile = r / kQTileRows;
  const int rr = int(r % kQTileRows);
  return (size_t(tile) * size_t(G) + size_t(grp)) * kQSbWords + size_t(2 * (rr & 7) + (rr >> 3));
}

// The inverse of q_code_position for a nibble of a block: (row within the tile, column within
// the group) of bit position `shift` of word `w` (0..127) of a (tile, group, plane) block.
LILAC_QHD void q_block_element(int w, int shift, int& row, int& col) {
  const int lane = w >> 2, kb = w & 3;
  const int g = lane >> 2, t = lane & 3;
  const int nib = shift >> 2, i = nib & 3, half = nib >> 2;
  row = g + 8 * (i & 1);
  col = 16 * kb + 2 * t + 8 * (i >> 1) + half;
}

}  // namespace lilac::cuda
