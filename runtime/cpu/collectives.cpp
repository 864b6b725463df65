// CPU kernels for the collectives, through the run's Communicator (single-rank: the identity; the
// shared-memory one: real exchanges among the threads of a mesh). Float values travel as T, integer and
// bool values as int64_t.
#include "ir/shape_rules.h"
#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

template <class T>
Status checkAxis(KernelArgs<T>& a) {
  const std::string& axis = a.node.getStr("axis");
  int64_t want = a.node.graph()->mesh().axisSize(axis), have = a.ctx.comm.axisSize(axis);
  if (want != have) return meshMismatch(std::string(a.node.opName()), axis, want, have);
  return {};
}

ReduceOp reduceOp(const Node& n) { return n.getStr("op") == "max" ? ReduceOp::Max : ReduceOp::Sum; }

template <class T, class E>
std::vector<E>& elems(Buf<T>& b) {
  if constexpr (std::is_same_v<E, int64_t>) return b.i;
  else return b.f;
}
template <class T, class E>
const std::vector<E>& elems(const Buf<T>& b) {
  if constexpr (std::is_same_v<E, int64_t>) return b.i;
  else return b.f;
}

template <class T, class E>
Status allReduce(KernelArgs<T>& a) {
  elems<T, E>(a.result()) = elems<T, E>(a.operand(0));
  return a.ctx.comm.allReduce(a.node.getStr("axis"), reduceOp(a.node), elems<T, E>(a.result()).data(),
                              a.result().numel());
}

// Every rank's shard, concatenated along `dim` in rank order.
template <class T, class E>
Status allGather(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  const std::string& axis = a.node.getStr("axis");
  int64_t n = a.ctx.comm.axisSize(axis);
  std::vector<E> gathered(static_cast<size_t>(x.numel() * n));
  TPC_TRY(a.ctx.comm.allGather(axis, elems<T, E>(x).data(), x.numel(), gathered.data()));
  int64_t dim = *normalizeAxis(a.node.getInt("dim"), x.rank());
  std::vector<int64_t> src = stridesOf(x.shape()), dst = stridesOf(a.result().shape());
  E* out = elems<T, E>(a.result()).data();
  for (int64_t r = 0; r < n; ++r)
    stridedCopy(gathered.data() + r * x.numel(), src, out + r * x.shape()[dim] * dst[dim], dst, x.shape(), a.ctx.pool);
  return {};
}

// Reduce over the axis, keep this rank's block of `dim`: the blocks are first packed rank-major.
template <class T, class E>
Status reduceScatter(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  Buf<T>& y = a.result();
  const std::string& axis = a.node.getStr("axis");
  int64_t n = a.ctx.comm.axisSize(axis);
  int64_t dim = *normalizeAxis(a.node.getInt("dim"), x.rank());
  std::vector<int64_t> src = stridesOf(x.shape()), dst = stridesOf(y.shape());
  std::vector<E> packed(static_cast<size_t>(x.numel()));
  const E* in = elems<T, E>(x).data();
  for (int64_t r = 0; r < n; ++r)
    stridedCopy(in + r * y.shape()[dim] * src[dim], src, packed.data() + r * y.numel(), dst, y.shape(), a.ctx.pool);
  return a.ctx.comm.reduceScatter(axis, reduceOp(a.node), packed.data(), y.numel(), elems<T, E>(y).data());
}

}  // namespace

template <class T>
Status kernelAllReduce(KernelArgs<T>& a) {
  TPC_TRY(checkAxis(a));
  return a.operand(0).isFloatBuf() ? allReduce<T, T>(a) : allReduce<T, int64_t>(a);
}

template <class T>
Status kernelAllGather(KernelArgs<T>& a) {
  TPC_TRY(checkAxis(a));
  return a.operand(0).isFloatBuf() ? allGather<T, T>(a) : allGather<T, int64_t>(a);
}

template <class T>
Status kernelReduceScatter(KernelArgs<T>& a) {
  TPC_TRY(checkAxis(a));
  return a.operand(0).isFloatBuf() ? reduceScatter<T, T>(a) : reduceScatter<T, int64_t>(a);
}

TPC_CPU_KERNEL_INSTANTIATE(AllReduce)
TPC_CPU_KERNEL_INSTANTIATE(AllGather)
TPC_CPU_KERNEL_INSTANTIATE(ReduceScatter)

}  // namespace tpc::cpu
