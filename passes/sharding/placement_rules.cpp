// Per-op placement rules along one mesh axis: which (operand placements -> result placements) strategies an
// op supports. Grouped by trait (elementwise, normalization, contraction, movement, reduction, ...), so an op
// added to ops.def with an existing trait gets its rule for free; ops without a rule run replicated.
#include <algorithm>
#include <numeric>

#include "passes/sharding/sharding.h"

namespace tpc::sharding {
namespace {

using AP = AxisPlacement;
using Cands = std::vector<AxisStrategy>;

AP R() { return AP::replicated(); }
AP S(int64_t d) { return AP::split(d); }
AP P() { return AP::partial(); }

int64_t norm(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

AxisStrategy strat(std::initializer_list<AP> in, std::initializer_list<AP> out, bool vp = false) {
  AxisStrategy s;
  s.in.assign(in.begin(), in.end());
  s.out.assign(out.begin(), out.end());
  s.vocabParallel = vp;
  return s;
}

// Which operands an elementwise op is linear in, so that partial sums pass through it:
// "joint" (add/sub: P op P is P) or "each" (mul: P * R is P), or operand 0 only (div, gelu_grad).
enum class Linearity { None, Joint, Each, First };
Linearity linearity(OpKind op) {
  switch (op) {
    case OpKind::Neg: case OpKind::Scale: case OpKind::Cast: case OpKind::Dropout: return Linearity::Joint;
    case OpKind::Add: case OpKind::Sub: return Linearity::Joint;
    case OpKind::Mul: return Linearity::Each;
    case OpKind::Div: case OpKind::GeluGrad: return Linearity::First;
    default: return Linearity::None;
  }
}

// Operand dim of output dim `od` under numpy broadcasting, or -1 when the operand broadcasts there.
int64_t operandDim(const Shape& in, const Shape& out, int64_t od) {
  int64_t d = od - (int64_t(out.size()) - int64_t(in.size()));
  if (d < 0 || (in[d] == 1 && out[od] != 1)) return -1;
  return d;
}

// Elementwise (with broadcasting): a split output dim is split in every operand that has it; partial sums
// pass through the operands the op is linear in.
Cands elementwise(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  const Shape& out = n.result()->shape();
  for (unsigned i = 0; i < n.numOperands(); ++i) {
    if (!in[i].isS()) continue;
    int64_t od = in[i].dim + (int64_t(out.size()) - n.operand(i)->type().rank());
    if (operandDim(n.operand(i)->shape(), out, od) < 0) continue;
    AxisStrategy s;
    for (unsigned j = 0; j < n.numOperands(); ++j) {
      int64_t d = operandDim(n.operand(j)->shape(), out, od);
      s.in.push_back(d < 0 ? R() : S(d));
    }
    s.out.push_back(S(od));
    c.push_back(std::move(s));
  }
  bool anyP = std::any_of(in.begin(), in.end(), [](const AP& p) { return p.isP(); });
  if (!anyP) return c;
  switch (linearity(n.op())) {
    case Linearity::Joint: {  // every operand P; a replicated one joins as rank 0's share (free)
      AxisStrategy s;
      for (unsigned j = 0; j < n.numOperands(); ++j) s.in.push_back(P());
      s.out.push_back(P());
      c.push_back(std::move(s));
      break;
    }
    case Linearity::Each:
    case Linearity::First:
      for (unsigned i = 0; i < n.numOperands(); ++i) {
        if (!in[i].isP() || (linearity(n.op()) == Linearity::First && i != 0)) continue;
        AxisStrategy s;
        for (unsigned j = 0; j < n.numOperands(); ++j) s.in.push_back(j == i ? P() : R());
        s.out.push_back(P());
        c.push_back(std::move(s));
      }
      break;
    case Linearity::None: break;
  }
  return c;
}

// matmul a[..., M, K] x b[..., K, N] (b may be 2-D); transposes swap the last two dims of an operand.
Cands matmul(const Node& n, llvm::ArrayRef<AP> in) {
  const int64_t ra = n.operand(0)->type().rank(), rb = n.operand(1)->type().rank();
  const int64_t ro = n.result()->type().rank();
  bool tA = n.getBool("transpose_a"), tB = n.getBool("transpose_b");
  int64_t aM = tA ? ra - 1 : ra - 2, aK = tA ? ra - 2 : ra - 1;
  int64_t bK = tB ? rb - 1 : rb - 2, bN = tB ? rb - 2 : rb - 1;
  Cands c;
  // (S(K), S(K)) -> P: each rank contracts its slice of K.
  if ((in[0].isS() && in[0].dim == aK) || (in[1].isS() && in[1].dim == bK)) c.push_back(strat({S(aK), S(bK)}, {P()}));
  // (R, S(N)) -> S(last): column parallel.
  if (in[1].isS() && in[1].dim == bN) c.push_back(strat({R(), S(bN)}, {S(ro - 1)}));
  // (S(M), R) -> S(M).
  if (in[0].isS() && in[0].dim == aM) c.push_back(strat({S(aM), R()}, {S(ro - 2)}));
  // Batch dims pass through (b broadcast along a's batch dims stays whole).
  const Shape& oS = n.result()->shape();
  auto batchCand = [&](int64_t od) {
    int64_t da = od - (ro - ra), db = od - (ro - rb);
    AP pa = (da >= 0 && n.operand(0)->shape()[da] == oS[od]) ? S(da) : R();
    AP pb = (db >= 0 && rb > 2 && n.operand(1)->shape()[db] == oS[od]) ? S(db) : R();
    AxisStrategy s;
    s.in = {pa, pb};
    s.out = {S(od)};
    c.push_back(std::move(s));
  };
  if (in[0].isS() && in[0].dim < ra - 2 && n.operand(0)->shape()[in[0].dim] != 1) batchCand(in[0].dim + (ro - ra));
  if (in[1].isS() && in[1].dim < rb - 2 && n.operand(1)->shape()[in[1].dim] != 1) batchCand(in[1].dim + (ro - rb));
  // Partial sums are linear in each operand.
  if (in[0].isP()) c.push_back(strat({P(), R()}, {P()}));
  if (in[1].isP()) c.push_back(strat({R(), P()}, {P()}));
  return c;
}

// A split of dim d maps through a reshape to output dim od when the dims before them hold the same number
// of elements (so both splits cut the flat index at the same points): S(d) -> S(od), od's size divisible.
int64_t reshapeDim(const Shape& from, const Shape& to, int64_t d, int64_t n) {
  int64_t before = 1;
  for (int64_t k = 0; k < d; ++k) before *= from[k];
  int64_t p = 1;
  for (size_t od = 0; od < to.size(); ++od) {
    if (p == before && to[od] != 1) return to[od] % n == 0 ? static_cast<int64_t>(od) : -1;
    p *= to[od];
    if (p > before) return -1;
  }
  return -1;
}

Cands movement(const Node& n, llvm::ArrayRef<AP> in, int64_t axisSize) {
  Cands c;
  const Shape& xs = n.operand(0)->shape();
  const Shape& ys = n.result()->shape();
  switch (n.op()) {
    case OpKind::Reshape:
      if (in[0].isS()) {
        int64_t od = reshapeDim(xs, ys, in[0].dim, axisSize);
        if (od >= 0) c.push_back(strat({in[0]}, {S(od)}));
      }
      break;
    case OpKind::Transpose:
      if (in[0].isS()) {
        const auto& perm = n.getInts("perm");
        int64_t od = std::find(perm.begin(), perm.end(), in[0].dim) - perm.begin();
        c.push_back(strat({in[0]}, {S(od)}));
      }
      break;
    case OpKind::Slice:
      if (in[0].isS() && in[0].dim != norm(n.getInt("axis"), int64_t(xs.size()))) c.push_back(strat({in[0]}, {in[0]}));
      break;
    case OpKind::Concat: {
      int64_t axis = norm(n.getInt("axis"), int64_t(ys.size()));
      for (const AP& p : in)
        if (p.isS() && p.dim != axis) {
          AxisStrategy s;
          s.in.assign(n.numOperands(), p);
          s.out = {p};
          c.push_back(std::move(s));
          break;
        }
      if (std::any_of(in.begin(), in.end(), [](const AP& p) { return p.isP(); })) {
        AxisStrategy s;  // a replicated operand (the zeros of a slice's VJP) joins as rank 0's share
        s.in.assign(n.numOperands(), P());
        s.out = {P()};
        c.push_back(std::move(s));
      }
      break;
    }
    case OpKind::BroadcastTo:
      if (in[0].isS()) {
        int64_t od = in[0].dim + int64_t(ys.size() - xs.size());
        if (xs[in[0].dim] == ys[od]) c.push_back(strat({in[0]}, {S(od)}));
      }
      break;
    default: break;
  }
  if (in[0].isP() && n.op() != OpKind::Concat) c.push_back(strat({P()}, {P()}));
  return c;
}

Cands reduction(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  if (n.op() == OpKind::SumSquares) return c;
  int64_t r = n.operand(0)->type().rank();
  std::vector<int64_t> axes;
  for (int64_t a : n.getInts("axes")) axes.push_back(norm(a, r));
  bool keep = n.getBool("keepdims");
  auto reduced = [&](int64_t d) { return std::find(axes.begin(), axes.end(), d) != axes.end(); };
  bool isMax = n.op() == OpKind::ReduceMax;
  if (in[0].isS()) {
    int64_t d = in[0].dim;
    if (reduced(d)) {
      if (!isMax) c.push_back(strat({in[0]}, {P()}));  // each rank sums its slice
    } else {
      int64_t od = d;
      if (!keep)
        for (int64_t a : axes)
          if (a < d) --od;
      c.push_back(strat({in[0]}, {S(od)}));
    }
  }
  if (in[0].isP() && !isMax) c.push_back(strat({P()}, {P()}));
  return c;
}

Cands normalization(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  int64_t r = n.operand(0)->type().rank();
  switch (n.op()) {
    case OpKind::LayerNorm:  // (with a residual it is built after partition, for one rank's program)
      if (n.numOperands() == 3 && in[0].isS() && in[0].dim != r - 1) c.push_back(strat({in[0], R(), R()}, {in[0]}));
      break;
    case OpKind::LayerNormGrad: {
      // dx follows x; dgamma, dbeta sum over the split rows: partial. dy must be whole on the row (no P).
      for (int k : {1, 0})
        if (in[k].isS() && in[k].dim != r - 1) {
          c.push_back(strat({in[k], in[k], R()}, {in[k], P(), P()}));
          break;
        }
      break;
    }
    case OpKind::Softmax: {
      int64_t axis = norm(n.getInt("axis"), r);
      if (in[0].isS() && in[0].dim != axis) c.push_back(strat({in[0]}, {in[0]}));
      break;
    }
    case OpKind::SoftmaxGrad: {
      int64_t axis = norm(n.getInt("axis"), r);
      for (int k : {0, 1})
        if (in[k].isS() && in[k].dim != axis) {
          c.push_back(strat({in[k], in[k]}, {in[k]}));
          break;
        }
      if (in[0].isP()) c.push_back(strat({P(), R()}, {P()}));
      break;
    }
    default: break;
  }
  return c;
}

Cands loss(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  if (n.op() == OpKind::CrossEntropy) {
    int64_t r = n.operand(0)->type().rank();
    if (in[0].isS() && in[0].dim == r - 1) c.push_back(strat({in[0], R()}, {R()}, true));
    for (int k : {0, 1})
      if (in[k].isS() && in[k].dim < r - 1) {
        c.push_back(strat({in[k], in[k]}, {in[k]}));
        break;
      }
  } else if (n.op() == OpKind::CrossEntropyGrad) {
    int64_t r = n.operand(1)->type().rank();
    if (in[1].isS() && in[1].dim == r - 1) c.push_back(strat({R(), in[1], R()}, {in[1]}, true));
    for (int k : {1, 0, 2})
      if (in[k].isS() && in[k].dim < r - 1) {
        c.push_back(strat({in[k], in[k], in[k]}, {in[k]}));
        break;
      }
    if (in[0].isP()) c.push_back(strat({P(), R(), R()}, {P()}));
  }
  return c;
}

Cands contraction(const Node& n, llvm::ArrayRef<AP> in) {
  if (n.op() == OpKind::Matmul) return matmul(n, in);
  // attention_qkv(_grad): built by the CUDA backend on one rank's program, after partition; a global graph
  // that holds one runs it replicated.
  if (n.op() == OpKind::AttentionQkv || n.op() == OpKind::AttentionQkvGrad) return {};
  // attention(q, k, v) and its grad: batch and head dims split; T and Dh whole.
  Cands c;
  for (const AP& p : in)
    if (p.isS() && p.dim < 2) {
      AxisStrategy s;
      s.in.assign(n.numOperands(), p);
      s.out.assign(n.numResults(), p);
      c.push_back(std::move(s));
      break;
    }
  return c;
}

Cands gather(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  if (n.op() == OpKind::Embedding) {
    int64_t ro = n.result()->type().rank();
    if (in[0].isS() && in[0].dim == 0) c.push_back(strat({S(0), R()}, {P()}));  // vocab parallel
    if (in[0].isS() && in[0].dim == 1) c.push_back(strat({S(1), R()}, {S(ro - 1)}));
    if (in[1].isS()) c.push_back(strat({R(), in[1]}, {in[1]}));
  } else {  // embedding_grad(dy, ids)
    int64_t r = n.operand(0)->type().rank();
    if (in[0].isS() && in[0].dim == r - 1) c.push_back(strat({in[0], R()}, {S(1)}));
    for (int k : {0, 1})
      if (in[k].isS() && in[k].dim < r - 1) {
        c.push_back(strat({in[k], in[k]}, {P()}));
        break;
      }
    if (in[0].isP()) c.push_back(strat({P(), R()}, {P()}));
  }
  return c;
}

Cands optimizer(const Node& n, llvm::ArrayRef<AP> in) {
  Cands c;
  if (n.op() == OpKind::AdamWUpdate) {
    AP p = in[0].isP() ? R() : in[0];  // grad, m and v follow the param
    c.push_back(strat({p, p, p, p, R(), R()}, {p, p, p}));
    // Moments split where the param is not (ZeRO-1 over dp): the update runs on the moments' slice of the
    // param (a free local slice of a replicated one) and of the grad (reduce-scattered, not all-reduced).
    if (in[2].isS() && in[2] != in[0]) c.push_back(strat({in[2], in[2], in[2], in[2], R(), R()}, {in[2], in[2], in[2]}));
  } else if (n.op() == OpKind::GlobalNorm) {
    AxisStrategy s;  // sharded grads stay sharded (the partitioner sums their squares per shard group)
    for (const AP& p : in) s.in.push_back(p.isP() ? R() : p);
    s.out = {R()};
    c.push_back(std::move(s));
  }
  return c;
}

}  // namespace

std::vector<AxisStrategy> axisCandidates(const Node& n, llvm::ArrayRef<AP> in, int64_t axisSize) {
  Cands c;
  if (n.has(traits::Elementwise)) c = elementwise(n, in);
  else if (n.has(traits::Movement)) c = movement(n, in, axisSize);
  else if (n.has(traits::Reduction)) c = reduction(n, in);
  else if (n.has(traits::Normalization)) c = normalization(n, in);
  else if (n.has(traits::Loss)) c = loss(n, in);
  else if (n.has(traits::Contraction)) c = contraction(n, in);
  else if (n.has(traits::Gather)) c = gather(n, in);
  else if (n.has(traits::Optimizer)) c = optimizer(n, in);
  // Only strategies whose split dims divide evenly.
  auto divisible = [&](const AxisStrategy& s) {
    for (unsigned i = 0; i < s.in.size(); ++i)
      if (s.in[i].isS() && n.operand(i)->shape()[s.in[i].dim] % axisSize != 0) return false;
    for (unsigned i = 0; i < s.out.size(); ++i)
      if (s.out[i].isS() && n.result(i)->shape()[s.out[i].dim] % axisSize != 0) return false;
    return true;
  };
  c.erase(std::remove_if(c.begin(), c.end(), [&](const AxisStrategy& s) { return !divisible(s); }), c.end());
  return c;
}

Shape localShape(const Shape& global, const Placement& p, const Mesh& mesh) {
  Shape s = global;
  for (const MeshAxis& a : mesh.axes) {
    AP ap = p.get(a.name);
    if (ap.isS()) s[ap.dim] /= a.size;
  }
  return s;
}

std::vector<int64_t> rankCoords(const Mesh& mesh, int64_t rank) {
  std::vector<int64_t> c(mesh.axes.size());
  for (size_t k = mesh.axes.size(); k-- > 0;) {
    c[k] = rank % mesh.axes[k].size;
    rank /= mesh.axes[k].size;
  }
  return c;
}

}  // namespace tpc::sharding
