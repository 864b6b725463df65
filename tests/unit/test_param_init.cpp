// initParam (runtime/param_init.h): the normal draw's moments and tails, uniform bounds, the same bits for a
// seed and name whatever the thread count, and pinned values (the generator is machine-independent: f32
// polynomials without FMA contraction, so these bits hold on every machine and compiler).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "ir/graph.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

struct Moments {
  double mean = 0, std = 0, kurtosis = 0, beyond2 = 0, maxAbsZ = 0;
};

Moments moments(const HostTensor& t) {
  const float* f = t.data<float>();
  const int64_t n = t.numel();
  Moments m;
  for (int64_t i = 0; i < n; ++i) m.mean += f[i];
  m.mean /= n;
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (f[i] - m.mean) * (f[i] - m.mean);
  m.std = std::sqrt(var / n);
  for (int64_t i = 0; i < n; ++i) {
    double z = (f[i] - m.mean) / m.std;
    m.kurtosis += z * z * z * z;
    m.beyond2 += std::abs(z) > 2;
    m.maxAbsZ = std::max(m.maxAbsZ, std::abs(z));
  }
  m.kurtosis /= n;
  m.beyond2 /= n;
  return m;
}

TEST_CASE("initParam: normal draws have the declared std, a normal's kurtosis and tails", "[param_init]") {
  Graph g("init");
  Value* w = g.addParam("h.0.mlp.c_fc.weight", TensorType(DType::f32, {2048, 1024}), InitSpec{"normal", {0.02}});
  HostTensor t = initParam(*w, 1234);
  Moments m = moments(t);
  INFO("mean " << m.mean << " std " << m.std << " kurtosis " << m.kurtosis << " beyond 2 sigma " << m.beyond2
               << " max |z| " << m.maxAbsZ);
  CHECK(std::abs(m.mean) < 1e-4);
  CHECK(std::abs(m.std / 0.02 - 1) < 2e-3);
  CHECK(std::abs(m.kurtosis - 3) < 0.03);
  CHECK(std::abs(m.beyond2 - 0.0455) < 1e-3);  // P(|z| > 2) of a normal
  CHECK(m.maxAbsZ > 4.5);                      // 2M draws reach the tails ...
  CHECK(m.maxAbsZ < 6.0);                      // ... which 24-bit uniforms bound at 5.8 sigma
}

TEST_CASE("initParam: the same seed and name give the same bits, another seed or name others", "[param_init]") {
  Graph g("init");
  Value* a = g.addParam("a", TensorType(DType::f32, {3000, 700}), InitSpec{"normal", {1.0}});  // several threads
  Value* b = g.addParam("b", TensorType(DType::f32, {3000, 700}), InitSpec{"normal", {1.0}});
  Value* small = g.addParam("a", TensorType(DType::f32, {10, 70}), InitSpec{"normal", {1.0}});  // one thread
  HostTensor x = initParam(*a, 7), y = initParam(*a, 7), z = initParam(*a, 8), o = initParam(*b, 7);
  CHECK(std::memcmp(x.data<float>(), y.data<float>(), x.bytes()) == 0);
  CHECK(std::memcmp(x.data<float>(), z.data<float>(), x.bytes()) != 0);
  CHECK(std::memcmp(x.data<float>(), o.data<float>(), x.bytes()) != 0);
  // Element i depends on (seed, name, i) only: a smaller tensor of the same name starts with the same values.
  HostTensor s = initParam(*small, 7);
  CHECK(std::memcmp(x.data<float>(), s.data<float>(), s.bytes()) == 0);
}

TEST_CASE("initParam: pinned values of the normal draw (machine-independent bits)", "[param_init]") {
  Graph g("init");
  Value* w = g.addParam("wte", TensorType(DType::f32, {4}), InitSpec{"normal", {0.02}});
  HostTensor t = initParam(*w, 1234);
  const uint32_t want[4] = {0xbcf30826u, 0x3bd6f0b5u, 0xbba3308au, 0x3b818ad1u};
  for (int i = 0; i < 4; ++i) {
    uint32_t bits;
    std::memcpy(&bits, t.data<float>() + i, 4);
    INFO("element " << i << ": " << t.data<float>()[i]);
    CHECK(bits == want[i]);
  }
}

TEST_CASE("initParam: an f32 normal draw is made on first access, once, the same for every reader", "[param_init]") {
  Graph g("init");
  Value* w = g.addParam("w", TensorType(DType::f32, {2500, 1000}), InitSpec{"normal", {0.5}});
  HostTensor t = initParam(*w, 9), again = initParam(*w, 9);
  const HostTensor::NormalDraw* draw = t.pendingNormalDraw();
  REQUIRE(draw != nullptr);  // deferred: a backend may draw it itself
  CHECK(draw->scale == 0.5f);
  CHECK_FALSE(t.untouchedZeros());
  HostTensor shared = t;  // copies share the storage and the pending draw
  CHECK(shared.pendingNormalDraw() == draw);
  // Eight readers at once: one draws, all see the same bytes.
  std::vector<const float*> seen(8);
  std::vector<std::thread> readers;
  for (size_t k = 0; k < seen.size(); ++k) readers.emplace_back([&, k] { seen[k] = std::as_const(shared).data<float>(); });
  for (std::thread& r : readers) r.join();
  for (const float* p : seen) CHECK(p == seen[0]);
  CHECK(t.pendingNormalDraw() == nullptr);
  CHECK(std::memcmp(t.data<float>(), again.clone().data<float>(), t.bytes()) == 0);
  CHECK(std::abs(moments(t).std / 0.5 - 1) < 3e-3);
  // f64 tensors (the CPU backend's --fp64) and uniform draws are made at once.
  CHECK(initParam(*w, 9, true).pendingNormalDraw() == nullptr);
  Value* u = g.addParam("u", TensorType(DType::f32, {10}), InitSpec{"uniform", {0, 1}});
  CHECK(initParam(*u, 9).pendingNormalDraw() == nullptr);
}

TEST_CASE("initParam: uniform draws stay in their bounds, and ones and zeros", "[param_init]") {
  Graph g("init");
  Value* u = g.addParam("u", TensorType(DType::f32, {100000}), InitSpec{"uniform", {-0.5, 0.25}});
  HostTensor t = initParam(*u, 3);
  double lo = 1, hi = -1, mean = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.data<float>()[i];
    lo = std::min(lo, v), hi = std::max(hi, v), mean += v;
  }
  mean /= static_cast<double>(t.numel());
  CHECK(lo >= -0.5);
  CHECK(hi <= 0.25);
  CHECK(lo < -0.499);
  CHECK(hi > 0.249);
  CHECK(std::abs(mean + 0.125) < 3e-3);
  Value* ones = g.addParam("g", TensorType(DType::f32, {5}), InitSpec{"ones", {}});
  Value* zeros = g.addParam("z", TensorType(DType::f32, {5}), InitSpec{"zeros", {}});
  CHECK(initParam(*ones, 1).data<float>()[4] == 1.f);
  HostTensor zt = initParam(*zeros, 1);
  CHECK(zt.untouchedZeros());  // never written: a backend may clear device memory instead of copying
  CHECK(std::as_const(zt).data<float>()[4] == 0.f);
  CHECK_FALSE(initParam(*ones, 1).untouchedZeros());
}

}  // namespace
}  // namespace tpc
