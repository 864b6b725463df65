// `pack-qkv-attention`: attention reads q, k, v straight from the QKV projection's layout and writes its out
// in the layout the projection after it reads, instead of copying them through transposes and slices:
//   %x = transpose(%qkv) {perm=P}            (P takes qkv to [3, B, H, T, Dh]: the GPT builder's [B, T, 3, H, Dh],
//   %q = reshape(slice(%x, 0, [0, 1)))        megatron-tp's [B, 3, T, H, Dh]); %k, %v likewise from [1, 2), [2, 3)
//   %o, %lse = attention(%q, %k, %v);  %y = transpose(%o) {perm=[0,2,1,3]}
//     =>  %y, %lse = attention_qkv(%qkv) {perm=P}
// and its gradient (slice's VJP pads each of dq, dk, dv with zeros to [3, B, H, T, Dh] and adds them up):
//   %dq, %dk, %dv = attention_grad(transpose(%dy) {perm=[0,2,1,3]}, %q, %k, %v, %o, %lse)
//   %dqkv = transpose(sum of concat(zeros..., reshape(%dq | %dk | %dv), zeros...)) {perm=P^-1}
//     =>  %dqkv = attention_qkv_grad(%dy, %qkv, %y, %lse) {perm=P}
// The gradient may read q, k, v recomputed from %qkv by the same transpose, slices and reshapes (selective
// recompute). An attention is rewritten only when the pattern holds for it and every gradient that reads it, and each
// fusion group of the adds is wholly inside the pattern (it vanishes with them); otherwise it is left alone.
// Same numbers: the kernels are attention's own with other strides, the dropout mask is drawn on the same
// [B, H, Tq, Tk] index space. For one rank's program (placements gone); the CUDA backend runs it.
#include <algorithm>
#include <map>
#include <set>

#include "ir/shape_rules.h"
#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {
namespace {

using Users = llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>;

const std::vector<int64_t> kHeadsTokens{0, 2, 1, 3};

struct GradMatch {
  Node* grad;
  Value* dy;     // [B, T, H, Dh]: what the transpose to dout read
  Value* dqkvY;  // the transposed sum: what attention_qkv_grad's result replaces
};

struct Match {
  Value* qkv;
  std::vector<int64_t> perm;
  std::vector<Node*> outTransposes;
  std::vector<GradMatch> grads;
};

class PackQkvAttentionPass final : public Pass {
 public:
  std::string_view name() const override { return "pack-qkv-attention"; }

  Result<bool> run(Graph& g) override {
    users_ = g.computeUsers();
    groupSize_.clear();
    for (Node* n : g.nodeVector())
      if (n->has(traits::Elementwise) && n->getInt("fusion_group") >= 0) ++groupSize_[n->getInt("fusion_group")];
    std::vector<Node*> touched;
    bool changed = false;
    for (Node* a : g.nodeVector()) {
      if (a->op() != OpKind::Attention) continue;
      std::vector<Node*> seen;
      std::optional<Match> m = match(g, *a, seen);
      if (!m) continue;
      AttrDict attrs = a->attrs();
      attrs.set("perm", m->perm);
      TPC_ASSIGN(Node * packed, g.create(OpKind::AttentionQkv, {m->qkv}, attrs, a));
      packed->setLoc(a->loc());
      for (Node* t : m->outTransposes) replace(g, t->result(), packed->result(0));
      for (const GradMatch& gm : m->grads) {
        TPC_ASSIGN(Node * grad, g.create(OpKind::AttentionQkvGrad,
                                         {gm.dy, m->qkv, packed->result(0), packed->result(1)}, attrs, gm.grad));
        grad->setLoc(gm.grad->loc());
        replace(g, gm.dqkvY, grad->result(0));
      }
      touched.insert(touched.end(), seen.begin(), seen.end());
      touched.push_back(a);
      changed = true;
      users_ = g.computeUsers();
    }
    if (changed) eraseDead(g, touched);
    return changed;
  }

 private:
  Users users_;
  std::map<int64_t, int> groupSize_;

  static void replace(Graph& g, Value* from, Value* to) {
    if (from->hasName() && !to->hasName()) to->setName(from->name());
    g.replaceAllUsesWith(from, to);
  }

  // The matched nodes that nothing reads any more, last first (zeros shared with other layers stay).
  static void eraseDead(Graph& g, const std::vector<Node*>& touched) {
    std::set<Node*> cand(touched.begin(), touched.end());
    Users users = g.computeUsers();
    std::set<Node*> erased;
    std::vector<Node*> order = g.nodeVector();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (!cand.count(n)) continue;
      bool dead = true;
      for (Value* r : n->results()) {
        if (g.isOutput(r)) dead = false;
        auto u = users.find(r);
        if (u != users.end())
          for (Node* user : u->second) dead = dead && erased.count(user);
      }
      if (!dead) continue;
      erased.insert(n);
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (erased.count(*it)) g.erase(*it);
  }

