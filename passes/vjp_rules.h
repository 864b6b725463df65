// The VJP rules of autodiff (one per op, in vjp_rules.cpp) and the small builder they emit nodes with.
// Private to passes/: autodiff.cpp is the only user.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "llvm/ADT/ArrayRef.h"

namespace tpc {

// Appends backward nodes at the end of a graph (so a backward runs after the forward it differentiates).
class VjpBuilder {
 public:
  explicit VjpBuilder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  Result<Node*> node(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs = {});
  Result<Value*> op(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs = {});
  // full(shape, 0) of type t.
  Result<Value*> zeros(const TensorType& t);
  // Sums a broadcast cotangent back to `target` (numpy broadcasting): reduce_sum over the broadcast axes,
  // then reshape to drop or keep size-1 dims.   dy[4,3,5] -> target[3,1]: reduce_sum(axes=[0,2]) + reshape
  Result<Value*> reduceTo(Value* dy, llvm::ArrayRef<int64_t> target);

 private:
  Graph& g_;
};

// The cotangents of a node's results (one per result; null where no cotangent reaches it) and which
// operands need a gradient.
struct VjpArgs {
  const Node& node;
  llvm::ArrayRef<Value*> dys;
  llvm::ArrayRef<bool> needs;
  Value* dy() const { return dys[0]; }
  Value* x(unsigned i = 0) const { return node.operand(i); }
  Value* y(unsigned i = 0) const { return node.result(i); }
};

// d(operand) for each operand of args.node (null where not needed), or an error naming the op when a
// gradient must flow through an op that has none.
Result<std::vector<Value*>> applyVjp(VjpBuilder& b, const VjpArgs& args);

}  // namespace tpc
