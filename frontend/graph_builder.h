// A typed C++ layer over Graph::create for model builders (models/). Shapes are the builder's
// responsibility: a node that does not type-check is a bug in the builder, so it is a TPC_ASSERT.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace tpc {

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  // Name scopes: a parameter created while scopes "h.0" and "attn" are open is named "h.0.attn.<name>".
  class Scope {
   public:
    Scope(GraphBuilder& b, std::string name) : b_(b) { b_.scopes_.push_back(std::move(name)); }
    ~Scope() { b_.scopes_.pop_back(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GraphBuilder& b_;
  };
  Scope scope(std::string name) { return Scope(*this, std::move(name)); }
  std::string scopedName(const std::string& name) const;

  Value* input(const std::string& name, DType dtype, Shape shape);
  Value* param(const std::string& name, Shape shape, InitSpec init, DType dtype = DType::f32);
  void output(Value* v, const std::string& name);
  // Names an intermediate value (shown by the printer instead of a number).
  Value* named(Value* v, const std::string& name);

  // Any op; the typed helpers below call this.
  Node* op(OpKind kind, llvm::ArrayRef<Value*> operands, AttrDict attrs = {});
  Value* op1(OpKind kind, llvm::ArrayRef<Value*> operands, AttrDict attrs = {}) { return op(kind, operands, std::move(attrs))->result(0); }

  Value* add(Value* a, Value* b) { return op1(OpKind::Add, {a, b}); }
  Value* mul(Value* a, Value* b) { return op1(OpKind::Mul, {a, b}); }
  Value* gelu(Value* x) { return op1(OpKind::Gelu, {x}); }
  Value* matmul(Value* a, Value* b, bool transB = false, bool transA = false);
  // x @ w + bias (bias may be null).
  Value* linear(Value* x, Value* w, Value* bias);
  Value* layerNorm(Value* x, Value* gamma, Value* beta, double eps);
  Value* embedding(Value* table, Value* ids) { return op1(OpKind::Embedding, {table, ids}); }
  // Dropout with a fresh random key; p == 0 returns x unchanged.
  Value* dropout(Value* x, double p);
  // Causal attention on [B, H, T, Dh]; returns the output (the log-sum-exp result stays in the graph).
  Value* attention(Value* q, Value* k, Value* v, double dropoutP, bool causal = true);
  Value* reshape(Value* x, std::vector<int64_t> shape);
  Value* transpose(Value* x, std::vector<int64_t> perm);
  Value* slice(Value* x, int64_t axis, int64_t start, int64_t end);
  Value* crossEntropy(Value* logits, Value* targets) { return op1(OpKind::CrossEntropy, {logits, targets}); }
  Value* reduceMean(Value* x, std::vector<int64_t> axes);

  // Keys for random ops: unique within the graph, starting at 1.
  int64_t nextRandomKey() { return ++lastKey_; }

 private:
  Graph& g_;
  std::vector<std::string> scopes_;
  int64_t lastKey_ = 0;
};

}  // namespace tpc
