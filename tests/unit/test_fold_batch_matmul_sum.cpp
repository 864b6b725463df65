// fold-batch-matmul-sum on whole GPT training steps: every batched weight gradient is folded into one
// matmul over the flattened rows, and the step computes the same thing (CPU backend, fp32 rounding apart),
// unsharded and on the rank programs of a data-parallel x tensor-parallel partition.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "models/gpt.h"
#include "passes/builtin_passes.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> gptStep(const std::string& pre, const std::string& post = "") {
  GptConfig gc;
  gc.layers = 2;
  gc.hidden = 32;
  gc.heads = 2;
  gc.vocab = 60;
  gc.paddedVocab = 256;
  gc.positions = 8;
  TrainConfig tc;
  tc.microBatch = 4;
  tc.globalBatch = 4;
  tc.seqLength = 8;
  auto m = buildGpt(gc, tc);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  PassManager pm;
  Status s = pm.addPipeline(pre + "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce" + post);
  REQUIRE(s.ok());
  s = pm.run(*g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (!g->mesh().empty()) REQUIRE(propagatePlacements(*g).ok());
  return g;
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
  TensorMap state;
  for (const Value* p : global.params()) state[p->name()] = initParam(*p, 7);
  Status st = backend->prepare(global, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  std::mt19937 rng(5);
  TensorMap out;
  for (int64_t s = 0; s < 2; ++s) {
    TensorMap in;
    HostTensor tokens(TensorType(DType::i32, {4, 8})), targets(TensorType(DType::i32, {4, 8}));
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 60);
    for (int64_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 60);
    in["tokens"] = tokens;
    in["targets"] = targets;
    in["lr"] = HostTensor::scalarF32(1e-2f);
    in["step"] = HostTensor::scalarF32(static_cast<float>(s + 1));
    auto r = backend->step(in, s);
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
      worst = std::max(worst, std::abs(g.getAsDouble(i) - w.getAsDouble(i)));
      scale = std::max(scale, std::abs(w.getAsDouble(i)));
    }
    CHECK(worst <= 1e-5 * std::max(scale, 1.0));
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
  // The QKV weight under tp is [3, D, D/tp] broadcast against [B, 1, T, D]: left as it was; the others fold.
  CHECK(foldedPerRank == 2 * 3 + 1);
  // A global graph after propagation is not touched (its values carry placements).
  auto global = g->clone();
  auto r = createFoldBatchMatmulSumPass()->run(*global);
  REQUIRE(r.ok());
  CHECK(!*r);
  checkClose(twoSteps(std::move(plain), *g), twoSteps(std::move(folded), *g));
}

}  // namespace tpc