  llvm::ArrayRef<Node*> usersOf(const Value* v) const {
    auto u = users_.find(v);
    return u == users_.end() ? llvm::ArrayRef<Node*>() : llvm::ArrayRef<Node*>(u->second);
  }
  Node* soleUser(const Value* v) const {
    auto u = usersOf(v);
    return u.size() == 1 ? u[0] : nullptr;
  }

  static int64_t axisOf(const Node& n) {
    int64_t ax = n.getInt("axis");
    return ax < 0 ? ax + n.operand(0)->type().rank() : ax;
  }

  // q, k or v (which = 0, 1, 2) as reshape(slice(transpose(qkv, perm), 0, [which, which + 1))): the transpose.
  static Node* packedSource(const Value* x, int64_t which) {
    const Node* r = x->def();
    if (!r || r->op() != OpKind::Reshape) return nullptr;
    const Node* s = r->operand(0)->def();
    if (!s || s->op() != OpKind::Slice || axisOf(*s) != 0 || s->getInt("start") != which ||
        s->getInt("end") != which + 1)
      return nullptr;
    Node* t = s->operand(0)->def();
    if (!t || t->op() != OpKind::Transpose) return nullptr;
    Shape want{1};
    want.insert(want.end(), x->shape().begin(), x->shape().end());
    return s->result()->shape() == want ? t : nullptr;
  }

  // Whether a and b are the same value or computed alike (same op, attributes but fusion groups, result index and
  // operands, to `depth` nodes up): a recomputed copy, e.g. selective recompute's bias add and reshape of qkv.
  // The nodes of a's side that differ from b's are appended to `copies` (they die with the rewrite).
  static bool sameValue(const Value* a, const Value* b, int depth, std::vector<Node*>& copies) {
    if (a == b) return true;
    const Node *da = a->def(), *db = b->def();
    if (depth == 0 || !da || !db || da->op() != db->op() || a->type() != b->type() ||
        da->numOperands() != db->numOperands() || da->numResults() != db->numResults())
      return false;
    if (da->has(traits::Random) || da->has(traits::Collective)) return false;
    AttrDict aa = da->attrs(), ab = db->attrs();
    aa.erase("fusion_group");
    ab.erase("fusion_group");
    if (!(aa == ab)) return false;
    for (unsigned r = 0; r < da->numResults(); ++r)
      if ((da->result(r) == a) != (db->result(r) == b)) return false;
    for (unsigned i = 0; i < da->numOperands(); ++i)
      if (!sameValue(da->operand(i), db->operand(i), depth - 1, copies)) return false;
    copies.push_back(const_cast<Node*>(da));
    return true;
  }

  // Zeros: full(0), or a slice, reshape or transpose of zeros (the partitioner slices a global full).
  static bool isZero(const Value* v, std::vector<Node*>& seen) {
    const Node* d = v->def();
    if (!d) return false;
    if (d->op() == OpKind::Full) {
      if (d->getFloat("value") != 0.0) return false;
    } else if (d->op() != OpKind::Slice && d->op() != OpKind::Reshape && d->op() != OpKind::Transpose) {
      return false;
    } else if (!isZero(d->operand(0), seen)) {
      return false;
    }
    seen.push_back(const_cast<Node*>(d));
    return true;
  }

  std::optional<Match> match(const Graph& g, Node& a, std::vector<Node*>& seen) const {
    for (const Value* v : a.operands())
      if (v->placement()) return std::nullopt;
    Node* x = packedSource(a.operand(0), 0);
    if (!x || packedSource(a.operand(1), 1) != x || packedSource(a.operand(2), 2) != x) return std::nullopt;
    Match m;
    m.qkv = x->operand(0);
    m.perm = x->getInts("perm");
    auto p = packedQkv(m.qkv->shape(), m.perm);
    if (!p || Shape{p->B, p->H, p->T, p->D} != a.operand(0)->shape() || a.operand(0)->shape() != a.operand(1)->shape())
      return std::nullopt;
    for (int k = 0; k < 3; ++k) {
      seen.push_back(a.operand(k)->def());
      seen.push_back(a.operand(k)->def()->operand(0)->def());
    }
    seen.push_back(x);
    Value *o = a.result(0), *lse = a.result(1);
    if (g.isOutput(o) || g.isOutput(lse)) return std::nullopt;
    std::vector<Node*> grads;
    for (Node* u : usersOf(o)) {
      if (u->op() == OpKind::Transpose && u->getInts("perm") == kHeadsTokens) {
        m.outTransposes.push_back(u);
        seen.push_back(u);
      } else if (u->op() == OpKind::AttentionGrad) {
        if (std::find(grads.begin(), grads.end(), u) == grads.end()) grads.push_back(u);
      } else {
        return std::nullopt;
      }
    }
    for (Node* u : usersOf(lse))
      if (u->op() != OpKind::AttentionGrad || std::find(grads.begin(), grads.end(), u) == grads.end())
        return std::nullopt;
    for (Node* gr : grads) {
      std::optional<GradMatch> gm = matchGrad(g, a, *gr, *m.qkv, m.perm, seen);
      if (!gm) return std::nullopt;
      m.grads.push_back(*gm);
    }
    return m;
  }

