// CPU kernels: fused causal attention and its backward, one query row at a time (no T x T matrix is
// stored, like the flash kernel they are the reference for). Dropout acts on the probabilities with a
// mask from Philox keyed by (seed, step, key, index into [B, H, Tq, Tk]); the backward redraws it. On a
// shard, global_shape/offsets place [B, H] in the unsharded [B, H] (Tq and Tk are whole): the index is the
// unsharded op's, so heads split over ranks draw the same mask as one rank.
#include <cmath>
#include <limits>

#include "runtime/cpu/kernels.h"
#include "runtime/philox.h"

namespace tpc::cpu {
namespace {

struct AttnDims {
  int64_t B, H, Tq, Tk, D;
  bool causal;
  double scale, dropout;
  uint32_t key;
  ShardIndex index;  // [B, H, Tq, Tk] in the unsharded index space
};

Result<AttnDims> dims(const Node& n, const Shape& q, const Shape& k) {
  AttnDims d{q[0], q[1], q[2], k[2], q[3], n.getBool("causal"), n.getFloat("scale"), n.getFloat("dropout"),
             static_cast<uint32_t>(n.getInt("key")), {}};
  if (d.scale == 0.0) d.scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  int64_t space[4] = {d.B, d.H, d.Tq, d.Tk};
  TPC_ASSIGN(d.index, ShardIndex::make(n, space, 2, "[batch, heads]"));
  return d;
}

// Number of keys query i sees.
inline int64_t keysFor(const AttnDims& d, int64_t i) { return d.causal ? std::min(i + 1, d.Tk) : d.Tk; }

// Dropout multiplier for probability (bh, i, j): 0 or 1/(1-p); 1 without dropout.
template <class T>
inline T dropFactor(const AttnDims& d, const RunContext& ctx, int64_t bh, int64_t i, int64_t j) {
  if (d.dropout == 0.0) return T(1);
  int64_t at[4] = {bh / d.H, bh % d.H, i, j};
  uint64_t idx = d.index.at(at);
  return philox::dropoutKeep(ctx.seed, ctx.step, d.key, idx, static_cast<float>(d.dropout))
             ? static_cast<T>(1.0 / (1.0 - d.dropout))
             : T(0);
}

}  // namespace

template <class T>
Status kernelAttention(KernelArgs<T>& a) {
  const Buf<T>&Q = a.operand(0), &K = a.operand(1), &V = a.operand(2);
  TPC_ASSIGN(AttnDims d, dims(a.node, Q.shape(), K.shape()));
  T* out = a.result(0).f.data();
  T* lse = a.result(1).f.data();
  RunContext& ctx = a.ctx;
  int64_t rows = d.B * d.H * d.Tq;
  ctx.pool.parallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, d.Tk * d.D)), [&](int64_t r0, int64_t r1) {
    std::vector<T> s(static_cast<size_t>(d.Tk));
    for (int64_t row = r0; row < r1; ++row) {
      int64_t bh = row / d.Tq, i = row % d.Tq, nk = keysFor(d, i);
      const T* q = Q.f.data() + row * d.D;
      const T* kb = K.f.data() + bh * d.Tk * d.D;
      const T* vb = V.f.data() + bh * d.Tk * d.D;
      T* o = out + row * d.D;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < nk; ++j) {
        T acc = 0;
        for (int64_t c = 0; c < d.D; ++c) acc += q[c] * kb[j * d.D + c];
        s[j] = acc * static_cast<T>(d.scale);
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += std::exp(static_cast<double>(s[j] - m));
      T l = nk == 0 ? -std::numeric_limits<T>::infinity() : m + static_cast<T>(std::log(sum));
      lse[row] = l;
      std::fill(o, o + d.D, T(0));
      for (int64_t j = 0; j < nk; ++j) {
        T p = std::exp(s[j] - l) * dropFactor<T>(d, ctx, bh, i, j);
        for (int64_t c = 0; c < d.D; ++c) o[c] += p * vb[j * d.D + c];
      }
    }
  });
  return {};
}

// Flash-attention backward: P = exp(S - lse), dP' = dout V^T, dP = dP' * dropmask, D_i = rowsum(dout * out),
// dS = P * (dP - D_i), dQ = scale dS K, dK = scale dS^T Q, dV = (P * dropmask)^T dout.
template <class T>
Status kernelAttentionGrad(KernelArgs<T>& a) {
  const Buf<T>&dOut = a.operand(0), &Q = a.operand(1), &K = a.operand(2), &V = a.operand(3), &O = a.operand(4),
         &L = a.operand(5);
  TPC_ASSIGN(AttnDims d, dims(a.node, Q.shape(), K.shape()));
  T *dq = a.result(0).f.data(), *dk = a.result(1).f.data(), *dv = a.result(2).f.data();
  RunContext& ctx = a.ctx;
  T scale = static_cast<T>(d.scale);
  // Parallel over (batch, head): dk and dv accumulate over every query row of a head.
  ctx.pool.parallelFor(d.B * d.H, 1, [&](int64_t h0, int64_t h1) {
    std::vector<T> p(static_cast<size_t>(d.Tk)), dp(static_cast<size_t>(d.Tk));
    for (int64_t bh = h0; bh < h1; ++bh) {
      const T* kb = K.f.data() + bh * d.Tk * d.D;
      const T* vb = V.f.data() + bh * d.Tk * d.D;
      T* dkb = dk + bh * d.Tk * d.D;
      T* dvb = dv + bh * d.Tk * d.D;
      for (int64_t i = 0; i < d.Tq; ++i) {
        int64_t row = bh * d.Tq + i, nk = keysFor(d, i);
        const T* q = Q.f.data() + row * d.D;
        const T* g = dOut.f.data() + row * d.D;
        const T* o = O.f.data() + row * d.D;
        T* dqr = dq + row * d.D;
        T l = L.f[row];
        T Di = 0;
        for (int64_t c = 0; c < d.D; ++c) Di += g[c] * o[c];
        for (int64_t j = 0; j < nk; ++j) {
          T s = 0, gv = 0;
          for (int64_t c = 0; c < d.D; ++c) {
            s += q[c] * kb[j * d.D + c];
            gv += g[c] * vb[j * d.D + c];
          }
          T f = dropFactor<T>(d, ctx, bh, i, j);
          p[j] = std::exp(s * scale - l);
          dp[j] = gv * f;
          T pf = p[j] * f;
          for (int64_t c = 0; c < d.D; ++c) dvb[j * d.D + c] += pf * g[c];
        }
        for (int64_t j = 0; j < nk; ++j) {
          T ds = p[j] * (dp[j] - Di) * scale;
          for (int64_t c = 0; c < d.D; ++c) {
            dqr[c] += ds * kb[j * d.D + c];
            dkb[j * d.D + c] += ds * q[c];
          }
        }
      }
    }
  });
  return {};
}

TPC_CPU_KERNEL_INSTANTIATE(Attention)
TPC_CPU_KERNEL_INSTANTIATE(AttentionGrad)

}  // namespace tpc::cpu
