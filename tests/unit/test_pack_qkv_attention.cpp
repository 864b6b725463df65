// pack-qkv-attention on whole GPT training steps (with attention dropout): every attention and its gradient
// become attention_qkv(_grad) on the QKV projection's layout, the transposes, slices and zero-padded
// concats around them are gone, and the step computes the same (CPU backend), unsharded, after the fuse
// pass, and on the rank programs of megatron-tp 2 (whose QKV layout is [B, 3, T, H, Dh]). Where the
// pattern does not hold exactly the graph is left alone.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "gpt_step_support.h"
#include "worst_error.h"
#include "models/gpt.h"
#include "passes/builtin_passes.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

constexpr int64_t kLayers = 2;

std::unique_ptr<Graph> gptStep(const std::string& pre, const std::string& post = "") {
  GptConfig gc;
  gc.layers = kLayers;
  gc.hidden = 32;
  gc.heads = 4;
  gc.vocab = 60;
  gc.paddedVocab = 128;
  gc.positions = 8;
  gc.attentionDropout = 0.2;
  TrainConfig tc;
  tc.microBatch = 2;
  tc.globalBatch = 2;
  tc.seqLength = 8;
  auto m = buildGpt(gc, tc);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  PassManager pm;
  Status s = pm.addPipeline(pre + "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce" + post, "");
  REQUIRE(s.ok());
  s = pm.run(*g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (!g->mesh().empty()) REQUIRE(propagatePlacements(*g).ok());
  return g;
}

int count(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

struct Counts {
  int transpose, slice, concat, full, add, attention, attentionGrad, packed, packedGrad;
};
Counts counts(const Graph& g) {
  return {count(g, OpKind::Transpose), count(g, OpKind::Slice),      count(g, OpKind::Concat),
          count(g, OpKind::Full),      count(g, OpKind::Add),        count(g, OpKind::Attention),
          count(g, OpKind::AttentionGrad), count(g, OpKind::AttentionQkv), count(g, OpKind::AttentionQkvGrad)};
}

bool pack(Graph& g) {
  auto r = createPackQkvAttentionPass()->run(g);
  INFO((r.ok() ? std::string() : r.error()));
  REQUIRE(r.ok());
  return *r;
}

// Per layer the pass removes 2 + 2 transposes, 3 slices, 3 concats and 2 adds; zero fulls shared by the
// layers go with the last one.
void checkPacked(const Counts& before, const Counts& after, int layers) {
  CHECK(after.attention == before.attention - layers);
  CHECK(after.attentionGrad == before.attentionGrad - layers);
  CHECK(after.packed == layers);
  CHECK(after.packedGrad == layers);
  CHECK(after.transpose == before.transpose - 4 * layers);
  CHECK(after.slice <= before.slice - 3 * layers);
  CHECK(after.concat == before.concat - 3 * layers);
  CHECK(after.add == before.add - 2 * layers);
  CHECK(after.full <= before.full);
}

// Two steps on the CPU; the loss, grad norm and every updated parameter after them.
TensorMap twoSteps(std::vector<std::unique_ptr<Graph>> ranks, const Graph& global) {
  CpuOptions o;
  o.threads = 2;
  o.seed = 11;
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
    HostTensor tokens(TensorType(DType::i32, {2, 8})), targets(TensorType(DType::i32, {2, 8}));
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
  return test::withState(*backend, global, std::move(out));
}

// The packed kernels run the same loops in the same order: equal up to f32 rounding of index arithmetic
// (none), so a tight bound.
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
    CHECK(worst <= 1e-6 * std::max(scale, 1.0));
  }
}

}  // namespace

TEST_CASE("pack-qkv-attention: a GPT step's attentions read the QKV layout, no copies, same results", "[passes][pack-qkv]") {
  auto g = gptStep("");
  auto packed = g->clone();
  Counts before = counts(*packed);
  REQUIRE(before.attention == kLayers);
  CHECK(pack(*packed));
  checkPacked(before, counts(*packed), kLayers);
  CHECK(count(*packed, OpKind::Transpose) == 0);
  for (const Node* n : packed->nodes())
    if (n->op() == OpKind::Concat) CHECK(n->result()->type().rank() < 5);  // the slice gradients' are gone
  for (const Node* n : packed->nodes())
    if (n->op() == OpKind::AttentionQkv) {
      CHECK(n->getInts("perm") == std::vector<int64_t>{2, 0, 3, 1, 4});
      CHECK(n->getFloat("dropout") == 0.2);
    }
  CHECK(!pack(*packed));  // nothing left to rewrite
  checkClose(twoSteps({}, *g), twoSteps({}, *packed));
}

