// The fuse-classifier pass (llm.c's fused classifier): the loss and its gradient from one read of the logits.
//   %loss = cross_entropy(%x, %t)   ...   %dloss = ...   %dx = cross_entropy_grad(%dloss, %x, %t)
//     =>  %dloss = ... (moved up)   %loss, %dx = cross_entropy_with_grad(%dloss, %x, %t)
// Same logits, targets and attributes. Only when nothing else reads the logits (no other node, not an
// output): the fused node is then their last reader and the memory plan writes dlogits over them (OpInfo's
// inPlace pair), so the step never holds both. dloss must not depend on the loss: in a training step it is
// the VJP seed of the mean (full, reshape, broadcast_to, scale; a loss-scale mul under fp16); the nodes it
// needs that come after the loss, all constants, movement or elementwise and not in a fusion group, move up
// to just before it. Runs on one rank's program (after partition: vocab-parallel losses are other ops).
#include <optional>

#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {
namespace {

bool sameLoss(const Node& a, const Node& b) {
  return a.getInt("ignore_index") == b.getInt("ignore_index") && a.getInt("num_classes") == b.getInt("num_classes");
}

class FuseClassifierPass final : public Pass {
 public:
  std::string_view name() const override { return "fuse-classifier"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    auto users = g.computeUsers();
    llvm::DenseSet<const Node*> before;  // the nodes up to `grad`: its cross_entropy must be one of them
    for (Node* grad : g.nodeVector()) {
      before.insert(grad);
      if (grad->op() != OpKind::CrossEntropyGrad) continue;
      Value *dloss = grad->operand(0), *x = grad->operand(1), *t = grad->operand(2);
      const auto& readers = users.lookup(x);
      if (g.isOutput(x) || readers.size() != 2) continue;
      Node* fwd = readers[0] == grad ? readers[1] : readers[0];
      if (fwd->op() != OpKind::CrossEntropy || !before.count(fwd) || fwd->operand(0) != x || fwd->operand(1) != t ||
          !sameLoss(*fwd, *grad))
        continue;
      auto moved = nodesToHoist(g, fwd, dloss);
      if (!moved) continue;
      for (Node* n : *moved) g.move(n, fwd);
      TPC_ASSIGN(Node * fused, g.create(OpKind::CrossEntropyWithGrad, {dloss, x, t}, grad->attrs(), fwd));
      for (auto [from, to] : {std::pair{fwd->result(), fused->result(0)}, std::pair{grad->result(), fused->result(1)}}) {
        g.replaceAllUsesWith(from, to);
        to->setPlacement(from->placement());
      }
      std::string lossName = fwd->result()->name(), gradName = grad->result()->name();
      g.erase(grad);
      g.erase(fwd);
      fused->result(0)->setName(lossName);
      fused->result(1)->setName(gradName);
      users = g.computeUsers();
      changed = true;
    }
    return changed;
  }

 private:
  // The nodes dloss needs that come after `fwd`, in program order; none when one of them is fwd itself (dloss
  // depends on the loss) or is not a cheap constant-like node that may move.
  static std::optional<std::vector<Node*>> nodesToHoist(const Graph& g, const Node* fwd, Value* dloss) {
    llvm::DenseSet<const Node*> after;
    bool seen = false;
    for (Node* n : g.nodes()) {
      if (seen) after.insert(n);
      seen = seen || n == fwd;
    }
    llvm::DenseSet<const Node*> need;
    std::vector<const Value*> work = {dloss};
    while (!work.empty()) {
      const Node* d = work.back()->def();
      work.pop_back();
      if (!d || (!after.count(d) && d != fwd) || !need.insert(d).second) continue;
      if (d == fwd || fusionGroupOf(*d) >= 0 ||
          !(d->has(traits::Constant) || d->has(traits::Movement) || d->has(traits::Elementwise)))
        return std::nullopt;
      for (const Value* v : d->operands()) work.push_back(v);
    }
    std::vector<Node*> out;
    for (Node* n : g.nodes())
      if (need.count(n)) out.push_back(n);
    return out;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseClassifierPass() { return std::make_unique<FuseClassifierPass>(); }

}  // namespace tpc
