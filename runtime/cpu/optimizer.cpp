// CPU kernels: global_norm (accumulated in double), clip_scale and the AdamW update.
#include <cmath>

#include "runtime/cpu/kernels.h"

namespace tpc::cpu {

template <class T>
double sumOfSquares(KernelArgs<T>& a) {
  double sum = 0;
  for (const Buf<T>* x : a.in) {
    int64_t n = x->numel();
    int64_t chunks = fixedChunks(n);  // not the pool size: the sum must not depend on --threads
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
    a.ctx.pool.parallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0;
        for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) s += static_cast<double>(x->f[i]) * x->f[i];
        part[c] = s;
      }
    });
    for (double p : part) sum += p;
  }
  return sum;
}
template <class T>
Status kernelGlobalNorm(KernelArgs<T>& a) {
  a.result().f[0] = static_cast<T>(std::sqrt(sumOfSquares(a)));
  return {};
}

// min(1, max_norm / (norm + 1e-6))
template <class T>
Status kernelClipScale(KernelArgs<T>& a) {
  double norm = a.operand(0).f[0], maxNorm = a.node.getFloat("max_norm");
  a.result().f[0] = static_cast<T>(std::min(1.0, maxNorm / (norm + 1e-6)));
  return {};
}

// m' = b1 m + (1-b1) g; v' = b2 v + (1-b2) g^2; p' = p - lr (m'/(1-b1^t) / (sqrt(v'/(1-b2^t)) + eps) + wd p)
template <class T>
Status kernelAdamWUpdate(KernelArgs<T>& a) {
  const Buf<T>&P = a.operand(0), &G = a.operand(1), &M = a.operand(2), &V = a.operand(3);
  double lr = a.operand(4).f[0], t = a.operand(5).f[0];
  double b1 = a.node.getFloat("beta1"), b2 = a.node.getFloat("beta2"), eps = a.node.getFloat("eps"),
         wd = a.node.getFloat("weight_decay");
  double c1 = 1.0 - std::pow(b1, t), c2 = 1.0 - std::pow(b2, t);
  if (!(c1 > 0) || !(c2 > 0)) return makeError("adamw_update: step must be >= 1, got ", t);
  T *po = a.result(0).f.data(), *mo = a.result(1).f.data(), *vo = a.result(2).f.data();
  a.ctx.pool.parallelFor(P.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T g = G.f[i], p = P.f[i];
      T m = static_cast<T>(b1) * M.f[i] + static_cast<T>(1 - b1) * g;
      T v = static_cast<T>(b2) * V.f[i] + static_cast<T>(1 - b2) * g * g;
      T mhat = m / static_cast<T>(c1), vhat = v / static_cast<T>(c2);
      po[i] = p - static_cast<T>(lr) * (mhat / (std::sqrt(vhat) + static_cast<T>(eps)) + static_cast<T>(wd) * p);
      mo[i] = m;
      vo[i] = v;
    }
  });
  return {};
}

template <class T>
Status kernelSumSquares(KernelArgs<T>& a) {
  a.result().f[0] = static_cast<T>(sumOfSquares(a));
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(GlobalNorm)
TPC_CPU_KERNEL_INSTANTIATE(SumSquares)
TPC_CPU_KERNEL_INSTANTIATE(ClipScale)
TPC_CPU_KERNEL_INSTANTIATE(AdamWUpdate)

}  // namespace tpc::cpu
