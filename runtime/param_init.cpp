// Parameter initialization: a counter-based generator (splitmix64 of seed, name hash, index), so that
// any element can be drawn independently of the others.
#include "runtime/param_init.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <algorithm>
#include <thread>
#include <vector>

#include "ir/assert.h"

namespace tpc {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in (0, 1), from 53 random bits.
double uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

// A normal draw from one 64-bit word by Box-Muller in f32, with ln and cos as polynomials of +, -, *, / and
// sqrt only: no libm call, so the loop vectorizes (gpt2-xl's 1.5B draws took 9 s with double log/cos on 16
// threads) and the bits are the same on every machine (CMakeLists compiles this file with
// -ffp-contract=off: no FMA contraction). Two 24-bit uniforms: u1 in (0, 1), u2 in [0, 1).
inline float lnUnit(float x) {  // ln x for x in (0, 1]
  uint32_t b;
  std::memcpy(&b, &x, 4);
  int e = static_cast<int>((b >> 23) & 0xffu) - 127;
  uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;  // the mantissa in [1, 2)
  float m;
  std::memcpy(&m, &mb, 4);
  if (m > 1.41421356f) {  // into [sqrt(1/2), sqrt(2)): |s| below 0.172
    m *= 0.5f;
    e += 1;
  }
  // ln m = 2 atanh(s), s = (m - 1) / (m + 1); the series to s^9 leaves under 4e-10.
  float s = (m - 1.f) / (m + 1.f), s2 = s * s;
  float series = s * (2.f + s2 * (2.f / 3.f + s2 * (2.f / 5.f + s2 * (2.f / 7.f + s2 * (2.f / 9.f)))));
  return static_cast<float>(e) * 0.693147181f + series;
}
inline float cos2pi(float u) {  // cos(2 pi u) for u in [0, 1)
  float a = u > 0.5f ? 1.f - u : u;  // [0, 0.5]
  float sign = 1.f;
  if (a > 0.25f) {  // cos(2 pi a) = -cos(2 pi (0.5 - a))
    a = 0.5f - a;
    sign = -1.f;
  }
  float x = 6.28318531f * a, x2 = x * x;  // [0, pi/2]: Taylor to x^12 leaves under 7e-9
  float c = 1.f + x2 * (-1.f / 2.f + x2 * (1.f / 24.f + x2 * (-1.f / 720.f + x2 * (1.f / 40320.f +
            x2 * (-1.f / 3628800.f + x2 * (1.f / 479001600.f))))));
  return sign * c;
}
inline float normalDraw(uint64_t bits) {
  float u1 = (static_cast<float>(bits >> 40) + 0.5f) * (1.f / 16777216.f);
  float u2 = static_cast<float>((bits >> 16) & 0xffffffu) * (1.f / 16777216.f);
  return std::sqrt(-2.f * lnUnit(u1)) * cos2pi(u2);
}

}  // namespace

HostTensor initParam(const Value& v, uint64_t seed, bool fp64) {
  TensorType t = v.type();
  if (isFloat(t.dtype)) t.dtype = fp64 ? DType::f64 : DType::f32;
  HostTensor out(t);  // zero-filled
  const InitSpec& init = v.init();
  const int64_t n = out.numel();
  if (init.kind == "zeros" || init.empty() || n == 0) return out;
  if (init.kind == "ones" || init.kind == "const") {
    double c = init.kind == "ones" ? 1.0 : init.args[0];
    if (t.dtype == DType::f32) std::fill_n(out.data<float>(), n, static_cast<float>(c));
    else
      for (int64_t i = 0; i < n; ++i) out.setFromDouble(i, c);
    return out;
  }
  TPC_ASSERT(init.kind == "uniform" || init.kind == "normal", "unknown initializer " + init.kind);
  const bool normal = init.kind == "normal";
  const double a0 = init.args[0], a1 = init.args.size() > 1 ? init.args[1] : 0.0;
  const uint64_t key = splitmix64(seed ^ hashName(v.name()));
  // Element i's value depends on (seed, name, i) alone, so chunks can be drawn on several threads and
  // give the same tensor as one thread (gpt2-xl's 1.6B parameters took a minute on one).
  float* f32 = t.dtype == DType::f32 ? out.data<float>() : nullptr;
  auto drawRange = [&, f32](int64_t begin, int64_t end) {
    if (normal && f32) {  // the common case, kept free of branches and calls
      const float scale = static_cast<float>(a0);
      for (int64_t i = begin; i < end; ++i) f32[i] = scale * normalDraw(splitmix64(key + static_cast<uint64_t>(i)));
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      double x = normal ? a0 * static_cast<double>(normalDraw(splitmix64(key + static_cast<uint64_t>(i))))
                        : a0 + (a1 - a0) * uniform01(splitmix64(key + 2 * static_cast<uint64_t>(i)));
      if (f32) f32[i] = static_cast<float>(x);
      else out.setFromDouble(i, x);
    }
  };
  const int64_t perThread = int64_t{1} << 20;
  int64_t threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (n + perThread - 1) / perThread);
  if (threads <= 1) {
    drawRange(0, n);
    return out;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n + threads - 1) / threads;
  for (int64_t k = 0; k < threads; ++k) pool.emplace_back(drawRange, k * chunk, std::min(n, (k + 1) * chunk));
  for (std::thread& th : pool) th.join();
  return out;
}

Status checkStateFitsInMemory(const Graph& step, int64_t bytesPerFloat, uint64_t limitBytes, const std::string& source) {
  // Long double: 2^50 elements per tensor times many tensors leaves int64_t.
  long double total = 0, largest = 0;
  const Value* big = nullptr;
  for (const Value* p : step.params()) {
    long double b = static_cast<long double>(p->type().numel()) *
                    (isFloat(p->dtype()) ? bytesPerFloat : static_cast<int64_t>(sizeof(int64_t)));
    total += b;
    if (b > largest) largest = b, big = p;
  }
  if (total <= static_cast<long double>(limitBytes)) return {};
  auto gib = [](long double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1Lf GiB", b / (1024.0L * 1024 * 1024));
    return std::string(buf);
  };
  return makeError(source, ": error: the parameters and optimizer state need ", gib(total), ", more than this machine's ",
                   gib(limitBytes), " of memory (the largest, %", big->name(), ", is ", big->type().str(), ": ", gib(largest),
                   "); make the model smaller");
}

uint64_t physicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : UINT64_MAX;
}

}  // namespace tpc
