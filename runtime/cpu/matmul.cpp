// CPU kernel: matmul with transposes and broadcast batch dims. A packed GEMM (GotoBLAS-style, without
// the assembly): B is packed into NR-wide column panels, each thread packs MR-row blocks of A per
// KC-deep slice, and a fixed-size MR x NR register tile is accumulated by a loop the compiler vectorizes.
#include <algorithm>
#include <string>

#include "runtime/cpu/kernels.h"

namespace tpc::cpu {
namespace {

constexpr int kMR = 4;
constexpr int kNR = 8;
constexpr int64_t kKC = 256;

template <class T>
inline void microKernel(const T* __restrict ap, const T* __restrict bp, int64_t kc, T* __restrict acc) {
  T c[kMR][kNR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const T* bk = bp + k * kNR;
    const T* ak = ap + k * kMR;
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < kNR; ++j) c[r][j] += ak[r] * bk[j];
  }
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc[r * kNR + j] = c[r][j];
}

// C[M, N] (row-major, contiguous) = A x B with A(i, k) = a[i*ars + k*acs] and B(k, j) = b[k*brs + j*bcs].
template <class T>
void gemm(const T* a, int64_t ars, int64_t acs, const T* b, int64_t brs, int64_t bcs, T* c, int64_t M, int64_t N,
          int64_t K, ThreadPool& pool) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(c, c + M * N, T(0));
    return;
  }
  int64_t nb = (N + kNR - 1) / kNR, mb = (M + kMR - 1) / kMR;
  std::vector<T> bpack(static_cast<size_t>(nb * K * kNR));
  for (int64_t jb = 0; jb < nb; ++jb)
    for (int64_t k = 0; k < K; ++k) {
      T* dst = bpack.data() + (jb * K + k) * kNR;
      for (int j = 0; j < kNR; ++j) {
        int64_t col = jb * kNR + j;
        dst[j] = col < N ? b[k * brs + col * bcs] : T(0);
      }
    }
  // About 64 KFLOP per chunk at least: tiny products stay on one thread.
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * K * kMR));
  pool.parallelFor(mb, grain, [&](int64_t ib0, int64_t ib1) {
    std::vector<T> apack(static_cast<size_t>(kKC * kMR));
    T tile[kMR * kNR];
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      int64_t kc = std::min(kKC, K - k0);
      for (int64_t ib = ib0; ib < ib1; ++ib) {
        int64_t i0 = ib * kMR, rows = std::min<int64_t>(kMR, M - i0);
        for (int64_t k = 0; k < kc; ++k)
          for (int r = 0; r < kMR; ++r)
            apack[k * kMR + r] = r < rows ? a[(i0 + r) * ars + (k0 + k) * acs] : T(0);
        for (int64_t jb = 0; jb < nb; ++jb) {
          microKernel(apack.data(), bpack.data() + (jb * K + k0) * kNR, kc, tile);
          int64_t j0 = jb * kNR, cols = std::min<int64_t>(kNR, N - j0);
          for (int64_t r = 0; r < rows; ++r) {
            T* crow = c + (i0 + r) * N + j0;
            if (k0 == 0)
              for (int64_t j = 0; j < cols; ++j) crow[j] = tile[r * kNR + j];
            else
              for (int64_t j = 0; j < cols; ++j) crow[j] += tile[r * kNR + j];
          }
        }
      }
    }
  });
}

}  // namespace

