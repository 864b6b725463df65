// Philox4x32-10 (Salmon et al., Random123), the counter-based generator behind every random op. Plain
// functions usable from host code and, compiled by nvcc, from CUDA kernels: a mask element depends only on
// (seed, step, key, element index), so a shard, a recomputation or a VJP draws exactly the same bits.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define TPC_PHILOX_FN __host__ __device__ inline
#else
#define TPC_PHILOX_FN inline
#endif

namespace tpc::philox {

struct U4 {
  uint32_t x[4];
};

TPC_PHILOX_FN uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

TPC_PHILOX_FN U4 philox4x32_10(U4 ctr, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, ctr.x[0], &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, ctr.x[2], &hi1);
    U4 next = {{hi1 ^ ctr.x[1] ^ k0, lo1, hi0 ^ ctr.x[3] ^ k1, lo0}};
    ctr = next;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// A uniform float in [0, 1) for one element of a random stream. Four consecutive elements share one
// Philox block: counter = (index / 4, step, key), key = seed; the lane is index % 4. The step's high 32
// bits are not used.
TPC_PHILOX_FN float uniform(uint64_t seed, int64_t step, uint32_t key, uint64_t index) {
  uint64_t block = index >> 2;
  U4 ctr = {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(step), key}};
  U4 r = philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(r.x[index & 3] >> 8) * (1.0f / 16777216.0f);
}

// Dropout keeps an element with probability 1 - p.
TPC_PHILOX_FN bool dropoutKeep(uint64_t seed, int64_t step, uint32_t key, uint64_t index, float p) {
  return uniform(seed, step, key, index) >= p;
}

}  // namespace tpc::philox
