// CPU kernels: cross_entropy (fused log-softmax + NLL per position) and its gradient. Rows whose target is
// ignore_index give 0 loss and 0 gradient; any other target outside [0, V) is the user's error.
#include <cmath>
#include <limits>

#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

template <class T>
double logSumExp(const T* x, int64_t V) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(x[j]));
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

Status checkTargets(const Node& n, const std::vector<int64_t>& targets, int64_t V) {
  int64_t ignore = n.getInt("ignore_index");
  for (size_t r = 0; r < targets.size(); ++r) {
    int64_t t = targets[r];
    if (t != ignore && (t < 0 || t >= V))
      return makeError(n.opName(), ": target ", t, " at position ", r, " is outside [0, ", V, ") and is not ignore_index=",
                       ignore);
  }
  return {};
}

}  // namespace

template <class T>
Status kernelCrossEntropy(KernelArgs<T>& a) {
  const Buf<T>&L = a.operand(0), &Tg = a.operand(1);
  int64_t V = L.shape().back(), rows = Tg.numel();
  TPC_TRY(checkTargets(a.node, Tg.i, V));
  int64_t ignore = a.node.getInt("ignore_index");
  T* loss = a.result().f.data();
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t t = Tg.i[r];
      const T* x = L.f.data() + r * V;
      loss[r] = t == ignore ? T(0) : static_cast<T>(logSumExp(x, V) - x[t]);
    }
  });
  return {};
}

// dlogits = dloss * (softmax(logits) - onehot(target))
template <class T>
Status kernelCrossEntropyGrad(KernelArgs<T>& a) {
  const Buf<T>&DL = a.operand(0), &L = a.operand(1), &Tg = a.operand(2);
  int64_t V = L.shape().back(), rows = Tg.numel();
  TPC_TRY(checkTargets(a.node, Tg.i, V));
  int64_t ignore = a.node.getInt("ignore_index");
  T* dx = a.result().f.data();
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t t = Tg.i[r];
      T* d = dx + r * V;
      if (t == ignore) {
        std::fill(d, d + V, T(0));
        continue;
      }
      const T* x = L.f.data() + r * V;
      double lse = logSumExp(x, V), g = DL.f[r];
      for (int64_t j = 0; j < V; ++j) d[j] = static_cast<T>(g * (std::exp(x[j] - lse) - (j == t ? 1.0 : 0.0)));
    }
  });
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(CrossEntropy)
TPC_CPU_KERNEL_INSTANTIATE(CrossEntropyGrad)

}  // namespace tpc::cpu
