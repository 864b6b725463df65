// CPU kernels: layer_norm (last dim, biased variance, eps inside the sqrt) and softmax along an axis, with
// their gradients. Row statistics accumulate in double.
#include <cmath>
#include <limits>

#include "ir/shape_rules.h"
#include "runtime/cpu/kernels.h"
#include "runtime/host_tensor.h"

namespace tpc::cpu {
namespace {

// mean and 1/sqrt(var + eps) of one row.
template <class T>
void rowStats(const T* x, int64_t D, double eps, double* mean, double* rstd) {
  double s = 0;
  for (int64_t j = 0; j < D; ++j) s += x[j];
  double m = s / D, v = 0;
  for (int64_t j = 0; j < D; ++j) v += (x[j] - m) * (x[j] - m);
  *mean = m;
  *rstd = 1.0 / std::sqrt(v / D + eps);
}

// outer x axis x inner decomposition of a shape around one axis.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit splitAt(const Shape& s, int64_t axis) {
  AxisSplit r;
  for (int64_t k = 0; k < static_cast<int64_t>(s.size()); ++k) {
    if (k < axis) r.outer *= s[k];
    else if (k == axis) r.n = s[k];
    else r.inner *= s[k];
  }
  return r;
}

// v rounded to a 16-bit dtype t as the executor keeps such values (roundToDType); f32 and f64 as computed.
template <class T>
T roundedTo(DType t, T v) {
  if (t == DType::bf16) return static_cast<T>(bf16ToFloat(floatToBf16(static_cast<float>(v))));
  if (t == DType::f16) return static_cast<T>(f16ToFloat(floatToF16(static_cast<float>(v))));
  return v;
}

}  // namespace

// With a residual operand: s = x + residual rounded to x's dtype (a second result, the add's bits), then the
// layer_norm of s.
template <class T>
Status kernelLayerNorm(KernelArgs<T>& a) {
  const Buf<T>&X = a.operand(0), &G = a.operand(1), &Bt = a.operand(2);
  const Buf<T>* R = a.node.numOperands() == 4 ? &a.operand(3) : nullptr;
  const DType sType = a.node.operand(0)->dtype();
  double eps = a.node.getFloat("eps");
  int64_t D = X.shape().back(), rows = D ? X.numel() / D : 0;
  T* y = a.result(0).f.data();
  T* sum = R ? a.result(1).f.data() : nullptr;
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = X.f.data() + r * D;
      if (R) {
        for (int64_t j = 0; j < D; ++j) sum[r * D + j] = roundedTo<T>(sType, x[j] + R->f[r * D + j]);
        x = sum + r * D;
      }
      double m, rs;
      rowStats(x, D, eps, &m, &rs);
      for (int64_t j = 0; j < D; ++j) y[r * D + j] = static_cast<T>((x[j] - m) * rs) * G.f[j] + Bt.f[j];
    }
  });
  return {};
}

