// CPU kernels: cross_entropy (fused log-softmax + NLL per position) and its gradient. Rows whose target is
// ignore_index give 0 loss and 0 gradient; any other target outside [0, V) is the user's error.
#include <algorithm>
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
  int64_t C = a.node.getInt("num_classes") > 0 ? std::min(a.node.getInt("num_classes"), V) : V;
  TPC_TRY(checkTargets(a.node, Tg.i, C));
  int64_t ignore = a.node.getInt("ignore_index");
  T* loss = a.result().f.data();
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t t = Tg.i[r];
      const T* x = L.f.data() + r * V;
      loss[r] = t == ignore ? T(0) : static_cast<T>(logSumExp(x, C) - x[t]);
    }
  });
  return {};
}

// dlogits = dloss * (softmax(logits) - onehot(target))
template <class T>
Status kernelCrossEntropyGrad(KernelArgs<T>& a) {
  const Buf<T>&DL = a.operand(0), &L = a.operand(1), &Tg = a.operand(2);
  int64_t V = L.shape().back(), rows = Tg.numel();
  int64_t C = a.node.getInt("num_classes") > 0 ? std::min(a.node.getInt("num_classes"), V) : V;
  TPC_TRY(checkTargets(a.node, Tg.i, C));
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
      double lse = logSumExp(x, C), g = DL.f[r];
      for (int64_t j = 0; j < C; ++j) d[j] = static_cast<T>(g * (std::exp(x[j] - lse) - (j == t ? 1.0 : 0.0)));
      std::fill(d + C, d + V, T(0));
    }
  });
  return {};
}

// Both of the above from one read of each row: loss as cross_entropy, dlogits as cross_entropy_grad (the
// same expressions, so the same numbers).
template <class T>
Status kernelCrossEntropyWithGrad(KernelArgs<T>& a) {
  const Buf<T>&DL = a.operand(0), &L = a.operand(1), &Tg = a.operand(2);
  int64_t V = L.shape().back(), rows = Tg.numel();
  int64_t C = a.node.getInt("num_classes") > 0 ? std::min(a.node.getInt("num_classes"), V) : V;
  TPC_TRY(checkTargets(a.node, Tg.i, C));
  int64_t ignore = a.node.getInt("ignore_index");
  T *loss = a.result(0).f.data(), *dx = a.result(1).f.data();
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t t = Tg.i[r];
      T* d = dx + r * V;
      if (t == ignore) {
        loss[r] = T(0);
        std::fill(d, d + V, T(0));
        continue;
      }
      const T* x = L.f.data() + r * V;
      double lse = logSumExp(x, C), g = DL.f[r];
      loss[r] = static_cast<T>(lse - x[t]);
      for (int64_t j = 0; j < C; ++j) d[j] = static_cast<T>(g * (std::exp(x[j] - lse) - (j == t ? 1.0 : 0.0)));
      std::fill(d + C, d + V, T(0));
    }
  });
  return {};
}

// ---- vocab-parallel pieces: this rank holds classes [vocab_start, vocab_start + Vl) of the logits ----
namespace {
// Own columns that are real classes (not vocab padding).
inline int64_t ownClasses(const Node& n, int64_t Vl) {
  return std::clamp<int64_t>(n.getInt("num_classes") - n.getInt("vocab_start"), 0, Vl);
}
}  // namespace

template <class T>
Status kernelVocabMax(KernelArgs<T>& a) {
  const Buf<T>& L = a.operand(0);
  int64_t Vl = L.shape().back(), rows = a.result().numel(), C = ownClasses(a.node, Vl);
  for (int64_t r = 0; r < rows; ++r) {
    // A rank whose columns are all vocab padding has no classes: its max is the lowest finite T, not -inf,
    // so that every value of a healthy step is finite (Backend::findFirstNonFinite looks for the first that
    // is not); the all_reduce(max) over the ranks that follows never picks it.
    double m = -static_cast<double>(std::numeric_limits<T>::max());
    for (int64_t j = 0; j < C; ++j) m = std::max(m, static_cast<double>(L.f[r * Vl + j]));
    a.result().f[r] = static_cast<T>(m);
  }
  return {};
}
template <class T>
Status kernelVocabSumExp(KernelArgs<T>& a) {
  const Buf<T>&L = a.operand(0), &M = a.operand(1);
  int64_t Vl = L.shape().back(), rows = a.result().numel(), C = ownClasses(a.node, Vl);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::exp(static_cast<double>(L.f[r * Vl + j]) - M.f[r]);
    a.result().f[r] = static_cast<T>(s);
  }
  return {};
}
template <class T>
Status kernelVocabPick(KernelArgs<T>& a) {
  const Buf<T>&L = a.operand(0), &Tg = a.operand(1);
  int64_t Vl = L.shape().back(), rows = Tg.numel(), start = a.node.getInt("vocab_start");
  int64_t ignore = a.node.getInt("ignore_index");
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = Tg.i[r] - start;
    a.result().f[r] = Tg.i[r] != ignore && t >= 0 && t < Vl ? L.f[r * Vl + t] : T(0);
  }
  return {};
}
template <class T>
Status kernelVocabLoss(KernelArgs<T>& a) {
  const Buf<T>&M = a.operand(0), &S = a.operand(1), &P = a.operand(2), &Tg = a.operand(3);
  int64_t ignore = a.node.getInt("ignore_index");
  for (int64_t r = 0; r < Tg.numel(); ++r)
    a.result().f[r] = Tg.i[r] == ignore ? T(0) : static_cast<T>(std::log(static_cast<double>(S.f[r])) + M.f[r] - P.f[r]);
  return {};
}
template <class T>
Status kernelVocabXentGrad(KernelArgs<T>& a) {
  const Buf<T>&DL = a.operand(0), &L = a.operand(1), &M = a.operand(2), &S = a.operand(3), &Tg = a.operand(4);
  int64_t Vl = L.shape().back(), rows = Tg.numel(), C = ownClasses(a.node, Vl), start = a.node.getInt("vocab_start");
  int64_t ignore = a.node.getInt("ignore_index");
  T* dx = a.result().f.data();
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dx + r * Vl;
    std::fill(d, d + Vl, T(0));
    if (Tg.i[r] == ignore) continue;
    double g = DL.f[r], lse = std::log(static_cast<double>(S.f[r])) + M.f[r];
    for (int64_t j = 0; j < C; ++j)
      d[j] = static_cast<T>(g * (std::exp(static_cast<double>(L.f[r * Vl + j]) - lse) - (j + start == Tg.i[r] ? 1.0 : 0.0)));
  }
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(CrossEntropy)
TPC_CPU_KERNEL_INSTANTIATE(CrossEntropyGrad)
TPC_CPU_KERNEL_INSTANTIATE(CrossEntropyWithGrad)
TPC_CPU_KERNEL_INSTANTIATE(VocabMax)
TPC_CPU_KERNEL_INSTANTIATE(VocabSumExp)
TPC_CPU_KERNEL_INSTANTIATE(VocabPick)
TPC_CPU_KERNEL_INSTANTIATE(VocabLoss)
TPC_CPU_KERNEL_INSTANTIATE(VocabXentGrad)

}  // namespace tpc::cpu
