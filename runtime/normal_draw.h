// The counter-based normal draw of parameter init, written once for two compilers: the host (param_init.cpp)
// and NVRTC (runtime/cuda/param_draw.cpp draws parameters on the GPU). TPC_NORMAL_DRAW_CODE(...) both
// compiles its argument here and keeps its text (normalDrawSource()), which the GPU kernel pastes after its
// own TPC_HD and bit-cast definitions, so the two sides run the same IEEE operations in the same order and
// give the same bits: element i of a parameter = scale * tpc_normal_draw(tpc_splitmix64(key + i)). Included
// by param_init.cpp alone (compiled without FMA contraction), which defines normalDrawSource().
// Both sides compile without FMA contraction (param_init.cpp: -ffp-contract=off; NVRTC: --fmad=false), and
// IEEE +, -, *, / and sqrt round the same on both. The code may use no macros of its own (the text is taken
// unexpanded) and only unsigned int / unsigned long long / int / float.
#pragma once

#include <math.h>
#include <cstring>

namespace tpc {

#define TPC_NORMAL_DRAW_CODE(...) \
  __VA_ARGS__                     \
  const char* normalDrawSource() { return #__VA_ARGS__; }

#define TPC_HD inline
inline unsigned int tpc_float_bits(float x) {
  unsigned int b;
  std::memcpy(&b, &x, 4);
  return b;
}
inline float tpc_bits_float(unsigned int b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

TPC_NORMAL_DRAW_CODE(
TPC_HD unsigned long long tpc_splitmix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/* ln x for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m - 1) / (m + 1),
   |s| < 0.172, the series to s^9 leaves under 4e-10. */
TPC_HD float tpc_ln_unit(float x) {
  unsigned int b = tpc_float_bits(x);
  int e = (int)((b >> 23) & 0xffu) - 127;
  float m = tpc_bits_float((b & 0x7fffffu) | 0x3f800000u);
  if (m > 1.41421356f) {
    m = m * 0.5f;
    e = e + 1;
  }
  float s = (m - 1.f) / (m + 1.f), s2 = s * s;
  float series = s * (2.f + s2 * (2.f / 3.f + s2 * (2.f / 5.f + s2 * (2.f / 7.f + s2 * (2.f / 9.f)))));
  return (float)e * 0.693147181f + series;
}
/* cos(2 pi u) for u in [0, 1): folded onto [0, pi/2], Taylor to x^12 leaves under 7e-9. */
TPC_HD float tpc_cos_2pi(float u) {
  float a = u > 0.5f ? 1.f - u : u;
  float sign = 1.f;
  if (a > 0.25f) {
    a = 0.5f - a;
    sign = -1.f;
  }
  float x = 6.28318531f * a, x2 = x * x;
  float c = 1.f + x2 * (-1.f / 2.f + x2 * (1.f / 24.f + x2 * (-1.f / 720.f + x2 * (1.f / 40320.f +
            x2 * (-1.f / 3628800.f + x2 * (1.f / 479001600.f))))));
  return sign * c;
}
/* Box-Muller from one 64-bit word: two 24-bit uniforms, u1 in (0, 1), u2 in [0, 1). */
TPC_HD float tpc_normal_draw(unsigned long long bits) {
  float u1 = ((float)(bits >> 40) + 0.5f) * (1.f / 16777216.f);
  float u2 = (float)((bits >> 16) & 0xffffffu) * (1.f / 16777216.f);
  return sqrtf(-2.f * tpc_ln_unit(u1)) * tpc_cos_2pi(u2);
}
)

#undef TPC_HD

}  // namespace tpc
