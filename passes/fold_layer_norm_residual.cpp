// `fold-layer-norm-residual`: the forward residual stream's add that a layer_norm reads becomes the layer_norm's
// residual operand, so that one kernel writes the sum and normalizes it (ops.def: the add's bits):
//   %s = add(%t, %r); %y = layer_norm(%s, %g, %b)  =>  %y, %s = layer_norm(%t, %g, %b, %r)
// and, after fold-matmul-epilogues took the add into a GEMM (cuBLASLt's BIAS with C = r, beta 1):
//   %s = matmul_epilogue {bias} (%a, %w, %bias, %r); %y = layer_norm(%s, %g, %b)
//     => %t = matmul_epilogue {bias} (%a, %w, %bias); %y, %s = layer_norm(%t, %g, %b, %r)
// The GEMM then writes t without reading r; the layer_norm, which reads s's row anyway, reads t and r and writes
// s too. On an H100 that was slower (docs/performance.md), so the CUDA backend runs it only with
// TPC_LN_RESIDUAL=1. When: s is the layer_norm's x and no graph output, every other reader of s comes after the
// layer_norm, the add is in no fusion group and its operands have s's type; `accept(layer_norm)` may refuse (the CUDA kernel: rows of at most 2048), and
// `acceptGemm(matmul_epilogue)` the bias GEMM without its residual (the CUDA backend's epilogue list and
// cuBLASLt's support: then nothing changes). For one rank's program (the CUDA backend runs it in rewriteForCuda,
// after fold-matmul-epilogues).
#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class FoldLayerNormResidualPass final : public Pass {
 public:
  FoldLayerNormResidualPass(std::function<bool(const Node&)> accept, std::function<bool(const Node&)> acceptGemm)
      : accept_(std::move(accept)), acceptGemm_(std::move(acceptGemm)) {}
  std::string_view name() const override { return "fold-layer-norm-residual"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    auto users = g.computeUsers();
    llvm::DenseMap<const Node*, size_t> pos;
    auto number = [&] {
      pos.clear();
      size_t k = 0;
      for (Node* n : g.nodes()) pos[n] = k++;
    };
    number();
    for (Node* ln : g.nodeVector()) {
      if (ln->op() != OpKind::LayerNorm || ln->numOperands() != 3) continue;
      if (accept_ && !accept_(*ln)) continue;
      Value* s = ln->operand(0);
      Node* def = s->def();
      if (!def || g.isOutput(s)) continue;
      bool later = true;
      for (Node* u : users.lookup(s)) later &= u == ln || pos.lookup(u) > pos.lookup(ln);
      if (!later) continue;
      // The sum's two terms: (t, r) of an add, or the epilogue GEMM without its residual and r.
      Value *t = nullptr, *r = nullptr;
      if (def->op() == OpKind::Add && fusionGroupOf(*def) < 0 && def->operand(0)->type() == s->type() &&
          def->operand(1)->type() == s->type()) {
        t = def->operand(0);
        r = def->operand(1);
      } else if (def->op() == OpKind::MatmulEpilogue && def->getStr("epilogue") == "bias" && def->numOperands() == 4 &&
                 def->numResults() == 1 && def->operand(3)->type() == s->type()) {
        TPC_ASSIGN(Node * gemm, g.create(OpKind::MatmulEpilogue, {def->operand(0), def->operand(1), def->operand(2)},
                                         def->attrs(), def));
        if (acceptGemm_ && !acceptGemm_(*gemm)) {
          g.erase(gemm);
          continue;
        }
        gemm->setLoc(def->loc());
        t = gemm->result();
        r = def->operand(3);
      } else {
        continue;
      }
      TPC_ASSIGN(Node * f, g.create(OpKind::LayerNorm, {t, ln->operand(1), ln->operand(2), r}, ln->attrs(), ln));
      f->setLoc(ln->loc());
      if (ln->result()->hasName()) f->result(0)->setName(ln->result()->name());
      if (s->hasName()) f->result(1)->setName(s->name());
      g.replaceAllUsesWith(ln->result(), f->result(0));
      g.replaceAllUsesWith(s, f->result(1));
      g.erase(ln);
      g.erase(def);
      users = g.computeUsers();
      number();
      changed = true;
    }
    return changed;
  }

 private:
  std::function<bool(const Node&)> accept_, acceptGemm_;
};

}  // namespace

std::unique_ptr<Pass> createFoldLayerNormResidualPass(std::function<bool(const Node&)> accept,
                                                      std::function<bool(const Node&)> acceptGemm) {
  return std::make_unique<FoldLayerNormResidualPass>(std::move(accept), std::move(acceptGemm));
}

}  // namespace tpc
