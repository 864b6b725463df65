// An example tpc pass plugin: `fold-scales` folds chains of scale ops.
//   scale(scale(%x, a), b) => scale(%x, a*b)        scale(%x, 1.0) => %x
// Build it like this file's CMakeLists.txt does, then:
//   tpc opt model.tir --pass-plugin=./libtpc_fold_scales.so --passes=fold-scales,dce
#include "passes/pass_registry.h"
#include "passes/plugin.h"

#ifndef TPC_EXAMPLE_PLUGIN_API_VERSION
#define TPC_EXAMPLE_PLUGIN_API_VERSION TPC_PASS_PLUGIN_API_VERSION
#endif

namespace {

class FoldScalesPass final : public tpc::Pass {
 public:
  explicit FoldScalesPass(bool dropIdentity) : dropIdentity_(dropIdentity) {}
  std::string_view name() const override { return "fold-scales"; }

  tpc::Result<bool> run(tpc::Graph& g) override {
    bool changed = false;
    for (tpc::Node* n : g.nodeVector()) {
      if (n->op() != tpc::OpKind::Scale) continue;
      tpc::Node* producer = n->operand(0)->def();
      // scale(scale(x, a), b) => scale(x, a*b): read x directly; the inner scale dies if unused (dce).
      if (producer && producer->op() == tpc::OpKind::Scale) {
        n->setAttr("factor", producer->getFloat("factor") * n->getFloat("factor"));
        n->setOperand(0, producer->operand(0));
        changed = true;
      }
      // scale(x, 1.0) => x
      if (dropIdentity_ && n->getFloat("factor") == 1.0) {
        g.replaceAllUsesWith(n->result(), n->operand(0));
        g.erase(n);
        changed = true;
      }
    }
    return changed;
  }

 private:
  bool dropIdentity_;
};

void registerPasses(tpc::PassRegistry* registry) {
  (void)registry->add({"fold-scales",
                       "folds scale(scale(x, a), b) into scale(x, a*b) and drops scale(x, 1.0) (example plugin)",
                       {{"drop-identity", "remove scale(x, 1.0) (default true)"}},
                       [](const tpc::PassOptions& o) -> tpc::Result<std::unique_ptr<tpc::Pass>> {
                         TPC_ASSIGN(bool drop, o.getBool("drop-identity", true));
                         return std::unique_ptr<tpc::Pass>(new FoldScalesPass(drop));
                       }});
}

}  // namespace

extern "C" TpcPassPluginInfo tpcPassPluginInfo() {
  return {TPC_EXAMPLE_PLUGIN_API_VERSION, "fold-scales", "1.0", &registerPasses};
}
