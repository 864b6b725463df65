// Multi-tensor casts without a GPU (runtime/cuda/cast_groups.h): a bf16 GPT step's parameter casts form one
// group run at the first of them, which the memory plan starts every cast result's life at; gpt2's launches
// per step drop by all but one of its 98 casts, its planned arena stays the same; which casts a group takes;
// the kernel compiles with NVRTC, and under the CPU emulator gives the per-node cast kernels' bits and the
// CPU backend's cast (cast_group_cases.h; the GPU runs the same checks).
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <deque>

#include "cast_group_cases.h"
#include "emulated_device.h"
#include "gpt_step_support.h"
#include "runtime/cuda/adamw_groups.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;

namespace {

// The groups of `g` as CudaBackend::prepare forms them (fusion, AdamW, then cast groups when `casts`).
struct Groups {
  std::deque<FusionGroup> all;  // stable addresses
  llvm::DenseMap<const Node*, const FusionGroup*> of;
  void index() {
    of.clear();
    for (const FusionGroup& fg : all) {
      for (const Node* m : fg.members) of[m] = &fg;
      for (const Node* m : fg.absorbed) of[m] = &fg;
    }
  }
};
Groups backendGroups(const Graph& g, bool casts) {
  Groups gs;
  auto fused = fusionGroups(g);
  INFO((fused.ok() ? std::string() : fused.error()));
  REQUIRE(fused.ok());
  for (FusionGroup& fg : *fused) gs.all.push_back(std::move(fg));
  gs.index();
  for (FusionGroup& fg : cuda::adamwGroups(g, &gs.of)) gs.all.push_back(std::move(fg));
  gs.index();
  if (casts)
    for (FusionGroup& fg : cuda::castGroups(g, &gs.of)) gs.all.push_back(std::move(fg));
  gs.index();
  return gs;
}

// Kernel launches and cuBLASLt calls per step from the lowerings (a group's one kernel at its last member).
int64_t launches(const Graph& g, const Groups& gs) {
  int64_t count = 0;
  for (const Node* n : g.nodes()) {
    if (const FusionGroup* fg = gs.of.lookup(n)) {
      count += fg->members.back() == n;
      continue;
    }
    cuda::NodeExec how = cuda::nodeExec(*n);
    if (how == cuda::NodeExec::Matmul) ++count;
    if (how != cuda::NodeExec::Kernels) continue;
    auto l = cuda::lowerNode(*n, kernels::sm90());
    INFO(n->opName() << ": " << (l.ok() ? std::string() : l.error()));
    REQUIRE(l.ok());
    count += static_cast<int64_t>(l->kernels.size()) + (l->zeroWorkspace && l->workspaceBytes > 0);
  }
  return count;
}

// Casts of parameters that the fuse pass left out of its groups.
int64_t paramCasts(const Graph& g) {
  int64_t n = 0;
  for (const Node* c : g.nodes()) {
    bool p = c->op() == OpKind::Cast && c->operand(0)->isParam();
    n += p && fusionGroupOf(*c) < 0;
  }
  return n;
}

// The group's checks on a step: one bf16 group of every parameter cast, at the first; each cast result's
// buffer lives from there; returns {launches without, with} and {arena without, with}.
std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> checkStep(Graph& g) {
  REQUIRE(cuda::rewriteForCuda(g).ok());
  const int64_t casts = paramCasts(g);
  REQUIRE(casts > 2);
  Groups without = backendGroups(g, false), with = backendGroups(g, true);
  std::vector<const FusionGroup*> castGroups;
  for (const FusionGroup& fg : with.all)
    if (cuda::isCastGroup(fg)) castGroups.push_back(&fg);
  REQUIRE(castGroups.size() == 1);
  const FusionGroup& cg = *castGroups[0];
  CHECK(static_cast<int64_t>(cg.inputs.size()) == casts);
  const Node* first = nullptr;
  for (Node* n : g.nodes())
    if (n->op() == OpKind::Cast && n->operand(0)->isParam() && fusionGroupOf(*n) < 0 && !first) first = n;
  CHECK(cg.members.front() == first);
  for (size_t t = 0; t < cg.inputs.size(); ++t) {
    CHECK(cg.inputs[t]->isParam());
    CHECK(cg.inputs[t]->dtype() == DType::f32);
    CHECK(cg.outputs[t]->dtype() == DType::bf16);
  }
  cuda::StepMemoryPlan a = cuda::planStepMemory(g, {}, &without.of), b = cuda::planStepMemory(g, {}, &with.of);
  int start = -1, k = 0;
  for (const Node* n : g.nodes()) {
    if (n == first) start = k;
    ++k;
  }
  for (const Value* v : cg.outputs) {
    REQUIRE(b.bufferOf.count(v));
    const PlannedBuffer& buf = b.buffers[b.bufferOf.lookup(v)];
    CHECK(buf.first == start);
    CHECK(buf.last >= a.buffers[a.bufferOf.lookup(v)].last);  // read where it was read before
  }
  return {{launches(g, without), launches(g, with)}, {a.arenaBytes, b.arenaBytes}};
}

}  // namespace

TEST_CASE("cast groups: a bf16 GPT step's parameter casts are one kernel at the first, their buffers live from there",
          "[cuda][cast-group]") {
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    auto step = gptStep(smallGpt(), 2, megatronTp(tp) + "mixed-precision(dtype=bf16)," + kTrainPasses);
    std::unique_ptr<Graph> g = tp > 1 ? std::move(rankGraphs(*step)[1]) : std::move(step);
    REQUIRE(createFusePass()->run(*g).ok());  // each rank's program is fused, as the pipeline does it
    int64_t casts = paramCasts(*g);
    auto [count, arena] = checkStep(*g);
    CHECK(count.second == count.first - (casts - 1));
    CHECK(arena.second <= arena.first + arena.first / 4);
    if (tp == 1) CHECK(casts == 8 * 2 + 2);  // 4 weights and 4 biases per layer, wte, wpe (not the layer norms)
  }
}

