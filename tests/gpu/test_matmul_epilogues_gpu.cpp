// cuBLASLt epilogues (fold-matmul-epilogues, CudaOptions::matmulEpilogues) on the GPU: each epilogue against
// the unfused ops it replaces on random inputs (fp32 within 1e-5, bf16 within 1e-2 of the largest value), with
// fewer launches (cuBLASLt took the epilogue); and a 2-layer GPT trained with and without them (with its
// attentions packed by pack-qkv-attention in both), unsharded and on megatron-tp 2 virtual ranks.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "fusion_test_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

struct Outcome {
  TensorMap out;
  int64_t launches = 0;
};

Outcome runOnce(const Graph& g, const TensorMap& inputs, bool epilogues) {
  CudaOptions o;
  o.verbose = false;
  o.matmulEpilogues = epilogues;
  o.matmulEpilogueKinds = "all";  // dgelu_bgrad too (the backend's default folds every other kind)
  auto backend = createCudaBackend({}, o);
  TensorMap state;
  for (const Value* p : g.params()) state[p->name()] = initParam(*p, 1);
  Status st = backend->prepare(g, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  auto r = backend->step(inputs, 1);
  INFO((r.ok() ? std::string() : r.error()));
  REQUIRE(r.ok());
  return {*r, backend->launchesPerStep()};
}

// The unfused ops of one epilogue, in dtype t.
std::unique_ptr<Graph> unfused(const std::string& e, DType t) {
  auto g = std::make_unique<Graph>(e);
  auto T = [&](Shape s) { return TensorType(t, std::move(s)); };
  auto op = [&](OpKind k, std::vector<Value*> ops, AttrDict a = {}) {
    auto n = g->create(k, ops, std::move(a));
    REQUIRE(n.ok());
    return (*n)->result();
  };
  AttrDict tb, ta, rows, all;
  tb.set("transpose_b", true);
  ta.set("transpose_a", true);
  rows.set("axes", std::vector<int64_t>{0, 1});
  all.set("axes", std::vector<int64_t>{0});
  if (e == "bias" || e == "bias+residual" || e == "gelu_bias") {
    Value* x = g->addInput("x", T({4, 32, 64}));
    Value* w = g->addInput("w", T({64, 96}));
    Value* bias = g->addInput("bias", T({96}));
    Value* p = op(OpKind::Add, {op(OpKind::Matmul, {x, w}), bias});
    if (e == "bias") g->addOutput(p, "y");
    if (e == "bias+residual") g->addOutput(op(OpKind::Add, {g->addInput("res", T({4, 32, 96})), p}), "y");
    if (e == "gelu_bias") {
      g->addOutput(op(OpKind::Gelu, {p}), "y");
      g->addOutput(p, "pre");
    }
  } else if (e == "dgelu" || e == "dgelu_bgrad") {
    Value* dy = g->addInput("dy", T({4, 32, 64}));
    Value* w = g->addInput("w", T({96, 64}));
    Value* pre = g->addInput("pre", T({4, 32, 96}));
    Value* d = op(OpKind::GeluGrad, {op(OpKind::Matmul, {dy, w}, tb), pre});
    g->addOutput(d, "dx");
    if (e == "dgelu_bgrad") g->addOutput(op(OpKind::ReduceSum, {d}, rows), "db");
  } else {  // bgrad_b: a weight gradient and the bias gradient of the same rows
    Value* x = g->addInput("x", T({128, 64}));
    Value* d = g->addInput("d", T({128, 96}));
    g->addOutput(op(OpKind::Matmul, {x, d}, ta), "dw");
    g->addOutput(op(OpKind::ReduceSum, {d}, all), "db");
  }
  return g;
}

}  // namespace

