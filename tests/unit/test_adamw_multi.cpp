// Multi-tensor AdamW without a GPU (runtime/cuda/adamw_groups.h): a GPT step's updates form one group gated
// by its loss and grad_norm, every parameter update is written in place by it (so the backend keeps no copy
// of the state), the kernel compiles with NVRTC, and under the CPU emulator it gives the per-tensor kernels'
// bits and leaves the state alone on a gated step (adamw_group_cases.h; the GPU runs the same checks).
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <map>

#include "adamw_group_cases.h"
#include "cuda_emulator.h"
#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;

namespace {

std::unique_ptr<Graph> gptStep(int64_t tp) {
  GptConfig g;
  g.layers = 2;
  g.hidden = 32;
  g.heads = 2;
  g.vocab = 64;
  g.paddedVocab = 128;
  g.positions = 8;
  TrainConfig c;
  c.microBatch = 2;
  c.globalBatch = 2;
  c.seqLength = 8;
  auto m = buildGpt(g, c);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> step = std::move(m->forward);
  PassManager pm;
  REQUIRE(pm.addPipeline((tp > 1 ? "megatron-tp(tp=" + std::to_string(tp) + ")," : std::string()) +
                         "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce,fuse").ok());
  Status s = pm.run(*step);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (tp > 1) REQUIRE(propagatePlacements(*step).ok());
  return step;
}

// Host memory as the device; kernels compiled by the host compiler (cuda_emulator.h), once per source.
struct EmulatedDevice final : adamw::Device {
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  std::vector<std::unique_ptr<char[]>> blocks;
  long long step = 3;
  char* alloc(size_t bytes) override {
    blocks.emplace_back(new (std::align_val_t(16)) char[bytes]);
    return blocks.back().get();
  }
  void upload(char* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const char* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void launch(const cuda::KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, int hold) override {
    auto it = built.find(k.source);
    if (it == built.end()) {
      auto fn = compileEmulated(k.source, k.entry, dir.path.string(), static_cast<int>(built.size()));
      if (!fn.ok()) FAIL(fn.error());
      it = built.emplace(k.source, *fn).first;
    }
    int holdWord = hold;
    kernels::ArgPack pack(k, ops, res, nullptr, 0, &step, &holdWord);
    it->second(pack.args.data(), k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
  }
};

}  // namespace

TEST_CASE("adamw groups: a GPT step's updates are one gated group that writes every parameter in place", "[cuda][adamw]") {
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    auto step = gptStep(tp);
    std::unique_ptr<Graph> g = tp > 1 ? std::move(partitionForRank(*step, 1)).value() : step->clone();
    REQUIRE(cuda::rewriteForCuda(*g).ok());
    auto fused = fusionGroups(*g);
    REQUIRE(fused.ok());
    std::vector<FusionGroup> groups = std::move(fused).value();
    llvm::DenseMap<const Node*, const FusionGroup*> groupOf;
    for (const FusionGroup& fg : groups)
      for (const Node* m : fg.members) groupOf[m] = &fg;
    std::vector<FusionGroup> adamw = cuda::adamwGroups(*g, &groupOf);
    REQUIRE(adamw.size() == 1);
    int updates = 0;
    for (const Node* n : g->nodes()) updates += n->op() == OpKind::AdamWUpdate;
    CHECK(static_cast<int>(adamw[0].members.size()) == updates);
    CHECK(updates == 2 * 12 + 4);  // 12 tensors a layer, the embeddings, the final layer norm
    REQUIRE(cuda::adamwGroupGates(adamw[0]) == 2);
    const size_t T = adamw[0].members.size();
    std::map<std::string, const Value*> outputs;
    for (size_t i = 0; i < g->outputs().size(); ++i) outputs[g->outputName(i)] = g->outputs()[i].value;
    CHECK(adamw[0].inputs[4 * T + 2] == outputs.at("loss"));
    CHECK(adamw[0].inputs[4 * T + 3] == outputs.at("grad_norm"));
    groups.push_back(adamw[0]);
    groupOf.clear();
    for (const FusionGroup& fg : groups)
      for (const Node* m : fg.members) groupOf[m] = &fg;
    // Every output that replaces a parameter is written into it by the group: nothing for the backend to keep.
    cuda::StepMemoryPlan plan = cuda::planStepMemory(*g, {}, &groupOf);
    CHECK(plan.paramCopies.empty());
    CHECK(static_cast<int>(plan.inPlace.size()) == 3 * updates);
    for (const auto& [v, name] : plan.inPlace) CHECK(groupOf.lookup(v->def()) == &groups.back());
  }
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
