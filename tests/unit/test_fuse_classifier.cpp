// The fused classifier (issue 7): the fuse-classifier pass on GPT steps (one cross_entropy_with_grad, the
// CPU backend trains it to the unfused step's bits), and the memory plan writing dlogits over dead logits
// (cross_entropy_grad, cross_entropy_with_grad, vocab_xent_grad under megatron-tp).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "graph_text_support.h"
#include "gpt_step_support.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "runtime/memory_plan.h"

namespace tpc {
namespace {

int countOps(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

std::unique_ptr<Graph> fuseClassifier(const Graph& step) {
  std::unique_ptr<Graph> g = step.clone();
  auto changed = createFuseClassifierPass()->run(*g);
  INFO((changed.ok() ? std::string() : changed.error()));
  REQUIRE(changed.ok());
  CHECK(*changed);
  Status v = verifyGraph(*g);
  INFO((v.ok() ? std::string() : v.error()));
  REQUIRE(v.ok());
  return g;
}

// Losses and the final state of `steps` CPU steps of `g` from the same initial state and batches.
std::pair<std::vector<double>, std::map<std::string, std::string>> trainCpu(const Graph& g, int64_t steps,
                                                                           const Shape& batch) {
  CpuOptions o;
  o.threads = 2;
  auto b = test::preparedCpuBackend(g, o, 1);
  std::mt19937 rng(5);
  test::TrainBatches tb;
  tb.shape = batch;
  std::vector<double> losses = test::trainLosses(*b, rng, steps, tb);
  return {losses, test::stateBytes(*b, g)};
}

using test::namedValue;
using test::parseTestGraph;

StepMemoryPlan planOf(const Graph& g) {
  return planStepMemory(g, {}, nullptr, [](const Node& n) { return n.op() == OpKind::Reshape; });
}

}  // namespace

TEST_CASE("fuse-classifier: a GPT step's loss and gradient become one op that trains to the same bits on the CPU",
          "[passes][fuse_classifier]") {
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    auto step = test::gptStep(test::smallGpt(), 4, std::string(bf16 ? "mixed-precision(dtype=bf16)," : "") + test::kTrainPasses);
    auto fused = fuseClassifier(*step);
    CHECK(countOps(*fused, OpKind::CrossEntropyWithGrad) == 1);
    CHECK(countOps(*fused, OpKind::CrossEntropy) == 0);
    CHECK(countOps(*fused, OpKind::CrossEntropyGrad) == 0);
    // The logits' last reader is the fused node: dlogits take their buffer.
    for (const Node* n : fused->nodes())
      if (n->op() == OpKind::CrossEntropyWithGrad) CHECK(planOf(*fused).viewOf.lookup(n->result(1)) == n->operand(1));
    auto [lossA, stateA] = trainCpu(*step, 3, {4, 16});
    auto [lossB, stateB] = trainCpu(*fused, 3, {4, 16});
    CHECK(lossA == lossB);
    CHECK(stateA == stateB);
  }
}

TEST_CASE("fuse-classifier: each micro batch's loss of an accumulated step is fused and the step trains the same",
          "[passes][fuse_classifier]") {
  auto step = test::gptStep(test::smallGpt(), 2, "autodiff(accum=2, clip-grad=1.0, weight-decay=0.1),cse,dce", 2);
  auto fused = fuseClassifier(*step);
  CHECK(countOps(*step, OpKind::CrossEntropy) == 2);
  CHECK(countOps(*fused, OpKind::CrossEntropyWithGrad) == 2);
  CHECK(countOps(*fused, OpKind::CrossEntropyGrad) == 0);
  auto [lossA, stateA] = trainCpu(*step, 2, {2, 2, 16});
  auto [lossB, stateB] = trainCpu(*fused, 2, {2, 2, 16});
  CHECK(lossA == lossB);
  CHECK(stateA == stateB);
}

TEST_CASE("fuse-classifier: at the loss a GPT step holds one logits-sized buffer, not two", "[passes][fuse_classifier]") {
  // Logits larger than anything else of the step: [8, 16, 4096] f32 (2 MiB).
  GptConfig g = test::smallGpt();
  g.vocab = 4000;
  g.paddedVocab = 4096;
  auto step = test::gptStep(g, 8, test::kTrainPasses);
  auto fused = fuseClassifier(*step);
  const int64_t logits = 8 * 16 * 4096 * 4;
  // The bytes live during the loss gradient (the unfused step's cross_entropy_grad, the fused node).
  auto liveAt = [](const Graph& graph, OpKind op) {
    StepMemoryPlan plan = planOf(graph);
    int at = 0;
    for (const Node* n : graph.nodes()) {
      if (n->op() == op) break;
      ++at;
    }
    int64_t live = 0;
    for (const PlannedBuffer& b : plan.buffers) live += b.first <= at && at <= b.last ? b.bytes : 0;
    return live;
  };
  int64_t unfused = liveAt(*step, OpKind::CrossEntropyGrad), one = liveAt(*fused, OpKind::CrossEntropyWithGrad);
  WARN("live at the loss gradient: " << unfused << " bytes unfused, " << one << " fused (logits " << logits << ")");
  CHECK(one >= logits);
  CHECK(one < 2 * logits);
  CHECK(unfused < 2 * logits);  // cross_entropy_grad alone writes over the logits too: it is their last reader
}

TEST_CASE("memory plan: dlogits take the logits' buffer only when nothing reads the logits after", "[memory][fuse_classifier]") {
  // The unfused pair: cross_entropy_grad is the logits' last reader.
  auto g = parseTestGraph(R"(graph @head(%x: f32[4,8], %t: i32[4]) params(%w: f32[8,16] init=zeros) {
  %logits = matmul(%x, %w) : f32[4,16]
  %loss = cross_entropy(%logits, %t) : f32[4]
  %m = reduce_mean(%loss) {axes=[0]} : f32[]
  %one = full() {shape=[4], value=0.25} : f32[4]
  %dx = cross_entropy_grad(%one, %logits, %t) : f32[4,16]
  %dw = matmul(%x, %dx) {transpose_a=true} : f32[8,16]
  return %m, %dw
})");
  StepMemoryPlan plan = planOf(*g);
  const Value *logits = namedValue(*g, "logits"), *dx = namedValue(*g, "dx");
  CHECK(plan.viewOf.lookup(dx) == logits);
  CHECK(!plan.bufferOf.count(dx));
  CHECK(plan.buffers[plan.bufferOf.lookup(logits)].last == 5);  // to dx's reader

