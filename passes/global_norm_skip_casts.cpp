// `global-norm-skip-casts`: global_norm (and sum_squares, its sharded form: each rank's partial sum before the
// all-reduce) reads a bf16/f16 gradient itself instead of its f32 cast:
//   %c = cast(%g: bf16[...]) {to=f32}    %n = global_norm(..., %c, ...)
//     =>  %n = global_norm(..., %g, ...)
// Widening bf16/f16 to f32 is exact and global_norm squares in f32 whatever it reads, so the norm is the same
// bits. Under mixed precision every gradient is cast to its f32 parameter's type before clipping; once the
// norm no longer reads the cast, its only reader is the clip multiply feeding AdamW, and the CUDA backend
// folds both into the multi-tensor AdamW kernel (runtime/cuda/adamw_groups.h): no f32 copy of the gradients
// and two launches fewer per parameter. The CUDA backend runs it; the CPU backend keeps the graph as built.
#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {
namespace {

bool exactWidening(const Node* c) {
  if (!c || c->op() != OpKind::Cast || c->result()->dtype() != DType::f32) return false;
  DType from = c->operand(0)->dtype();
  return from == DType::bf16 || from == DType::f16 || from == DType::f32;
}

class GlobalNormSkipCastsPass final : public Pass {
 public:
  std::string_view name() const override { return "global-norm-skip-casts"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    std::vector<Node*> bypassed;
    for (Node* n : g.nodeVector()) {
      if (n->op() != OpKind::GlobalNorm && n->op() != OpKind::SumSquares) continue;
      for (unsigned k = 0; k < n->numOperands(); ++k) {
        Node* c = n->operand(k)->def();
        // A cast in a fusion group is computed inside the group's kernel; its source may not be stored.
        if (!exactWidening(c) || fusionGroupOf(*c) >= 0) continue;
        n->setOperand(k, c->operand(0));
        bypassed.push_back(c);
        changed = true;
      }
    }
    auto users = g.computeUsers();
    llvm::DenseSet<Node*> erased;
    for (Node* c : bypassed) {  // the casts nothing reads any more
      auto u = users.find(c->result());
      if ((u == users.end() || u->second.empty()) && !g.isOutput(c->result()) && erased.insert(c).second) g.erase(c);
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createGlobalNormSkipCastsPass() { return std::make_unique<GlobalNormSkipCastsPass>(); }

}  // namespace tpc
