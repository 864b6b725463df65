// Multi-tensor AdamW without a GPU (runtime/cuda/adamw_groups.h): a GPT step's updates form one group gated
// by its loss and grad_norm, every parameter update is written in place by it (so the backend keeps no copy
// of the state), the kernel compiles with NVRTC, and under the CPU emulator it gives the per-tensor kernels'
// bits and leaves the state alone on a gated step (adamw_group_cases.h; the GPU runs the same checks).
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <map>

#include "llvm/ADT/DenseSet.h"

#include "adamw_group_cases.h"
#include "emulated_device.h"
#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "gpt_step_support.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;

namespace {

// One rank's program of a 2-layer GPT step (rank 1 when sharded), fused as the real pipeline does it.
std::unique_ptr<Graph> rankStep(int64_t tp, bool bf16) {
  auto step = gptStep(smallGpt(), 2, megatronTp(tp) + (bf16 ? "mixed-precision(dtype=bf16)," : "") + kTrainPasses);
  std::unique_ptr<Graph> g = tp > 1 ? std::move(rankGraphs(*step)[1]) : std::move(step);
  auto fused = createFusePass()->run(*g);
  REQUIRE(fused.ok());
  return g;
}

// Each member's group (and, with `absorbed`, each absorbed node's), as the backend maps them.
llvm::DenseMap<const Node*, const FusionGroup*> groupMap(const std::vector<FusionGroup>& groups, bool absorbed) {
  llvm::DenseMap<const Node*, const FusionGroup*> groupOf;
  for (const FusionGroup& fg : groups) {
    for (const Node* m : fg.members) groupOf[m] = &fg;
    if (absorbed)
      for (const Node* m : fg.absorbed) groupOf[m] = &fg;
  }
  return groupOf;
}

// The fusion groups of a step rewritten for the CUDA backend.
std::vector<FusionGroup> cudaFusionGroups(Graph& g) {
  REQUIRE(cuda::rewriteForCuda(g).ok());
  auto fused = fusionGroups(g);
  INFO((fused.ok() ? std::string() : fused.error()));
  REQUIRE(fused.ok());
  return std::move(fused).value();
}

}  // namespace

TEST_CASE("adamw groups: a GPT step's updates are one gated group that writes every parameter in place", "[cuda][adamw]") {
  for (auto [tp, bf16] : {std::pair<int64_t, bool>{1, false}, {2, false}, {1, true}, {2, true}}) {
    INFO("tp " << tp << (bf16 ? ", bf16" : ", f32"));
    std::unique_ptr<Graph> g = rankStep(tp, bf16);
    std::vector<FusionGroup> groups = cudaFusionGroups(*g);
    auto groupOf = groupMap(groups, false);
    std::vector<FusionGroup> adamw = cuda::adamwGroups(*g, &groupOf);
    // Under bf16 the gradients the kernels read are bf16 (the casts absorbed) or f32 (where the backward
    // wrote f32, e.g. the embedding gradients on one rank): a group for each dtype there is.
    REQUIRE(!adamw.empty());
    REQUIRE(adamw.size() <= (bf16 ? 2u : 1u));
    if (adamw.size() == 2) CHECK(adamw[0].inputs[1]->dtype() != adamw[1].inputs[1]->dtype());
    int updates = 0, members = 0, muls = 0, casts = 0, bf16Grads = 0;
    for (const Node* n : g->nodes()) updates += n->op() == OpKind::AdamWUpdate;
    CHECK(updates == 2 * 12 + 4);  // 12 tensors a layer, the embeddings, the final layer norm
    std::map<std::string, const Value*> outputs;
    for (size_t i = 0; i < g->outputs().size(); ++i) outputs[g->outputName(i)] = g->outputs()[i].value;
    for (const FusionGroup& a : adamw) {
      const size_t T = a.members.size();
      members += static_cast<int>(T);
      REQUIRE(cuda::adamwGroupGates(a) == 2);
      // The clip multiplies (and under bf16 the f32 casts of the bf16 gradients) run inside the group.
      REQUIRE(cuda::adamwGroupScales(a));
      CHECK(a.inputs[4 * T + 2]->def()->op() == OpKind::ClipScale);
      CHECK(a.inputs[4 * T + 3] == outputs.at("loss"));
      CHECK(a.inputs[4 * T + 4] == outputs.at("grad_norm"));
      for (const Node* n : a.absorbed) {
        muls += n->op() == OpKind::Mul;
        casts += n->op() == OpKind::Cast;
      }
      for (size_t k = 0; k < T; ++k) bf16Grads += a.inputs[4 * k + 1]->dtype() == DType::bf16;
    }
    CHECK(members == updates);
    CHECK(muls == updates);
    CHECK(casts == bf16Grads);
    if (!bf16) CHECK(bf16Grads == 0);
    // The rank's own bf16 gradients reach the group as bf16 (their casts absorbed), one rank or tp 2 (where
    // the gradients all-reduced in f32, the replicated ones', stay f32).
    if (bf16) CHECK(bf16Grads > updates / 2);
    // global-norm-skip-casts: the norm (under tp each rank's sum_squares) reads the bf16 gradients themselves.
    int norms = 0;
    for (const Node* n : g->nodes())
      if (n->op() == OpKind::GlobalNorm || n->op() == OpKind::SumSquares) {
        ++norms;
        for (const Value* v : n->operands()) CHECK((v->def() == nullptr || v->def()->op() != OpKind::Cast));
      }
    CHECK(norms >= 1);
    for (FusionGroup& a : adamw) groups.push_back(a);
    groupOf = groupMap(groups, true);
    // Every output that replaces a parameter is written into it by the group: nothing for the backend to keep.
    cuda::StepMemoryPlan plan = cuda::planStepMemory(*g, {}, &groupOf);
    CHECK(plan.paramCopies.empty());
    CHECK(static_cast<int>(plan.inPlace.size()) == 3 * updates);
    for (const auto& [v, name] : plan.inPlace) CHECK(cuda::isAdamWGroup(*groupOf.lookup(v->def())));
    // Nothing a group absorbed is stored.
    for (const FusionGroup& fg : groups)
      for (const Node* a : fg.absorbed) CHECK(!plan.bufferOf.count(a->result()));
  }
}

