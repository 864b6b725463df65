// CPU kernels: unary and binary elementwise ops (numpy broadcasting), gelu and its gradient, cast, dropout.
#include <cmath>

#include "runtime/cpu/kernels.h"
#include "runtime/philox.h"

namespace tpc::cpu {
namespace {

template <class T, class F>
Status unary(KernelArgs<T>& a, F f) {
  const T* x = a.operand(0).f.data();
  T* y = a.result().f.data();
  a.ctx.pool.parallelFor(a.result().numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
  return {};
}

// out = f(x, y) with numpy broadcasting; rows of the output's last dim are the parallel unit.
template <class E, class F>
void broadcastMap(const E* x, llvm::ArrayRef<int64_t> xShape, const E* y, llvm::ArrayRef<int64_t> yShape, E* out,
                  llvm::ArrayRef<int64_t> outShape, ThreadPool& pool, F f) {
  int64_t n = 1;
  for (int64_t d : outShape) n *= d;
  int64_t nx = 1, ny = 1;
  for (int64_t d : xShape) nx *= d;
  for (int64_t d : yShape) ny *= d;
  if (nx == n && ny == n) {
    pool.parallelFor(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = f(x[i], y[i]);
    });
    return;
  }
  if (n == 0) return;
  std::vector<int64_t> sx = broadcastStrides(xShape, outShape), sy = broadcastStrides(yShape, outShape);
  size_t r = outShape.size();
  int64_t inner = outShape[r - 1], rows = n / inner;
  int64_t ix = sx[r - 1], iy = sy[r - 1];
  pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t ox = 0, oy = 0, rem = row;
      for (size_t k = r - 1; k-- > 0;) {
        int64_t idx = rem % outShape[k];
        rem /= outShape[k];
        ox += idx * sx[k];
        oy += idx * sy[k];
      }
      E* o = out + row * inner;
      for (int64_t j = 0; j < inner; ++j) o[j] = f(x[ox + j * ix], y[oy + j * iy]);
    }
  });
}

template <class T, class F>
Status binary(KernelArgs<T>& a, F f) {
  const Buf<T>&x = a.operand(0), &y = a.operand(1);
  Buf<T>& out = a.result();
  if (out.isFloatBuf())
    broadcastMap(x.f.data(), x.shape(), y.f.data(), y.shape(), out.f.data(), out.shape(), a.ctx.pool,
                 [&](T p, T q) { return f(p, q); });
  else
    broadcastMap(x.i.data(), x.shape(), y.i.data(), y.shape(), out.i.data(), out.shape(), a.ctx.pool,
                 [&](int64_t p, int64_t q) { return static_cast<int64_t>(f(p, q)); });
  return {};
}

}  // namespace

template <class T>
Status kernelNeg(KernelArgs<T>& a) { return unary(a, [](T x) { return -x; }); }
template <class T>
Status kernelExp(KernelArgs<T>& a) { return unary(a, [](T x) { return std::exp(x); }); }
template <class T>
Status kernelLog(KernelArgs<T>& a) { return unary(a, [](T x) { return std::log(x); }); }
template <class T>
Status kernelSqrt(KernelArgs<T>& a) { return unary(a, [](T x) { return std::sqrt(x); }); }
template <class T>
Status kernelRsqrt(KernelArgs<T>& a) { return unary(a, [](T x) { return T(1) / std::sqrt(x); }); }
template <class T>
Status kernelTanh(KernelArgs<T>& a) { return unary(a, [](T x) { return std::tanh(x); }); }

template <class T>
Status kernelGelu(KernelArgs<T>& a) {
  return unary(a, [](T x) { return geluTanh(x); });
}

template <class T>
Status kernelScale(KernelArgs<T>& a) {
  T s = static_cast<T>(a.node.getFloat("factor"));
  return unary(a, [s](T x) { return x * s; });
}

