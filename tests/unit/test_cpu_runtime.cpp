// CPU backend: host tensor conversions, Philox, dropout statistics, buffer liveness, the GPT block end to
// end, CpuBackend's state updates, and (hidden, `tpc_tests "[.bench]"`) a matmul throughput benchmark.
#include <chrono>
#include <cmath>

#include "cpu_test_helpers.h"
#include "ir/parser.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/philox.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;

TEST_CASE("host tensor: bf16 and f16 round to nearest even and round-trip", "[cpu][host_tensor]") {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  CHECK(floatToBf16(1.0f) == 0x3f80);
  CHECK(floatToBf16(bits(0x3f808000u)) == 0x3f80);  // tie -> even
  CHECK(floatToBf16(bits(0x3f818000u)) == 0x3f82);  // tie -> even
  CHECK(floatToBf16(bits(0x3f808001u)) == 0x3f81);
  CHECK(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
  CHECK(floatToF16(1.0f) == 0x3c00);
  CHECK(floatToF16(65504.0f) == 0x7bff);
  CHECK(floatToF16(65520.0f) == 0x7c00);
  CHECK(floatToF16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(floatToF16(std::ldexp(1.0f, -25)) == 0x0000);      // tie -> even (0)
  CHECK(floatToF16(std::ldexp(3.0f, -25)) == 0x0002);      // tie -> even (2)
  CHECK(floatToF16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(floatToF16(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);
  CHECK(floatToF16(-2.0f) == 0xc000);
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00) == 0x7c00 && (v & 0x3ff)) continue;  // NaN payloads
    REQUIRE(floatToF16(f16ToFloat(v)) == v);
    if ((v & 0x7f80) == 0x7f80 && (v & 0x7f)) continue;
    REQUIRE(floatToBf16(bf16ToFloat(v)) == v);
  }
  HostTensor t(TensorType(DType::f32, {3}));
  t.setFromDouble(0, 1.5);
  t.setFromDouble(1, -2.7);
  t.setFromDouble(2, 1e6);
  HostTensor b = t.convertTo(DType::bf16), i = t.convertTo(DType::i32), d = t.convertTo(DType::f64);
  CHECK(b.getAsDouble(0) == 1.5);
  CHECK(b.getAsDouble(2) == bf16ToFloat(floatToBf16(1e6f)));
  CHECK(i.getAsDouble(1) == -2.0);
  CHECK(d.getAsDouble(1) == static_cast<double>(-2.7f));
  CHECK(i.convertTo(DType::i64).getAsDouble(2) == 1e6);
}

TEST_CASE("philox: Random123 known-answer vector", "[cpu][philox]") {
  philox::U4 r = philox::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  CHECK(r.x[0] == 0x6627e8d5u);
  CHECK(r.x[1] == 0xe169c58du);
  CHECK(r.x[2] == 0xbc57ac4cu);
  CHECK(r.x[3] == 0x9b00dbd8u);
}

TEST_CASE("cpu: dropout masks are keyed by (seed, step, key, index) and keep 1-p on average", "[cpu][dropout]") {
  const int64_t n = 200000;
  const double p = 0.3;
  HostTensor ones(TensorType(DType::f32, {n}));
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
  auto drop = [&](int64_t key, int64_t step, int threads) {
    AttrDict a;
    a.set("p", p);
    a.set("key", key);
    OneOp o = oneOp(OpKind::Dropout, {f32({n})}, a);
    auto r = runGraph(*o.graph, {ones}, false, step, threads);
    REQUIRE(r.ok());
    return values(r->at(0));
  };
  auto m = drop(1, 0, 2);
  CHECK(m == drop(1, 0, 2));
  CHECK(m == drop(1, 0, 1));  // independent of the thread count
  CHECK(m != drop(1, 1, 2));  // another step
  CHECK(m != drop(2, 0, 2));  // another key
  double kept = 0, sum = 0;
  for (double v : m) {
    kept += v != 0;
    sum += v;
    if (v != 0) REQUIRE(v == Approx(1 / (1 - p)).epsilon(1e-6));
  }
  double sigma = std::sqrt(n * p * (1 - p));
  CHECK(std::abs(kept - n * (1 - p)) < 3 * sigma);
  CHECK(std::abs(sum / n - 1.0) < 3 * std::sqrt(p / (1 - p) / n));
}

TEST_CASE("cpu: buffers are freed after their last use", "[cpu][liveness]") {
  Graph g("chain");
  TensorType t = f32({1000});
  Value* v = g.addInput("x", t);
  const int kLen = 60;
  for (int k = 0; k < kLen; ++k) v = (*g.create(k % 2 ? OpKind::Neg : OpKind::Tanh, {v}, {}))->result();
  g.addOutput(v);
  auto e = CpuExecutor::create(g, CpuOptions{});
  REQUIRE(e.ok());
  std::mt19937 rng(31);
  HostTensor x = randomTensor(t, rng, false);
  REQUIRE((*e)->run({&x}, {}, 0).ok());
  int64_t total = (kLen + 1) * t.bytes();
  int64_t peak = (*e)->peakLiveBytes();
  INFO("peak " << peak << " of " << total);
  CHECK(peak < total);
  CHECK(peak <= 2 * t.bytes());  // the operand and the result of one node
}

namespace {

// Parameters drawn from each parameter's init spec; tokens and targets uniform in [0, 128).
std::vector<HostTensor> gptParams(const Graph& g, std::mt19937& rng, bool fp64) {
  std::vector<HostTensor> ps;
  for (Value* p : g.params()) {
    HostTensor t(TensorType(fp64 ? DType::f64 : DType::f32, p->shape()));
    std::normal_distribution<double> nd(0, p->init().kind == "normal" ? p->init().args[0] : 0);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.setFromDouble(i, p->init().kind == "ones" ? 1.0 : p->init().kind == "zeros" ? 0.0 : nd(rng));
    ps.push_back(t);
  }
  return ps;
}

}  // namespace

TEST_CASE("cpu: the GPT block runs end to end with a loss near ln(vocab)", "[cpu][gpt]") {
  auto g = parseGraphFile(sourcePath("tests/ir/gpt_block.tir"));
  REQUIRE(g.ok());
  std::mt19937 rng(32);
  HostTensor tokens = randomTensor(i32({2, 16}), rng, false, 0, 127), targets = randomTensor(i32({2, 16}), rng, false, 0, 127);
  double loss[2];
  for (bool fp64 : {false, true}) {
    std::mt19937 prng(33);
    std::vector<HostTensor> params = gptParams(**g, prng, fp64);
    std::vector<const HostTensor*> pp;
    for (auto& p : params) pp.push_back(&p);
    double byThreads[2];
    for (int threads : {1, 2}) {
      CpuOptions opt;
      opt.fp64 = fp64;
      opt.threads = threads;
      auto e = CpuExecutor::create(**g, opt);
      REQUIRE(e.ok());
      auto out = (*e)->run({&tokens, &targets}, pp, 0);
      if (!out.ok()) FAIL(out.error());
      REQUIRE(out->size() == 1);
      byThreads[threads - 1] = out->at(0).getAsDouble(0);
    }
    CHECK(byThreads[0] == byThreads[1]);  // results do not depend on the thread count
    loss[fp64] = byThreads[1];
    CHECK(std::isfinite(loss[fp64]));
    CHECK(std::abs(loss[fp64] - std::log(128.0)) < 0.2);
  }
  CHECK(std::abs(loss[0] - loss[1]) < 1e-5);  // fp32 agrees with fp64
}

TEST_CASE("cpu backend: outputs named like a parameter replace it, others are returned", "[cpu][backend]") {
  Graph g("step");
  Value* w = g.addParam("w", f32({3}));
  Value* x = g.addInput("x", f32({3}));
  Value* w2 = (*g.create(OpKind::Add, {w, x}, {}))->result();
  AttrDict a;
  a.set("axes", std::vector<int64_t>{0});
  Value* s = (*g.create(OpKind::ReduceSum, {w2}, a))->result();
  g.addOutput(w2, "w");
  g.addOutput(s, "sum");
  auto backend = createCpuBackend(CpuOptions{});
  TensorMap init{{"w", fromValues(f32({3}), {1, 2, 3}, false)}};
  REQUIRE(backend->prepare(g, init).ok());
  TensorMap in{{"x", fromValues(f32({3}), {0.5, 0.5, 0.5}, false)}};
  for (int stepIdx = 1; stepIdx <= 2; ++stepIdx) {
    auto out = backend->step(in, stepIdx);
    REQUIRE(out.ok());
    REQUIRE(out->count("sum") == 1);
    CHECK(out->count("w") == 0);
    CHECK(out->at("sum").getAsDouble(0) == Approx(6 + 1.5 * stepIdx));
  }
  auto w3 = backend->readState("w");
  REQUIRE(w3.ok());
  CHECK(values(*w3) == std::vector<double>{2, 3, 4});
  CHECK(!backend->step({}, 3).ok());  // missing input: an error naming it
  CHECK(backend->step({}, 3).error().find("%x") != std::string::npos);
  CHECK(!createCpuBackend(CpuOptions{})->prepare(g, {}).ok());
}

TEST_CASE("cpu bench: matmul throughput", "[.bench]") {
  std::mt19937 rng(40);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{512, 64, 192}, {512, 64, 384}, {512, 384, 64}, {512, 64, 384},
                         {512, 256, 64}, {512, 512, 512}}) {
    OneOp o = oneOp(OpKind::Matmul, {f32({M, K}), f32({K, N})});
    auto e = CpuExecutor::create(*o.graph, CpuOptions{});
    REQUIRE(e.ok());
    HostTensor a = randomTensor(f32({M, K}), rng, false), b = randomTensor(f32({K, N}), rng, false);
    int iters = 0;
    auto t0 = std::chrono::steady_clock::now();
    double secs = 0;
    while (secs < 1.0) {
      REQUIRE((*e)->run({&a, &b}, {}, 0).ok());
      ++iters;
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    double gflops = 2.0 * M * N * K * iters / secs / 1e9;
    WARN("matmul M=" << M << " K=" << K << " N=" << N << ": " << gflops << " GFLOP/s (" << iters << " runs)");
  }
}
