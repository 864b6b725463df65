// CPU kernels: data movement (reshape, transpose, slice, concat, broadcast_to) for float and integer
// values alike, and the embedding gather with its scatter-add gradient.
#include "ir/shape_rules.h"
#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

// Calls f(srcPtr, dstPtr) on the float or the integer storage of two buffers of the same dtype class.
template <class T, class F>
void withStorage(const Buf<T>& src, Buf<T>& dst, F f) {
  if (src.isFloatBuf()) f(src.f.data(), dst.f.data());
  else f(src.i.data(), dst.i.data());
}

}  // namespace

template <class T>
Status kernelReshape(KernelArgs<T>& a) {
  withStorage(a.operand(0), a.result(), [&](const auto* s, auto* d) { std::copy(s, s + a.result().numel(), d); });
  return {};
}

template <class T>
Status kernelTranspose(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  const auto& perm = a.node.getInts("perm");
  std::vector<int64_t> in = stridesOf(x.shape()), src(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) src[k] = in[perm[k]];
  std::vector<int64_t> dst = stridesOf(a.result().shape());
  withStorage(x, a.result(), [&](const auto* s, auto* d) { stridedCopy(s, src, d, dst, a.result().shape(), a.ctx.pool); });
  return {};
}

template <class T>
Status kernelSlice(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  int64_t axis = *normalizeAxis(a.node.getInt("axis"), x.rank());
  std::vector<int64_t> src = stridesOf(x.shape()), dst = stridesOf(a.result().shape());
  int64_t offset = a.node.getInt("start") * src[axis];
  withStorage(x, a.result(),
              [&](const auto* s, auto* d) { stridedCopy(s + offset, src, d, dst, a.result().shape(), a.ctx.pool); });
  return {};
}

template <class T>
Status kernelConcat(KernelArgs<T>& a) {
  Buf<T>& out = a.result();
  int64_t axis = *normalizeAxis(a.node.getInt("axis"), out.rank());
  std::vector<int64_t> dst = stridesOf(out.shape());
  int64_t at = 0;
  for (const Buf<T>* x : a.in) {
    std::vector<int64_t> src = stridesOf(x->shape());
    withStorage(*x, out, [&](const auto* s, auto* d) { stridedCopy(s, src, d + at * dst[axis], dst, x->shape(), a.ctx.pool); });
    at += x->shape()[axis];
  }
  return {};
}

template <class T>
Status kernelBroadcastTo(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  std::vector<int64_t> src = broadcastStrides(x.shape(), a.result().shape()), dst = stridesOf(a.result().shape());
  withStorage(x, a.result(), [&](const auto* s, auto* d) { stridedCopy(s, src, d, dst, a.result().shape(), a.ctx.pool); });
  return {};
}

// rows of table[V, D]; ids outside [vocab_start, vocab_start + V) give zero rows (another shard owns them).
template <class T>
Status kernelEmbedding(KernelArgs<T>& a) {
  const Buf<T>&table = a.operand(0), &ids = a.operand(1);
  int64_t V = table.shape()[0], D = table.shape()[1], start = a.node.getInt("vocab_start");
  T* out = a.result().f.data();
  a.ctx.pool.parallelFor(ids.numel(), std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t row = ids.i[r] - start;
      if (row >= 0 && row < V) std::copy(table.f.data() + row * D, table.f.data() + (row + 1) * D, out + r * D);
    }
  });
  return {};
}

// Scatter-add of dy rows into dtable[vocab, D]; ids outside this shard's range are skipped. Serial, so
// that repeated ids add up in a fixed order.
template <class T>
Status kernelEmbeddingGrad(KernelArgs<T>& a) {
  const Buf<T>&dy = a.operand(0), &ids = a.operand(1);
  int64_t vocab = a.node.getInt("vocab"), start = a.node.getInt("vocab_start"), D = dy.shape().back();
  T* out = a.result().f.data();
  for (int64_t r = 0; r < ids.numel(); ++r) {
    int64_t row = ids.i[r] - start;
    if (row < 0 || row >= vocab) continue;
    const T* g = dy.f.data() + r * D;
    for (int64_t j = 0; j < D; ++j) out[row * D + j] += g[j];
  }
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(Reshape)
TPC_CPU_KERNEL_INSTANTIATE(Transpose)
TPC_CPU_KERNEL_INSTANTIATE(Slice)
TPC_CPU_KERNEL_INSTANTIATE(Concat)
TPC_CPU_KERNEL_INSTANTIATE(BroadcastTo)
TPC_CPU_KERNEL_INSTANTIATE(Embedding)
TPC_CPU_KERNEL_INSTANTIATE(EmbeddingGrad)

}  // namespace tpc::cpu
