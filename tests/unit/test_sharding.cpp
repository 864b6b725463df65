// The sharding engine and policies on the GPT: collectives per step against Megatron's counts, local
// shapes, rank constants, and the user errors (tp not dividing heads, dp not dividing the batch, policies
// that disagree on a tensor).
#include <catch2/catch.hpp>

#include <map>

#include "gpt_step_support.h"
#include "ir/parser.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

GptConfig gpt(int64_t layers) {
  GptConfig g = test::smallGpt();
  g.layers = layers;
  g.heads = 8;
  g.paddedVocab = 1024;
  return g;
}

Result<std::unique_ptr<Graph>> sharded(int64_t layers, const std::string& pre, const std::string& post, int64_t rank) {
  ModelFile m = test::gptModel(gpt(layers), 4);
  std::unique_ptr<Graph> g = std::move(m.forward);
  PassManager pm;
  TPC_TRY(pm.addPipeline(pre + "autodiff,cse,dce" + post, ""));
  TPC_TRY(pm.run(*g));
  TPC_TRY(propagatePlacements(*g));
  return partitionForRank(*g, rank);
}

// "all_reduce(tp,sum)" -> count
std::map<std::string, int> collectives(const Graph& g) {
  std::map<std::string, int> n;
  for (const Node* node : g.nodes())
    if (node->has(traits::Collective)) {
      std::string k = std::string(node->opName()) + "(" + node->getStr("axis");
      if (node->op() != OpKind::AllGather) k += "," + node->getStr("op");
      ++n[k + ")"];
    }
  return n;
}

const Value* param(const Graph& g, const std::string& name) {
  for (const Value* p : g.params())
    if (p->name() == name) return p;
  return nullptr;
}

// What each collective moves, by kind and the global shape of the tensor it makes whole or splits:
// "all_gather(tp) [4,16,64]" (a [B,T,D] activation), "all_reduce(tp,sum) [64]" (a LayerNorm/bias grad), ...
std::map<std::string, int> collectiveShapes(const Graph& g) {
  std::map<std::string, int> n;
  for (const Node* node : g.nodes()) {
    if (!node->has(traits::Collective)) continue;
    std::string k = std::string(node->opName()) + "(" + node->getStr("axis");
    if (node->op() != OpKind::AllGather) k += "," + node->getStr("op");
    const Value* whole = node->op() == OpKind::ReduceScatter ? node->operand(0) : node->result();
    Shape s = whole->shape();
    // The QKV input is gathered as its [B,1,T,D] view: count it as the [B,T,D] activation it is.
    if (s.size() == 4 && s[1] == 1) s = {s[0], s[2], s[3]};
    ++n[k + ") " + shapeStr(s)];
  }
  return n;
}

}  // namespace

TEST_CASE("sharding: megatron tp=2 has Megatron's all_reduces and local shapes", "[sharding]") {
  for (int64_t layers : {1, 2}) {
    auto g = sharded(layers, "megatron-tp(tp=2),", "", 1);
    INFO((g.ok() ? std::string() : g.error()));
    REQUIRE(g.ok());
    auto c = collectives(**g);
    // Forward: embedding + 2 per layer; backward: 2 per layer + the LM head's input grad; the vocab-parallel
    // loss: max, sum exp, target logit; global_norm: the tp-sharded grads' sum of squares.
    CHECK(c["all_reduce(tp,sum)"] == 4 * layers + 2 + 2 + 1);
    CHECK(c["all_reduce(tp,max)"] == 1);
    CHECK(c.size() == 2);  // no all_gather: the logits are never gathered
    CHECK(param(**g, "h.0.attn.c_attn.weight")->type().str() == "f32[64,3,32]");
    CHECK(param(**g, "h.0.attn.c_proj.weight")->type().str() == "f32[32,64]");
    CHECK(param(**g, "h.0.mlp.c_fc.weight")->type().str() == "f32[64,128]");
    CHECK(param(**g, "h.0.mlp.c_proj.weight")->type().str() == "f32[128,64]");
    CHECK(param(**g, "wte")->type().str() == "f32[512,64]");
    CHECK(param(**g, "wte.adam_m")->type().str() == "f32[512,64]");
    CHECK(param(**g, "wpe")->type().str() == "f32[16,64]");
    bool vocabStart = false, gradRows = false;
    for (const Node* n : (*g)->nodes()) {
      if (n->op() == OpKind::Embedding) vocabStart = n->getInt("vocab_start") == 512;  // rank 1's rows
      // wte's gradient from the embedding: only the rank's rows, never the whole vocab then a slice.
      if (n->op() == OpKind::EmbeddingGrad)
        gradRows = n->getInt("vocab_start") == 512 && n->result()->type().str() == "f32[512,64]";
      if (n->op() == OpKind::Slice && n->operand(0)->def())
        CHECK(n->operand(0)->def()->op() != OpKind::EmbeddingGrad);
    }
    CHECK(vocabStart);
    CHECK(gradRows);
  }
}

