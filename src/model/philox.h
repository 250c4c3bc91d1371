// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, identical on the host and the device, so the CUDA sampler draws the
// same uniform as the CPU sampler for the same (seed, step).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LILAC_PHILOX_HD __host__ __device__ __forceinline__
#else
#define LILAC_PHILOX_HD inline
#endif

namespace lilac {

struct Philox4x32 {
  uint32_t v[4];
};

LILAC_PHILOX_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                         uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * c0, p1 = uint64_t(M1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32),
                   lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += W0;
    k1 += W1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1): key = seed, counter = (step, 0, 0); the top 24 bits of the first word.
LILAC_PHILOX_HD float philox_uniform_hd(uint64_t seed, uint64_t step) {
  Philox4x32 r = philox4x32_10(uint32_t(step), uint32_t(step >> 32), 0u, 0u, uint32_t(seed),
                               uint32_t(seed >> 32));
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace lilac
