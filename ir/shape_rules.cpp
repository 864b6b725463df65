// One shape/dtype rule per op (ops.def order). Each rule also rejects what the op cannot take, so the
// verifier is "infer again and compare". Messages start with the op name and say what is wrong.
#include "ir/shape_rules.h"

#include <algorithm>
#include <set>

#include "ir/assert.h"

namespace tpc {
namespace {

using Types = std::vector<TensorType>;

struct Ctx {
  OpKind op;
  llvm::ArrayRef<TensorType> in;
  const AttrDict& attrs;
  const Mesh& mesh;

  std::string_view name() const { return opName(op); }
  const Attr& attr(std::string_view a) const {
    if (const Attr* v = attrs.find(a)) return *v;
    const AttrSpec* spec = opInfo(op).findAttr(a);
    TPC_ASSERT(spec && spec->defaultValue, std::string(name()) + ": attribute " + std::string(a));
    return *spec->defaultValue;
  }
  int64_t i(std::string_view a) const { return attr(a).i(); }
  double f(std::string_view a) const { return attr(a).f(); }
  bool b(std::string_view a) const { return attr(a).b(); }
  const std::string& s(std::string_view a) const { return attr(a).s(); }
  const std::vector<int64_t>& ints(std::string_view a) const { return attr(a).ints(); }

