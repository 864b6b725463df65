// CPU kernels: fused causal attention and its backward, one query row at a time (no T x T matrix is
// stored, like the flash kernel they are the reference for). Dropout acts on the probabilities with a
// mask from Philox keyed by (seed, step, key, index into [B, H, Tq, Tk]); the backward redraws it. On a
// shard, global_shape/offsets place [B, H] in the unsharded [B, H] (Tq and Tk are whole): the index is the
// unsharded op's, so heads split over ranks draw the same mask as one rank. attention_qkv reads q, k, v
// from one packed tensor and writes out as [B, T, H, Dh]: the same loops on strided views.
#include <cmath>
#include <limits>

#include "ir/shape_rules.h"
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

// [B, H, T, Dh] rows of a tensor in memory: row (bh, t) starts at base + b sb + h sh + t st (Dh contiguous).
template <class P>
struct View {
  P* base;
  int64_t sb, sh, st;
  P* row(int64_t bh, int64_t t, int64_t H) const { return base + (bh / H) * sb + (bh % H) * sh + t * st; }
};
template <class P>
View<P> contiguous(P* p, const AttnDims& d, int64_t T) {
  return {p, d.H * T * d.D, T * d.D, d.D};
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

template <class T>
Status attentionRows(const AttnDims& d, RunContext& ctx, View<const T> Q, View<const T> K, View<const T> V, View<T> O,
                     T* lse) {
  int64_t rows = d.B * d.H * d.Tq;
  ctx.pool.parallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, d.Tk * d.D)), [&](int64_t r0, int64_t r1) {
    std::vector<T> s(static_cast<size_t>(d.Tk));
    for (int64_t row = r0; row < r1; ++row) {
      int64_t bh = row / d.Tq, i = row % d.Tq, nk = keysFor(d, i);
      const T* q = Q.row(bh, i, d.H);
      T* o = O.row(bh, i, d.H);
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < nk; ++j) {
        const T* kr = K.row(bh, j, d.H);
        T acc = 0;
        for (int64_t c = 0; c < d.D; ++c) acc += q[c] * kr[c];
        s[j] = acc * static_cast<T>(d.scale);
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += std::exp(static_cast<double>(s[j] - m));
      T l = nk == 0 ? -std::numeric_limits<T>::infinity() : m + static_cast<T>(std::log(sum));
      lse[row] = l;
      std::fill(o, o + d.D, T(0));
      for (int64_t j = 0; j < nk; ++j) {
        const T* vr = V.row(bh, j, d.H);
        T p = std::exp(s[j] - l) * dropFactor<T>(d, ctx, bh, i, j);
        for (int64_t c = 0; c < d.D; ++c) o[c] += p * vr[c];
      }
    }
  });
  return {};
}

// Flash-attention backward: P = exp(S - lse), dP' = dout V^T, dP = dP' * dropmask, D_i = rowsum(dout * out),
// dS = P * (dP - D_i), dQ = scale dS K, dK = scale dS^T Q, dV = (P * dropmask)^T dout. dq, dk, dv start zero.
template <class T>
Status attentionGradRows(const AttnDims& d, RunContext& ctx, View<const T> G, View<const T> Q, View<const T> K,
                         View<const T> V, View<const T> O, const T* L, View<T> dQ, View<T> dK, View<T> dV) {
  T scale = static_cast<T>(d.scale);
  // Parallel over (batch, head): dk and dv accumulate over every query row of a head.
  ctx.pool.parallelFor(d.B * d.H, 1, [&](int64_t h0, int64_t h1) {
    std::vector<T> p(static_cast<size_t>(d.Tk)), dp(static_cast<size_t>(d.Tk));
    for (int64_t bh = h0; bh < h1; ++bh) {
      for (int64_t i = 0; i < d.Tq; ++i) {
        int64_t row = bh * d.Tq + i, nk = keysFor(d, i);
        const T* q = Q.row(bh, i, d.H);
        const T* g = G.row(bh, i, d.H);
        const T* o = O.row(bh, i, d.H);
        T* dqr = dQ.row(bh, i, d.H);
        T l = L[row];
        T Di = 0;
        for (int64_t c = 0; c < d.D; ++c) Di += g[c] * o[c];
        for (int64_t j = 0; j < nk; ++j) {
          const T *kr = K.row(bh, j, d.H), *vr = V.row(bh, j, d.H);
          T* dvr = dV.row(bh, j, d.H);
          T s = 0, gv = 0;
          for (int64_t c = 0; c < d.D; ++c) {
            s += q[c] * kr[c];
            gv += g[c] * vr[c];
          }
          T f = dropFactor<T>(d, ctx, bh, i, j);
          p[j] = std::exp(s * scale - l);
          dp[j] = gv * f;
          T pf = p[j] * f;
          for (int64_t c = 0; c < d.D; ++c) dvr[c] += pf * g[c];
        }
        for (int64_t j = 0; j < nk; ++j) {
          const T* kr = K.row(bh, j, d.H);
          T* dkr = dK.row(bh, j, d.H);
          T ds = p[j] * (dp[j] - Di) * scale;
          for (int64_t c = 0; c < d.D; ++c) {
            dqr[c] += ds * kr[c];
            dkr[c] += ds * q[c];
          }
        }
      }
    }
  });
  return {};
}

