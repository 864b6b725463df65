// `fold-matmul-epilogues`: the elementwise ops and bias sums around a matmul become one matmul_epilogue
// node (ops.def), which the CUDA backend runs as one cuBLASLt call with an epilogue (bgrad_a, and dgelu_bgrad where
// it asks, as its own sm_90 GEMM kernel: runtime/cuda/kernels/gemm_sm90.cpp). Rules, in this order:
//   gelu(add(matmul(a, b), bias))              => %y, %pre = matmul_epilogue(a, b, bias) {epilogue=gelu_bias}
//   add(res, add(matmul(a, b), bias))          => matmul_epilogue(a, b, bias, res) {epilogue=bias}
//   add(matmul(a, b), bias)                    => matmul_epilogue(a, b, bias) {epilogue=bias}
//   reduce_sum(gelu_grad(matmul(a, b), pre))   => %g, %db = matmul_epilogue(a, b, pre) {epilogue=dgelu_bgrad}
//   gelu_grad(matmul(a, b), pre)               => matmul_epilogue(a, b, pre) {epilogue=dgelu}
//   reduce_sum(d) beside matmul(d or reshape(d), w)            (an input gradient and its bias gradient)
//                                              => %dx, %db = matmul_epilogue(d, w) {epilogue=bgrad_a}
//   reduce_sum(d) beside matmul(x, reshape(d)) {transpose_a}   (a weight gradient and its bias gradient)
//                                              => %w, %db = matmul_epilogue(x, reshape(d)) {epilogue=bgrad_b}
// bias is [N]; the sums are over every dim but the last. The matmul's result must have no other reader.
// `canRun` (the CUDA backend asks cuBLASLt's heuristic) may refuse a candidate: the unfused ops then stay.
// For one rank's program after fuse: a fusion group left with one member is ungrouped.
#include <algorithm>
#include <functional>
#include <map>

#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"
#include "passes/node_patterns.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace tpc {
namespace {

class FoldMatmulEpiloguesPass final : public Pass {
 public:
  explicit FoldMatmulEpiloguesPass(std::function<bool(const Node&)> canRun) : canRun_(std::move(canRun)) {}
  std::string_view name() const override { return "fold-matmul-epilogues"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    using Rule = Result<bool> (FoldMatmulEpiloguesPass::*)(Graph&, Node*);
    // gelu before bias (it takes the bias add too); dgelu before bgrad_a and bgrad_b (it may take the bias sum);
    // bgrad_a (the input gradient's GEMM sums it) before bgrad_b (the weight gradient's).
    for (Rule rule : {&FoldMatmulEpiloguesPass::geluBias, &FoldMatmulEpiloguesPass::bias,
                      &FoldMatmulEpiloguesPass::dgelu, &FoldMatmulEpiloguesPass::bgradA,
                      &FoldMatmulEpiloguesPass::bgradB}) {
      dead_.clear();
      refresh(g);
      for (Node* n : g.nodeVector()) {
        if (dead_.count(n)) continue;
        TPC_ASSIGN(bool did, (this->*rule)(g, n));
        if (!did) continue;
        changed = true;
        refresh(g);
      }
    }
    if (changed) ungroupSingletons(g);
    return changed;
  }

 private:
  std::function<bool(const Node&)> canRun_;
  llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>> users_;
  llvm::DenseMap<const Node*, size_t> pos_;
  llvm::SmallPtrSet<Node*, 32> dead_;

  void refresh(const Graph& g) {
    users_ = g.computeUsers();
    pos_.clear();
    size_t k = 0;
    for (Node* n : g.nodes()) pos_[n] = k++;
  }
  llvm::ArrayRef<Node*> users(const Value* v) const {
    auto it = users_.find(v);
    return it == users_.end() ? llvm::ArrayRef<Node*>() : llvm::ArrayRef<Node*>(it->second);
  }

