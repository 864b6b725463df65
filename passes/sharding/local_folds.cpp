// Folds on a rank's program that the engine's one-sweep choices leave behind: a replicated value computed
// whole only for the rank to slice its block out of it; megatron-tp's stacked QKV projection (a batched matmul
// over q, k, v) where the rank's columns can be read as one packed matrix again.
#include <map>

#include "passes/sharding/sharding.h"

namespace tpc {

// slice(embedding_grad(dy, ids){vocab=V, vocab_start=s}, axis 0, a, b) => embedding_grad(dy, ids){vocab=b-a,
// vocab_start=s+a}: under vocab-parallel tp (without sp) the tied wte's gradient from the embedding is
// otherwise computed for the whole vocab on every rank and sliced to the rank's rows.
void foldSlicedEmbeddingGrads(Graph& local) {
  auto users = local.computeUsers();
  for (Node* s : local.nodeVector()) {
    if (s->op() != OpKind::Slice || s->getInt("axis") != 0) continue;
    Node* eg = s->operand(0)->def();
    if (!eg || eg->op() != OpKind::EmbeddingGrad || users.lookup(eg->result()).size() != 1 || local.isOutput(eg->result()))
      continue;
    int64_t start = s->getInt("start"), end = s->getInt("end");
    AttrDict a = eg->attrs();
    a.set("vocab", end - start);
    a.set("vocab_start", eg->getInt("vocab_start") + start);
    auto n = local.create(OpKind::EmbeddingGrad, {eg->operand(0), eg->operand(1)}, std::move(a), s);
    if (!n.ok()) continue;  // types disagree: leave the slice
    if (s->result()->hasName()) (*n)->result()->setName(s->result()->name());
    local.replaceAllUsesWith(s->result(), (*n)->result());
  }
}

namespace {

bool isTranspose(const Node* n, std::vector<int64_t> perm) {
  return n && n->op() == OpKind::Transpose && n->getInts("perm") == perm;
}

bool plainMatmul(const Node* n, bool ta, bool tb) {
  return n && n->op() == OpKind::Matmul && n->getBool("transpose_a") == ta && n->getBool("transpose_b") == tb;
}

bool reduceOver(const Node* n, std::vector<int64_t> axes) {
  return n && n->op() == OpKind::ReduceSum && !n->getBool("keepdims") && n->getInts("axes") == axes;
}

// The only user of v, or null.
Node* onlyUser(const llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>& users, const Graph& g, Value* v) {
  const auto& u = users.lookup(v);
  return u.size() == 1 && !g.isOutput(v) ? u[0] : nullptr;
}

// Wt = transpose(Wc: [D, 3, d], perm [1,0,2]): megatron-tp's stacked view of the rank's q, k, v columns.
Value* stackedWeight(Value* wt) {
  Node* t = wt->def();
  if (!isTranspose(t, {1, 0, 2}) || t->operand(0)->type().rank() != 3) return nullptr;
  return t->operand(0);
}

// x4 = reshape(x: [B, T, D], [B, 1, T, D]).
Value* unstackedInput(Value* x4) {
  Node* r = x4->def();
  if (!r || r->op() != OpKind::Reshape || x4->type().rank() != 4 || x4->shape()[1] != 1) return nullptr;
  Value* x = r->operand(0);
  const Shape& s = x->shape();
  if (s.size() != 3 || s[0] != x4->shape()[0] || s[1] != x4->shape()[2] || s[2] != x4->shape()[3]) return nullptr;
  return x;
}

class StackedQkvFold {
 public:
  explicit StackedQkvFold(Graph& g) : g_(g), users_(g.computeUsers()) {}

  void run() {
    for (Node* n : g_.nodeVector()) {
      if (!isTranspose(n, {1, 0, 3, 2, 4})) continue;
      // The forward's transpose reads the stacked projection, the backward's the heads' gradients.
      if (!forward(n)) backward(n);
    }
  }

