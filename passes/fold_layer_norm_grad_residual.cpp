// `fold-layer-norm-grad-residual`: the residual-stream gradient sum after a layer_norm_grad becomes its
// residual operand, so that one kernel writes dx + residual (ops.def: the same bits as the add):
//   %dx, %dg, %db = layer_norm_grad(%dy, %x, %g); %s = add(%r, %dx)
//     => %s, %dg, %db = layer_norm_grad(%dy, %x, %g, %r)
// when the add (either operand order, not in a fusion group) is dx's only reader, dx is no graph output, r has
// dx's type and is defined before the layer_norm_grad (the fused node takes its place). For one rank's
// program (the CUDA backend runs it in rewriteForCuda).
#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class FoldLayerNormGradResidualPass final : public Pass {
 public:
  std::string_view name() const override { return "fold-layer-norm-grad-residual"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    auto users = g.computeUsers();
    llvm::DenseMap<const Node*, size_t> pos;
    size_t k = 0;
    for (Node* n : g.nodes()) pos[n] = k++;
    for (Node* add : g.nodeVector()) {
      if (add->op() != OpKind::Add || fusionGroupOf(*add) >= 0) continue;
      for (unsigned side = 0; side < 2; ++side) {
        Value* dx = add->operand(side);
        Value* r = add->operand(1 - side);
        Node* ln = dx->def();
        if (!ln || ln->op() != OpKind::LayerNormGrad || ln->numOperands() != 3 || dx != ln->result(0)) continue;
        auto u = users.lookup(dx);
        if (u.size() != 1 || g.isOutput(dx) || r == dx) continue;
        if (r->type() != dx->type() || add->result()->type() != dx->type()) continue;
        if (r->def() && pos.lookup(r->def()) > pos.lookup(ln)) continue;
        TPC_ASSIGN(Node * f, g.create(OpKind::LayerNormGrad, {ln->operand(0), ln->operand(1), ln->operand(2), r}, ln->attrs(), ln));
        f->setLoc(ln->loc());
        Value* sum = add->result();
        if (sum->hasName()) f->result(0)->setName(sum->name());
        for (unsigned i = 1; i < 3; ++i)
          if (ln->result(i)->hasName()) f->result(i)->setName(ln->result(i)->name());
        g.replaceAllUsesWith(sum, f->result(0));
        g.replaceAllUsesWith(ln->result(1), f->result(1));
        g.replaceAllUsesWith(ln->result(2), f->result(2));
        g.erase(add);
        g.erase(ln);
        users = g.computeUsers();
        pos.clear();
        k = 0;
        for (Node* n : g.nodes()) pos[n] = k++;
        changed = true;
        break;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createFoldLayerNormGradResidualPass() { return std::make_unique<FoldLayerNormGradResidualPass>(); }

}  // namespace tpc
