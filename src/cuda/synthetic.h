// Synthetic weights: the same pseudo-random value for (seed, tensor key, element index) on the
// host and on the device, so a GPU model generated on the device and a host copy of its first
// layers (for the CPU reference) hold identical numbers. Values are uniform in [-a, a] around a
// centre, rounded to bf16 where the tensor is bf16.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define LILAC_HD __host__ __device__ __forceinline__
#else
#define LILAC_HD inline
#endif

namespace lilac::synthetic {

// A 64-bit mix (splitmix64 finaliser): good avalanche, cheap, identical on host and device.
LILAC_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Uniform in [centre - a, centre + a).
LILAC_HD float value(uint64_t tensor_key, uint64_t index, float centre, float a) {
  uint64_t h = mix64(tensor_key ^ mix64(index + 0x9e3779b97f4a7c15ull));
  float u = float(uint32_t(h >> 40)) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
  return centre + a * (2.0f * u - 1.0f);
}

// FNV-1a of a tensor's name, mixed with the seed: the key of that tensor's value stream.
inline uint64_t tensor_key(uint64_t seed, const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  return mix64(h ^ mix64(seed));
}

}  // namespace lilac::synthetic