 private:
  Result<Value*> mk(OpKind op, std::vector<Value*> ops, AttrDict a, Node* before) {
    TPC_ASSIGN(Node * n, g_.create(op, ops, std::move(a), before));
    return n->result(0);
  }
  Result<Value*> reshape(Value* v, std::vector<int64_t> shape, Node* before) {
    return mk(OpKind::Reshape, {v}, attrs({{"shape", std::move(shape)}}), before);
  }
  void replace(Value* from, Value* to) {
    if (from->hasName() && !to->hasName()) to->setName(from->name());
    g_.replaceAllUsesWith(from, to);
  }
  // x of x4 = reshape(x, [B, 1, T, D]); under sequence parallelism x4 = all_gather(reshape(xs, [B, 1, T/tp, D]))
  // on dim 2, and x is all_gather(xs) on dim 1 (made once, in place of the old gather).
  Result<Value*> unstacked(Value* x4) {
    if (Value* x = unstackedInput(x4)) return x;
    Node* ag = x4->def();
    if (!ag || ag->op() != OpKind::AllGather || ag->getInt("dim") != 2) return nullptr;
    Value* xs = unstackedInput(ag->operand(0));
    if (!xs) return nullptr;
    if (auto it = gathered_.find(x4); it != gathered_.end()) return it->second;
    AttrDict a = ag->attrs();
    a.set("dim", int64_t{1});
    TPC_ASSIGN(Value * x, mk(OpKind::AllGather, {xs}, std::move(a), ag));
    return gathered_[x4] = x;
  }

  // The packed [D, 3d] view of Wc, made once per weight.
  Result<Value*> flatWeight(Value* wc, Node* before) {
    if (auto it = flat_.find(wc); it != flat_.end()) return it->second;
    const Shape& s = wc->shape();
    TPC_ASSIGN(Value * f, reshape(wc, {s[0], s[1] * s[2]}, before));
    return flat_[wc] = f;
  }

  // heads = transpose(reshape(add(matmul(x4, Wt), reshape(b, [1,3,1,d])), [B,3,T,h,Dh]), [1,0,3,2,4])
  //   => transpose(reshape(add(matmul(x, Wc as [D,3d]), b as [3d]), [B,T,3,h,Dh]), [2,0,3,1,4])
  bool forward(Node* heads) {
    Node* r5 = heads->operand(0)->def();
    if (!r5 || r5->op() != OpKind::Reshape || r5->result()->type().rank() != 5) return false;
    Node* add = r5->operand(0)->def();
    Node* mm = add && add->op() == OpKind::Add ? add->operand(0)->def() : nullptr;
    if (!plainMatmul(mm, false, false)) return false;
    auto xr = unstacked(mm->operand(0));
    Value* x = xr.ok() ? *xr : nullptr;
    Value* wc = stackedWeight(mm->operand(1));
    Node* br = add->operand(1)->def();
    if (!x || !wc || !br || br->op() != OpKind::Reshape) return false;
    Value* b = br->operand(0);
    const Shape &ws = wc->shape(), &h5 = r5->result()->shape();  // [B, 3, T, h, Dh]
    const int64_t G = ws[1], d = ws[2];
    const Shape& xs = x->shape();  // [B, T, D]
    if (b->shape() != Shape{G, d} || br->result()->shape() != Shape{1, G, 1, d} || h5[0] != xs[0] || h5[1] != G ||
        h5[2] != xs[1] || h5[3] * h5[4] != d || ws[0] != xs[2])
      return false;
    auto done = [&]() -> Result<Value*> {
      // One packed GEMM and bias view per stacked matmul and bias: selective recompute's copy of the bias add
      // reads the same matmul, and its copy then reads the same packed GEMM (pack-qkv-attention matches it).
      Value*& y = packedMm_[mm->result()];
      if (!y) {
        TPC_ASSIGN(Value * wf, flatWeight(wc, mm));
        TPC_ASSIGN(y, mk(OpKind::Matmul, {x, wf}, {}, mm));
      }
      Value*& bf = flatBias_[b];
      if (!bf) {
        TPC_ASSIGN(bf, reshape(b, {G * d}, heads));
      }
      TPC_ASSIGN(Value * yb, mk(OpKind::Add, {y, bf}, {}, heads));
      TPC_ASSIGN(Value * y5, reshape(yb, {h5[0], h5[2], G, h5[3], h5[4]}, heads));
      return mk(OpKind::Transpose, {y5}, attrs({{"perm", std::vector<int64_t>{2, 0, 3, 1, 4}}}), heads);
    }();
    if (!done.ok() || (*done)->type() != heads->result()->type()) return false;
    replace(heads->result(), *done);
    return true;
  }

