// MLX affine quantization and the tiled repack on the GPU (load time, not on the decode path).
//
// quantize_mlx: one thread per group of 64 bf16 (128 bytes read as 8 x 16 bytes, 32 / 16 bytes of
//   codes written at 4 / 8 bits, 2 + 2 bytes of scale and bias): for the whole 35 B-weight model,
//   70 GB read and 20 GB written, ~25 ms at the copy bandwidth; in practice a few hundred ms
//   (each thread's 128-byte row is a separate cache line: loads are per-thread, not coalesced,
//   but every byte fetched is used). The arithmetic is mlx_quantize_row's, operation for
//   operation in f32 (no contraction is possible: there is no multiply-add in it; nvcc's default
//   -prec-div=true makes '/' IEEE-rounded, rintf rounds half to even like std::rint, fminf /
//   fmaxf equal std::min / std::max on the finite values and NaN-skipping in the same way).
// repack_mlx: one thread per tiled code word (8 nibbles gathered from the MLX words through
//   q_block_element) and one per sb word; the MLX input is read with scattered 4-byte loads
//   (L2-resident per block of 16 rows). ~1 s for the real model's 20 GB.
#include "cuda/q4_quantize.h"

#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/q4_layout.h"
#include "util/env_choice.h"
#include "util/error.h"

namespace lilac::cuda {
namespace {

int grid_for(int64_t n, int threads) {
  return int(std::min<int64_t>((n + threads - 1) / threads, 132 * 64));
}

template <int BITS>
__global__ void __launch_bounds__(256)
    quantize_mlx_kernel(const bf16* __restrict__ w, int64_t n_groups, uint32_t* __restrict__ codes,
                        uint16_t* __restrict__ scales, uint16_t* __restrict__ biases) {
  constexpr float n_bins = float((1 << BITS) - 1);
  constexpr float eps = 1e-7f;
  constexpr int per_word = 32 / BITS;
  for (int64_t gi = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gi < n_groups;
       gi += int64_t(gridDim.x) * blockDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(w + gi * kQGroup);
    uint32_t v[32];  // 64 bf16, two per word (element 2j in the low half)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint4 q = src[j];
      v[4 * j] = q.x;
      v[4 * j + 1] = q.y;
      v[4 * j + 2] = q.z;
      v[4 * j + 3] = q.w;
    }
    float w_min = INFINITY, w_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float lo = __uint_as_float(v[j] << 16), hi = __uint_as_float(v[j] & 0xffff0000u);
      w_max = fmaxf(w_max, lo);
      w_min = fminf(w_min, lo);
      w_max = fmaxf(w_max, hi);
      w_min = fminf(w_min, hi);
    }
    const bool mask = fabsf(w_min) > fabsf(w_max);
    float scale = fmaxf((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = rintf(edge / scale);
    float bias = 0.f;
    if (q0 != 0.f) {
      scale = edge / q0;
      bias = edge;
    }
    uint32_t* out = codes + gi * (kQGroup / per_word);
#pragma unroll
    for (int j = 0; j < kQGroup / per_word; ++j) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < per_word; ++k) {
        const int e = j * per_word + k;
        const float x =
            (e & 1) ? __uint_as_float(v[e >> 1] & 0xffff0000u) : __uint_as_float(v[e >> 1] << 16);
        float q = rintf((x - bias) / scale);
        q = q > 0.f ? fminf(q, n_bins) : 0.f;  // MLX's clamp to [0, n_bins]; NaN -> 0
        word |= uint32_t(q) << (k * BITS);
      }
      out[j] = word;
    }
    scales[gi] = __bfloat16_as_ushort(__float2bfloat16_rn(scale));
    biases[gi] = __bfloat16_as_ushort(__float2bfloat16_rn(bias));
  }
}

// One thread per tiled code word: the 8 nibbles of word w of block (tile, group, plane).
template <int BITS>
__global__ void __launch_bounds__(256)
    repack_codes_kernel(const uint32_t* __restrict__ codes, int64_t rows, int cols,
                        uint32_t* __restrict__ out, int64_t n_words) {
  constexpr int P = BITS / 4;
  const int G = cols / kQGroup;
  const int64_t words_per_row = int64_t(cols) * BITS / 32;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int w = int(i % kQBlockWords);
    const int64_t block = i / kQBlockWords;  // (tile * G + grp) * P + plane
    const int plane = int(block % P);
    const int grp = int((block / P) % G);
    const int64_t tile = block / P / G;
    uint32_t word = 0;
#pragma unroll
    for (int nib = 0; nib < 8; ++nib) {
      int row, col;
      q_block_element(w, 4 * nib, row, col);
      const int64_t r = tile * kQTileRows + row;
      if (r >= rows) continue;
      const int k = grp * kQGroup + col;
      uint32_t q;
      if (BITS == 4)
        q = (codes[r * words_per_row + k / 8] >> (4 * (k % 8))) & 15u;
      else
        q = (codes[r * words_per_row + k / 4] >> (8 * (k % 4) + 4 * plane)) & 15u;
      word |= q << (4 * nib);
    }
    out[i] = word;
  }
}