template <class T>
Status kernelMatmul(KernelArgs<T>& a) {
  const Buf<T>&A = a.operand(0), &B = a.operand(1);
  Buf<T>& C = a.result();
  bool ta = a.node.getBool("transpose_a"), tb = a.node.getBool("transpose_b");
  int64_t ra = A.rank(), rb = B.rank(), rc = C.rank();
  int64_t M = C.shape()[rc - 2], N = C.shape()[rc - 1];
  int64_t K = ta ? A.shape()[ra - 2] : A.shape()[ra - 1];
  int64_t ars = ta ? 1 : K, acs = ta ? M : 1;
  int64_t brs = tb ? 1 : N, bcs = tb ? K : 1;

  llvm::ArrayRef<int64_t> outBatch = llvm::ArrayRef<int64_t>(C.shape()).drop_back(2);
  llvm::ArrayRef<int64_t> aBatch = llvm::ArrayRef<int64_t>(A.shape()).drop_back(2);
  llvm::ArrayRef<int64_t> bBatch = llvm::ArrayRef<int64_t>(B.shape()).drop_back(2);
  int64_t nbatch = 1, bBatchNumel = 1;
  for (int64_t d : outBatch) nbatch *= d;
  for (int64_t d : bBatch) bBatchNumel *= d;
  (void)rb;

  // b shared by every batch and a's batches contiguous rows: one [batch*M, K] x [K, N] product.
  if (bBatchNumel == 1 && !ta && A.numel() == nbatch * M * K) {
    gemm(A.f.data(), ars, acs, B.f.data(), brs, bcs, C.f.data(), nbatch * M, N, K, a.ctx.pool);
    return {};
  }
  std::vector<int64_t> sa = broadcastStrides(aBatch, outBatch), sb = broadcastStrides(bBatch, outBatch);
  auto offsets = [&](int64_t batch, int64_t* oa, int64_t* ob) {
    *oa = *ob = 0;
    for (size_t k = outBatch.size(); k-- > 0;) {
      int64_t idx = batch % outBatch[k];
      batch /= outBatch[k];
      *oa += idx * sa[k];
      *ob += idx * sb[k];
    }
    *oa *= M * K;
    *ob *= K * N;
  };
  auto one = [&](int64_t batch) {
    int64_t oa, ob;
    offsets(batch, &oa, &ob);
    gemm(A.f.data() + oa, ars, acs, B.f.data() + ob, brs, bcs, C.f.data() + batch * M * N, M, N, K, a.ctx.pool);
  };
  if (nbatch >= a.ctx.pool.size()) {
    a.ctx.pool.parallelFor(nbatch, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < nbatch; ++i) one(i);
  }
  return {};
}

// The matmul (fp accumulation, not rounded to a 16-bit dtype before the epilogue, as cuBLASLt), then the
// epilogue on every [row, column] of the [rows, N] result; sums over rows accumulate in double.
template <class T>
Status kernelMatmulEpilogue(KernelArgs<T>& a) {
  const std::string& e = a.node.getStr("epilogue");
  Buf<T>& out = a.result(0);
  Buf<T> mm(out.type);
  KernelArgs<T> plain{a.node, {a.in[0], a.in[1]}, {&mm}, a.ctx};
  TPC_TRY(kernelMatmul(plain));
  const int64_t N = out.shape().back(), rows = N ? out.numel() / N : 0;
  const T* m = mm.f.data();
  T* c = out.f.data();
  const T* x = a.in.size() > 2 ? a.operand(2).f.data() : nullptr;  // bias or pre
  const T* res = a.in.size() > 3 ? a.operand(3).f.data() : nullptr;
  T* pre = e == "gelu_bias" ? a.result(1).f.data() : nullptr;
  const int kind = e == "bias" ? 0 : e == "gelu_bias" ? 1 : e == "bgrad_b" || e == "bgrad_a" ? 3 : 2;
  a.ctx.pool.parallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N)), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * N; i < r1 * N; ++i) {
      int64_t j = i % N;
      switch (kind) {
        case 0: c[i] = res ? (m[i] + x[j]) + res[i] : m[i] + x[j]; break;
        case 1: pre[i] = m[i] + x[j], c[i] = geluTanh(pre[i]); break;
        case 2: c[i] = m[i] * geluTanhGrad(x[i]); break;
        default: c[i] = m[i];
      }
    }
  });
  if (e == "dgelu_bgrad" || e == "bgrad_b" || e == "bgrad_a") {
    // bgrad_b: b [K, N], summed over its K rows; bgrad_a: a [..., K] over all but its last dim.
    const Buf<T>& src = e == "bgrad_b" ? a.operand(1) : e == "bgrad_a" ? a.operand(0) : out;
    int64_t n = src.shape().back(), r = n ? src.numel() / n : 0;
    std::vector<double> sum(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < n; ++j) sum[j] += static_cast<double>(src.f[i * n + j]);
    for (int64_t j = 0; j < n; ++j) a.result(1).f[j] = static_cast<T>(sum[j]);
  }
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(Matmul)
TPC_CPU_KERNEL_INSTANTIATE(MatmulEpilogue)

}  // namespace tpc::cpu
