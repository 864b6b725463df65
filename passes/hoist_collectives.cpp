// `hoist-collectives`: each collective moves up to just after the node that produces its operand (after the
// last member of that node's fusion group, whose kernel produces it) and after the previous collective (the
// collectives keep their order), with a reshape only it reads moving along. The nodes it passes over (a
// weight gradient's matmul next to the activation gradient being all-reduced) then run while it does, on
// the CUDA backend's communication stream. One rank's program; only the order changes:
//   %dx = matmul(...); %dw = matmul(...); %s = all_reduce(%dx)  =>  %dx = ...; %s = all_reduce(%dx); %dw = ...
#include <algorithm>

#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class HoistCollectivesPass final : public Pass {
 public:
  std::string_view name() const override { return "hoist-collectives"; }

  Result<bool> run(Graph& g) override {
    auto users = g.computeUsers();
    bool changed = false;
    Node* previous = nullptr;  // the last collective placed
    for (Node* c : g.nodeVector()) {
      if (!c->has(traits::Collective)) continue;
      std::vector<Node*> order = g.nodeVector();
      llvm::DenseMap<const Node*, int> pos;
      llvm::DenseMap<int64_t, int> groupEnd;
      for (int k = 0; k < static_cast<int>(order.size()); ++k) {
        pos[order[k]] = k;
        if (int64_t id = fusionGroupOf(*order[k]); id >= 0) groupEnd[id] = k;
      }
      // Reshapes read only by the collective (a chain of them) move with it.
      std::vector<Node*> along;
      int anchor = previous ? pos[previous] : -1;
      std::vector<Value*> reads(c->operands().begin(), c->operands().end());
      while (!reads.empty()) {
        Value* v = reads.back();
        reads.pop_back();
        Node* d = v->def();
        if (!d) continue;
        if (d->op() == OpKind::Reshape && fusionGroupOf(*d) < 0 && users.lookup(v).size() == 1 && !g.isOutput(v)) {
          along.insert(along.begin(), d);
          reads.push_back(d->operand(0));
          continue;
        }
        int64_t id = fusionGroupOf(*d);
        anchor = std::max(anchor, id >= 0 ? groupEnd[id] : pos[d]);
      }
      // Already there (or the chain of reshapes is interleaved with what it waits for): left alone.
      Node* before = order[static_cast<size_t>(anchor + 1)];
      if (before != c && std::find(along.begin(), along.end(), before) == along.end()) {
        for (Node* a : along) g.move(a, before);
        g.move(c, before);
        changed = true;
      }
      previous = c;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createHoistCollectivesPass() { return std::make_unique<HoistCollectivesPass>(); }

}  // namespace tpc