// Float -> float copies (the executor then rounds bf16/f16 results); float -> int truncates toward zero.
template <class T>
Status kernelCast(KernelArgs<T>& a) {
  const Buf<T>& x = a.operand(0);
  Buf<T>& y = a.result();
  DType to = y.type.dtype;
  int64_t n = y.numel();
  auto toInt = [to](int64_t v) -> int64_t {
    if (to == DType::boolean) return v != 0;
    if (to == DType::i32) return static_cast<int32_t>(v);
    return v;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (x.isFloatBuf() && y.isFloatBuf()) y.f[i] = x.f[i];
    else if (x.isFloatBuf()) y.i[i] = to == DType::boolean ? (x.f[i] != T(0)) : toInt(static_cast<int64_t>(x.f[i]));
    else if (y.isFloatBuf()) y.f[i] = static_cast<T>(x.i[i]);
    else y.i[i] = toInt(x.i[i]);
  }
  return {};
}

// The keep decision depends only on (seed, step, key, global element index), so the VJP (dropout of dy with
// the same key) reproduces the forward mask, and a shard (global_shape/offsets set) draws exactly its
// block of the unsharded op's mask.
template <class T>
Status kernelDropout(KernelArgs<T>& a) {
  double p = a.node.getFloat("p");
  uint32_t key = static_cast<uint32_t>(a.node.getInt("key"));
  const T* x = a.operand(0).f.data();
  T* y = a.result().f.data();
  T scale = static_cast<T>(1.0 / (1.0 - p));
  uint64_t seed = a.ctx.seed;
  int64_t step = a.ctx.step;
  float pf = static_cast<float>(p);
  if (p == 0.0) {
    std::copy(x, x + a.result().numel(), y);
    return {};
  }
  const Shape& shape = a.result().shape();
  TPC_ASSIGN(ShardIndex idx, ShardIndex::make(a.node, shape, shape.size(), "x's shape"));
  int64_t r = static_cast<int64_t>(shape.size());
  int64_t inner = r == 0 ? 1 : shape[r - 1], rows = inner == 0 ? 0 : a.result().numel() / inner;
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / 8 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      // The global index of this row's first element; the last dim is contiguous in both spaces.
      uint64_t g0 = idx.globalRowStart(row, shape);
      for (int64_t j = 0; j < inner; ++j) {
        int64_t i = row * inner + j;
        y[i] = philox::dropoutKeep(seed, step, key, g0 + static_cast<uint64_t>(j), pf) ? x[i] * scale : T(0);
      }
    }
  });
  return {};
}

template <class T>
Status kernelAdd(KernelArgs<T>& a) { return binary(a, [](auto x, auto y) { return x + y; }); }
template <class T>
Status kernelSub(KernelArgs<T>& a) { return binary(a, [](auto x, auto y) { return x - y; }); }
template <class T>
Status kernelMul(KernelArgs<T>& a) { return binary(a, [](auto x, auto y) { return x * y; }); }
template <class T>
Status kernelDiv(KernelArgs<T>& a) {
  if (!a.result().isFloatBuf()) {
    for (int64_t v : a.operand(1).i)
      if (v == 0) return makeError("div: integer division by zero");
  }
  return binary(a, [](auto x, auto y) { return x / y; });
}

template <class T>
Status kernelGeluGrad(KernelArgs<T>& a) {
  const T* dy = a.operand(0).f.data();
  const T* x = a.operand(1).f.data();
  T* dx = a.result().f.data();
  a.ctx.pool.parallelFor(a.result().numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * geluTanhGrad(x[i]);
  });
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(Neg)
TPC_CPU_KERNEL_INSTANTIATE(Exp)
TPC_CPU_KERNEL_INSTANTIATE(Log)
TPC_CPU_KERNEL_INSTANTIATE(Sqrt)
TPC_CPU_KERNEL_INSTANTIATE(Rsqrt)
TPC_CPU_KERNEL_INSTANTIATE(Tanh)
TPC_CPU_KERNEL_INSTANTIATE(Gelu)
TPC_CPU_KERNEL_INSTANTIATE(Scale)
TPC_CPU_KERNEL_INSTANTIATE(Cast)
TPC_CPU_KERNEL_INSTANTIATE(Dropout)
TPC_CPU_KERNEL_INSTANTIATE(Add)
TPC_CPU_KERNEL_INSTANTIATE(Sub)
TPC_CPU_KERNEL_INSTANTIATE(Mul)
TPC_CPU_KERNEL_INSTANTIATE(Div)
TPC_CPU_KERNEL_INSTANTIATE(GeluGrad)

}  // namespace tpc::cpu