  // g4 = reshape(transpose(gs: [3,B,h,T,Dh], [1,0,3,2,4]), [B,3,T,d]) feeds the stacked projection's
  // gradients: reduce_sum over [0,2] (bias), reduce_sum(matmul(g4, Wt) {transpose_b}, [1]) (input),
  // transpose(reduce_sum(matmul(x4^T, g4), [0]), [1,0,2]) (weight). Each becomes the packed form on
  // gp = reshape(transpose(gs, [1,3,0,2,4]), [B,T,3d]), as on one rank.
  void backward(Node* tb) {
    Node* r4 = onlyUser(users_, g_, tb->result());
    if (!r4 || r4->op() != OpKind::Reshape || r4->result()->type().rank() != 4) return;
    Value* gs = tb->operand(0);
    const Shape &s4 = r4->result()->shape(), &t5 = tb->result()->shape();  // [B, 3, T, d] of [B, 3, T, h, Dh]
    const int64_t B = s4[0], G = s4[1], T = s4[2], d = s4[3];
    if (t5[0] != B || t5[1] != G || t5[2] != T || t5[3] * t5[4] != d) return;
    Value* gp = nullptr;
    auto packed = [&]() -> Result<Value*> {
      if (gp) return gp;
      TPC_ASSIGN(Value * t, mk(OpKind::Transpose, {gs}, attrs({{"perm", std::vector<int64_t>{1, 3, 0, 2, 4}}}), r4));
      TPC_ASSIGN(gp, reshape(t, {B, T, G * d}, r4));
      return gp;
    };
    for (Node* u : llvm::SmallVector<Node*, 4>(users_.lookup(r4->result()))) {
      if (reduceOver(u, {0, 2})) {  // bias
        auto nv = [&]() -> Result<Value*> {
          TPC_ASSIGN(Value * p, packed());
          TPC_ASSIGN(Value * s, mk(OpKind::ReduceSum, {p}, attrs({{"axes", std::vector<int64_t>{0, 1}}}), u));
          return reshape(s, {G, d}, u);
        }();
        if (nv.ok() && (*nv)->type() == u->result()->type()) replace(u->result(), *nv);
      } else if (plainMatmul(u, false, true) && u->operand(0) == r4->result()) {  // input
        Value* wc = stackedWeight(u->operand(1));
        Node* sum = onlyUser(users_, g_, u->result());
        if (!wc || !reduceOver(sum, {1})) continue;
        auto nv = [&]() -> Result<Value*> {
          TPC_ASSIGN(Value * p, packed());
          TPC_ASSIGN(Value * wf, flatWeight(wc, u));
          return mk(OpKind::Matmul, {p, wf}, attrs({{"transpose_b", true}}), sum);
        }();
        if (nv.ok() && (*nv)->type() == sum->result()->type()) replace(sum->result(), *nv);
      } else if (plainMatmul(u, true, false) && u->operand(1) == r4->result()) {  // weight
        auto xr = unstacked(u->operand(0));
        Value* x = xr.ok() ? *xr : nullptr;
        Node* sum = onlyUser(users_, g_, u->result());
        Node* tr = sum && reduceOver(sum, {0}) ? onlyUser(users_, g_, sum->result()) : nullptr;
        if (!x || !isTranspose(tr, {1, 0, 2})) continue;
        auto nv = [&]() -> Result<Value*> {
          TPC_ASSIGN(Value * p, packed());
          TPC_ASSIGN(Value * m, mk(OpKind::Matmul, {x, p}, attrs({{"transpose_a", true}}), tr));
          TPC_ASSIGN(Value * s, mk(OpKind::ReduceSum, {m}, attrs({{"axes", std::vector<int64_t>{0}}}), tr));
          return reshape(s, {x->shape()[2], G, d}, tr);
        }();
        if (nv.ok() && (*nv)->type() == tr->result()->type()) replace(tr->result(), *nv);
      }
    }
  }

  Graph& g_;
  llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>> users_;
  std::map<Value*, Value*> flat_, gathered_, packedMm_, flatBias_;
};

}  // namespace

void foldStackedQkv(Graph& local) { StackedQkvFold(local).run(); }

void foldZeroShareAdds(Graph& local, const std::set<const Value*>& zeros) {
  for (Node* n : local.nodeVector()) {
    if (n->op() != OpKind::Add) continue;
    for (unsigned i = 0; i < 2; ++i) {
      Value* other = n->operand(1 - i);
      if (zeros.count(n->operand(i)) && other->type() == n->result()->type()) {
        if (n->result()->hasName() && !other->hasName()) other->setName(n->result()->name());
        local.replaceAllUsesWith(n->result(), other);
        break;
      }
    }
  }
}

}  // namespace tpc