// Selective recompute copies the bias add, the reshape, transpose and slices of q, k, v before each block's
// backward: attention_grad reads the copies, which are the forward's computed alike; packed all the same.
TEST_CASE("pack-qkv-attention: under selective recompute the gradient's recomputed q, k, v pack too", "[passes][pack-qkv]") {
  auto g = gptStep("", ",recompute(mode=selective)");
  auto packed = g->clone();
  REQUIRE(count(*packed, OpKind::Attention) == kLayers);
  for (const Node* n : packed->nodes())  // the premise: the gradients read recomputed copies
    if (n->op() == OpKind::AttentionGrad) {
      const Node* fwd = n->operand(4)->def();
      REQUIRE(fwd);
      CHECK(n->operand(1) != fwd->operand(0));
    }
  CHECK(pack(*packed));
  CHECK(count(*packed, OpKind::Attention) == 0);
  CHECK(count(*packed, OpKind::AttentionGrad) == 0);
  CHECK(count(*packed, OpKind::AttentionQkv) == kLayers);
  CHECK(count(*packed, OpKind::AttentionQkvGrad) == kLayers);
  CHECK(count(*packed, OpKind::Transpose) == 0);
  // The recomputed copies (the bias add and reshape too) died with the rewrite: nothing is left for dce, and
  // each QKV bias is added once, by the forward (selective recomputed it before).
  auto dced = packed->clone();
  auto d = createDCEPass()->run(*dced);
  REQUIRE(d.ok());
  CHECK(!*d);
  auto biasAdds = [](const Graph& graph) {
    int n = 0;
    for (const Node* node : graph.nodes())
      for (const Value* v : node->operands())
        n += node->op() == OpKind::Add && v->hasName() && v->name().find("attn.c_attn.bias") != std::string::npos;
    return n;
  };
  CHECK(biasAdds(*g) == 2 * kLayers);
  CHECK(biasAdds(*packed) == kLayers);
  checkClose(twoSteps({}, *g), twoSteps({}, *packed));
}

// Under megatron-tp the recomputed bias add reads the same stacked QKV matmul as the forward's: partition packs
// both onto one GEMM (no GEMM is recomputed: selective keeps matmul results), and the attention packs.
TEST_CASE("pack-qkv-attention: megatron-tp 2 with selective recompute: one QKV GEMM a layer, packed, same step",
          "[passes][pack-qkv][sharding]") {
  auto g = gptStep("megatron-tp(tp=2),", ",recompute(mode=selective)");
  auto ref = gptStep("megatron-tp(tp=2),");
  std::vector<std::unique_ptr<Graph>> plain, packed;
  for (int64_t r = 0; r < g->mesh().numRanks(); ++r) {
    INFO("rank " << r);
    auto l = partitionForRank(*g, r);
    auto lr = partitionForRank(*ref, r);
    REQUIRE(l.ok());
    REQUIRE(lr.ok());
    CHECK(count(**l, OpKind::Matmul) == count(**lr, OpKind::Matmul));
    plain.push_back((*l)->clone());
    CHECK(pack(**l));
    CHECK(count(**l, OpKind::AttentionQkv) == kLayers);
    CHECK(count(**l, OpKind::Attention) == 0);
    CHECK(count(**l, OpKind::Transpose) == 0);
    auto d = createDCEPass()->run(**l);
    REQUIRE(d.ok());
    CHECK(!*d);
    packed.push_back(std::move(*l));
  }
  checkClose(twoSteps(std::move(plain), *g), twoSteps(std::move(packed), *g));
}