  template <class... Args>
  Error err(const Args&... args) const {
    return makeError(name(), ": ", args...);
  }
  Status needFloat(size_t k, const char* what) const {
    if (!isFloat(in[k].dtype)) return err(what, " must be a float tensor, got ", in[k].str());
    return {};
  }
  Status needInt(size_t k, const char* what) const {
    if (!isInteger(in[k].dtype)) return err(what, " must be an i32 or i64 tensor, got ", in[k].str());
    return {};
  }
  Status needRank(size_t k, int64_t r, const char* what) const {
    if (in[k].rank() != r) return err(what, " must have rank ", r, ", got ", in[k].str());
    return {};
  }
  Status needSame(size_t a, size_t b, const char* wa, const char* wb) const {
    if (in[a] != in[b]) return err(wa, " and ", wb, " must have the same type, got ", in[a].str(), " and ", in[b].str());
    return {};
  }
  Status needProb(std::string_view a) const {
    double p = f(a);
    if (!(p >= 0.0 && p < 1.0)) return err(a, "=", formatFloat(p), " must be in [0, 1)");
    return {};
  }
  Result<int64_t> meshAxis(std::string_view a) const {
    const std::string& ax = s(a);
    int idx = mesh.axisIndex(ax);
    if (idx < 0) {
      if (mesh.empty()) return err("axis '", ax, "' is not in the graph's mesh (the graph has no mesh(...))");
      return err("axis '", ax, "' is not in the graph's ", mesh.str());
    }
    return mesh.axes[idx].size;
  }
};

Types one(TensorType t) { return Types{std::move(t)}; }

// ---- elementwise ----
Result<Types> unaryFloat(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "operand"));
  return one(c.in[0]);
}
Result<Types> inferNeg(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferExp(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferLog(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferSqrt(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferRsqrt(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferTanh(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferGelu(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferScale(const Ctx& c) { return unaryFloat(c); }
Result<Types> inferCast(const Ctx& c) { return one(TensorType(c.attr("to").dtype(), c.in[0].shape)); }
Result<Types> inferDropout(const Ctx& c) {
  TPC_TRY(c.needProb("p"));
  return unaryFloat(c);
}

Result<Types> binary(const Ctx& c) {
  if (c.in[0].dtype != c.in[1].dtype)
    return c.err("operand dtypes differ: ", c.in[0].str(), " and ", c.in[1].str(), " (insert a cast)");
  auto s = broadcastShapes(c.in[0].shape, c.in[1].shape);
  if (!s) return c.err(s.error());
  return one(TensorType(c.in[0].dtype, *s));
}
Result<Types> inferAdd(const Ctx& c) { return binary(c); }
Result<Types> inferSub(const Ctx& c) { return binary(c); }
Result<Types> inferMul(const Ctx& c) { return binary(c); }
Result<Types> inferDiv(const Ctx& c) { return binary(c); }
Result<Types> inferGeluGrad(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "dy"));
  TPC_TRY(c.needSame(0, 1, "dy", "x"));
  return one(c.in[1]);
}

// ---- normalization, softmax, loss ----
Status checkLayerNormAffine(const Ctx& c, size_t x, size_t gamma, size_t beta) {
  TPC_TRY(c.needFloat(x, "x"));
  if (c.in[x].rank() < 1) return c.err("x must have rank >= 1, got ", c.in[x].str());
  int64_t d = c.in[x].shape.back();
  for (size_t k : {gamma, beta}) {
    if (k == SIZE_MAX) continue;
    TPC_TRY(c.needFloat(k, "gamma/beta"));
    if (c.in[k].rank() != 1 || c.in[k].shape[0] != d)
      return c.err("gamma/beta must be [", d, "] (the last dim of x), got ", c.in[k].str());
  }
  if (c.f("eps") <= 0) return c.err("eps must be > 0");
  return {};
}
Result<Types> inferLayerNorm(const Ctx& c) {
  if (c.in.size() != 3 && c.in.size() != 4)
    return c.err("takes (x, gamma, beta) or (x, gamma, beta, residual), got ", c.in.size(), " operands");
  TPC_TRY(checkLayerNormAffine(c, 0, 1, 2));
  if (c.in.size() == 3) return one(c.in[0]);
  TPC_TRY(c.needSame(3, 0, "residual", "x"));
  return Types{c.in[0], c.in[0]};
}
Result<Types> inferLayerNormGrad(const Ctx& c) {
  if (c.in.size() != 3 && c.in.size() != 4)
    return c.err("takes (dy, x, gamma) or (dy, x, gamma, residual), got ", c.in.size(), " operands");
  TPC_TRY(checkLayerNormAffine(c, 1, 2, SIZE_MAX));
  TPC_TRY(c.needSame(0, 1, "dy", "x"));
  if (c.in.size() == 4) TPC_TRY(c.needSame(3, 1, "residual", "x"));
  Types out{c.in[1], c.in[2], c.in[2]};
  if (c.b("sum_dx")) out.push_back(TensorType(c.in[1].dtype, {c.in[1].shape.back()}));
  return out;
}
Result<Types> inferSoftmax(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "operand"));
  auto ax = normalizeAxis(c.i("axis"), c.in[0].rank());
  if (!ax) return c.err(ax.error());
  return one(c.in[0]);
}
Result<Types> inferSoftmaxGrad(const Ctx& c) {
  TPC_TRY(c.needSame(0, 1, "dy", "y"));
  return inferSoftmax(c);
}
Status checkLogitsTargets(const Ctx& c, size_t logits, size_t targets) {
  TPC_TRY(c.needFloat(logits, "logits"));
  TPC_TRY(c.needInt(targets, "targets"));
  const TensorType& l = c.in[logits];
  const TensorType& t = c.in[targets];
  if (l.rank() < 1 || llvm::ArrayRef<int64_t>(l.shape).drop_back() != llvm::ArrayRef<int64_t>(t.shape))
    return c.err("targets must have the shape of logits without the class dim: logits ", l.str(), ", targets ", t.str());
  return {};
}
Result<Types> inferCrossEntropy(const Ctx& c) {
  TPC_TRY(checkLogitsTargets(c, 0, 1));
  return one(TensorType(DType::f32, c.in[1].shape));
}
Result<Types> inferCrossEntropyGrad(const Ctx& c) {
  TPC_TRY(checkLogitsTargets(c, 1, 2));
  if (c.in[0].shape != c.in[2].shape || !isFloat(c.in[0].dtype))
    return c.err("dloss must be a float tensor shaped like targets ", shapeStr(c.in[2].shape), ", got ", c.in[0].str());
  return one(c.in[1]);
}
Result<Types> inferCrossEntropyWithGrad(const Ctx& c) {
  TPC_ASSIGN(Types grad, inferCrossEntropyGrad(c));
  return Types{TensorType(DType::f32, c.in[2].shape), grad[0]};
}
// Vocab-parallel pieces: per-position f32 statistics shaped like the logits without the class dim.
Status checkRows(const Ctx& c, size_t k, const TensorType& logits, const char* what) {
  llvm::ArrayRef<int64_t> rows = llvm::ArrayRef<int64_t>(logits.shape).drop_back();
  if (llvm::ArrayRef<int64_t>(c.in[k].shape) != rows)
    return c.err(what, " must be shaped ", shapeStr(rows), ", got ", c.in[k].str());
  return {};
}
Result<Types> inferVocabMax(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "logits"));
  if (c.in[0].rank() < 1) return c.err("logits must have a class dim, got ", c.in[0].str());
  llvm::ArrayRef<int64_t> rows = llvm::ArrayRef<int64_t>(c.in[0].shape).drop_back();
  return one(TensorType(DType::f32, Shape(rows.begin(), rows.end())));
}
Result<Types> inferVocabSumExp(const Ctx& c) {
  TPC_ASSIGN(Types t, inferVocabMax(c));
  TPC_TRY(checkRows(c, 1, c.in[0], "gmax"));
  return t;
}
Result<Types> inferVocabPick(const Ctx& c) {
  TPC_TRY(checkLogitsTargets(c, 0, 1));
  return one(TensorType(DType::f32, c.in[1].shape));
}
Result<Types> inferVocabLoss(const Ctx& c) {
  TPC_TRY(c.needInt(3, "targets"));
  for (size_t k : {0, 1, 2})
    if (c.in[k].shape != c.in[3].shape) return c.err("statistics must be shaped like targets ", c.in[3].str(), ", got ", c.in[k].str());
  return one(TensorType(DType::f32, c.in[3].shape));
}
Result<Types> inferVocabXentGrad(const Ctx& c) {
  TPC_TRY(checkLogitsTargets(c, 1, 4));
  for (size_t k : {0, 2, 3}) TPC_TRY(checkRows(c, k, c.in[1], "dloss, gmax and sumexp"));
  return one(c.in[1]);
}

// ---- contractions ----
Result<Types> inferMatmul(const Ctx& c) {
  const TensorType &a = c.in[0], &b = c.in[1];
  if (a.rank() < 2 || b.rank() < 2) return c.err("operands must have rank >= 2, got ", a.str(), " and ", b.str());
  TPC_TRY(c.needFloat(0, "a"));
  if (a.dtype != b.dtype) return c.err("operand dtypes differ: ", a.str(), " and ", b.str());
  int64_t m = a.shape[a.rank() - 2], ka = a.shape[a.rank() - 1];
  if (c.b("transpose_a")) std::swap(m, ka);
  int64_t kb = b.shape[b.rank() - 2], n = b.shape[b.rank() - 1];
  if (c.b("transpose_b")) std::swap(kb, n);
  if (ka != kb)
    return c.err("contraction dims differ: ", a.str(), (c.b("transpose_a") ? "^T" : ""), " x ", b.str(),
                 (c.b("transpose_b") ? "^T" : ""), " (", ka, " vs ", kb, ")");
  auto batch = broadcastShapes(llvm::ArrayRef<int64_t>(a.shape).drop_back(2), llvm::ArrayRef<int64_t>(b.shape).drop_back(2));
  if (!batch) return c.err("batch dims: ", batch.error());
  Shape out = *batch;
  out.push_back(m);
  out.push_back(n);
  return one(TensorType(a.dtype, out));
}
// The operand and result lists per epilogue are in ops.def; the layout limits are cuBLASLt's (one GEMM).
Result<Types> inferMatmulEpilogue(const Ctx& c) {
  const std::string& e = c.s("epilogue");
  size_t want = e == "bgrad_b" || e == "bgrad_a" ? 2 : 3;
  bool residual = e == "bias" && c.in.size() == 4;
  if (e != "bias" && e != "gelu_bias" && e != "dgelu" && e != "dgelu_bgrad" && e != "bgrad_b" && e != "bgrad_a")
    return c.err("epilogue '", e, "' is not one of bias, gelu_bias, dgelu, dgelu_bgrad, bgrad_b, bgrad_a");
  if (c.in.size() != want && !residual)
    return c.err("epilogue ", e, " takes ", want, e == "bias" ? " or 4" : "", " operands, got ", c.in.size());
  TPC_ASSIGN(Types mm, (inferMatmul(Ctx{c.op, c.in.take_front(2), c.attrs, c.mesh})));
  const TensorType& out = mm[0];
  TPC_TRY(c.needRank(1, 2, "b"));
  if (c.b("transpose_a")) TPC_TRY(c.needRank(0, 2, "a (transposed)"));
  const int64_t N = out.shape.back();
  TensorType vec(out.dtype, {N});
  if (e == "bias" || e == "gelu_bias")
    if (c.in[2] != vec) return c.err("bias must be ", vec.str(), ", got ", c.in[2].str());
  if (e == "dgelu" || e == "dgelu_bgrad")
    if (c.in[2] != out) return c.err("pre (the gelu input) must be ", out.str(), ", got ", c.in[2].str());
  if (residual && c.in[3] != out) return c.err("residual must be ", out.str(), ", got ", c.in[3].str());
  if (e == "bgrad_b" && (!c.b("transpose_a") || c.b("transpose_b")))
    return c.err("epilogue bgrad_b needs transpose_a=true and transpose_b=false (b's rows are the sum)");
  if (e == "bgrad_a" && c.b("transpose_a"))
    return c.err("epilogue bgrad_a needs transpose_a=false (a's rows are the sum)");
  if (e == "gelu_bias") return Types{out, out};
  if (e == "dgelu_bgrad" || e == "bgrad_b") return Types{out, vec};
  if (e == "bgrad_a") return Types{out, TensorType(c.in[0].dtype, {c.in[0].shape.back()})};
  return mm;
}
Status checkQKV(const Ctx& c, size_t q, size_t k, size_t v) {
  for (size_t x : {q, k, v}) {
    TPC_TRY(c.needRank(x, 4, "q, k and v ([batch, heads, seq, head_dim])"));
    TPC_TRY(c.needFloat(x, "q, k and v"));
  }
  const TensorType &Q = c.in[q], &K = c.in[k], &V = c.in[v];
  if (K != V) return c.err("k and v must have the same type, got ", K.str(), " and ", V.str());
  if (Q.dtype != K.dtype || Q.shape[0] != K.shape[0] || Q.shape[1] != K.shape[1] || Q.shape[3] != K.shape[3])
    return c.err("q ", Q.str(), " and k ", K.str(), " disagree on batch, heads, head_dim or dtype");
  if (c.b("causal") && Q.shape[2] != K.shape[2])
    return c.err("causal attention needs q and k of the same sequence length, got ", Q.shape[2], " and ", K.shape[2]);
  if (c.f("scale") < 0) return c.err("scale must be >= 0 (0 means 1/sqrt(head_dim))");
  return c.needProb("dropout");
}
TensorType lseType(const TensorType& q) { return TensorType(DType::f32, {q.shape[0], q.shape[1], q.shape[2]}); }
Result<Types> inferAttention(const Ctx& c) {
  TPC_TRY(checkQKV(c, 0, 1, 2));
  return Types{c.in[0], lseType(c.in[0])};
}
Result<Types> inferAttentionGrad(const Ctx& c) {
  TPC_TRY(checkQKV(c, 1, 2, 3));
  TPC_TRY(c.needSame(0, 1, "dout", "q"));
  TPC_TRY(c.needSame(4, 1, "out", "q"));
  if (c.in[5] != lseType(c.in[1])) return c.err("lse must be ", lseType(c.in[1]).str(), ", got ", c.in[5].str());
  return Types{c.in[1], c.in[2], c.in[3]};
}
Result<Types> inferAttentionQkv(const Ctx& c) {
  TPC_TRY(c.needRank(0, 5, "qkv"));
  TPC_TRY(c.needFloat(0, "qkv"));
  auto p = packedQkv(c.in[0].shape, c.ints("perm"));
  if (!p) return c.err(p.error());
  if (c.f("scale") < 0) return c.err("scale must be >= 0 (0 means 1/sqrt(head_dim))");
  TPC_TRY(c.needProb("dropout"));
  return Types{TensorType(c.in[0].dtype, {p->B, p->T, p->H, p->D}), TensorType(DType::f32, {p->B, p->H, p->T})};
}
Result<Types> inferAttentionQkvGrad(const Ctx& c) {
  std::vector<TensorType> qkv{c.in[1]};
  TPC_ASSIGN(Types fwd, inferAttentionQkv(Ctx{OpKind::AttentionQkv, qkv, c.attrs, c.mesh}));
  if (c.in[0] != fwd[0]) return c.err("dout must be ", fwd[0].str(), ", got ", c.in[0].str());
  if (c.in[2] != fwd[0]) return c.err("out must be ", fwd[0].str(), ", got ", c.in[2].str());
  if (c.in[3] != fwd[1]) return c.err("lse must be ", fwd[1].str(), ", got ", c.in[3].str());
  return Types{c.in[1]};
}
Result<Types> inferEmbedding(const Ctx& c) {
  TPC_TRY(c.needRank(0, 2, "table ([vocab, dim])"));
  TPC_TRY(c.needFloat(0, "table"));
  TPC_TRY(c.needInt(1, "ids"));
  if (c.i("vocab_start") < 0) return c.err("vocab_start must be >= 0");
  Shape out = c.in[1].shape;
  out.push_back(c.in[0].shape[1]);
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferEmbeddingGrad(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "dy"));
  TPC_TRY(c.needInt(1, "ids"));
  const TensorType &dy = c.in[0], &ids = c.in[1];
  if (dy.rank() != ids.rank() + 1 || llvm::ArrayRef<int64_t>(dy.shape).drop_back() != llvm::ArrayRef<int64_t>(ids.shape))
    return c.err("dy must be ids' shape plus the embedding dim: dy ", dy.str(), ", ids ", ids.str());
  if (c.i("vocab") <= 0) return c.err("vocab must be > 0, got ", c.i("vocab"));
  return one(TensorType(dy.dtype, {c.i("vocab"), dy.shape.back()}));
}