TEST_CASE("cast groups: gpt2 bf16 at micro batch 16 x 1024: 97 launches fewer per step, the same arena", "[cuda][cast-group]") {
  auto preset = gptPreset("gpt2");
  REQUIRE(preset.ok());
  TrainConfig c = preset->config;
  c.microBatch = c.globalBatch = 16;
  c.seqLength = 1024;
  auto m = buildGpt(preset->gpt, c);
  REQUIRE(m.ok());
  runPasses(*m->forward, "mixed-precision(dtype=bf16)," + kTrainPasses + ",fuse");
  Graph& g = *m->forward;
  CHECK(paramCasts(g) == 98);
  auto [count, arena] = checkStep(g);
  WARN("gpt2 bf16, micro batch 16: " << count.first << " launches per step with a kernel per cast, " << count.second
                                     << " with the cast group; arena " << arena.first << " -> " << arena.second << " bytes");
  CHECK(count.second == count.first - 97);
  CHECK(arena.second == arena.first);
}

TEST_CASE("cast groups: only casts of parameters and inputs between float dtypes, one group per dtype pair",
          "[cuda][cast-group]") {
  Graph g("casts");
  auto cast = [&](Value* x, DType to) {
    auto n = g.create(OpKind::Cast, {x}, [to] { AttrDict a; a.set("to", to); return a; }());
    REQUIRE(n.ok());
    g.addOutput((*n)->result(), "y" + std::to_string(g.outputs().size()));
    return *n;
  };
  Value* p0 = g.addParam("p0", TensorType(DType::f32, {5}));
  Value* p1 = g.addParam("p1", TensorType(DType::f32, {7}));
  Value* x = g.addInput("x", TensorType(DType::bf16, {3}));
  Value* ids = g.addInput("ids", TensorType(DType::i32, {3}));
  Node* a = cast(p0, DType::bf16);
  Node* b = cast(x, DType::f32);             // an input: alone in its pair, stays a plain cast
  Node* c = cast(a->result(), DType::f32);   // not of a parameter or an input
  Node* d = cast(p1, DType::bf16);
  Node* e = cast(ids, DType::f32);           // not between float dtypes
  Node* f = cast(p1, DType::f16);
  Node* h = cast(p0, DType::f16);
  Node* fused = cast(p1, DType::bf16);
  fused->setAttr("fusion_group", int64_t{0});  // in a fusion group
  std::vector<FusionGroup> groups = cuda::castGroups(g);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].members == std::vector<Node*>{a});
  CHECK(groups[0].absorbed == std::vector<Node*>{d});
  CHECK(groups[0].inputs == std::vector<Value*>{p0, p1});
  CHECK(groups[0].outputs == std::vector<Value*>{a->result(), d->result()});
  CHECK(groups[1].members == std::vector<Node*>{f});
  CHECK(groups[1].absorbed == std::vector<Node*>{h});
  for (const FusionGroup& fg : groups) CHECK(cuda::isCastGroup(fg));
  (void)b, (void)c, (void)e;
  // A cast another group already runs is left to it.
  llvm::DenseMap<const Node*, const FusionGroup*> taken;
  FusionGroup other;
  taken[d] = &other;
  groups = cuda::castGroups(g, &taken);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].members == std::vector<Node*>{f});
}

TEST_CASE("cast groups: the multi-tensor cast compiles with NVRTC for sm_90", "[cuda][cast-group]") {
  TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  const DType f = DType::f32, bf = DType::bf16, h = DType::f16;
  for (auto [from, to] : {std::pair{f, bf}, {bf, f}, {f, h}, {h, f}, {bf, h}, {h, bf}}) {
    INFO(dtypeName(from) << " -> " << dtypeName(to));
    std::mt19937 rng(3);
    castgroup::CastCase c = castgroup::makeCastCase(from, to, {1, 8193, 33}, rng);
    auto low = cuda::lowerCastGroup(c.group, kernels::sm90());
    REQUIRE(low.ok());
    const cuda::KernelSpec& k = low->kernels.at(0);
    CHECK(k.grid.x == 1 + 2 + 1);  // a chunk of 8192 elements per block here
    CHECK(k.block.x == 256);
    REQUIRE(k.tables.size() == 1);
    CHECK(k.tables[0].size() == 2 * 3);  // (source, destination) per tensor
    auto cubin = nvrtc.compile(k.source, k.entry);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    CHECK(cubin.ok());
  }
  std::mt19937 rng(4);
  castgroup::CastCase big = castgroup::makeCastCase(f, bf, {5000000, 5000000, 7000000}, rng);
  auto low = cuda::lowerCastGroup(big.group, kernels::sm90());
  REQUIRE(low.ok());
  CHECK(low->kernels.at(0).grid.x == 2048);  // a fixed grid striding over the 2075 chunks
}

TEST_CASE("cast groups: under the CPU emulator, the per-node cast kernels' bits and the CPU backend's cast",
          "[cuda][cast-group]") {
  EmulatedDevice d;
  const DType f = DType::f32, bf = DType::bf16, h = DType::f16;
  // Tiny, odd, under and over a vector of 8, a chunk of 8192 and one more (each pair is two host compiles).
  CHECK(castgroup::checkCastGroups(d, {{f, bf}, {bf, f}, {f, h}}, {1, 3, 7, 8, 9, 8192, 8193, 12007}, 2, 3000) > 0);
}

#endif  // TPC_HAVE_CUDA
