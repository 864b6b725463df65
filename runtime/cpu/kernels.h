// What a CPU kernel sees: its node, operand and result buffers, and the run context. One kernel per op,
// `kernel<Enum>`, declared here from ops.def and defined in the op's family file (elementwise.cpp,
// matmul.cpp, ...) for T = float and T = double; the executor's dispatch table names every one of them,
// so an op without a kernel does not build.
//
// Storage: float values (any float dtype) are held as T; bf16/f16 values are T rounded through their
// 16-bit type after every op that produces them. Integer and bool values are held as int64_t.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/cpu/communicator.h"
#include "runtime/cpu/thread_pool.h"

namespace tpc::cpu {

template <class T>
struct Buf {
  TensorType type;
  std::vector<T> f;        // float dtypes
  std::vector<int64_t> i;  // integer and bool dtypes

  Buf() = default;
  explicit Buf(TensorType t) : type(std::move(t)) {
    if (isFloat(type.dtype)) f.assign(static_cast<size_t>(type.numel()), T(0));
    else i.assign(static_cast<size_t>(type.numel()), 0);
  }
  bool isFloatBuf() const { return isFloat(type.dtype); }
  int64_t numel() const { return type.numel(); }
  const Shape& shape() const { return type.shape; }
  int64_t rank() const { return type.rank(); }
  int64_t bytes() const { return numel() * static_cast<int64_t>(isFloatBuf() ? sizeof(T) : sizeof(int64_t)); }
};

struct RunContext {
  ThreadPool& pool;
  Communicator& comm;
  uint64_t seed;
  int64_t step;
};

template <class T>
struct KernelArgs {
  const Node& node;
  std::vector<const Buf<T>*> in;
  std::vector<Buf<T>*> out;  // allocated (zero-filled) by the executor with the result types
  RunContext& ctx;

  const Buf<T>& operand(size_t k) const { return *in[k]; }
  Buf<T>& result(size_t k = 0) const { return *out[k]; }
};

#define OP(Enum, name, nops, nres, traits, attrs) \
  template <class T>                              \
  Status kernel##Enum(KernelArgs<T>& a);
#include "ir/ops.def"
#undef OP

// Explicit instantiations, one line per op in its family file.
#define TPC_CPU_KERNEL_INSTANTIATE(Enum)                         \
  template Status kernel##Enum<float>(KernelArgs<float> & a);    \
  template Status kernel##Enum<double>(KernelArgs<double> & a);

// GPT-2's gelu (tanh approximation) 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi), and its
// derivative 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2), t = tanh(c (x + 0.044715 x^3)).
template <class T>
constexpr T kGeluC = T(0.7978845608028654);
template <class T>
inline T geluTanh(T x) {
  return T(0.5) * x * (T(1) + std::tanh(kGeluC<T> * (x + T(0.044715) * x * x * x)));
}
template <class T>
inline T geluTanhGrad(T v) {
  T t = std::tanh(kGeluC<T> * (v + T(0.044715) * v * v * v));
  return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * kGeluC<T> * (T(1) + T(3 * 0.044715) * v * v);
}

// Row-major strides of a shape.
inline std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    s[k] = acc;
    acc *= shape[k];
  }
  return s;
}

// Strides of `shape` read as if broadcast to `outShape` (numpy rules): 0 on broadcast dims.
inline std::vector<int64_t> broadcastStrides(llvm::ArrayRef<int64_t> shape, llvm::ArrayRef<int64_t> outShape) {
  std::vector<int64_t> s(outShape.size(), 0);
  std::vector<int64_t> own = stridesOf(shape);
  size_t off = outShape.size() - shape.size();
  for (size_t k = 0; k < shape.size(); ++k) s[off + k] = shape[k] == 1 ? 0 : own[k];
  return s;
}

