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
#include "runtime/normal_draw.h"

namespace tpc {
namespace {

uint64_t hashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in (0, 1), from 53 random bits.
double uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

// Runs draw(begin, end) over [0, n) in chunks on this machine's threads. Element i's value depends on
// (seed, name, i) alone, so the chunks give the same tensor as one thread (gpt2-xl's 1.6B parameters took a
// minute on one).
template <class Draw>
void drawInChunks(int64_t n, const Draw& draw) {
  const int64_t perThread = int64_t{1} << 20;
  int64_t threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (n + perThread - 1) / perThread);
  if (threads <= 1) {
    draw(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n + threads - 1) / threads;
  for (int64_t k = 0; k < threads; ++k) pool.emplace_back([&draw, k, chunk, n] { draw(k * chunk, std::min(n, (k + 1) * chunk)); });
  for (std::thread& th : pool) th.join();
}

}  // namespace

HostTensor initParam(const Value& v, uint64_t seed, bool fp64) {
  TensorType t = v.type();
  if (isFloat(t.dtype)) t.dtype = fp64 ? DType::f64 : DType::f32;
  const InitSpec& init = v.init();
  const int64_t n = t.numel();
  if (init.kind == "normal" && t.dtype == DType::f32 && n > 0) {
    // The common case: drawn on first access, so that a backend that can draw it itself (the CUDA backend,
    // on the GPU from normalDrawSource()) never computes the host copy.
    const HostTensor::NormalDraw draw{tpc_splitmix64(seed ^ hashName(v.name())), static_cast<float>(init.args[0])};
    return HostTensor::deferred(t, draw, [n, draw](uint8_t* bytes) {
      float* f32 = reinterpret_cast<float*>(bytes);
      drawInChunks(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          f32[i] = draw.scale * tpc_normal_draw(tpc_splitmix64(draw.key + static_cast<uint64_t>(i)));
      });
    });
  }
  HostTensor out(t);  // zero-filled
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
  const uint64_t key = tpc_splitmix64(seed ^ hashName(v.name()));
  float* f32 = t.dtype == DType::f32 ? out.data<float>() : nullptr;
  drawInChunks(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double x = normal ? a0 * static_cast<double>(tpc_normal_draw(tpc_splitmix64(key + static_cast<uint64_t>(i))))
                        : a0 + (a1 - a0) * uniform01(tpc_splitmix64(key + 2 * static_cast<uint64_t>(i)));
      if (f32) f32[i] = static_cast<float>(x);
      else out.setFromDouble(i, x);
    }
  });
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