// ---- movement ----
Result<Types> inferReshape(const Ctx& c) {
  const auto& want = c.ints("shape");
  Shape out(want.begin(), want.end());
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == -1) {
      if (infer >= 0) return c.err("shape ", shapeStr(want), " has more than one -1");
      infer = static_cast<int64_t>(k);
    } else if (out[k] < 0) {
      return c.err("shape ", shapeStr(want), " has a negative size");
    } else if (__builtin_mul_overflow(known, out[k], &known)) {
      return c.err("shape ", shapeStr(want), " has too many elements (the count overflows int64)");
    }
  }
  int64_t n = c.in[0].numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0) return c.err("cannot reshape ", c.in[0].str(), " to ", shapeStr(want));
    out[infer] = n / known;
  } else if (known != n) {
    return c.err("cannot reshape ", c.in[0].str(), " (", n, " elements) to ", shapeStr(want), " (", known, " elements)");
  }
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferTranspose(const Ctx& c) {
  const auto& perm = c.ints("perm");
  int64_t r = c.in[0].rank();
  std::vector<int64_t> sorted(perm);
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int64_t>(perm.size()) == r;
  for (int64_t k = 0; ok && k < r; ++k) ok = sorted[k] == k;
  if (!ok) return c.err("perm ", shapeStr(perm), " is not a permutation of the ", r, " dims of ", c.in[0].str());
  Shape out;
  for (int64_t p : perm) out.push_back(c.in[0].shape[p]);
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferSlice(const Ctx& c) {
  auto ax = normalizeAxis(c.i("axis"), c.in[0].rank());
  if (!ax) return c.err(ax.error());
  int64_t d = c.in[0].shape[*ax], s = c.i("start"), e = c.i("end");
  if (s < 0 || e > d || s >= e) return c.err("slice [", s, ", ", e, ") is not inside dim ", *ax, " of ", c.in[0].str());
  Shape out = c.in[0].shape;
  out[*ax] = e - s;
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferConcat(const Ctx& c) {
  auto ax = normalizeAxis(c.i("axis"), c.in[0].rank());
  if (!ax) return c.err(ax.error());
  Shape out = c.in[0].shape;
  out[*ax] = 0;
  for (const TensorType& t : c.in) {
    bool ok = t.dtype == c.in[0].dtype && t.rank() == c.in[0].rank();
    for (int64_t k = 0; ok && k < t.rank(); ++k) ok = k == *ax || t.shape[k] == c.in[0].shape[k];
    if (!ok) return c.err("operands ", c.in[0].str(), " and ", t.str(), " differ outside the concat axis ", *ax);
    out[*ax] += t.shape[*ax];
  }
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferBroadcastTo(const Ctx& c) {
  const auto& want = c.ints("shape");
  auto s = broadcastShapes(c.in[0].shape, want);
  if (!s || llvm::ArrayRef<int64_t>(*s) != llvm::ArrayRef<int64_t>(want))
    return c.err("cannot broadcast ", c.in[0].str(), " to ", shapeStr(want));
  return one(TensorType(c.in[0].dtype, Shape(want.begin(), want.end())));
}

// ---- reductions and constants ----
Result<Types> reduce(const Ctx& c) {
  int64_t r = c.in[0].rank();
  std::set<int64_t> axes;
  for (int64_t a : c.ints("axes")) {
    auto ax = normalizeAxis(a, r);
    if (!ax) return c.err(ax.error());
    if (!axes.insert(*ax).second) return c.err("axis ", a, " listed twice");
  }
  Shape out;
  for (int64_t k = 0; k < r; ++k) {
    if (!axes.count(k)) out.push_back(c.in[0].shape[k]);
    else if (c.b("keepdims")) out.push_back(1);
  }
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferReduceSum(const Ctx& c) { return reduce(c); }
Result<Types> inferReduceMean(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "operand"));
  return reduce(c);
}
Result<Types> inferReduceMax(const Ctx& c) { return reduce(c); }
Result<Types> inferFull(const Ctx& c) {
  const auto& s = c.ints("shape");
  for (int64_t d : s)
    if (d < 0) return c.err("shape ", shapeStr(s), " has a negative size");
  return one(TensorType(c.attr("dtype").dtype(), Shape(s.begin(), s.end())));
}

// ---- collectives ----
Status checkReduceOp(const Ctx& c) {
  const std::string& op = c.s("op");
  if (op != "sum" && op != "max") return c.err("op=", op, " is not a reduction (expected sum or max)");
  return {};
}
Result<Types> inferAllReduce(const Ctx& c) {
  TPC_TRY(c.meshAxis("axis").status());
  TPC_TRY(checkReduceOp(c));
  return one(c.in[0]);
}
Result<Types> inferAllGather(const Ctx& c) {
  TPC_ASSIGN(int64_t n, c.meshAxis("axis"));
  auto d = normalizeAxis(c.i("dim"), c.in[0].rank());
  if (!d) return c.err("dim=", c.i("dim"), " is out of range for ", c.in[0].str());
  Shape out = c.in[0].shape;
  out[*d] *= n;
  return one(TensorType(c.in[0].dtype, out));
}
Result<Types> inferReduceScatter(const Ctx& c) {
  TPC_ASSIGN(int64_t n, c.meshAxis("axis"));
  TPC_TRY(checkReduceOp(c));
  auto d = normalizeAxis(c.i("dim"), c.in[0].rank());
  if (!d) return c.err("dim=", c.i("dim"), " is out of range for ", c.in[0].str());
  Shape out = c.in[0].shape;
  if (out[*d] % n != 0)
    return c.err("dim ", *d, " of ", c.in[0].str(), " is not divisible by the ", c.s("axis"), " axis size ", n);
  out[*d] /= n;
  return one(TensorType(c.in[0].dtype, out));
}

// ---- optimizer ----
Status needScalarF32(const Ctx& c, size_t k, const char* what) {
  if (c.in[k] != TensorType(DType::f32, {})) return c.err(what, " must be a scalar f32[], got ", c.in[k].str());
  return {};
}
Result<Types> inferGlobalNorm(const Ctx& c) {
  for (size_t k = 0; k < c.in.size(); ++k) TPC_TRY(c.needFloat(k, "every operand"));
  return one(TensorType(DType::f32, {}));
}
Result<Types> inferSumSquares(const Ctx& c) { return inferGlobalNorm(c); }
Result<Types> inferClipScale(const Ctx& c) {
  TPC_TRY(needScalarF32(c, 0, "norm"));
  if (c.f("max_norm") <= 0) return c.err("max_norm must be > 0");
  return one(c.in[0]);
}
Result<Types> inferAdamWUpdate(const Ctx& c) {
  TPC_TRY(c.needFloat(0, "param"));
  for (size_t k : {1, 2, 3}) {
    TPC_TRY(c.needFloat(k, "grad, m and v"));
    if (c.in[k].shape != c.in[0].shape)
      return c.err("grad, m and v must be shaped like param ", c.in[0].str(), ", got ", c.in[k].str());
  }
  TPC_TRY(needScalarF32(c, 4, "lr"));
  TPC_TRY(needScalarF32(c, 5, "step"));
  for (const char* b : {"beta1", "beta2"})
    if (!(c.f(b) >= 0 && c.f(b) < 1)) return c.err(b, " must be in [0, 1)");
  if (c.f("eps") <= 0 || c.f("weight_decay") < 0) return c.err("eps must be > 0 and weight_decay >= 0");
  return Types{c.in[0], c.in[2], c.in[3]};
}

using Rule = Result<Types> (*)(const Ctx&);
const Rule kRules[] = {
#define OP(Enum, name, nops, nres, traits, attrs) &infer##Enum,
#include "ir/ops.def"
#undef OP
};

}  // namespace

Result<Shape> broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t k = 0; k < r; ++k) {
    int64_t x = k < r - a.size() ? 1 : a[k - (r - a.size())];
    int64_t y = k < r - b.size() ? 1 : b[k - (r - b.size())];
    if (x != y && x != 1 && y != 1) return makeError("shapes ", shapeStr(a), " and ", shapeStr(b), " do not broadcast");
    out[k] = x == 1 ? y : x;
  }
  return out;
}

