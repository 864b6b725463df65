// mixed-precision(dtype=bf16): what it casts (compute in bf16, f32 masters, f32 loss) and what it does to
// training on the CPU backend (which rounds every bf16 value through bf16), alone and under tp 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> trainingStep(const std::string& pre, int64_t tp = 1) {
  GptConfig gc;
  gc.layers = 2;
  gc.hidden = 64;
  gc.heads = 4;
  gc.vocab = 100;
  gc.paddedVocab = 256;
  gc.positions = 16;
  TrainConfig tc;
  tc.microBatch = 4;
  tc.globalBatch = 4;
  tc.seqLength = 16;
  auto m = buildGpt(gc, tc);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  std::string passes = (tp > 1 ? "megatron-tp(tp=" + std::to_string(tp) + ")," : std::string()) + pre +
                       "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce";
  PassManager pm;
  Status s = pm.addPipeline(passes);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  s = pm.run(*g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (tp > 1) REQUIRE(propagatePlacements(*g).ok());
  return g;
}

std::vector<double> trainLosses(const Graph& g, int64_t steps) {
  CpuOptions o;
  o.threads = 2;
  std::unique_ptr<Backend> backend;
  if (g.mesh().empty()) {
    backend = createCpuBackend(o);
  } else {
    std::vector<std::unique_ptr<Graph>> ranks;
    for (int64_t r = 0; r < g.mesh().numRanks(); ++r) {
      auto l = partitionForRank(g, r);
      REQUIRE(l.ok());
      ranks.push_back(std::move(*l));
    }
    backend = createCpuMeshBackend(std::move(ranks), o);
  }
  TensorMap state;
  for (const Value* p : g.params()) state[p->name()] = initParam(*p, 1);
  Status st = backend->prepare(g, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  std::mt19937 rng(3);
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    TensorMap in;
    HostTensor tokens(TensorType(DType::i32, {4, 16}));
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 20);
    HostTensor targets = tokens.clone();  // learnable: predict the same token
    in["tokens"] = tokens;
    in["targets"] = targets;
    in["lr"] = HostTensor::scalarF32(3e-3f);
    in["step"] = HostTensor::scalarF32(static_cast<float>(s + 1));
    auto out = backend->step(in, s);
    INFO((out.ok() ? std::string() : out.error()));
    REQUIRE(out.ok());
    losses.push_back(out->at("loss").data<float>()[0]);
  }
  return losses;
}

}  // namespace

TEST_CASE("mixed-precision: matmuls and attention in bf16, f32 masters, AdamW state and loss", "[precision]") {
  auto g = trainingStep("mixed-precision(dtype=bf16),");
  int matmuls = 0, attentions = 0, casts = 0;
  for (Node* n : g->nodes()) {
    if (n->op() == OpKind::Matmul) {
      ++matmuls;
      CHECK(n->operand(0)->dtype() == DType::bf16);
      CHECK(n->operand(1)->dtype() == DType::bf16);
    }
    if (n->op() == OpKind::Attention) {
      ++attentions;
      for (Value* v : n->operands()) CHECK(v->dtype() == DType::bf16);
      CHECK(n->result(1)->dtype() == DType::f32);  // lse
    }
    if (n->op() == OpKind::AdamWUpdate)
      for (Value* v : n->operands()) CHECK(v->dtype() == DType::f32);  // param, grad, m, v, lr, step
    if (n->op() == OpKind::LayerNorm) {
      CHECK(n->operand(0)->dtype() == DType::bf16);
      CHECK(n->operand(1)->dtype() == DType::f32);
    }
    if (n->op() == OpKind::Cast) ++casts;
  }
  CHECK(matmuls > 0);
  CHECK(attentions == 2);
  CHECK(casts > 0);
  for (const Value* p : g->params()) CHECK(p->dtype() == DType::f32);
  for (const auto& o : g->outputs()) CHECK(o.value->dtype() == DType::f32);  // loss, grad_norm, updated params
}

TEST_CASE("mixed-precision: bf16 training on the CPU follows fp32 within bf16 noise", "[precision]") {
  auto f32 = trainLosses(*trainingStep(""), 8);
  auto bf16 = trainLosses(*trainingStep("mixed-precision(dtype=bf16),"), 8);
  double worst = 0, any = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    worst = std::max(worst, std::abs(bf16[i] - f32[i]) / f32[i]);
    any = std::max(any, std::abs(bf16[i] - f32[i]));
  }
  WARN("bf16 vs fp32 losses over 8 steps: worst relative difference " << worst << "; fp32 " << f32.front() << " -> "
                                                                      << f32.back() << ", bf16 " << bf16.front()
                                                                      << " -> " << bf16.back());
  CHECK(worst <= 2e-2);
  CHECK(any > 0);                         // bf16 rounding really happened
  CHECK(bf16.back() < 0.8 * bf16.front());  // and it still learns
}

TEST_CASE("mixed-precision: bf16 under tp 2 matches bf16 on one rank", "[precision][sharding]") {
  auto one = trainLosses(*trainingStep("mixed-precision(dtype=bf16),"), 4);
  auto two = trainLosses(*trainingStep("mixed-precision(dtype=bf16),", 2), 4);
  for (size_t i = 0; i < one.size(); ++i) CHECK(std::abs(two[i] - one[i]) / one[i] <= 1e-2);
}

TEST_CASE("mixed-precision: a bad dtype option is refused", "[precision]") {
  PassManager pm;
  Status s = pm.addPipeline("mixed-precision(dtype=fp8)");
  REQUIRE(!s.ok());
  CHECK(s.error().find("dtype=fp8 must be bf16 or f16") != std::string::npos);
}

}  // namespace tpc