TEST_CASE("pack-qkv-attention: after the fuse pass the slice gradient's fusion groups vanish with it", "[passes][pack-qkv]") {
  auto g = gptStep("", ",fuse");
  auto packed = g->clone();
  Counts before = counts(*packed);
  CHECK(pack(*packed));
  checkPacked(before, counts(*packed), kLayers);
  checkClose(twoSteps({}, *g), twoSteps({}, *packed));
}

TEST_CASE("pack-qkv-attention: a fusion group reaching outside the pattern is left alone", "[passes][pack-qkv]") {
  auto g = gptStep("", ",fuse");
  // Put an add outside the pattern into the group of the first attention gradient's adds.
  int grads = 0;
  int64_t group = -1;
  for (const Node* n : g->nodes()) {
    grads += n->op() == OpKind::AttentionGrad;  // the first layer's gradient comes last
    if (grads == kLayers && group < 0 && n->op() == OpKind::Add && n->result()->shape().size() == 5)
      group = n->getInt("fusion_group");
  }
  REQUIRE(group >= 0);
  Node* outside = nullptr;
  for (Node* n : g->nodeVector())
    if (n->op() == OpKind::Add && n->result()->shape().size() == 3 && n->getInt("fusion_group") < 0) outside = n;
  REQUIRE(outside);
  outside->setAttr("fusion_group", Attr(group));
  Counts before = counts(*g);
  CHECK(pack(*g));
  Counts after = counts(*g);
  CHECK(after.attention == before.attention - (kLayers - 1));
  CHECK(after.packed == kLayers - 1);
  CHECK(after.attentionGrad == 1);
}

TEST_CASE("pack-qkv-attention: an attention whose out is read elsewhere or whose q, k, v are not one packed "
          "tensor is left alone", "[passes][pack-qkv]") {
  SECTION("out is a graph output") {
    auto g = gptStep("");
    for (Node* n : g->nodeVector())
      if (n->op() == OpKind::Attention) {
        g->addOutput(n->result(0), "attn_out");
        break;
      }
    Counts before = counts(*g);
    CHECK(pack(*g));
    Counts after = counts(*g);
    CHECK(after.attention == before.attention - (kLayers - 1));
    CHECK(after.attentionGrad == before.attentionGrad - (kLayers - 1));
  }
  SECTION("k and v swapped") {
    auto g = gptStep("");
    for (Node* n : g->nodeVector())
      if (n->op() == OpKind::Attention) {
        auto made = g->create(OpKind::Attention, {n->operand(0), n->operand(2), n->operand(1)}, n->attrs(), n);
        REQUIRE(made.ok());
        g->replaceAllUsesWith(n->result(0), (*made)->result(0));
        g->replaceAllUsesWith(n->result(1), (*made)->result(1));
        g->erase(n);
      }
    CHECK(!pack(*g));
  }
}

// megatron-tp's stacked QKV ([B, 3, T, H, Dh]) is read packed again by partition (foldStackedQkv), so the rank
// programs pack as one rank's do, with the rank's heads; the stacked form's own packing is the golden case.
TEST_CASE("pack-qkv-attention: on the rank programs of megatron-tp 2 the step matches",
          "[passes][pack-qkv][sharding]") {
  auto g = gptStep("megatron-tp(tp=2),");
  std::vector<std::unique_ptr<Graph>> plain, packed;
  for (int64_t r = 0; r < g->mesh().numRanks(); ++r) {
    auto l = partitionForRank(*g, r);
    REQUIRE(l.ok());
    plain.push_back((*l)->clone());
    Counts before = counts(**l);
    CHECK(pack(**l));
    checkPacked(before, counts(**l), kLayers);
    for (const Node* n : (*l)->nodes())
      if (n->op() == OpKind::AttentionQkv) {
        CHECK(n->getInts("perm") == std::vector<int64_t>{2, 0, 3, 1, 4});
        CHECK(n->result(0)->shape() == Shape{2, 8, 2, 8});  // the local 2 of 4 heads
        CHECK(n->getInts("offsets") == std::vector<int64_t>{0, 2 * r});
      }
    packed.push_back(std::move(*l));
  }
  // A global graph after propagation is not touched (its values carry placements).
  auto global = g->clone();
  CHECK(!pack(*global));
  checkClose(twoSteps(std::move(plain), *g), twoSteps(std::move(packed), *g));
}

}  // namespace tpc
