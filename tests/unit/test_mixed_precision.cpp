// mixed-precision(dtype=bf16): what it casts (compute in bf16, f32 masters, f32 loss) and what it does to
// training on the CPU backend (which rounds every bf16 value through bf16), alone and under tp 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "gpt_step_support.h"
#include "worst_error.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> trainingStep(const std::string& pre, int64_t tp = 1) {
  return test::gptStep(test::smallGpt(), 4, test::megatronTp(tp) + pre + test::kTrainPasses);
}

// Learnable batches (the targets are the tokens).
std::vector<double> trainLosses(const Graph& g, int64_t steps) {
  CpuOptions o;
  o.threads = 2;
  auto backend = test::preparedCpuBackend(g, o, 1);
  std::mt19937 rng(3);
  test::TrainBatches batches;
  batches.vocab = 20;
  batches.echo = true;
  batches.lr = 3e-3f;
  batches.firstStepIndex = 0;
  return test::trainLosses(*backend, rng, steps, batches);
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
  double worst = test::worstRelError(bf16, f32), any = test::worstAbsError(bf16, f32);
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
  Status s = pm.addPipeline("mixed-precision(dtype=fp8)", "");
  REQUIRE(!s.ok());
  CHECK(s.error().find("dtype=fp8 must be bf16 or f16") != std::string::npos);
}

}  // namespace tpc
