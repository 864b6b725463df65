// Generated movement kernels (reshape as a contiguous copy, transpose, slice, concat, broadcast_to: each a
// strided copy), `full`, and collectives over an axis of size 1 (a copy).
#include <cstring>

#include "ir/shape_rules.h"
#include "runtime/cuda/kernels/codegen.h"
#include "runtime/cuda/kernels/generated_lowerings.h"

namespace tpc::cuda {

using namespace codegen;

Result<NodeLowering> lowerMovement(const Node& n, const LoweringContext&) {
  const Value* out = n.result();
  const Shape& os = out->shape();
  DType t = out->dtype();
  std::vector<int64_t> dst = strides(os);
  KernelArg res{ArgKind::Result, 0}, in0{ArgKind::Operand, 0};
  NodeLowering l;
  switch (n.op()) {
    case OpKind::Reshape: {
      int64_t numel = out->type().numel();
      l.kernels.push_back(stridedCopy(t, {numel}, 0, {1}, 0, {1}, res, in0));
      break;
    }
    case OpKind::Transpose: {
      const auto& perm = n.getInts("perm");
      std::vector<int64_t> in = strides(n.operand(0)->shape()), src(perm.size());
      for (size_t k = 0; k < perm.size(); ++k) src[k] = in[perm[k]];
      l.kernels.push_back(stridedCopy(t, os, 0, dst, 0, src, res, in0));
      break;
    }
    case OpKind::Slice: {
      const Value* x = n.operand(0);
      TPC_ASSIGN(int64_t axis, normalizeAxis(n.getInt("axis"), x->type().rank()));
      std::vector<int64_t> src = strides(x->shape());
      l.kernels.push_back(stridedCopy(t, os, 0, dst, n.getInt("start") * src[axis], src, res, in0));
      break;
    }
    case OpKind::Concat: {
      TPC_ASSIGN(int64_t axis, normalizeAxis(n.getInt("axis"), out->type().rank()));
      int64_t at = 0;
      for (unsigned k = 0; k < n.numOperands(); ++k) {
        const Value* x = n.operand(k);
        if (x->type().numel() > 0)
          l.kernels.push_back(stridedCopy(t, x->shape(), at * dst[axis], dst, 0, strides(x->shape()), res,
                                          {ArgKind::Operand, k}));
        at += x->shape()[axis];
      }
      break;
    }
    case OpKind::BroadcastTo:
      l.kernels.push_back(stridedCopy(t, os, 0, dst, 0, broadcastStrides(n.operand(0)->shape(), os), res, in0));
      break;
    default: return makeError("cuda: ", n.opName(), " is not a movement op of the generated lowerings");
  }
  return l;
}

Result<NodeLowering> lowerFull(const Node& n, const LoweringContext&) {
  const Value* out = n.result();
  DType t = out->dtype();
  std::string C = computeType(t);
  std::string body = "(" + ctype(t) + "* out, i64 n, double value) {\n"
                     "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n"
                     "    " + store(t, "out + i", "(" + C + ")value") + "\n  }\n}\n";
  KernelSpec k;
  k.entry = entryName("tpc_full", body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  elementwiseGeometry(k, out->type().numel());
  // The value travels as the bits of a double in an Int64 argument (Float arguments are floats).
  double v = n.getFloat("value");
  int64_t bits;
  static_assert(sizeof bits == sizeof v);
  std::memcpy(&bits, &v, sizeof v);
  k.args = {{ArgKind::Result, 0}, {ArgKind::Int64, 0, out->type().numel()}, {ArgKind::Int64, 0, bits}};
  NodeLowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

Result<NodeLowering> lowerSingleRankCollective(const Node& n, const LoweringContext&) {
  int64_t numel = n.result()->type().numel();
  if (numel != n.operand(0)->type().numel())
    return makeError("cuda: ", n.opName(), " over an axis of size 1 must keep its size (", n.operand(0)->type().str(),
                     " -> ", n.result()->type().str(), ")");
  NodeLowering l;
  l.kernels.push_back(stridedCopy(n.result()->dtype(), {numel}, 0, {1}, 0, {1}, {ArgKind::Result, 0}, {ArgKind::Operand, 0}));
  return l;
}

}  // namespace tpc::cuda