// Copies a strided view: for every index of `shape`, dst[sum idx*dstStrides] = src[sum idx*srcStrides].
template <class E>
void stridedCopy(const E* src, llvm::ArrayRef<int64_t> srcStrides, E* dst, llvm::ArrayRef<int64_t> dstStrides,
                 llvm::ArrayRef<int64_t> shape, ThreadPool& pool) {
  size_t r = shape.size();
  if (r == 0) {
    *dst = *src;
    return;
  }
  int64_t inner = shape[r - 1], rows = 1;
  for (size_t k = 0; k + 1 < r; ++k) rows *= shape[k];
  if (inner == 0 || rows == 0) return;
  int64_t si = srcStrides[r - 1], di = dstStrides[r - 1];
  pool.parallelFor(rows, std::max<int64_t>(1, 16384 / inner), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t so = 0, dof = 0, rem = row;
      for (size_t k = r - 1; k-- > 0;) {
        int64_t idx = rem % shape[k];
        rem /= shape[k];
        so += idx * srcStrides[k];
        dof += idx * dstStrides[k];
      }
      const E* s = src + so;
      E* d = dst + dof;
      if (si == 1 && di == 1) std::copy(s, s + inner, d);
      else
        for (int64_t j = 0; j < inner; ++j) d[j * di] = s[j * si];
    }
  });
}

// Where a random op's index space (local shape `local`) sits in the unsharded one: the node's
// `global_shape` and `offsets` cover its first `covered` dims (empty: unsharded); the remaining dims are
// whole. at() maps a local multi-index to the row-major index in the global space, which keys Philox.
struct ShardIndex {
  std::vector<int64_t> offsets, globalStrides;

  static Result<ShardIndex> make(const Node& n, llvm::ArrayRef<int64_t> local, size_t covered, const char* space) {
    const std::vector<int64_t>& gs = n.getInts("global_shape");
    const std::vector<int64_t>& off = n.getInts("offsets");
    ShardIndex s;
    s.offsets.assign(local.size(), 0);
    std::vector<int64_t> global(local.begin(), local.end());
    if (!gs.empty() || !off.empty()) {
      if (gs.size() != covered || off.size() != covered)
        return makeError(n.opName(), ": global_shape ", shapeStr(gs), " and offsets ", shapeStr(off), " must both have ",
                         covered, " entries (", space, ")");
      for (size_t d = 0; d < covered; ++d) {
        if (off[d] < 0 || off[d] + local[d] > gs[d])
          return makeError(n.opName(), ": the shard ", shapeStr(local), " at offsets ", shapeStr(off),
                           " does not fit in global_shape ", shapeStr(gs), " (", space, ")");
        global[d] = gs[d];
        s.offsets[d] = off[d];
      }
    }
    s.globalStrides = stridesOf(global);
    return s;
  }
  uint64_t at(llvm::ArrayRef<int64_t> idx) const {
    int64_t g = 0;
    for (size_t d = 0; d < idx.size(); ++d) g += (offsets[d] + idx[d]) * globalStrides[d];
    return static_cast<uint64_t>(g);
  }
  // The global index of element 0 of row `row` (all dims but the last) of a tensor of `shape`.
  uint64_t globalRowStart(int64_t row, llvm::ArrayRef<int64_t> shape) const {
    size_t r = shape.size();
    if (r == 0) return 0;
    int64_t g = offsets[r - 1] * globalStrides[r - 1];
    for (size_t k = r - 1; k-- > 0;) {
      g += (offsets[k] + row % shape[k]) * globalStrides[k];
      row /= shape[k];
    }
    return static_cast<uint64_t>(g);
  }
};

// Grain (elements per chunk) below which elementwise work is not worth a second thread.
constexpr int64_t kElementwiseGrain = 1 << 15;

// How many partial sums a parallel reduction over n elements adds up (in chunk order): a function of n
// alone, so that results are bit-identical whatever the thread count (README, "Determinism").
inline int64_t fixedChunks(int64_t n) { return std::clamp<int64_t>(n / kElementwiseGrain, 1, 64); }

}  // namespace tpc::cpu
