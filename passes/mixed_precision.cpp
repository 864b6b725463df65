// `mixed-precision(dtype=bf16)`: the forward graph computes in bf16 while parameters stay f32 masters
// (Megatron's bf16 mode, llm.c). Runs before autodiff, after the sharding policies (they match the f32
// graph's structure). Every f32 operand of a compute op is cast at its use, so activations, matmuls and
// attention run in bf16 and their kernels accumulate in f32; LayerNorm keeps f32 gamma/beta (its
// statistics are f32 inside the kernel); loss ops take bf16 logits and return f32, and everything
// downstream of a loss (the mean, the scalar loss) stays f32.
//   %y = matmul(%x, %w)         =>  %w.bf16 = cast(%w, to=bf16); %y = matmul(%x, %w.bf16)
// One cast per use, not per value: autodiff then gives each use its own f32 gradient (the cast's VJP) and
// sums them in f32 (a tied embedding's two uses); cse merges the duplicate forward casts afterwards.
#include <set>

#include "ir/shape_rules.h"
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class MixedPrecisionPass final : public Pass {
 public:
  explicit MixedPrecisionPass(DType d) : low_(d) {}
  std::string_view name() const override { return "mixed-precision"; }

  Result<bool> run(Graph& g) override {
    // On a training step the backward's values would be cast like the forward's, against the f32 gradients.
    for (Node* n : g.nodes())
      if (n->has(traits::Optimizer))
        return makeError("mixed-precision: run it before autodiff (it casts the forward graph's matmul operands; "
                         "autodiff then derives the backward in the same precision)");
    // Values computed from a loss keep f32.
    std::set<const Value*> lossRegion;
    for (Node* n : g.nodes()) {
      bool fromLoss = n->has(traits::Loss);
      for (Value* v : n->operands()) fromLoss = fromLoss || lossRegion.count(v);
      if (fromLoss)
        for (Value* r : n->results()) lossRegion.insert(r);
    }
    bool changed = false;
    for (Node* n : g.nodeVector()) {
      bool keepF32 = n->has(traits::Loss) || lossRegion.count(n->result(0)) || n->op() == OpKind::Cast ||
                     n->has(traits::Constant) || n->has(traits::Optimizer) || n->has(traits::Collective);
      std::vector<Value*> operands(n->operands().begin(), n->operands().end());
      for (unsigned i = 0; i < operands.size() && !keepF32; ++i) {
        if (operands[i]->dtype() != DType::f32) continue;
        if (n->op() == OpKind::LayerNorm && i > 0) continue;      // gamma, beta stay f32
        if (n->op() == OpKind::LayerNormGrad && i == 2) continue;  // gamma
        AttrDict a;
        a.set("to", Attr(low_));
        TPC_ASSIGN(Node * c, g.create(OpKind::Cast, {operands[i]}, std::move(a), n));
        operands[i] = c->result();
      }
      // Re-create the node so its result types follow its operands' (new or upstream-changed) types.
      std::vector<TensorType> types;
      for (Value* v : operands) types.push_back(v->type());
      TPC_ASSIGN(auto results, inferTypes(n->op(), types, n->attrs(), g.mesh()));
      bool same = true;
      for (unsigned i = 0; i < operands.size(); ++i) same = same && operands[i] == n->operand(i);
      for (unsigned r = 0; r < n->numResults(); ++r) same = same && results[r] == n->result(r)->type();
      if (same) continue;
      TPC_ASSIGN(Node * m, g.create(n->op(), operands, n->attrs(), n));
      m->setLoc(n->loc());
      for (unsigned r = 0; r < n->numResults(); ++r) {
        m->result(r)->setPlacement(n->result(r)->placement());
        if (n->result(r)->hasName()) m->result(r)->setName(n->result(r)->name());
        g.replaceAllUsesWith(n->result(r), m->result(r));
      }
      g.erase(n);
      changed = true;
    }
    return changed;
  }

 private:
  DType low_;
};

}  // namespace

Result<std::unique_ptr<Pass>> createMixedPrecisionPass(const PassOptions& opts) {
  std::string d = opts.getString("dtype", "bf16");
  if (d != "bf16" && d != "f16")
    return makeError("pass 'mixed-precision': option dtype=", d, " must be bf16 or f16");
  std::unique_ptr<Pass> p = std::make_unique<MixedPrecisionPass>(d == "bf16" ? DType::bf16 : DType::f16);
  return p;
}

}  // namespace tpc
