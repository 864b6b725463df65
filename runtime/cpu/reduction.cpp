// CPU kernels: reduce_sum / reduce_mean / reduce_max over a set of axes (keepdims only changes the
// result's shape), and full. Each thread reduces a contiguous slice of the input into its own partial
// result (sums in double), and the partials are combined in thread order, so results are deterministic.
#include <cmath>
#include <limits>

#include "ir/shape_rules.h"
#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

enum class Red { Sum, Mean, Max };

template <class T, class E>
void reduceInto(const E* x, const Shape& inShape, const std::vector<bool>& reduced, E* out, int64_t outNumel, Red kind,
                ThreadPool& pool) {
  size_t r = inShape.size();
  // Output stride of every input dim (0 on reduced dims); the output is the input with those dims dropped.
  std::vector<int64_t> ostride(r, 0);
  int64_t acc = 1;
  for (size_t k = r; k-- > 0;)
    if (!reduced[k]) {
      ostride[k] = acc;
      acc *= inShape[k];
    }
  int64_t n = 1;
  for (int64_t d : inShape) n *= d;
  double init = kind == Red::Max ? -std::numeric_limits<double>::infinity() : 0.0;
  int64_t chunks = fixedChunks(n);  // not the pool size: the sum must not depend on --threads
  std::vector<std::vector<double>> partial(static_cast<size_t>(chunks));
  pool.parallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      std::vector<double>& p = partial[c];
      p.assign(static_cast<size_t>(outNumel), init);
      if (b == e) continue;
      std::vector<int64_t> idx(r, 0);
      int64_t rem = b, o = 0;
      for (size_t k = r; k-- > 0;) {
        idx[k] = rem % inShape[k];
        rem /= inShape[k];
        o += idx[k] * ostride[k];
      }
      for (int64_t i = b; i < e; ++i) {
        double v = static_cast<double>(x[i]);
        if (kind == Red::Max) p[o] = std::max(p[o], v);
        else p[o] += v;
        for (size_t k = r; k-- > 0;) {  // advance the multi-index and the output offset
          o += ostride[k];
          if (++idx[k] < inShape[k]) break;
          o -= ostride[k] * inShape[k];
          idx[k] = 0;
        }
      }
    }
  });
  double count = outNumel ? static_cast<double>(n) / outNumel : 1.0;
  for (int64_t j = 0; j < outNumel; ++j) {
    double v = init;
    for (auto& p : partial) v = kind == Red::Max ? std::max(v, p[j]) : v + p[j];
    if (kind == Red::Mean) v /= count;
    out[j] = static_cast<E>(v);
  }
}

template <class T>
Status reduce(KernelArgs<T>& a, Red kind) {
  const Buf<T>& x = a.operand(0);
  std::vector<bool> reduced(static_cast<size_t>(x.rank()), false);
  for (int64_t ax : a.node.getInts("axes")) reduced[*normalizeAxis(ax, x.rank())] = true;
  Buf<T>& out = a.result();
  if (x.numel() == 0 && kind == Red::Max) return makeError("reduce_max: cannot reduce an empty tensor ", x.type.str());
  if (x.isFloatBuf()) reduceInto<T>(x.f.data(), x.shape(), reduced, out.f.data(), out.numel(), kind, a.ctx.pool);
  else reduceInto<T>(x.i.data(), x.shape(), reduced, out.i.data(), out.numel(), kind, a.ctx.pool);
  return {};
}

}  // namespace

template <class T>
Status kernelReduceSum(KernelArgs<T>& a) { return reduce(a, Red::Sum); }
template <class T>
Status kernelReduceMean(KernelArgs<T>& a) { return reduce(a, Red::Mean); }
template <class T>
Status kernelReduceMax(KernelArgs<T>& a) { return reduce(a, Red::Max); }

template <class T>
Status kernelFull(KernelArgs<T>& a) {
  double v = a.node.getFloat("value");
  Buf<T>& out = a.result();
  if (out.isFloatBuf()) std::fill(out.f.begin(), out.f.end(), static_cast<T>(v));
  else std::fill(out.i.begin(), out.i.end(), static_cast<int64_t>(v));
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(ReduceSum)
TPC_CPU_KERNEL_INSTANTIATE(ReduceMean)
TPC_CPU_KERNEL_INSTANTIATE(ReduceMax)
TPC_CPU_KERNEL_INSTANTIATE(Full)

}  // namespace tpc::cpu