  std::optional<GradMatch> matchGrad(const Graph& g, const Node& a, Node& gr, const Value& qkv,
                                     const std::vector<int64_t>& perm, std::vector<Node*>& seen) const {
    // q, k, v as the forward read them, or recomputed from the same projection output the same way (selective
    // recompute copies movement ops before the backward); the copies die with the rewrite.
    for (int k = 0; k < 3; ++k) {
      const Value* v = gr.operand(k + 1);
      if (v == a.operand(k)) continue;
      Node* t = packedSource(v, k);
      if (!t || t->getInts("perm") != perm || v->type() != a.operand(k)->type() ||
          !sameValue(t->operand(0), &qkv, 8, seen))
        return std::nullopt;
      seen.push_back(v->def());
      seen.push_back(v->def()->operand(0)->def());
      seen.push_back(t);
    }
    if (gr.operand(4) != a.result(0) || gr.operand(5) != a.result(1) || !(gr.attrs() == a.attrs()))
      return std::nullopt;
    Node* t = gr.operand(0)->def();
    if (!t || t->op() != OpKind::Transpose || t->getInts("perm") != kHeadsTokens) return std::nullopt;
    GradMatch gm{&gr, t->operand(0), nullptr};
    seen.push_back(t);
    seen.push_back(&gr);
    // Each of dq, dk, dv: read only by one reshape to [1, B, H, T, Dh].
    Node* reshapes[3];
    for (int k = 0; k < 3; ++k) {
      const Value* d = gr.result(k);
      if (g.isOutput(d)) return std::nullopt;
      Node* r = soleUser(d);
      Shape want{1};
      want.insert(want.end(), d->shape().begin(), d->shape().end());
      if (!r || r->op() != OpKind::Reshape || r->result()->shape() != want) return std::nullopt;
      reshapes[k] = r;
    }
    // The sum: from the concat that holds dq up through adds to the value the inverse transpose reads.
    Node* c = soleUser(reshapes[0]->result());
    if (!c) return std::nullopt;
    const Value* s = c->result();
    while (Node* u = soleUser(s)) {
      if (u->op() != OpKind::Add || g.isOutput(s)) break;
      s = u->result();
    }
    Node* y = soleUser(s);
    std::vector<int64_t> inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    if (!y || y->op() != OpKind::Transpose || y->getInts("perm") != inv || g.isOutput(s) ||
        y->result()->type() != qkv.type())
      return std::nullopt;
    int filled[3] = {0, 0, 0};
    std::map<int64_t, int> groups;
    if (!sumOfSlots(g, s, reshapes, true, filled, groups, seen)) return std::nullopt;
    if (filled[0] != 1 || filled[1] != 1 || filled[2] != 1) return std::nullopt;
    for (const auto& [grp, count] : groups)
      if (groupSize_.at(grp) != count) return std::nullopt;  // the fusion group reaches outside the sum
    seen.push_back(y);
    gm.dqkvY = y->result();
    return gm;
  }

  // Whether v is a sum (adds, each read only by the next) of concats on axis 0 whose operands are zeros or
  // reshapes[k] at offset k; counts the slots filled and the adds per fusion group.
  bool sumOfSlots(const Graph& g, const Value* v, Node* const* reshapes, bool root, int* filled,
                  std::map<int64_t, int>& groups, std::vector<Node*>& seen) const {
    Node* d = v->def();
    if (!d || (!root && (g.isOutput(v) || usersOf(v).size() != 1))) return false;
    if (d->op() == OpKind::Add) {
      for (const Value* x : d->operands())
        if (x->shape() != v->shape() || !sumOfSlots(g, x, reshapes, false, filled, groups, seen)) return false;
      if (d->getInt("fusion_group") >= 0) ++groups[d->getInt("fusion_group")];
      seen.push_back(d);
      return true;
    }
    if (d->op() != OpKind::Concat || axisOf(*d) != 0 || v->shape().empty() || v->shape()[0] != 3) return false;
    int64_t off = 0;
    for (const Value* x : d->operands()) {
      int k = 0;
      while (k < 3 && x != reshapes[k]->result()) ++k;
      if (k < 3) {
        if (off != k) return false;
        ++filled[k];
        seen.push_back(reshapes[k]);
      } else if (!isZero(x, seen)) {
        return false;
      }
      off += x->shape()[0];
    }
    seen.push_back(d);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createPackQkvAttentionPass() { return std::make_unique<PackQkvAttentionPass>(); }

}  // namespace tpc