TEST_CASE("cuda epilogues: each cuBLASLt epilogue matches the unfused ops (fp32 1e-5, bf16 1e-2)", "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  for (DType t : {DType::f32, DType::bf16})
    for (const char* e : {"bias", "bias+residual", "gelu_bias", "dgelu", "dgelu_bgrad", "bgrad_b"}) {
      INFO(e << " " << dtypeName(t));
      auto g = unfused(e, t);
      std::mt19937 rng(11);
      TensorMap in;
      for (const Value* v : g->inputs()) {
        HostTensor x(TensorType(DType::f32, v->shape()));
        double span = v->name() == "pre" ? 3 : 1;
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(std::uniform_real_distribution<double>(-span, span)(rng));
        in[v->name()] = x;
      }
      Outcome plain = runOnce(*g, in, false), fused = runOnce(*g, in, true);
      WARN(e << " " << dtypeName(t) << ": launches " << plain.launches << " unfused, " << fused.launches << " with the epilogue");
      CHECK(fused.launches < plain.launches);  // cuBLASLt took the epilogue
      for (auto& [name, want] : plain.out) {
        INFO(name);
        const HostTensor& got = fused.out.at(name);
        REQUIRE(got.numel() == want.numel());
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < want.numel(); ++i) {
          scale = std::max(scale, std::abs(want.getAsDouble(i)));
          double d = std::abs(got.getAsDouble(i) - want.getAsDouble(i));
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        WARN(e << " " << dtypeName(t) << " " << name << ": worst difference " << worst << " of " << scale);
        CHECK(worst <= (t == DType::f32 ? 1e-5 : 1e-2) * std::max(scale, 1.0));
      }
    }
}

TEST_CASE("cuda epilogues: a 2-layer GPT trains 10 steps to the same losses with and without them", "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  for (bool bf16 : {false, true}) {
    auto g = test::fusionGptStep(bf16, true, true);
    std::vector<double> losses[2];
    int64_t launches[2] = {0, 0};
    for (int with : {0, 1}) {
      CudaOptions o;
      o.seed = 99;
      o.verbose = false;
      o.matmulEpilogues = with == 1;
      o.matmulEpilogueKinds = "all";
      auto backend = createCudaBackend({}, o);
      test::prepareInitialState(*backend, *g, 1);
      std::mt19937 rng(7);
      losses[with] = test::trainLosses(*backend, rng, 10);
      launches[with] = backend->launchesPerStep();
    }
    double worst = 0;
    for (size_t i = 0; i < losses[0].size(); ++i)
      worst = std::max(worst, std::abs(losses[1][i] - losses[0][i]) / std::abs(losses[0][i]));
    WARN((bf16 ? "bf16" : "fp32") << ": losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step "
                                  << launches[0] << " without epilogues, " << launches[1] << " with; worst relative loss difference "
                                  << worst);
    CHECK(worst <= (bf16 ? 1e-2 : 1e-5));
    CHECK(launches[1] < launches[0]);
  }
}

// The rank programs fold other epilogues than the unsharded step (test_rewrite_for_cuda.cpp): rank 0's
// projections take the residual as C, rank 1's do not; the QKV projection stays unfused.
TEST_CASE("cuda epilogues: megatron-tp 2 on virtual ranks trains 5 steps to the same losses with and without them",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  GptConfig gc = test::smallGpt();
  gc.heads = 8;
  gc.paddedVocab = 128;
  gc.attentionDropout = 0.1;
  auto step = test::gptStep(gc, 4, test::megatronTp(2) + test::kTrainPasses);
  std::vector<double> losses[2];
  int64_t launches[2] = {0, 0};
  for (int with : {0, 1}) {
    std::vector<std::unique_ptr<Graph>> ranks = test::rankGraphs(*step);
    REQUIRE(ranks.size() == 2);
    for (auto& r : ranks) REQUIRE(createFusePass()->run(*r).ok());  // as tpc run: fuse each rank's program
    CudaOptions o;
    o.seed = 99;
    o.verbose = false;
    o.matmulEpilogues = with == 1;
    o.matmulEpilogueKinds = "all";
    auto backend = createCudaBackend(std::move(ranks), o);
    test::prepareInitialState(*backend, *step, 1);
    std::mt19937 rng(7);
    losses[with] = test::trainLosses(*backend, rng, 5);
    launches[with] = backend->launchesPerStep();
  }
  double worst = 0;
  for (size_t i = 0; i < losses[0].size(); ++i)
    worst = std::max(worst, std::abs(losses[1][i] - losses[0][i]) / std::abs(losses[0][i]));
  WARN("tp 2: losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step " << launches[0]
                       << " without epilogues, " << launches[1] << " with; worst relative loss difference " << worst);
  CHECK(worst <= 1e-5);
  CHECK(launches[1] < launches[0]);
}

}  // namespace tpc
