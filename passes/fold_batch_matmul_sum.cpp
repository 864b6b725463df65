// `fold-batch-matmul-sum`: a weight gradient as one matmul over all rows of the batch instead of one
// matmul per batch index summed afterwards (autodiff's vjpMatmul + reduceTo write the latter):
//   %p = matmul(%a: [b..., T, K], %d: [b..., T, N]) {transpose_a=true} : [b..., K, N]
//   %g = reduce_sum(%p) {axes=[every batch axis]} : [K, N]
//     =>  %g = matmul(reshape(%a, [b*T, K]), reshape(%d, [b*T, N])) {transpose_a=true} : [K, N]
// No [b..., K, N] intermediate is stored (for gpt2's LM head [8, 50304, 768]) and the sum over the batch
// accumulates in the matmul's f32 accumulator instead of rounding each batch index's product first.
// For one rank's program (after partition, or an unsharded step): the rows it folds are local. The CUDA
// backend runs it; the CPU backend does not, so its results stay bit-identical to the reference loops.
#include <algorithm>
#include <numeric>

#include "ir/assert.h"
#include "passes/builtin_passes.h"

namespace tpc {
namespace {

class FoldBatchMatmulSumPass final : public Pass {
 public:
  std::string_view name() const override { return "fold-batch-matmul-sum"; }

  Result<bool> run(Graph& g) override {
    auto users = g.computeUsers();
    bool changed = false;
    for (Node* n : g.nodeVector()) {
      Node* m = match(g, *n, users);
      if (!m) continue;
      Value *a = m->operand(0), *d = m->operand(1);
      const int64_t r = a->type().rank();
      int64_t rows = 1;
      for (int64_t k = 0; k + 1 < r; ++k) rows *= a->shape()[k];
      auto flat = [&](Value* v) -> Result<Value*> {
        AttrDict s;
        s.set("shape", std::vector<int64_t>{rows, v->shape()[r - 1]});
        TPC_ASSIGN(Node * rs, g.create(OpKind::Reshape, {v}, std::move(s), n));
        return rs->result();
      };
      TPC_ASSIGN(Value * af, flat(a));
      TPC_ASSIGN(Value * df, flat(d));
      AttrDict t;
      t.set("transpose_a", true);
      TPC_ASSIGN(Node * mm, g.create(OpKind::Matmul, {af, df}, std::move(t), n));
      mm->setLoc(n->loc());
      TPC_ASSERT_GRAPH(g, mm->result()->type() == n->result()->type(),
                 "fold-batch-matmul-sum: the folded matmul's type " + mm->result()->type().str() + " differs from " +
                     n->result()->type().str());
      if (n->result()->hasName()) mm->result()->setName(n->result()->name());
      g.replaceAllUsesWith(n->result(), mm->result());
      g.erase(n);
      g.erase(m);
      changed = true;
    }
    return changed;
  }

 private:
  // The matmul of `n` when n is reduce_sum(matmul(a, d) {transpose_a}) over exactly the batch axes, a and d
  // have the same batch dims (no broadcast), and nothing else reads the matmul; else null.
  static Node* match(const Graph& g, const Node& n, const llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>& users) {
    if (n.op() != OpKind::ReduceSum || n.getBool("keepdims")) return nullptr;
    Node* m = n.operand(0)->def();
    if (!m || m->op() != OpKind::Matmul || !m->getBool("transpose_a") || m->getBool("transpose_b")) return nullptr;
    // A global graph after propagation places every value; the new ones would need placements too.
    if (m->result()->placement() || g.isOutput(m->result())) return nullptr;
    auto u = users.find(m->result());
    if (u == users.end() || u->second.size() != 1) return nullptr;
    const Shape &as = m->operand(0)->shape(), &ds = m->operand(1)->shape();
    const int64_t r = static_cast<int64_t>(as.size());
    if (r < 3 || static_cast<int64_t>(ds.size()) != r) return nullptr;
    if (!std::equal(as.begin(), as.end() - 1, ds.begin())) return nullptr;  // same batch dims and rows T
    std::vector<int64_t> axes = n.getInts("axes");
    for (int64_t& ax : axes)
      if (ax < 0) ax += r;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> batch(static_cast<size_t>(r - 2));
    std::iota(batch.begin(), batch.end(), 0);
    return axes == batch ? m : nullptr;
  }
};

}  // namespace

std::unique_ptr<Pass> createFoldBatchMatmulSumPass() { return std::make_unique<FoldBatchMatmulSumPass>(); }

}  // namespace tpc
