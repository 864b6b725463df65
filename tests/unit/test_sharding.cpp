// The sharding engine and policies on the GPT: collectives per step against Megatron's counts, local
// shapes, rank constants, and the user errors (tp not dividing heads, dp not dividing the batch, policies
// that disagree on a tensor).
#include <catch2/catch.hpp>

#include <map>

#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

GptConfig gpt(int64_t layers) {
  GptConfig g;
  g.layers = layers;
  g.hidden = 64;
  g.heads = 8;
  g.vocab = 100;
  g.paddedVocab = 1024;
  g.positions = 16;
  return g;
}

TrainConfig train4x16() {
  TrainConfig c;
  c.microBatch = 4;
  c.globalBatch = 4;
  c.seqLength = 16;
  return c;
}

Result<std::unique_ptr<Graph>> sharded(int64_t layers, const std::string& pre, const std::string& post, int64_t rank) {
  TPC_ASSIGN(ModelFile m, buildGpt(gpt(layers), train4x16()));
  std::unique_ptr<Graph> g = std::move(m.forward);
  PassManager pm;
  TPC_TRY(pm.addPipeline(pre + "autodiff,cse,dce" + post));
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
    bool vocabStart = false;
    for (const Node* n : (*g)->nodes())
      if (n->op() == OpKind::Embedding) vocabStart = n->getInt("vocab_start") == 512;  // rank 1's rows
    CHECK(vocabStart);
  }
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

TEST_CASE("sharding: user errors name the tensor and the mesh axis", "[sharding]") {
  SECTION("tp does not divide the heads") {
    auto g = sharded(1, "megatron-tp(tp=3),", "", 0);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error(), Catch::Contains("h.0.attn.c_attn.weight") && Catch::Contains("mesh axis tp"));
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
  SECTION("two policies disagree on the mesh") {
    auto g = sharded(1, "megatron-tp(tp=2),megatron-tp(tp=4),", "", 0);
    REQUIRE_FALSE(g.ok());
  }
}

}  // namespace tpc