  // The matmul defining v when cuBLASLt can run it as one GEMM with an epilogue (b 2-D, a 2-D when
  // transposed) and `reader` is the only reader of its result; else null.
  Node* soleMatmul(const Graph& g, const Value* v, const Node* reader) const {
    Node* m = v->def();
    if (!m || m->op() != OpKind::Matmul || m->result()->placement() || g.isOutput(v)) return nullptr;
    if (m->operand(1)->type().rank() != 2 || (m->getBool("transpose_a") && m->operand(0)->type().rank() != 2)) return nullptr;
    llvm::ArrayRef<Node*> u = users(v);
    return u.size() == 1 && u[0] == reader ? m : nullptr;
  }
  static bool isBias(const Value* bias, const Value* mm) {
    return bias->type() == TensorType(mm->dtype(), {mm->shape().back()});
  }
  // Whether v is computed inside one of the fusion groups the removed nodes belong to (the new node,
  // outside every group, would read it before that group's kernel has run).
  static bool inGroupOf(const Value* v, std::initializer_list<const Node*> removed) {
    int64_t gv = v->def() ? fusionGroupOf(*v->def()) : -1;
    if (gv < 0) return false;
    return std::any_of(removed.begin(), removed.end(), [&](const Node* r) { return fusionGroupOf(*r) == gv; });
  }
  // Creates matmul_epilogue(operands) from matmul m's flags before `before`; null when canRun_ refuses it.
  Result<Node*> candidate(Graph& g, const Node& m, const std::string& epilogue, llvm::ArrayRef<Value*> operands,
                          Node* before) {
    AttrDict attrs;
    attrs.set("epilogue", epilogue);
    if (m.getBool("transpose_a")) attrs.set("transpose_a", true);
    if (m.getBool("transpose_b")) attrs.set("transpose_b", true);
    TPC_ASSIGN(Node * e, g.create(OpKind::MatmulEpilogue, operands, std::move(attrs), before));
    e->setLoc(m.loc());
    if (canRun_ && !canRun_(*e)) {
      g.erase(e);
      return nullptr;
    }
    return e;
  }
  // Every reader of `from[i]` reads e's result i; the old nodes go.
  void replace(Graph& g, Node* e, std::initializer_list<Value*> from, std::initializer_list<Node*> erase) {
    unsigned i = 0;
    for (Value* v : from) {
      Value* to = e->result(i++);
      if (v->hasName()) to->setName(v->name());
      g.replaceAllUsesWith(v, to);
    }
    for (Node* n : erase) {
      dead_.insert(n);
      g.erase(n);
    }
  }

  // gelu(add(matmul, bias)) => gelu_bias; the add's result (gelu_grad reads it) becomes the aux result.
  Result<bool> geluBias(Graph& g, Node* n) {
    if (n->op() != OpKind::Gelu) return false;
    Node* add = n->operand(0)->def();
    if (!add || add->op() != OpKind::Add || add->result()->type() != n->result()->type()) return false;
    for (unsigned k : {0u, 1u}) {
      Node* m = soleMatmul(g, add->operand(k), add);
      Value* bias = add->operand(1 - k);
      if (!m || !isBias(bias, m->result()) || inGroupOf(bias, {add, n})) continue;
      TPC_ASSIGN(Node * e, (candidate(g, *m, "gelu_bias", {m->operand(0), m->operand(1), bias}, add)));
      if (!e) return false;
      replace(g, e, {n->result(), add->result()}, {n, add, m});
      return true;
    }
    return false;
  }

  // add(matmul, bias), with the residual add that is its only reader when there is one.
  Result<bool> bias(Graph& g, Node* n) {
    if (n->op() != OpKind::Add || n->result()->placement()) return false;
    for (unsigned k : {0u, 1u}) {
      Node* m = soleMatmul(g, n->operand(k), n);
      Value* bias = n->operand(1 - k);
      if (!m || n->result()->type() != m->result()->type() || !isBias(bias, m->result()) || inGroupOf(bias, {n}))
        continue;
      llvm::ArrayRef<Node*> u = users(n->result());
      if (u.size() == 1 && u[0]->op() == OpKind::Add && !g.isOutput(n->result())) {
        Node* r = u[0];
        Value* res = r->operand(0) == n->result() ? r->operand(1) : r->operand(0);
        if (res != n->result() && res->type() == n->result()->type() && r->result()->type() == res->type() &&
            !inGroupOf(res, {n, r})) {
          TPC_ASSIGN(Node * e, (candidate(g, *m, "bias", {m->operand(0), m->operand(1), bias, res}, r)));
          if (e) {
            replace(g, e, {r->result()}, {r, n, m});
            return true;
          }
        }
      }
      TPC_ASSIGN(Node * e, (candidate(g, *m, "bias", {m->operand(0), m->operand(1), bias}, n)));
      if (!e) return false;
      replace(g, e, {n->result()}, {n, m});
      return true;
    }
    return false;
  }

  // gelu_grad(matmul, pre), with the bias sum of its result when there is one.
  Result<bool> dgelu(Graph& g, Node* n) {
    if (n->op() != OpKind::GeluGrad) return false;
    Node* m = soleMatmul(g, n->operand(0), n);
    Value* pre = n->operand(1);
    if (!m || pre->type() != m->result()->type() || inGroupOf(pre, {n})) return false;
    Node* sum = nullptr;
    for (Node* u : users(n->result()))
      if (sumsAllButLast(*u) && !u->result()->placement()) sum = u;
    if (sum) {
      TPC_ASSIGN(Node * e, (candidate(g, *m, "dgelu_bgrad", {m->operand(0), m->operand(1), pre}, n)));
      if (e) {
        replace(g, e, {n->result(), sum->result()}, {sum, n, m});
        return true;
      }
    }
    TPC_ASSIGN(Node * e, (candidate(g, *m, "dgelu", {m->operand(0), m->operand(1), pre}, n)));
    if (!e) return false;
    replace(g, e, {n->result()}, {n, m});
    return true;
  }

