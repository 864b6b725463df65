// fold-vocab-padding: on one rank the loss reads the vocab-padded logits whole (cross_entropy num_classes)
// and its gradient comes out padded: no [B, T, V] slice copy nor concat with zeros is left, and training
// is bit-identical to the unfolded step.
#include <catch2/catch.hpp>

#include <random>

#include "gpt_step_support.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> trainingStep(bool fold) {
  GptConfig gc = test::smallGpt();
  gc.hidden = 32;
  gc.heads = 2;
  gc.paddedVocab = 128;
  gc.positions = 8;
  return test::gptStep(gc, 2, std::string("autodiff,cse,dce") + (fold ? ",fold-vocab-padding" : ""));
}

// The nodes that copy logits-sized data on the class dim: slices and concats of a [.., 100|128] value.
int logitsCopies(const Graph& g) {
  int n = 0;
  for (const Node* node : g.nodes())
    if ((node->op() == OpKind::Slice || node->op() == OpKind::Concat) && node->result()->shape().back() >= 100) ++n;
  return n;
}

std::vector<float> losses(const Graph& g) {
  CpuOptions o;
  o.threads = 1;
  auto b = test::preparedCpuBackend(g, o, 3);
  std::mt19937 rng(7);
  test::TrainBatches batches;
  batches.shape = {2, 8};
  std::vector<float> out;
  for (double loss : test::trainLosses(*b, rng, 3, batches)) out.push_back(static_cast<float>(loss));
  return out;
}

TEST_CASE("fold-vocab-padding: no logits slice or concat is left and the losses are bit-identical", "[passes][vocab]") {
  auto plain = trainingStep(false), folded = trainingStep(true);
  CHECK(logitsCopies(*plain) == 2);  // the forward slice to 100 classes, the backward concat with 28 zero columns
  CHECK(logitsCopies(*folded) == 0);
  int withClasses = 0;
  for (const Node* n : folded->nodes())
    if (n->op() == OpKind::CrossEntropy || n->op() == OpKind::CrossEntropyGrad) {
      CHECK(n->getInt("num_classes") == 100);
      CHECK(n->operand(n->op() == OpKind::CrossEntropy ? 0 : 1)->shape().back() == 128);
      ++withClasses;
    }
  CHECK(withClasses == 2);
  std::vector<float> a = losses(*plain), b = losses(*folded);
  REQUIRE(a.size() == 3);
  CHECK(a == b);
}

}  // namespace
}  // namespace tpc
