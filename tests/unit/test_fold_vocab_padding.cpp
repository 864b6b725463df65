// fold-vocab-padding: on one rank the loss reads the vocab-padded logits whole (cross_entropy num_classes)
// and its gradient comes out padded: no [B, T, V] slice copy nor concat with zeros is left, and training
// is bit-identical to the unfolded step.
#include <catch2/catch.hpp>

#include <random>

#include "models/gpt.h"
#include "passes/pipeline.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> trainingStep(bool fold) {
  GptConfig gc;
  gc.layers = 2;
  gc.hidden = 32;
  gc.heads = 2;
  gc.vocab = 100;
  gc.paddedVocab = 128;
  gc.positions = 8;
  TrainConfig tc;
  tc.microBatch = tc.globalBatch = 2;
  tc.seqLength = 8;
  auto m = buildGpt(gc, tc);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  PassManager pm;
  REQUIRE(pm.addPipeline(std::string("autodiff,cse,dce") + (fold ? ",fold-vocab-padding" : "")).ok());
  Status s = pm.run(*g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  return g;
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
  auto b = createCpuBackend(o);
  TensorMap state;
  for (const Value* p : g.params()) state[p->name()] = initParam(*p, 3);
  REQUIRE(b->prepare(g, state).ok());
  std::mt19937 rng(7);
  std::vector<float> out;
  for (int64_t s = 0; s < 3; ++s) {
    TensorMap in;
    for (const char* name : {"tokens", "targets"}) {
      HostTensor t(TensorType(DType::i32, Shape{2, 8}));
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
      in[name] = t;
    }
    in["lr"] = HostTensor::scalarF32(1e-3f);
    in["step"] = HostTensor::scalarF32(float(s + 1));
    auto r = b->step(in, s + 1);
    REQUIRE(r.ok());
    out.push_back(r->at("loss").data<float>()[0]);
  }
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