TEST_CASE("sharding: megatron-tp's [3, D] view of c_attn.bias is still a bias (no weight decay)", "[sharding]") {
  // The tp step must train the same model as one rank, where c_attn.bias is [3D] and never decayed.
  auto step = test::gptStep(gpt(1), 4, "megatron-tp(tp=2),autodiff(weight-decay=0.1)");
  int checked = 0;
  for (const Node* n : step->nodes()) {
    if (n->op() != OpKind::AdamWUpdate) continue;
    const std::string& name = n->operand(0)->name();
    if (name == "h.0.attn.c_attn.bias") {
      CHECK(n->operand(0)->type().str() == "f32[3,64]");
      CHECK(n->getFloat("weight_decay") == 0.0);
      ++checked;
    }
    if (name == "h.0.attn.c_attn.weight") {
      CHECK(n->getFloat("weight_decay") == Approx(0.1));
      ++checked;
    }
  }
  CHECK(checked == 2);
}

TEST_CASE("sharding: megatron tp=2 collectives are exactly Megatron's, 4 per layer", "[sharding]") {
  std::map<std::string, int> byLayers[3];
  for (int64_t L : {1, 2}) {
    auto g = sharded(L, "megatron-tp(tp=2),", "", 0);
    INFO((g.ok() ? std::string() : g.error()));
    REQUIRE(g.ok());
    byLayers[L] = collectives(**g);
    auto shapes = collectiveShapes(**g);
    INFO("layers " << L);
    // [B,T,D] activations: forward the embedding + 2 per layer (after proj, fc2); backward 2 per layer (the
    // column-parallel input grads) + the LM head's input grad. The vocab-parallel loss: [B,T] max, sum exp
    // and target logit. The grad norm: one scalar (sum of squares of the tp-split grads).
    CHECK(shapes["all_reduce(tp,sum) [4,16,64]"] == 4 * L + 2);
    CHECK(shapes["all_reduce(tp,sum) [4,16]"] == 2);
    CHECK(shapes["all_reduce(tp,max) [4,16]"] == 1);
    CHECK(shapes["all_reduce(tp,sum) []"] == 1);
    CHECK(shapes.size() == 4);
  }
  // One more layer: exactly 4 more all_reduces (2 forward, 2 backward) and nothing else.
  CHECK(byLayers[2]["all_reduce(tp,sum)"] - byLayers[1]["all_reduce(tp,sum)"] == 4);
  CHECK(byLayers[2].size() == byLayers[1].size());
  CHECK(byLayers[2]["all_reduce(tp,max)"] == byLayers[1]["all_reduce(tp,max)"]);
}

