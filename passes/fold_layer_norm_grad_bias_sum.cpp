// `fold-layer-norm-grad-bias-sum`: the bias gradient summed from a layer_norm_grad's dx becomes that node's
// fourth result (ops.def: sum_dx), so that the kernel writing dx also sums it and dx is not read again for it:
//   %dx, %dg, %db = layer_norm_grad(%dy, %x, %g[, %r]); %s = reduce_sum(%dx) {axes=[0, .., rank-2]}
//     => %dx, %dg, %db, %s = layer_norm_grad(%dy, %x, %g[, %r]) {sum_dx=true}
// when the reduce_sum sums exactly the leading dims (keepdims false) and `canSum` accepts the layer_norm_grad.
// dx keeps its other readers. The bias gradients of the attention projection and the second MLP matmul of
// a GPT are such sums (the residual stream's gradient). For one rank's program (the CUDA backend runs it in
// rewriteForCuda, after fold-layer-norm-grad-residual).
#include <functional>

#include "passes/builtin_passes.h"
#include "passes/node_patterns.h"

namespace tpc {
namespace {

class FoldLayerNormGradBiasSumPass final : public Pass {
 public:
  explicit FoldLayerNormGradBiasSumPass(std::function<bool(const Node&)> canSum) : canSum_(std::move(canSum)) {}
  std::string_view name() const override { return "fold-layer-norm-grad-bias-sum"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    for (Node* sum : g.nodeVector()) {
      if (!sumsAllButLast(*sum) || sum->result()->placement()) continue;
      Value* dx = sum->operand(0);
      Node* ln = dx->def();
      if (!ln || ln->op() != OpKind::LayerNormGrad || ln->getBool("sum_dx") || dx != ln->result(0)) continue;
      if (sum->result()->dtype() != dx->dtype() || (canSum_ && !canSum_(*ln))) continue;
      AttrDict attrs = ln->attrs();
      attrs.set("sum_dx", Attr(true));
      TPC_ASSIGN(Node * f, g.create(OpKind::LayerNormGrad, ln->operands(), attrs, ln));
      f->setLoc(ln->loc());
      for (unsigned i = 0; i < 3; ++i) {
        if (ln->result(i)->hasName()) f->result(i)->setName(ln->result(i)->name());
        g.replaceAllUsesWith(ln->result(i), f->result(i));
      }
      if (sum->result()->hasName()) f->result(3)->setName(sum->result()->name());
      g.replaceAllUsesWith(sum->result(), f->result(3));
      g.erase(sum);
      g.erase(ln);
      changed = true;
    }
    return changed;
  }

 private:
  std::function<bool(const Node&)> canSum_;
};

}  // namespace

std::unique_ptr<Pass> createFoldLayerNormGradBiasSumPass(std::function<bool(const Node&)> canSum) {
  return std::make_unique<FoldLayerNormGradBiasSumPass>(std::move(canSum));
}

}  // namespace tpc