  // The fused op, its logits through a view: dlogits (result 1) alias the memory under the view.
  auto f = parseTestGraph(R"(graph @fused(%x: f32[4,8], %t: i32[2,2]) params(%w: f32[8,16] init=zeros) {
  %logits = matmul(%x, %w) : f32[4,16]
  %l3 = reshape(%logits) {shape=[2,2,16]} : f32[2,2,16]
  %one = full() {shape=[2,2], value=0.25} : f32[2,2]
  %loss, %dx = cross_entropy_with_grad(%one, %l3, %t) : f32[2,2], f32[2,2,16]
  %dx2 = reshape(%dx) {shape=[4,16]} : f32[4,16]
  %dw = matmul(%x, %dx2) {transpose_a=true} : f32[8,16]
  return %loss, %dw
})");
  plan = planOf(*f);
  CHECK(plan.viewOf.lookup(namedValue(*f, "dx")) == namedValue(*f, "logits"));
  CHECK(plan.viewOf.lookup(namedValue(*f, "dx2")) == namedValue(*f, "logits"));  // a view of dlogits: the same bytes
  CHECK(plan.bufferOf.count(namedValue(*f, "loss")));
  CHECK(plan.buffers[plan.bufferOf.lookup(namedValue(*f, "logits"))].last == 5);

  // Logits read after the gradient, returned, or a graph input: dlogits get a buffer of their own.
  for (const char* text : {R"(graph @later(%x: f32[4,8], %t: i32[4]) params(%w: f32[8,16] init=zeros) {
  %logits = matmul(%x, %w) : f32[4,16]
  %one = full() {shape=[4], value=0.25} : f32[4]
  %dx = cross_entropy_grad(%one, %logits, %t) : f32[4,16]
  %s = neg(%logits) : f32[4,16]
  return %dx, %s
})",
                           R"(graph @returned(%x: f32[4,8], %t: i32[4]) params(%w: f32[8,16] init=zeros) {
  %logits = matmul(%x, %w) : f32[4,16]
  %one = full() {shape=[4], value=0.25} : f32[4]
  %dx = cross_entropy_grad(%one, %logits, %t) : f32[4,16]
  return %dx, %logits
})",
                           R"(graph @input(%logits: f32[4,16], %t: i32[4]) {
  %one = full() {shape=[4], value=0.25} : f32[4]
  %dx = cross_entropy_grad(%one, %logits, %t) : f32[4,16]
  return %dx
})"}) {
    auto h = parseTestGraph(text);
    INFO(h->name());
    plan = planOf(*h);
    CHECK(!plan.viewOf.count(namedValue(*h, "dx")));
    CHECK(plan.bufferOf.count(namedValue(*h, "dx")));
  }
}

TEST_CASE("memory plan: under megatron-tp 2 vocab_xent_grad writes over each rank's logits shard", "[memory][fuse_classifier]") {
  GptConfig g = test::smallGpt();
  g.heads = 8;
  g.paddedVocab = 1024;
  auto step = test::gptStep(g, 4, test::megatronTp(2) + test::kTrainPasses);
  auto ranks = test::rankGraphs(*step);
  REQUIRE(ranks.size() == 2);
  for (auto& r : ranks) {
    // Nothing for the pass to fuse: the sharded loss is other ops.
    auto changed = createFuseClassifierPass()->run(*r);
    REQUIRE(changed.ok());
    CHECK(!*changed);
    StepMemoryPlan plan = planOf(*r);
    int seen = 0;
    for (const Node* n : r->nodes()) {
      if (n->op() != OpKind::VocabXentGrad) continue;
      ++seen;
      const Value* mem = plan.viewOf.count(n->operand(1)) ? plan.viewOf.lookup(n->operand(1)) : n->operand(1);
      CHECK(plan.viewOf.lookup(n->result()) == mem);
    }
    CHECK(seen == 1);
  }
}

}  // namespace tpc
