// One VJP (vector-Jacobian product) rule per op of ir/ops.def, found by the op's Enum name: vjp<Enum>.
// A rule gets the cotangents of the node's results and returns the cotangent of each operand that needs
// one. Ops that have no gradient (integer, constant, optimizer and backward ops) say so by name.
#include "passes/vjp_rules.h"

#include <initializer_list>
#include <numeric>
#include <utility>

#include "ir/assert.h"
#include "ir/printer.h"

namespace tpc {

Result<Node*> VjpBuilder::node(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs) {
  return g_.create(op, operands, std::move(attrs));
}

Result<Value*> VjpBuilder::op(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs) {
  TPC_ASSIGN(Node * n, node(op, operands, std::move(attrs)));
  return n->result(0);
}

Result<Value*> VjpBuilder::zeros(const TensorType& t) {
  AttrDict a;
  a.set("shape", std::vector<int64_t>(t.shape.begin(), t.shape.end()));
  a.set("value", 0.0);
  a.set("dtype", t.dtype);
  return op(OpKind::Full, {}, std::move(a));
}

Result<Value*> VjpBuilder::reduceTo(Value* dy, llvm::ArrayRef<int64_t> target) {
  llvm::ArrayRef<int64_t> s = dy->shape();
  if (s == target) return dy;
  TPC_ASSERT(s.size() >= target.size(), "reduceTo: cotangent " + dy->type().str() + " has lower rank than its target");
  size_t lead = s.size() - target.size();
  std::vector<int64_t> axes;
  for (size_t k = 0; k < s.size(); ++k)
    if (k < lead || (target[k - lead] == 1 && s[k] != 1)) axes.push_back(static_cast<int64_t>(k));
  Value* r = dy;
  if (!axes.empty()) {
    AttrDict a;
    a.set("axes", axes);
    TPC_ASSIGN(r, op(OpKind::ReduceSum, {dy}, std::move(a)));
  }
  if (llvm::ArrayRef<int64_t>(r->shape()) != target) {
    AttrDict a;
    a.set("shape", std::vector<int64_t>(target.begin(), target.end()));
    TPC_ASSIGN(r, op(OpKind::Reshape, {r}, std::move(a)));
  }
  return r;
}

namespace {

using Grads = std::vector<Value*>;
using R = Result<Grads>;

std::vector<int64_t> vec(llvm::ArrayRef<int64_t> s) { return std::vector<int64_t>(s.begin(), s.end()); }

Error noGradient(const VjpArgs& a, const std::string& why) {
  ValueNames names(*a.node.graph());
  return makeError("autodiff: cannot differentiate through '", a.node.opName(), "' (", why, "): ",
                   printNode(a.node, names));
}

// ---- elementwise: unary ----
// y = -x  =>  dx = -dy
R vjpNeg(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Neg, {a.dy()}));
  return Grads{d};
}
// y = exp(x)  =>  dx = dy * y
R vjpExp(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Mul, {a.dy(), a.y()}));
  return Grads{d};
}
// y = log(x)  =>  dx = dy / x
R vjpLog(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Div, {a.dy(), a.x()}));
  return Grads{d};
}
// y = sqrt(x)  =>  dx = 0.5 * dy / y
R vjpSqrt(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * q, b.op(OpKind::Div, {a.dy(), a.y()}));
  TPC_ASSIGN(Value * d, b.op(OpKind::Scale, {q}, attrs({{"factor", 0.5}})));
  return Grads{d};
}
// y = x^-1/2  =>  dx = -0.5 * dy * y / x
R vjpRsqrt(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * p, b.op(OpKind::Mul, {a.dy(), a.y()}));
  TPC_ASSIGN(Value * q, b.op(OpKind::Div, {p, a.x()}));
  TPC_ASSIGN(Value * d, b.op(OpKind::Scale, {q}, attrs({{"factor", -0.5}})));
  return Grads{d};
}
// y = tanh(x)  =>  dx = dy - dy * y * y
R vjpTanh(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * yy, b.op(OpKind::Mul, {a.y(), a.y()}));
  TPC_ASSIGN(Value * p, b.op(OpKind::Mul, {a.dy(), yy}));
  TPC_ASSIGN(Value * d, b.op(OpKind::Sub, {a.dy(), p}));
  return Grads{d};
}
// y = gelu(x)  =>  dx = gelu_grad(dy, x)
R vjpGelu(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::GeluGrad, {a.dy(), a.x()}));
  return Grads{d};
}
// y = x * f  =>  dx = dy * f
R vjpScale(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Scale, {a.dy()}, attrs({{"factor", a.node.getFloat("factor")}})));
  return Grads{d};
}
// y = cast(x, to)  =>  dx = cast(dy, x.dtype)   (only float x ever needs a gradient)
R vjpCast(VjpBuilder& b, const VjpArgs& a) {
  if (a.dy()->dtype() == a.x()->dtype()) return Grads{a.dy()};
  TPC_ASSIGN(Value * d, b.op(OpKind::Cast, {a.dy()}, attrs({{"to", a.x()->dtype()}})));
  return Grads{d};
}
// y = mask(seed, step, key, i) * x / (1-p)  =>  dx = dropout(dy) with the same p and key: the mask depends
// only on (seed, step, key, element index), so it is drawn again identically.
R vjpDropout(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Dropout, {a.dy()}, a.node.attrs()));
  return Grads{d};
}

