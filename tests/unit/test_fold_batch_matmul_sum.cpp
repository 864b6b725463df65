// fold-batch-matmul-sum on whole GPT training steps: every batched weight gradient is folded into one
// matmul over the flattened rows, and the step computes the same thing (CPU backend, fp32 rounding apart),
// unsharded and on the rank programs of a data-parallel x tensor-parallel partition.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "gpt_step_support.h"
#include "worst_error.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> gptStep(const std::string& pre, const std::string& post = "") {
  GptConfig gc = test::smallGpt();
  gc.hidden = 32;
  gc.heads = 2;
  gc.vocab = 60;
  gc.positions = 8;
  return test::gptStep(gc, 4, pre + test::kTrainPasses + post);
}

// reduce_sum nodes that read a matmul's result.
int summedMatmuls(const Graph& g) {
  int n = 0;
  for (const Node* node : g.nodes())
    if (node->op() == OpKind::ReduceSum && node->operand(0)->def() && node->operand(0)->def()->op() == OpKind::Matmul) ++n;
  return n;
}

int fold(Graph& g) {
  int before = summedMatmuls(g);
  auto r = createFoldBatchMatmulSumPass()->run(g);
  REQUIRE(r.ok());
  CHECK(*r == (before != summedMatmuls(g)));
  auto d = createDCEPass()->run(g);
  REQUIRE(d.ok());
  return before - summedMatmuls(g);
}

// Two steps on the CPU; the loss, grad norm and every updated parameter after them.
TensorMap twoSteps(std::vector<std::unique_ptr<Graph>> ranks, const Graph& global) {
  CpuOptions o;
  o.threads = 2;
  std::unique_ptr<Backend> backend = ranks.empty() ? createCpuBackend(o) : createCpuMeshBackend(std::move(ranks), o);
  test::prepareInitialState(*backend, global, 7);
  std::mt19937 rng(5);
  TensorMap out;
  for (int64_t s = 0; s < 2; ++s) {
    auto r = backend->step(test::gptBatch(rng, {4, 8}, 60, 1e-2f, s + 1), s);
    INFO((r.ok() ? std::string() : r.error()));
    REQUIRE(r.ok());
    out = *r;
  }
  for (const Value* p : global.params()) {
    auto t = backend->readState(p->name());
    REQUIRE(t.ok());
    out[p->name()] = *t;
  }
  return out;
}

void checkClose(const TensorMap& want, const TensorMap& got) {
  REQUIRE(want.size() == got.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    const HostTensor& g = got.at(name);
    REQUIRE(g.numel() == w.numel());
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      worst = test::worseOf(worst, test::absError(g.getAsDouble(i), w.getAsDouble(i)));
      scale = std::max(scale, std::abs(w.getAsDouble(i)));
    }
    // 1e-4: a summation order AdamW amplifies where a gradient is near zero (the key bias's third is pure
    // rounding noise) moves a weight by a few 1e-5; a wrong fold moves many by one update (lr 1e-2).
    CHECK(worst <= 1e-4 * std::max(scale, 1.0));
  }
}

}  // namespace

TEST_CASE("fold-batch-matmul-sum: every weight gradient of a GPT step is one matmul, same results", "[passes][fold]") {
  auto g = gptStep("");
  auto folded = g->clone();
  // Per layer c_attn, attn c_proj, c_fc, mlp c_proj; and the tied LM head's wte.
  CHECK(fold(*folded) == 2 * 4 + 1);
  CHECK(summedMatmuls(*folded) == 0);
  for (const Node* n : folded->nodes())
    if (n->op() == OpKind::Matmul && n->getBool("transpose_a")) CHECK(n->result()->type().rank() == 2);
  checkClose(twoSteps({}, *g), twoSteps({}, *folded));
}

TEST_CASE("fold-batch-matmul-sum: on the rank programs of dp 2 x tp 2 the folded step matches", "[passes][fold][sharding]") {
  auto g = gptStep("megatron-tp(tp=2),", ",data-parallel(dp=2)");
  std::vector<std::unique_ptr<Graph>> plain, folded;
  int foldedPerRank = -1;
  for (int64_t r = 0; r < g->mesh().numRanks(); ++r) {
    auto l = partitionForRank(*g, r);
    REQUIRE(l.ok());
    plain.push_back((*l)->clone());
    int n = fold(**l);
    if (foldedPerRank < 0) foldedPerRank = n;
    CHECK(n == foldedPerRank);
    folded.push_back(std::move(*l));
  }
  // Every weight gradient, the QKV one too: partition reads the rank's [D, 3, D/tp] QKV block as one packed
  // matrix (foldStackedQkv), so its gradient is a plain [B, T, D]^T x [B, T, 3D/tp] as on one rank.
  CHECK(foldedPerRank == 2 * 4 + 1);
  // A global graph after propagation is not touched (its values carry placements).
  auto global = g->clone();
  auto r = createFoldBatchMatmulSumPass()->run(*global);
  REQUIRE(r.ok());
  CHECK(!*r);
  checkClose(twoSteps(std::move(plain), *g), twoSteps(std::move(folded), *g));
}

}  // namespace tpc