  // Moves the reshapes among `operands` defined at or after `at` up to it (their sources defined before it); false
  // when an operand is defined there otherwise.
  bool hoistBefore(Graph& g, Node* at, std::initializer_list<Value*> operands) {
    std::vector<Node*> hoist;
    for (Value* v : operands) {
      Node* def = v->def();
      if (!def || pos_.lookup(def) < pos_.lookup(at)) continue;
      Node* src = def->op() == OpKind::Reshape ? def->operand(0)->def() : nullptr;
      if (def->op() == OpKind::Reshape && (!src || pos_.lookup(src) < pos_.lookup(at))) hoist.push_back(def);
      else return false;
    }
    for (Node* h : hoist) g.move(h, at);
    return true;
  }

  // The bias sum n and matmul m (which reads the summed tensor) as one `epilogue` (bgrad_a or bgrad_b) over m's
  // operands, at the earlier of the two: NotHere when an operand is defined between them (not a reshape that can
  // move up), Refused when canRun_ refuses it or its sum's dtype is not n's.
  enum class SumFold { Folded, Refused, NotHere };
  Result<SumFold> foldSumInto(Graph& g, Node* n, Node* m, const char* epilogue) {
    Node* at = pos_.lookup(m) < pos_.lookup(n) ? m : n;
    if (!hoistBefore(g, at, {m->operand(0), m->operand(1)})) return SumFold::NotHere;
    TPC_ASSIGN(Node * e, (candidate(g, *m, epilogue, {m->operand(0), m->operand(1)}, at)));
    if (!e) return SumFold::Refused;
    if (e->result(1)->type() != n->result()->type()) {  // a bias sum of another dtype than the summed tensor's
      g.erase(e);
      return SumFold::Refused;
    }
    replace(g, e, {m->result(), n->result()}, {m, n});
    return SumFold::Folded;
  }

  // reduce_sum(d) over its rows, and a matmul(d or reshape(d) to [rows, N], w) (the input gradient d w^T) =>
  // bgrad_a at the earlier of the two.
  Result<bool> bgradA(Graph& g, Node* n) {
    if (!sumsAllButLast(*n) || n->result()->placement()) return false;
    Value* d = n->operand(0);
    const int64_t N = d->shape().back();
    std::vector<Value*> views = {d};
    for (Node* u : users(d))
      if (u->op() == OpKind::Reshape && !u->result()->shape().empty() && u->result()->shape().back() == N)
        views.push_back(u->result());
    for (Value* a : views) {
      for (Node* m : users(a)) {
        if (m->op() != OpKind::Matmul || m->operand(0) != a || m->operand(1) == a || m->getBool("transpose_a") ||
            m->operand(1)->type().rank() != 2 || m->result()->placement())
          continue;
        TPC_ASSIGN(SumFold f, (foldSumInto(g, n, m, "bgrad_a")));
        if (f != SumFold::NotHere) return f == SumFold::Folded;
      }
    }
    return false;
  }

  // reduce_sum(d) over its rows, and a matmul(x, d or reshape(d) to [rows, N]) {transpose_a} (the weight
  // gradient, after fold-batch-matmul-sum) => bgrad_b at the earlier of the two; a reshape defined between
  // them is moved up with it.
  Result<bool> bgradB(Graph& g, Node* n) {
    if (!sumsAllButLast(*n) || n->result()->placement()) return false;
    Value* d = n->operand(0);
    const int64_t N = d->shape().back(), rows = d->type().numel() / std::max<int64_t>(N, 1);
    std::vector<Value*> flats = {d};
    for (Node* u : users(d))
      if (u->op() == OpKind::Reshape && u->result()->shape() == Shape{rows, N}) flats.push_back(u->result());
    for (Value* b : flats) {
      if (b->type().rank() != 2) continue;
      for (Node* m : users(b)) {
        if (m->op() != OpKind::Matmul || m->operand(1) != b || !m->getBool("transpose_a") || m->getBool("transpose_b") ||
            m->operand(0)->type().rank() != 2 || m->result()->placement())
          continue;
        TPC_ASSIGN(SumFold f, (foldSumInto(g, n, m, "bgrad_b")));
        if (f != SumFold::NotHere) return f == SumFold::Folded;
      }
    }
    return false;
  }

  // Fusion groups that lost members to a fold and kept one: a kernel of one op needs no group.
  static void ungroupSingletons(Graph& g) {
    std::map<int64_t, std::vector<Node*>> groups;
    for (Node* n : g.nodes())
      if (int64_t id = fusionGroupOf(*n); id >= 0) groups[id].push_back(n);
    for (auto& [id, members] : groups)
      if (members.size() == 1) members[0]->eraseAttr("fusion_group");
  }
};

}  // namespace

std::unique_ptr<Pass> createFoldMatmulEpiloguesPass(std::function<bool(const Node&)> canRun) {
  return std::make_unique<FoldMatmulEpiloguesPass>(std::move(canRun));
}

}  // namespace tpc