// ---- elementwise: binary (each operand's cotangent summed back over its broadcast axes) ----
// y = a + b  =>  da = dy, db = dy
R vjpAdd(VjpBuilder& b, const VjpArgs& a) {
  Grads g(2, nullptr);
  for (unsigned i = 0; i < 2; ++i)
    if (a.needs[i]) {
      TPC_ASSIGN(g[i], b.reduceTo(a.dy(), a.x(i)->shape()));
    }
  return g;
}
// y = a - b  =>  da = dy, db = -dy
R vjpSub(VjpBuilder& b, const VjpArgs& a) {
  Grads g(2, nullptr);
  if (a.needs[0]) {
    TPC_ASSIGN(g[0], b.reduceTo(a.dy(), a.x(0)->shape()));
  }
  if (a.needs[1]) {
    TPC_ASSIGN(Value * n, b.op(OpKind::Neg, {a.dy()}));
    TPC_ASSIGN(g[1], b.reduceTo(n, a.x(1)->shape()));
  }
  return g;
}
// y = a * b  =>  da = dy * b, db = dy * a
R vjpMul(VjpBuilder& b, const VjpArgs& a) {
  Grads g(2, nullptr);
  for (unsigned i = 0; i < 2; ++i) {
    if (!a.needs[i]) continue;
    TPC_ASSIGN(Value * p, b.op(OpKind::Mul, {a.dy(), a.x(1 - i)}));
    TPC_ASSIGN(g[i], b.reduceTo(p, a.x(i)->shape()));
  }
  return g;
}
// y = a / b  =>  da = dy / b, db = -(dy * y) / b
R vjpDiv(VjpBuilder& b, const VjpArgs& a) {
  Grads g(2, nullptr);
  if (a.needs[0]) {
    TPC_ASSIGN(Value * q, b.op(OpKind::Div, {a.dy(), a.x(1)}));
    TPC_ASSIGN(g[0], b.reduceTo(q, a.x(0)->shape()));
  }
  if (a.needs[1]) {
    TPC_ASSIGN(Value * p, b.op(OpKind::Mul, {a.dy(), a.y()}));
    TPC_ASSIGN(Value * q, b.op(OpKind::Div, {p, a.x(1)}));
    TPC_ASSIGN(Value * n, b.op(OpKind::Neg, {q}));
    TPC_ASSIGN(g[1], b.reduceTo(n, a.x(1)->shape()));
  }
  return g;
}
R vjpGeluGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }

