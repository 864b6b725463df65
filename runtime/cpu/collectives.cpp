// CPU kernels for the collectives, through the run's Communicator. Over an axis of size 1 each one is
// the identity; larger axes need a multi-rank communicator (not built yet: the executor refuses such
// graphs in create(), and the kernels check again).
#include "ir/shape_rules.h"
#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

template <class T>
Result<int64_t> axisSize(KernelArgs<T>& a) {
  const std::string& axis = a.node.getStr("axis");
  int64_t want = a.node.graph()->mesh().axisSize(axis), have = a.ctx.comm.axisSize(axis);
  if (want != have) return multiRankUnsupported(std::string(a.node.opName()), axis, want);
  if (want > 1 && !a.operand(0).isFloatBuf())
    return makeError(a.node.opName(), ": integer collectives are not supported on the CPU backend");
  return want;
}

ReduceOp reduceOp(const Node& n) { return n.getStr("op") == "max" ? ReduceOp::Max : ReduceOp::Sum; }

}  // namespace

template <class T>
Status kernelAllReduce(KernelArgs<T>& a) {
  TPC_ASSIGN(int64_t n, axisSize(a));
  a.result().f = a.operand(0).f;
  a.result().i = a.operand(0).i;
  if (n == 1) return {};
  return a.ctx.comm.allReduce(a.node.getStr("axis"), reduceOp(a.node), a.result().f.data(), a.result().numel());
}

// Every rank's shard, concatenated along `dim` in rank order.
template <class T>
Status kernelAllGather(KernelArgs<T>& a) {
  TPC_ASSIGN(int64_t n, axisSize(a));
  const Buf<T>& x = a.operand(0);
  if (n == 1) {
    a.result().f = x.f;
    a.result().i = x.i;
    return {};
  }
  std::vector<T> gathered(static_cast<size_t>(x.numel() * n));
  TPC_TRY(a.ctx.comm.allGather(a.node.getStr("axis"), x.f.data(), x.numel(), gathered.data()));
  int64_t dim = *normalizeAxis(a.node.getInt("dim"), x.rank());
  std::vector<int64_t> src = stridesOf(x.shape()), dst = stridesOf(a.result().shape());
  for (int64_t r = 0; r < n; ++r)
    stridedCopy(gathered.data() + r * x.numel(), src, a.result().f.data() + r * x.shape()[dim] * dst[dim], dst, x.shape(),
                a.ctx.pool);
  return {};
}

// Reduce over the axis, keep this rank's slice of `dim`.
template <class T>
Status kernelReduceScatter(KernelArgs<T>& a) {
  TPC_ASSIGN(int64_t n, axisSize(a));
  const Buf<T>& x = a.operand(0);
  if (n == 1) {
    a.result().f = x.f;
    a.result().i = x.i;
    return {};
  }
  const std::string& axis = a.node.getStr("axis");
  std::vector<T> all = x.f;
  TPC_TRY(a.ctx.comm.allReduce(axis, reduceOp(a.node), all.data(), x.numel()));
  int64_t dim = *normalizeAxis(a.node.getInt("dim"), x.rank());
  std::vector<int64_t> src = stridesOf(x.shape()), dst = stridesOf(a.result().shape());
  int64_t offset = a.ctx.comm.axisRank(axis) * a.result().shape()[dim] * src[dim];
  stridedCopy(all.data() + offset, src, a.result().f.data(), dst, a.result().shape(), a.ctx.pool);
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(AllReduce)
TPC_CPU_KERNEL_INSTANTIATE(AllGather)
TPC_CPU_KERNEL_INSTANTIATE(ReduceScatter)

}  // namespace tpc::cpu