__global__ void __launch_bounds__(256)
    repack_sb_kernel(const uint16_t* __restrict__ scales, const uint16_t* __restrict__ biases,
                     int64_t rows, int G, uint32_t* __restrict__ sb, int64_t n_words) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int slot = int(i % kQSbWords);
    const int64_t block = i / kQSbWords;
    const int grp = int(block % G);
    const int64_t tile = block / G;
    const int64_t r = tile * kQTileRows + slot / 2 + 8 * (slot % 2);
    sb[i] = r < rows ? uint32_t(scales[r * G + grp]) | (uint32_t(biases[r * G + grp]) << 16) : 0u;
  }
}

// Sets *large when a scale of sb [n_words] has |s| >= 1/2 (or is not finite).
__global__ void __launch_bounds__(256)
    scales_large_kernel(const uint32_t* __restrict__ sb, int64_t n_words, int* __restrict__ large) {
  bool any = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words;
       i += int64_t(gridDim.x) * blockDim.x)
    any |= (sb[i] & 0x7FFFu) >= 0x3F00u;
  if (__syncthreads_or(any) && threadIdx.x == 0) *large = 1;
}

void check_shape(const char* what, int64_t rows, int cols, int bits) {
  if (rows < 1 || cols < kQGroup || cols % kQGroup != 0 || (bits != 4 && bits != 8))
    fail("cuda::{}: unsupported [{}, {}] at {} bits (cols a positive multiple of 64; 4 or 8 bits)",
         what, rows, cols, bits);
}

}  // namespace

void quantize_mlx(const bf16* w, int64_t rows, int cols, int bits, uint32_t* codes,
                  uint16_t* scales, uint16_t* biases, cudaStream_t stream) {
  check_shape("quantize_mlx", rows, cols, bits);
  if (!w || !codes || !scales || !biases) fail("cuda::quantize_mlx: null pointer");
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0)
    fail("cuda::quantize_mlx: w must be 16-byte aligned");
  const int64_t n_groups = rows * (cols / kQGroup);
  if (bits == 4)
    quantize_mlx_kernel<4>
        <<<grid_for(n_groups, 256), 256, 0, stream>>>(w, n_groups, codes, scales, biases);
  else
    quantize_mlx_kernel<8>
        <<<grid_for(n_groups, 256), 256, 0, stream>>>(w, n_groups, codes, scales, biases);
  LILAC_CUDA_LAUNCHED();
}

void repack_mlx(const uint32_t* codes, const uint16_t* scales, const uint16_t* biases, int64_t rows,
                int cols, int bits, uint32_t* tiled_codes, uint32_t* sb, cudaStream_t stream) {
  check_shape("repack_mlx", rows, cols, bits);
  if (!codes || !scales || !biases || !tiled_codes || !sb) fail("cuda::repack_mlx: null pointer");
  const int64_t n_words = int64_t(q_code_words(rows, cols, bits));
  if (bits == 4)
    repack_codes_kernel<4>
        <<<grid_for(n_words, 256), 256, 0, stream>>>(codes, rows, cols, tiled_codes, n_words);
  else
    repack_codes_kernel<8>
        <<<grid_for(n_words, 256), 256, 0, stream>>>(codes, rows, cols, tiled_codes, n_words);
  LILAC_CUDA_LAUNCHED();
  const int64_t n_sb = int64_t(q_sb_words(rows, cols));
  repack_sb_kernel<<<grid_for(n_sb, 256), 256, 0, stream>>>(scales, biases, rows, cols / kQGroup,
                                                            sb, n_sb);
  LILAC_CUDA_LAUNCHED();
}

bool q_scales_below_half(const uint32_t* sb, size_t sb_words) {
  static const bool two_fma =
      env_enum<bool>("LILAC_Q4_PREFILL_DEQUANT", false, {{"one-fma", false}, {"two-fma", true}});
  if (two_fma) return false;
  if (sb_words == 0) return true;
  if (!sb) fail("cuda::q_scales_below_half: null pointer");
  DeviceBuffer<int> large(1);
  LILAC_CUDA_CHECK(cudaMemset(large.get(), 0, sizeof(int)));
  scales_large_kernel<<<grid_for(int64_t(sb_words), 256), 256>>>(sb, int64_t(sb_words),
                                                                 large.get());
  LILAC_CUDA_LAUNCHED();
  int host = 0;
  LILAC_CUDA_CHECK(cudaMemcpy(&host, large.get(), sizeof(int), cudaMemcpyDeviceToHost));
  return host == 0;
}

}  // namespace lilac::cuda