Result<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return makeError("axis ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

Status checkAttrs(OpKind op, const AttrDict& attrs) {
  const OpInfo& info = opInfo(op);
  for (const auto& [name, value] : attrs) {
    const AttrSpec* spec = info.findAttr(name);
    if (!spec) {
      std::string known;
      for (const AttrSpec& a : info.attrs) known += (known.empty() ? "" : ", ") + a.name;
      return makeError(info.name, " has no attribute '", name, "'",
                       known.empty() ? std::string(" (it takes none)") : " (it takes: " + known + ")");
    }
    if (value.kind() != spec->kind)
      return makeError(info.name, ": attribute '", name, "' must be ", attrKindName(spec->kind), ", got ", value.str());
  }
  for (const AttrSpec& a : info.attrs)
    if (!a.defaultValue && !attrs.find(a.name)) return makeError(info.name, ": missing required attribute '", a.name, "'");
  return {};
}

Result<std::vector<TensorType>> inferTypes(OpKind op, llvm::ArrayRef<TensorType> operands, const AttrDict& attrs,
                                           const Mesh& mesh) {
  Ctx c{op, operands, attrs, mesh};
  TPC_ASSIGN(Types types, kRules[static_cast<size_t>(op)](c));
  // A shape taken from an attribute (broadcast_to's, full's) may hold more elements than an int64 counts.
  for (const TensorType& t : types)
    if (numelOverflows(t.shape)) return c.err("result shape ", shapeStr(t.shape), " has too many elements (the count overflows int64)");
  return types;
}

Result<PackedQkv> packedQkv(llvm::ArrayRef<int64_t> qkvShape, llvm::ArrayRef<int64_t> perm) {
  std::vector<int64_t> sorted(perm.begin(), perm.end());
  std::sort(sorted.begin(), sorted.end());
  if (qkvShape.size() != 5 || sorted != std::vector<int64_t>{0, 1, 2, 3, 4} || perm[4] != 4)
    return makeError("perm ", shapeStr(perm), " must permute the 5 dims of qkv ", shapeStr(qkvShape),
                     " to [3, batch, heads, seq, head_dim] (head_dim last)");
  if (qkvShape[perm[0]] != 3)
    return makeError("qkv ", shapeStr(qkvShape), " must have 3 (q, k, v) at dim ", perm[0]);
  int64_t stride[5], acc = 1;
  for (int k = 4; k >= 0; --k) {
    stride[k] = acc;
    acc *= qkvShape[k];
  }
  return PackedQkv{qkvShape[perm[1]], qkvShape[perm[2]], qkvShape[perm[3]], qkvShape[4],
                   stride[perm[0]],   stride[perm[1]],   stride[perm[2]],   stride[perm[3]]};
}

}  // namespace tpc