// xhat = (x - mean) rstd, g = dy * gamma: dx = rstd (g - mean(g) - xhat mean(g xhat));
// dgamma = sum over rows dy xhat; dbeta = sum over rows dy. A residual operand: dx rounded to its dtype, plus it.
// sum_dx: a fourth result, the rows' sum of dx as stored.
template <class T>
Status kernelLayerNormGrad(KernelArgs<T>& a) {
  const Buf<T>&DY = a.operand(0), &X = a.operand(1), &G = a.operand(2);
  const Buf<T>* R = a.node.numOperands() == 4 ? &a.operand(3) : nullptr;
  const DType dxType = a.node.result(0)->dtype();
  auto rounded = [dxType](double v) { return static_cast<double>(roundedTo<T>(dxType, static_cast<T>(v))); };
  double eps = a.node.getFloat("eps");
  int64_t D = X.shape().back(), rows = D ? X.numel() / D : 0;
  T* dx = a.result(0).f.data();
  std::vector<double> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = X.f.data() + r * D;
      const T* dy = DY.f.data() + r * D;
      rowStats(x, D, eps, &mean[r], &rstd[r]);
      double sg = 0, sgx = 0;
      for (int64_t j = 0; j < D; ++j) {
        double g = static_cast<double>(dy[j]) * G.f[j];
        sg += g;
        sgx += g * (x[j] - mean[r]) * rstd[r];
      }
      sg /= D;
      sgx /= D;
      for (int64_t j = 0; j < D; ++j) {
        double xhat = (x[j] - mean[r]) * rstd[r];
        double v = rstd[r] * (static_cast<double>(dy[j]) * G.f[j] - sg - xhat * sgx);
        dx[r * D + j] = R ? static_cast<T>(rounded(v) + R->f[r * D + j]) : static_cast<T>(v);
      }
    }
  });
  std::vector<double> dg(static_cast<size_t>(D), 0.0), db(static_cast<size_t>(D), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = X.f.data() + r * D;
    const T* dy = DY.f.data() + r * D;
    for (int64_t j = 0; j < D; ++j) {
      dg[j] += static_cast<double>(dy[j]) * (x[j] - mean[r]) * rstd[r];
      db[j] += dy[j];
    }
  }
  for (int64_t j = 0; j < D; ++j) {
    a.result(1).f[j] = static_cast<T>(dg[j]);
    a.result(2).f[j] = static_cast<T>(db[j]);
  }
  if (a.node.getBool("sum_dx")) {  // reduce_sum(dx) over the rows: dx as stored (rounded to its dtype), in double
    std::vector<double> s(static_cast<size_t>(D), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < D; ++j) s[j] += rounded(dx[r * D + j]);
    for (int64_t j = 0; j < D; ++j) a.result(3).f[j] = static_cast<T>(s[j]);
  }
  return {};
}

template <class T>
Status kernelSoftmax(KernelArgs<T>& a) {
  const Buf<T>& X = a.operand(0);
  int64_t axis = *normalizeAxis(a.node.getInt("axis"), X.rank());
  AxisSplit s = splitAt(X.shape(), axis);
  T* y = a.result().f.data();
  a.ctx.pool.parallelFor(s.outer * s.inner, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(s.n, 1)),
                         [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t base = (r / s.inner) * s.n * s.inner + r % s.inner;
      const T* x = X.f.data() + base;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < s.n; ++j) m = std::max(m, x[j * s.inner]);
      double sum = 0;
      for (int64_t j = 0; j < s.n; ++j) sum += std::exp(static_cast<double>(x[j * s.inner] - m));
      for (int64_t j = 0; j < s.n; ++j)
        y[base + j * s.inner] = static_cast<T>(std::exp(static_cast<double>(x[j * s.inner] - m)) / sum);
    }
  });
  return {};
}

// dx = y (dy - sum(dy y)) along the axis.
template <class T>
Status kernelSoftmaxGrad(KernelArgs<T>& a) {
  const Buf<T>&DY = a.operand(0), &Y = a.operand(1);
  int64_t axis = *normalizeAxis(a.node.getInt("axis"), Y.rank());
  AxisSplit s = splitAt(Y.shape(), axis);
  T* dx = a.result().f.data();
  a.ctx.pool.parallelFor(s.outer * s.inner, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(s.n, 1)),
                         [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t base = (r / s.inner) * s.n * s.inner + r % s.inner;
      double dot = 0;
      for (int64_t j = 0; j < s.n; ++j)
        dot += static_cast<double>(DY.f[base + j * s.inner]) * Y.f[base + j * s.inner];
      for (int64_t j = 0; j < s.n; ++j) {
        int64_t o = base + j * s.inner;
        dx[o] = static_cast<T>(Y.f[o] * (DY.f[o] - dot));
      }
    }
  });
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(LayerNorm)
TPC_CPU_KERNEL_INSTANTIATE(LayerNormGrad)
TPC_CPU_KERNEL_INSTANTIATE(Softmax)
TPC_CPU_KERNEL_INSTANTIATE(SoftmaxGrad)

}  // namespace tpc::cpu