// attention_qkv's shape: q, k, v are the three [B, H, T, Dh] views of the packed operand.
Result<AttnDims> packedDims(const Node& n, const Shape& qkv, PackedQkv& p) {
  TPC_ASSIGN(p, packedQkv(qkv, n.getInts("perm")));
  Shape q{p.B, p.H, p.T, p.D};
  return dims(n, q, q);
}
template <class P>
View<P> packedView(P* base, const PackedQkv& p, int which) {
  return {base + which * p.sWhich, p.sBatch, p.sHead, p.sToken};
}
// out [B, T, H, Dh]
template <class P>
View<P> tokenMajor(P* base, const AttnDims& d) {
  return {base, d.Tq * d.H * d.D, d.D, d.H * d.D};
}

}  // namespace

template <class T>
Status kernelAttention(KernelArgs<T>& a) {
  const Buf<T>&Q = a.operand(0), &K = a.operand(1), &V = a.operand(2);
  TPC_ASSIGN(AttnDims d, dims(a.node, Q.shape(), K.shape()));
  return attentionRows<T>(d, a.ctx, contiguous(Q.f.data(), d, d.Tq), contiguous(K.f.data(), d, d.Tk),
                          contiguous(V.f.data(), d, d.Tk), contiguous(a.result(0).f.data(), d, d.Tq),
                          a.result(1).f.data());
}

template <class T>
Status kernelAttentionGrad(KernelArgs<T>& a) {
  const Buf<T>&Q = a.operand(1), &K = a.operand(2);
  TPC_ASSIGN(AttnDims d, dims(a.node, Q.shape(), K.shape()));
  auto in = [&](size_t k, int64_t T_) { return contiguous<const T>(a.operand(k).f.data(), d, T_); };
  auto out = [&](size_t k, int64_t T_) { return contiguous<T>(a.result(k).f.data(), d, T_); };
  return attentionGradRows<T>(d, a.ctx, in(0, d.Tq), in(1, d.Tq), in(2, d.Tk), in(3, d.Tk), in(4, d.Tq),
                              a.operand(5).f.data(), out(0, d.Tq), out(1, d.Tk), out(2, d.Tk));
}

template <class T>
Status kernelAttentionQkv(KernelArgs<T>& a) {
  PackedQkv p{};
  TPC_ASSIGN(AttnDims d, packedDims(a.node, a.operand(0).shape(), p));
  const T* qkv = a.operand(0).f.data();
  return attentionRows<T>(d, a.ctx, packedView(qkv, p, 0), packedView(qkv, p, 1), packedView(qkv, p, 2),
                          tokenMajor(a.result(0).f.data(), d), a.result(1).f.data());
}

template <class T>
Status kernelAttentionQkvGrad(KernelArgs<T>& a) {
  PackedQkv p{};
  TPC_ASSIGN(AttnDims d, packedDims(a.node, a.operand(1).shape(), p));
  const T* qkv = a.operand(1).f.data();
  T* dqkv = a.result(0).f.data();
  return attentionGradRows<T>(d, a.ctx, tokenMajor(a.operand(0).f.data(), d), packedView(qkv, p, 0),
                              packedView(qkv, p, 1), packedView(qkv, p, 2), tokenMajor(a.operand(2).f.data(), d),
                              a.operand(3).f.data(), packedView(dqkv, p, 0), packedView(dqkv, p, 1),
                              packedView(dqkv, p, 2));
}

TPC_CPU_KERNEL_INSTANTIATE(Attention)
TPC_CPU_KERNEL_INSTANTIATE(AttentionGrad)
TPC_CPU_KERNEL_INSTANTIATE(AttentionQkv)
TPC_CPU_KERNEL_INSTANTIATE(AttentionQkvGrad)

}  // namespace tpc::cpu