TEST_CASE("sharding: sequence parallel is Megatron-SP's all_gather/reduce_scatter pairs, exactly", "[sharding]") {
  std::map<std::string, int> byLayers[3];
  for (int64_t L : {1, 2}) {
    auto g = sharded(L, "megatron-tp(tp=2),sequence-parallel,", "", 0);
    INFO((g.ok() ? std::string() : g.error()));
    REQUIRE(g.ok());
    byLayers[L] = collectives(**g);
    auto shapes = collectiveShapes(**g);
    INFO("layers " << L);
    for (const auto& [k, n] : shapes) INFO(k << ": " << n);
    // Per layer, on [B,T,D] activations split on the sequence: forward all_gather before QKV and fc1,
    // reduce_scatter after proj and fc2; backward the mirror (all_gather of the proj/fc2 output grads,
    // reduce_scatter of the QKV/fc1 input grads). Outside the layers: reduce_scatter after the embedding,
    // all_gather before the LM head, reduce_scatter of the LM head's input grad.
    CHECK(shapes["all_gather(tp) [4,16,64]"] == 4 * L + 1);
    CHECK(shapes["reduce_scatter(tp,sum) [4,16,64]"] == 4 * L + 2);
    // The embeddings' grads: wte's comes out partial (each rank saw half the tokens) and is reduce-scattered
    // to its vocab shard; wpe's comes out split on the sequence and is gathered for its update.
    CHECK(shapes["reduce_scatter(tp,sum) [1024,64]"] == 1);
    CHECK(shapes["all_gather(tp) [16,64]"] == 1);
    // Sequence-split LayerNorm weight/bias and row-parallel bias grads are partial: all_reduced over tp, as
    // Megatron does for params marked sequence_parallel (ln_1, ln_2, attn and mlp c_proj.bias; ln_f).
    CHECK(shapes["all_reduce(tp,sum) [64]"] == 6 * L + 2);
    // The vocab-parallel loss and the grad norm, as without sp.
    CHECK(shapes["all_reduce(tp,sum) [4,16]"] == 2);
    CHECK(shapes["all_reduce(tp,max) [4,16]"] == 1);
    CHECK(shapes["all_reduce(tp,sum) []"] == 1);
    CHECK(shapes.size() == 8);  // in particular: no all_reduce of an activation, no gathered weight
    for (const Value* v : (*g)->inputs()) CHECK(v->placement().has_value());
  }
  // One more layer: exactly 4 all_gather, 4 reduce_scatter and 6 small all_reduce more.
  CHECK(byLayers[2]["all_gather(tp)"] - byLayers[1]["all_gather(tp)"] == 4);
  CHECK(byLayers[2]["reduce_scatter(tp,sum)"] - byLayers[1]["reduce_scatter(tp,sum)"] == 4);
  CHECK(byLayers[2]["all_reduce(tp,sum)"] - byLayers[1]["all_reduce(tp,sum)"] == 6);
  CHECK(byLayers[2]["all_reduce(tp,max)"] == byLayers[1]["all_reduce(tp,max)"]);
}

TEST_CASE("sharding: dp 2 x tp 2 + sp keeps the batch split over dp and Megatron-SP's tp schedule", "[sharding]") {
  for (int64_t L : {1, 2}) {
    auto g = sharded(L, "megatron-tp(tp=2),sequence-parallel,", ",data-parallel(dp=2)", 3);
    INFO((g.ok() ? std::string() : g.error()));
    REQUIRE(g.ok());
    auto c = collectives(**g);
    INFO("layers " << L);
    // sequence-parallel's hint names tp only: dp stays split (no all_gather over dp of the residual stream).
    CHECK(c["all_gather(tp)"] == 4 * L + 2);
    CHECK(c["reduce_scatter(tp,sum)"] == 4 * L + 3);
    CHECK(c["all_reduce(tp,sum)"] == 6 * L + 5);
    CHECK(c["all_reduce(tp,max)"] == 1);
    int64_t params = 0;
    for (const Value* p : (*g)->params())
      if (p->name().find(".adam_") == std::string::npos) ++params;
    CHECK(c["all_reduce(dp,sum)"] == params + 1);  // one per gradient, plus the loss
    CHECK(c.size() == 5);
    for (const Node* n : (*g)->nodes())
      if (n->op() == OpKind::LayerNorm) CHECK(n->result()->type().str() == "f32[2,8,64]");  // [B/dp, T/tp, D]
  }
}

TEST_CASE("sharding: data parallel all-reduces every gradient once over dp", "[sharding]") {
  auto g = sharded(1, "", ",data-parallel(dp=2)", 1);
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  auto c = collectives(**g);
  int64_t params = 0;
  for (const Value* p : (*g)->params())
    if (p->name().find(".adam_") == std::string::npos) ++params;
  CHECK(c["all_reduce(dp,sum)"] == params + 1);  // one per gradient, plus the loss
  const Value* tokens = (*g)->inputs()[0];
  CHECK(tokens->type().str() == "i32[2,16]");
}