// ---- normalization, softmax, loss ----
// y = layer_norm(x, gamma, beta)  =>  (dx, dgamma, dbeta) = layer_norm_grad(dy, x, gamma)
R vjpLayerNorm(VjpBuilder& b, const VjpArgs& a) {
  if (a.node.numOperands() != 3)
    return noGradient(a, "layer_norm with a residual is built after autodiff (fold-layer-norm-residual)");
  TPC_ASSIGN(Node * n, b.node(OpKind::LayerNormGrad, {a.dy(), a.x(0), a.x(1)}, a.node.attrs()));
  return Grads{n->result(0), n->result(1), n->result(2)};
}
R vjpLayerNormGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }
// y = softmax(x)  =>  dx = softmax_grad(dy, y)
R vjpSoftmax(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::SoftmaxGrad, {a.dy(), a.y()}, a.node.attrs()));
  return Grads{d};
}
R vjpSoftmaxGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }
// loss = cross_entropy(logits, targets)  =>  dlogits = cross_entropy_grad(dloss, logits, targets); targets
// are integers and get none.
R vjpCrossEntropy(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::CrossEntropyGrad, {a.dy(), a.x(0), a.x(1)}, a.node.attrs()));
  return Grads{d, nullptr};
}
R vjpCrossEntropyGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }
R vjpCrossEntropyWithGrad(VjpBuilder&, const VjpArgs& a) {
  return noGradient(a, "cross_entropy_with_grad is built after autodiff (fuse-classifier)");
}
// The vocab-parallel pieces exist only in partitioned graphs, after autodiff.
R vjpVocabMax(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "vocab-parallel loss ops are built after autodiff"); }
R vjpVocabSumExp(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "vocab-parallel loss ops are built after autodiff"); }
R vjpVocabPick(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "vocab-parallel loss ops are built after autodiff"); }
R vjpVocabLoss(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "vocab-parallel loss ops are built after autodiff"); }
R vjpVocabXentGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "vocab-parallel loss ops are built after autodiff"); }

// ---- contractions ----
// C = op(A) op(B) with op = transpose when flagged:  dop(A) = dC op(B)^T,  dop(B) = op(A)^T dC, each
// transposed back when its operand was transposed, then summed over the batch dims the operand broadcast.
//   dA = tA ? op(B) dC^T : dC op(B)^T        dB = tB ? dC^T op(A) : op(A)^T dC
R vjpMatmul(VjpBuilder& b, const VjpArgs& a) {
  bool tA = a.node.getBool("transpose_a"), tB = a.node.getBool("transpose_b");
  Value *A = a.x(0), *B = a.x(1), *dC = a.dy();
  auto mm = [&](Value* l, Value* r, bool tl, bool tr) {
    AttrDict t;  // only the flags that are set, as a hand-written graph would
    if (tl) t.set("transpose_a", true);
    if (tr) t.set("transpose_b", true);
    return b.op(OpKind::Matmul, {l, r}, std::move(t));
  };
  Grads g(2, nullptr);
  if (a.needs[0]) {
    TPC_ASSIGN(Value * d, tA ? mm(B, dC, tB, true) : mm(dC, B, false, !tB));
    TPC_ASSIGN(g[0], b.reduceTo(d, A->shape()));
  }
  if (a.needs[1]) {
    TPC_ASSIGN(Value * d, tB ? mm(dC, A, true, tA) : mm(A, dC, !tA, false));
    TPC_ASSIGN(g[1], b.reduceTo(d, B->shape()));
  }
  return g;
}
R vjpMatmulEpilogue(VjpBuilder&, const VjpArgs& a) {
  return noGradient(a, "it is built after autodiff (fold-matmul-epilogues, for the CUDA backend)");
}
// (out, lse) = attention(q, k, v)  =>  (dq, dk, dv) = attention_grad(dout, q, k, v, out, lse), same attributes
// (the dropout mask is drawn again from the same key). lse is a by-product for the backward; a loss that
// reads it would need its own cotangent term, which attention_grad does not take.
R vjpAttention(VjpBuilder& b, const VjpArgs& a) {
  if (a.dys[1]) return noGradient(a, "a gradient through its lse result is not supported");
  Value* dout = a.dys[0];
  TPC_ASSIGN(Node * n, b.node(OpKind::AttentionGrad, {dout, a.x(0), a.x(1), a.x(2), a.y(0), a.y(1)}, a.node.attrs()));
  return Grads{n->result(0), n->result(1), n->result(2)};
}
R vjpAttentionGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }
// (out, lse) = attention_qkv(qkv)  =>  dqkv = attention_qkv_grad(dout, qkv, out, lse), same attributes
R vjpAttentionQkv(VjpBuilder& b, const VjpArgs& a) {
  if (a.dys[1]) return noGradient(a, "a gradient through its lse result is not supported");
  TPC_ASSIGN(Node * n, b.node(OpKind::AttentionQkvGrad, {a.dys[0], a.x(0), a.y(0), a.y(1)}, a.node.attrs()));
  return Grads{n->result(0)};
}
R vjpAttentionQkvGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }
// y = table[ids]  =>  dtable = embedding_grad(dy, ids) {vocab = table rows, same vocab_start} (a scatter-add)
R vjpEmbedding(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::EmbeddingGrad, {a.dy(), a.x(1)},
                             attrs({{"vocab", a.x(0)->shape()[0]}, {"vocab_start", a.node.getInt("vocab_start")}})));
  return Grads{d, nullptr};
}
R vjpEmbeddingGrad(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "second derivatives are not supported"); }

