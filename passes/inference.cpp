// `inference`: the forward graph as evaluation and sampling run it: every dropout becomes the identity
// and attention drops nothing (Megatron's model.eval()).   %y = dropout(%x, p=0.1)  =>  uses of %y read %x
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class InferencePass final : public Pass {
 public:
  std::string_view name() const override { return "inference"; }
  Result<bool> run(Graph& g) override {
    bool changed = false;
    for (Node* n : g.nodeVector()) {
      if (n->op() == OpKind::Dropout) {
        g.replaceAllUsesWith(n->result(), n->operand(0));
        g.erase(n);
        changed = true;
      } else if (n->has(traits::Contraction | traits::Random) && n->getFloat("dropout") != 0) {
        n->setAttr("dropout", Attr(0.0));
        changed = true;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createInferencePass() { return std::make_unique<InferencePass>(); }

}  // namespace tpc