TEST_CASE("sharding: ZeRO-1 reduce-scatters every gradient, all-gathers every param, holds 1/dp of the moments",
          "[sharding][zero1]") {
  auto g = sharded(1, "", ",data-parallel(dp=2, zero1=true)", 1);
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  auto c = collectives(**g);
  int64_t params = 0, local = 0;
  for (const Value* p : (*g)->params()) {
    if (p->name().find(".adam_") == std::string::npos) {
      ++params;
      continue;
    }
    // Each moment: split over dp on dim 0 or, where dp does not divide it, the next dim; never replicated.
    INFO(p->name() << " " << p->type().str() << " " << (p->placement() ? p->placement()->str() : "[]"));
    REQUIRE(p->placement().has_value());
    CHECK(p->placement()->get("dp").isS());
    local += p->type().numel();
  }
  auto plain = sharded(1, "", ",data-parallel(dp=2)", 1);
  REQUIRE(plain.ok());
  int64_t plainLocal = 0;
  for (const Value* p : (*plain)->params())
    if (p->name().find(".adam_") != std::string::npos) plainLocal += p->type().numel();
  CHECK(2 * local == plainLocal);  // exactly 1/dp of the moments
  CHECK(param(**g, "wte.adam_m")->type().str() == "f32[512,64]");
  CHECK(param(**g, "wte.adam_v")->type().str() == "f32[512,64]");
  CHECK(param(**g, "h.0.attn.c_attn.weight.adam_m")->type().str() == "f32[32,192]");
  CHECK(param(**g, "h.0.ln_1.weight.adam_v")->type().str() == "f32[32]");
  CHECK(param(**g, "wte")->type().str() == "f32[1024,64]");  // the params themselves stay whole
  CHECK(c["reduce_scatter(dp,sum)"] == params);  // one per gradient, instead of an all_reduce
  CHECK(c["all_gather(dp)"] == params);          // one per updated param
  CHECK(c["all_reduce(dp,sum)"] == 2);           // the loss and global_norm's sum of squares
  CHECK(c.size() == 3);
}

TEST_CASE("sharding: ZeRO-1 under dp 2 x tp 4 splits the moments over dp on a dim tp leaves whole",
          "[sharding][zero1]") {
  auto g = sharded(2, "megatron-tp(tp=4),", ",data-parallel(dp=2, zero1=true)", 5);
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  const Mesh& mesh = (*g)->mesh();
  int64_t local = 0, whole = 0, replicatedOverDp = 0;
  for (const Value* p : (*g)->params()) {
    if (p->name().find(".adam_") == std::string::npos) continue;
    int64_t w = p->type().numel();
    for (const MeshAxis& a : mesh.axes)
      if (p->placement()->get(a.name).isS()) w *= a.size;
    local += p->type().numel();
    whole += w;
    bool dpSplit = p->placement()->get("dp").isS();
    bool tpSplit = p->placement()->get("tp").isS();
    if (dpSplit && tpSplit) CHECK(p->placement()->get("dp").dim != p->placement()->get("tp").dim);
    // Only the tp-split biases ([3, D/tp] c_attn.bias, [4D/tp] c_fc.bias) have no dim left for dp.
    bool fallback = p->name().find("c_attn.bias") != std::string::npos || p->name().find("c_fc.bias") != std::string::npos;
    INFO(p->name() << " " << p->type().str() << " " << p->placement()->str());
    CHECK(dpSplit == !fallback);
    CHECK(p->type().numel() * (tpSplit ? 4 : 1) * (dpSplit ? 2 : 1) == w);
    if (!dpSplit) replicatedOverDp += p->type().numel();
  }
  CHECK(param(**g, "wte.adam_m")->type().str() == "f32[256,32]");                  // tp on vocab, dp on hidden
  CHECK(param(**g, "h.0.attn.c_attn.weight.adam_m")->type().str() == "f32[32,3,16]");  // [D, 3, D]: tp dim 2
  CHECK(param(**g, "h.0.mlp.c_proj.weight.adam_v")->type().str() == "f32[64,32]");     // tp dim 0, dp dim 1
  CHECK(param(**g, "h.0.mlp.c_fc.bias.adam_m")->type().str() == "f32[64]");             // replicated over dp
  // Half of what the same rank holds without ZeRO-1, but for the biases replicated over dp
  // (2 layers x (3 x 16 + 64) x 2 moments = 448 elements).
  CHECK(replicatedOverDp == 448);
  auto plain = sharded(2, "megatron-tp(tp=4),", ",data-parallel(dp=2)", 5);
  REQUIRE(plain.ok());
  int64_t plainLocal = 0;
  for (const Value* p : (*plain)->params())
    if (p->name().find(".adam_") != std::string::npos) plainLocal += p->type().numel();
  CHECK(2 * (local - replicatedOverDp) + replicatedOverDp == plainLocal);
  auto c = collectives(**g);
  CHECK(c["reduce_scatter(dp,sum)"] > 0);
  CHECK(c["all_gather(dp)"] == c["reduce_scatter(dp,sum)"]);
}