// ---- movement ----
// y = reshape(x)  =>  dx = reshape(dy, x.shape)
R vjpReshape(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::Reshape, {a.dy()}, attrs({{"shape", vec(a.x()->shape())}})));
  return Grads{d};
}
// y = transpose(x, perm)  =>  dx = transpose(dy, inverse(perm))
R vjpTranspose(VjpBuilder& b, const VjpArgs& a) {
  const auto& perm = a.node.getInts("perm");
  std::vector<int64_t> inv(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inv[perm[k]] = static_cast<int64_t>(k);
  TPC_ASSIGN(Value * d, b.op(OpKind::Transpose, {a.dy()}, attrs({{"perm", inv}})));
  return Grads{d};
}
// y = x[start:end] on axis  =>  dx = concat(zeros before, dy, zeros after) on axis
R vjpSlice(VjpBuilder& b, const VjpArgs& a) {
  const TensorType& xt = a.x()->type();
  int64_t axis = a.node.getInt("axis");
  if (axis < 0) axis += xt.rank();
  int64_t s = a.node.getInt("start"), e = a.node.getInt("end"), n = xt.shape[axis];
  std::vector<Value*> parts;
  auto pad = [&](int64_t len) -> Status {
    if (len == 0) return {};
    TensorType t = xt;
    t.shape[axis] = len;
    TPC_ASSIGN(Value * z, b.zeros(t));
    parts.push_back(z);
    return {};
  };
  TPC_TRY(pad(s));
  parts.push_back(a.dy());
  TPC_TRY(pad(n - e));
  if (parts.size() == 1) return Grads{a.dy()};
  TPC_ASSIGN(Value * d, b.op(OpKind::Concat, parts, attrs({{"axis", axis}})));
  return Grads{d};
}
// y = concat(x0, x1, ...) on axis  =>  dxi = dy[offset_i : offset_i + len_i] on axis
R vjpConcat(VjpBuilder& b, const VjpArgs& a) {
  int64_t axis = a.node.getInt("axis");
  if (axis < 0) axis += a.x()->type().rank();
  Grads g(a.node.numOperands(), nullptr);
  int64_t off = 0;
  for (unsigned i = 0; i < a.node.numOperands(); ++i) {
    int64_t len = a.x(i)->shape()[axis];
    if (a.needs[i]) {
      if (len == a.dy()->shape()[axis]) g[i] = a.dy();
      else {
        TPC_ASSIGN(g[i], b.op(OpKind::Slice, {a.dy()}, attrs({{"axis", axis}, {"start", off}, {"end", off + len}})));
      }
    }
    off += len;
  }
  return g;
}
// y = broadcast_to(x, shape)  =>  dx = dy summed over the broadcast axes
R vjpBroadcastTo(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.reduceTo(a.dy(), a.x()->shape()));
  return Grads{d};
}

