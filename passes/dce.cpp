// Dead code elimination: nodes none of whose results reach a graph output are removed.
#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {
namespace {

class DCEPass final : public Pass {
 public:
  std::string_view name() const override { return "dce"; }

  Result<bool> run(Graph& g) override {
    llvm::DenseSet<const Value*> live;
    for (const GraphOutput& o : g.outputs()) live.insert(o.value);
    std::vector<Node*> nodes = g.nodeVector();
    bool changed = false;
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      Node* n = *it;
      bool used = false;
      for (Value* r : n->results()) used = used || live.count(r);
      if (!used) {
        g.erase(n);
        changed = true;
        continue;
      }
      for (Value* v : n->operands()) live.insert(v);
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createDCEPass() { return std::make_unique<DCEPass>(); }

}  // namespace tpc