TEST_CASE("adamw groups: under bf16 the groups keep the parameters' bf16 copies, which get no arena buffer", "[cuda][adamw]") {
  std::unique_ptr<Graph> g = rankStep(1, true);
  std::vector<FusionGroup> groups = cudaFusionGroups(*g);
  auto groupOf = groupMap(groups, false);
  CHECK(cuda::adamwGroups(*g, &groupOf, false).size() == cuda::adamwGroups(*g, &groupOf).size());
  std::vector<FusionGroup> adamw = cuda::adamwGroups(*g, &groupOf, true);
  REQUIRE(!adamw.empty());
  // Each f32 parameter the step casts to bf16 (outside fusion groups) has its copy kept by its update's group.
  int castParams = 0;
  for (const Node* n : g->nodes())
    castParams += n->op() == OpKind::Cast && n->operand(0)->isParam() && n->result()->dtype() == DType::bf16 &&
                  fusionGroupOf(*n) < 0;
  REQUIRE(castParams > 0);
  llvm::DenseSet<const Value*> copies;
  for (const FusionGroup& a : adamw) {
    if (!cuda::adamwGroupKeepsCopies(a)) continue;
    for (size_t j = 0; j < a.members.size(); ++j) {
      const Value* c = a.outputs[4 * j + 3];
      REQUIRE(c->def());
      CHECK(c->def()->op() == OpKind::Cast);
      CHECK(c->dtype() == DType::bf16);
      CHECK(c->def()->operand(0) == a.members[j]->operand(0));  // the cast of this member's parameter
      CHECK(a.outputs[4 * j] == a.members[j]->result(0));
      copies.insert(c);
    }
  }
  CHECK(static_cast<int>(copies.size()) == castParams);
  for (FusionGroup& a : adamw) groups.push_back(a);
  groupOf = groupMap(groups, true);
  cuda::StepMemoryPlan arena = cuda::planStepMemory(*g, {}, &groupOf);
  cuda::StepMemoryPlan kept =
      cuda::planStepMemory(*g, {}, &groupOf, 256, {}, [&copies](const Value* v) { return copies.count(v) > 0; });
  int64_t copyBytes = 0;
  for (const Value* c : copies) {
    CHECK(arena.bufferOf.count(c));
    CHECK_FALSE(kept.bufferOf.count(c));
    copyBytes += c->type().bytes();
  }
  // The copies are live through the forward and backward, so the arena shrinks by about their size.
  CHECK(kept.arenaBytes < arena.arenaBytes);
  CHECK(arena.arenaBytes - kept.arenaBytes <= copyBytes + 256 * static_cast<int64_t>(copies.size()));
}

TEST_CASE("adamw groups: an update whose result a node reads, or gates computed after it, stays on its own", "[cuda][adamw]") {
  std::mt19937 rng(1);
  adamw::GroupCase c = adamw::makeGroupCase(DType::f32, {10, 20, 30}, rng);
  Graph& g = *c.graph;
  // A node reads node 1's p': node 1 is left out.
  REQUIRE(g.create(OpKind::Neg, {c.nodes[1]->result(0)}).ok());
  std::vector<FusionGroup> groups = cuda::adamwGroups(g);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].members == std::vector<Node*>{c.nodes[0], c.nodes[2]});
  // A loss computed after the updates cannot gate them: no group.
  auto late = g.create(OpKind::Neg, {c.nodes[2]->operand(0)});
  REQUIRE(late.ok());
  g.setOutput(0, (*late)->result());
  CHECK(cuda::adamwGroups(g).empty());
}

TEST_CASE("adamw groups: the multi-tensor kernel compiles with NVRTC for sm_90", "[cuda][adamw]") {
  TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  for (DType pdt : {DType::f32, DType::bf16}) {
    std::mt19937 rng(3);
    adamw::GroupCase c = adamw::makeGroupCase(pdt, {1, 4097, 33}, rng);
    auto low = cuda::lowerAdamWGroup(c.group, kernels::sm90());
    REQUIRE(low.ok());
    const cuda::KernelSpec& k = low->kernels.at(0);
    CHECK(k.grid.x == 1 + 2 + 1);  // a block per chunk of 4096 elements of each tensor
    CHECK(k.block.x == 256);
    auto cubin = nvrtc.compile(k.source, k.entry);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    CHECK(cubin.ok());
  }
}

TEST_CASE("adamw groups: under the CPU emulator, the per-tensor kernels' bits, and a gated step changes nothing",
          "[cuda][adamw]") {
  EmulatedDevice d;
  // Tiny, odd, a whole chunk and one more, three chunks (each size is a host compile of the per-tensor kernel).
  CHECK(adamw::checkAdamWGroups(d, {1, 3, 4096, 4097, 9001}, 2, 3000) > 0);
}

#endif  // TPC_HAVE_CUDA