// ---- reductions and constants ----
// dy with the reduced axes put back as size 1, broadcast to x's shape.
Result<Value*> unreduce(VjpBuilder& b, const VjpArgs& a) {
  const TensorType& xt = a.x()->type();
  Value* d = a.dy();
  if (!a.node.getBool("keepdims")) {
    std::vector<int64_t> kept = vec(xt.shape);
    for (int64_t ax : a.node.getInts("axes")) kept[ax < 0 ? ax + xt.rank() : ax] = 1;
    TPC_ASSIGN(d, b.op(OpKind::Reshape, {d}, attrs({{"shape", kept}})));
  }
  if (d->shape() == xt.shape) return d;
  return b.op(OpKind::BroadcastTo, {d}, attrs({{"shape", vec(xt.shape)}}));
}
// y = sum(x, axes)  =>  dx = broadcast(dy)
R vjpReduceSum(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, unreduce(b, a));
  return Grads{d};
}
// y = mean(x, axes)  =>  dx = broadcast(dy) / (number of reduced elements)
R vjpReduceMean(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, unreduce(b, a));
  double n = static_cast<double>(a.x()->type().numel()) / static_cast<double>(std::max<int64_t>(a.y()->type().numel(), 1));
  TPC_ASSIGN(Value * s, b.op(OpKind::Scale, {d}, attrs({{"factor", 1.0 / n}})));
  return Grads{s};
}
R vjpReduceMax(VjpBuilder&, const VjpArgs& a) {
  return noGradient(a, "its gradient needs an equality mask and the IR has no comparison op");
}
R vjpFull(VjpBuilder&, const VjpArgs&) { return Grads{}; }

// ---- collectives ----
// y = all_reduce_sum(x) over the axis: every rank's x contributes to every rank's y, so
//   dx = all_reduce_sum(dy).   (max has no gradient here.)
R vjpAllReduce(VjpBuilder& b, const VjpArgs& a) {
  if (a.node.getStr("op") != "sum") return noGradient(a, "only op=sum has a gradient");
  TPC_ASSIGN(Value * d, b.op(OpKind::AllReduce, {a.dy()}, attrs({{"axis", a.node.getStr("axis")}, {"op", "sum"}})));
  return Grads{d};
}
// y = all_gather(x, dim): rank r's x is slice r of every rank's y, so dx = the sum over ranks of slice r
// of their dy:  dx = reduce_scatter_sum(dy, dim).
R vjpAllGather(VjpBuilder& b, const VjpArgs& a) {
  TPC_ASSIGN(Value * d, b.op(OpKind::ReduceScatter, {a.dy()},
                             attrs({{"axis", a.node.getStr("axis")}, {"dim", a.node.getInt("dim")}, {"op", "sum"}})));
  return Grads{d};
}
// y = reduce_scatter_sum(x, dim): slice r of every rank's x is summed into rank r's y, so each rank's dx is
// every rank's dy side by side:  dx = all_gather(dy, dim).   (max has no gradient here.)
R vjpReduceScatter(VjpBuilder& b, const VjpArgs& a) {
  if (a.node.getStr("op") != "sum") return noGradient(a, "only op=sum has a gradient");
  TPC_ASSIGN(Value * d, b.op(OpKind::AllGather, {a.dy()}, attrs({{"axis", a.node.getStr("axis")}, {"dim", a.node.getInt("dim")}})));
  return Grads{d};
}

// ---- optimizer: the training step's tail, never differentiated ----
R vjpGlobalNorm(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "optimizer ops have no gradient"); }
R vjpSumSquares(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "optimizer ops have no gradient"); }
R vjpClipScale(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "optimizer ops have no gradient"); }
R vjpAdamWUpdate(VjpBuilder&, const VjpArgs& a) { return noGradient(a, "optimizer ops have no gradient"); }

using Rule = R (*)(VjpBuilder&, const VjpArgs&);
const Rule kRules[] = {
#define OP(Enum, name, nops, nres, traits, attrs) &vjp##Enum,
#include "ir/ops.def"
#undef OP
};

}  // namespace

Result<std::vector<Value*>> applyVjp(VjpBuilder& b, const VjpArgs& args) {
  TPC_ASSIGN(Grads g, kRules[static_cast<size_t>(args.node.op())](b, args));
  TPC_ASSERT(g.size() == args.node.numOperands(), std::string(args.node.opName()) + ": VJP rule returned the wrong arity");
  for (unsigned i = 0; i < g.size(); ++i) {
    if (!args.needs[i]) g[i] = nullptr;
    else TPC_ASSERT(g[i] && g[i]->type() == args.node.operand(i)->type(),
                    std::string(args.node.opName()) + ": VJP rule gave a cotangent of the wrong type for operand " +
                        std::to_string(i));
  }
  return g;
}

}  // namespace tpc
