// The fuse-classifier pass (llm.c's fused classifier): the loss and its gradient from one read of the logits.
//   %loss = cross_entropy(%x, %t)   ...   %dloss = ...   %dx = cross_entropy_grad(%dloss, %x, %t)
//     =>  %dloss = ... (moved up)   %loss, %dx = cross_entropy_with_grad(%dloss, %x, %t)
// Same logits, targets and attributes. Only when nothing else reads the logits (no other node, not an
// output): the fused node is then their last reader and the memory plan writes dlogits over them (OpInfo's
// inPlace pair), so the step never holds both. dloss must not depend on the loss: in a training step it is
// the VJP seed of the mean (full, reshape, broadcast_to, scale; a loss-scale mul under fp16); the nodes it
// needs that come after the loss, all constants, movement or elementwise and not in a fusion group, move up
// to just before it. Runs on one rank's program (after partition: vocab-parallel losses are other ops).
#include <algorithm>
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
    // A step unrolled over micro-batches has a match per micro-batch: the readers and the program order are
    // computed once and kept up to date, not recomputed per match. Moved and created nodes get positions
    // between their neighbours'.
    auto users = g.computeUsers();
    llvm::DenseMap<const Node*, double> pos;
    const std::vector<Node*> nodes = g.nodeVector();
    for (size_t k = 0; k < nodes.size(); ++k) pos[nodes[k]] = static_cast<double>(k);
    for (Node* grad : nodes) {
      if (grad->op() != OpKind::CrossEntropyGrad) continue;
      Value *dloss = grad->operand(0), *x = grad->operand(1), *t = grad->operand(2);
      const auto& readers = users.lookup(x);
      if (g.isOutput(x) || readers.size() != 2) continue;
      Node* fwd = readers[0] == grad ? readers[1] : readers[0];
      // Its cross_entropy must come before it.
      if (fwd->op() != OpKind::CrossEntropy || !(pos.lookup(fwd) < pos.lookup(grad)) || fwd->operand(0) != x ||
          fwd->operand(1) != t || !sameLoss(*fwd, *grad))
        continue;
      auto moved = nodesToHoist(pos, fwd, dloss);
      if (!moved) continue;
      const double at = pos.lookup(fwd), slots = static_cast<double>(moved->size() + 2);
      for (size_t k = 0; k < moved->size(); ++k) {
        g.move((*moved)[k], fwd);
        pos[(*moved)[k]] = at - 1 + static_cast<double>(k + 1) / slots;
      }
      TPC_ASSIGN(Node * fused, g.create(OpKind::CrossEntropyWithGrad, {dloss, x, t}, grad->attrs(), fwd));
      pos[fused] = at - 1 + static_cast<double>(moved->size() + 1) / slots;
      for (auto [from, to] : {std::pair{fwd->result(), fused->result(0)}, std::pair{grad->result(), fused->result(1)}}) {
        auto fromReaders = users.lookup(from);
        g.replaceAllUsesWith(from, to, fromReaders);
        to->setPlacement(from->placement());
        users.erase(from);
        users[to] = std::move(fromReaders);
      }
      for (Value* v : {dloss, x, t}) {  // fused reads them now, instead of fwd and grad
        auto& r = users[v];
        r.erase(std::remove_if(r.begin(), r.end(), [&](Node* n) { return n == fwd || n == grad; }), r.end());
        r.push_back(fused);
      }
      std::string lossName = fwd->result()->name(), gradName = grad->result()->name();
      pos.erase(grad);
      pos.erase(fwd);
      g.erase(grad);
      g.erase(fwd);
      fused->result(0)->setName(lossName);
      fused->result(1)->setName(gradName);
      changed = true;
    }
    return changed;
  }

 private:
  // The nodes dloss needs that come after `fwd`, in program order; none when one of them is fwd itself (dloss
  // depends on the loss) or is not a cheap constant-like node that may move.
  static std::optional<std::vector<Node*>> nodesToHoist(const llvm::DenseMap<const Node*, double>& pos,
                                                        const Node* fwd, Value* dloss) {
    const double at = pos.lookup(fwd);
    llvm::DenseSet<const Node*> need;
    std::vector<Node*> out;
    std::vector<const Value*> work = {dloss};
    while (!work.empty()) {
      Node* d = work.back()->def();
      work.pop_back();
      if (!d || (d != fwd && !(pos.lookup(d) > at)) || !need.insert(d).second) continue;
      if (d == fwd || fusionGroupOf(*d) >= 0 ||
          !(d->has(traits::Constant) || d->has(traits::Movement) || d->has(traits::Elementwise)))
        return std::nullopt;
      out.push_back(d);
      for (const Value* v : d->operands()) work.push_back(v);
    }
    std::sort(out.begin(), out.end(), [&](const Node* a, const Node* b) { return pos.lookup(a) < pos.lookup(b); });
    return out;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseClassifierPass() { return std::make_unique<FuseClassifierPass>(); }

}  // namespace tpc
