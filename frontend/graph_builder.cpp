// GraphBuilder: typed helpers over Graph::create; type errors are builder bugs (assertions).
#include "frontend/graph_builder.h"

#include "ir/assert.h"

namespace tpc {

std::string GraphBuilder::scopedName(const std::string& name) const {
  std::string s;
  for (const std::string& sc : scopes_) s += sc + ".";
  return s + name;
}

Value* GraphBuilder::input(const std::string& name, DType dtype, Shape shape) {
  return g_.addInput(scopedName(name), TensorType(dtype, std::move(shape)));
}

Value* GraphBuilder::param(const std::string& name, Shape shape, InitSpec init, DType dtype) {
  TPC_ASSERT(validateInit(init).ok(), "bad initializer " + init.str() + " for " + scopedName(name));
  return g_.addParam(scopedName(name), TensorType(dtype, std::move(shape)), std::move(init));
}

void GraphBuilder::output(Value* v, const std::string& name) { g_.addOutput(v, name); }

Value* GraphBuilder::named(Value* v, const std::string& name) {
  v->setName(scopedName(name));
  return v;
}

Node* GraphBuilder::op(OpKind kind, llvm::ArrayRef<Value*> operands, AttrDict attrs) {
  auto n = g_.create(kind, operands, std::move(attrs));
  TPC_ASSERT_GRAPH(g_, n.ok(), "graph builder: " + (n.ok() ? std::string() : n.error()));
  return *n;
}

Value* GraphBuilder::matmul(Value* a, Value* b, bool transB, bool transA) {
  AttrDict attrs;
  if (transA) attrs.set("transpose_a", true);
  if (transB) attrs.set("transpose_b", true);
  return op1(OpKind::Matmul, {a, b}, std::move(attrs));
}

Value* GraphBuilder::linear(Value* x, Value* w, Value* bias) {
  Value* y = matmul(x, w);
  return bias ? add(y, bias) : y;
}

Value* GraphBuilder::layerNorm(Value* x, Value* gamma, Value* beta, double eps) {
  AttrDict attrs;
  attrs.set("eps", eps);
  return op1(OpKind::LayerNorm, {x, gamma, beta}, std::move(attrs));
}

Value* GraphBuilder::dropout(Value* x, double p) {
  if (p == 0.0) return x;
  AttrDict attrs;
  attrs.set("p", p);
  attrs.set("key", nextRandomKey());
  return op1(OpKind::Dropout, {x}, std::move(attrs));
}

Value* GraphBuilder::attention(Value* q, Value* k, Value* v, double dropoutP, bool causal) {
  AttrDict attrs;
  attrs.set("causal", causal);
  if (dropoutP > 0.0) {
    attrs.set("dropout", dropoutP);
    attrs.set("key", nextRandomKey());
  }
  return op(OpKind::Attention, {q, k, v}, std::move(attrs))->result(0);
}

Value* GraphBuilder::reshape(Value* x, std::vector<int64_t> shape) {
  AttrDict attrs;
  attrs.set("shape", std::move(shape));
  return op1(OpKind::Reshape, {x}, std::move(attrs));
}

Value* GraphBuilder::transpose(Value* x, std::vector<int64_t> perm) {
  AttrDict attrs;
  attrs.set("perm", std::move(perm));
  return op1(OpKind::Transpose, {x}, std::move(attrs));
}

Value* GraphBuilder::slice(Value* x, int64_t axis, int64_t start, int64_t end) {
  AttrDict attrs;
  attrs.set("axis", axis);
  attrs.set("start", start);
  attrs.set("end", end);
  return op1(OpKind::Slice, {x}, std::move(attrs));
}

Value* GraphBuilder::reduceMean(Value* x, std::vector<int64_t> axes) {
  AttrDict attrs;
  attrs.set("axes", std::move(axes));
  return op1(OpKind::ReduceMean, {x}, std::move(attrs));
}

}  // namespace tpc