TEST_CASE("sharding: user errors name the tensor and the mesh axis", "[sharding]") {
  SECTION("tp does not divide the heads") {
    auto g = sharded(1, "megatron-tp(tp=3),", "", 0);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error(), Catch::Contains("h.0.attn.c_attn.weight") && Catch::Contains("mesh axis tp"));
  }
  SECTION("ZeRO-1 before autodiff") {
    auto g = sharded(1, "data-parallel(dp=2, zero1=true),", "", 0);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error(), Catch::Contains("zero1") && Catch::Contains("after autodiff"));
  }
  SECTION("dp does not divide the batch") {
    auto g = sharded(1, "", ",data-parallel(dp=3)", 0);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error(), Catch::Contains("tokens") && Catch::Contains("mesh axis dp"));
  }
  SECTION("an unknown policy") {
    auto g = sharded(1, "zigzag-tp(tp=2),", "", 0);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error(), Catch::Contains("zigzag-tp"));
  }
  SECTION("two policies disagree on a tensor") {
    Graph g;
    Value* w = g.addParam("w", TensorType(DType::f32, {8, 8}));
    REQUIRE(annotatePlacement(w, "tp", AxisPlacement::split(0), "policy-a").ok());
    Status s = annotatePlacement(w, "tp", AxisPlacement::split(1), "policy-b");
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::Contains("w f32[8,8]") && Catch::Contains("mesh axis tp") && Catch::Contains("S(0)"));
  }
  SECTION("a placement whose split the mesh axis does not divide") {
    // partition aborted on these (an input's block) or lost rows (a result's, a contraction dim's).
    const char* graphs[] = {
        "graph @g(%x: f32[4,4] place=[tp:S(0)]) mesh(tp=3) {\n  %y = neg(%x) : f32[4,4]\n  return %y\n}\n",
        "graph @g(%x: f32[4,4]) mesh(tp=3) {\n  %y = neg(%x) : f32[4,4] {place=[tp:S(0)]}\n  return %y\n}\n",
        "graph @g(%a: f32[4,6] place=[tp:S(1)], %b: f32[6,8] place=[tp:S(0)]) mesh(tp=4) {\n"
        "  %y = matmul(%a, %b) : f32[4,8]\n  return %y\n}\n",
        "graph @g(%x: f32[8,4] place=[dp:S(0), tp:S(0)]) mesh(dp=2, tp=3) {\n  %y = neg(%x) : f32[8,4]\n  return %y\n}\n"};
    const char* expected[] = {"the placement [tp:S(0)] of %x f32[4,4] splits dim 0 (4) over tp=3, which does not divide it",
                              "the placement [tp:S(0)] of %y f32[4,4] splits dim 0 (4) over tp=3",
                              "the placement [tp:S(1)] of %a f32[4,6] splits dim 1 (6) over tp=4",
                              "splits dim 0 (8) over dp=2 x tp=3"};
    for (size_t i = 0; i < std::size(graphs); ++i) {
      auto g = parseGraph(graphs[i]);
      REQUIRE(g.ok());
      Status s = propagatePlacements(**g);
      INFO(graphs[i]);
      REQUIRE_FALSE(s.ok());
      CHECK_THAT(s.error(), Catch::Contains(expected[i]));
      auto ranks = partitionForRank(**g, 0);
      REQUIRE_FALSE(ranks.ok());
      CHECK_THAT(ranks.error(), Catch::Contains(expected[i]));
    }
  }
  SECTION("two policies disagree on the mesh") {
    auto g = sharded(1, "megatron-tp(tp=2),megatron-tp(tp=4),", "", 0);
    REQUIRE_FALSE(g.ok());
  }
}

}  // namespace tpc
