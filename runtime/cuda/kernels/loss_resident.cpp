// cross_entropy_grad and cross_entropy_with_grad with the row resident on chip (issue 7): each logit read
// from HBM once and each dlogit written once, the next row loading while this one is worked on. A persistent
// block (up to 1024 threads; gpt2: one per SM) owns rows blockIdx.x, + gridDim.x, ...; each row is copied
// global -> shared by cp.async into one of two buffers, in 16-byte pieces that the copying thread alone reads
// later (its own wait is enough: no barrier for the data). Per row: the block max, then the sum of
// 2^(x log2 e - max log2 e) (two block reductions in a fixed order: deterministic), then dlogits from the
// shared copy, 16-byte stores; exponentials are one MUFU.EX2 each (tpc_ex2), the target's -1 and the
// padding columns handled only in the pieces that hold them. The same formulas as loss.cpp's kernel:
// dlogits = dloss * (2^(x log2 e - lse2) - onehot), loss = lse2 ln 2 - x_target, 0 on padding; ignored rows
// (not loaded) write zeros and loss 0; a target outside the classes gives a NaN loss and NaN gradient row.
// In place (dlogits over the logits) is safe: a row's pieces are all in shared memory before any is written.
#include <algorithm>

#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

struct Geometry {
  int64_t V, C, rows, nv;  // row length, classes, rows, 16-byte pieces a row
  uint32_t nt, k;          // threads a block, pieces a thread
  int64_t bufBytes;        // the two row buffers
};

Geometry geometryOf(const Node& n) {
  Geometry g;
  const Value* logits = n.operand(1);
  g.V = logits->shape().empty() ? 0 : logits->shape().back();
  g.rows = g.V ? logits->type().numel() / g.V : 0;
  g.C = n.getInt("num_classes") > 0 ? std::min(n.getInt("num_classes"), g.V) : g.V;
  g.nv = g.V / 8;
  g.nt = static_cast<uint32_t>(std::clamp<int64_t>((g.nv + 31) / 32 * 32, 32, 1024));
  g.k = static_cast<uint32_t>((g.nv + g.nt - 1) / g.nt);
  g.bufBytes = 2 * g.nv * 16;
  return g;
}

}  // namespace

bool residentXentGrad(const Node& n, const LoweringContext& ctx, bool withLoss) {
  DType xt = n.operand(1)->dtype();
  const Value* dlogits = n.result(withLoss ? 1 : 0);
  if (!ctx.xentOnePass || (xt != DType::bf16 && xt != DType::f16) || dlogits->dtype() != xt) return false;
  Geometry g = geometryOf(n);
  return g.V > 0 && g.V % 8 == 0 && g.rows > 0 && g.bufBytes + 256 <= ctx.maxSharedBytes;
}

Result<NodeLowering> lowerXentGradResident(const Node& n, const LoweringContext& ctx, bool withLoss) {
  if (!residentXentGrad(n, ctx, withLoss)) return makeError(n.opName(), ": the resident kernel does not apply here");
  DType xt = n.operand(1)->dtype();
  Geometry g = geometryOf(n);
  bool bf = xt == DType::bf16;
  std::string entry = withLoss ? "tpc_cross_entropy_with_grad_resident" : "tpc_cross_entropy_grad_resident";
  std::string src =
      devicePrelude() + tensorCorePrelude() + accessors("dl", n.operand(0)->dtype()) + accessors("x", xt) +
      accessors("t", n.operand(2)->dtype()) + (withLoss ? accessors("l", n.result(0)->dtype()) : "") +
      cat("#define V ", g.V, "\n#define C ", g.C, "\n#define NV ", g.nv, "\n#define NT ", g.nt, "\n#define K ", g.k,
          "\n#define KV ", g.nv / g.nt, "\n#define KC ", g.C / (8 * int64_t(g.nt)), "\n#define ROWS ", i64Lit(g.rows),
          "\n#define IGNORE ", i64Lit(n.getInt("ignore_index")), "\n#define WITH_LOSS ", withLoss ? 1 : 0,
          bf ? "\n#define LO(w) __uint_as_float((w) << 16)\n#define HI(w) __uint_as_float((w) & 0xffff0000u)\n#define PACK tpc_pack_bf16\n"
             : "\n#define LO(w) tpc_f16_to_f32((f16_t)((w) & 0xffffu))\n#define HI(w) tpc_f16_to_f32((f16_t)((w) >> 16))\n#define PACK tpc_pack_f16\n",
          R"(#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
// Piece q of a row: elements 8q .. 8q + 7; thread threadIdx.x owns pieces threadIdx.x + k NT, k < K (KV of them
// exist for every thread, KC hold classes only for every thread).
__device__ __forceinline__ void tpc_unpack8(uint4 a, float* v) {
  v[0] = LO(a.x); v[1] = HI(a.x); v[2] = LO(a.y); v[3] = HI(a.y);
  v[4] = LO(a.z); v[5] = HI(a.z); v[6] = LO(a.w); v[7] = HI(a.w);
}
__device__ __forceinline__ uint4 tpc_pack8(const float* v) {
  uint4 a;
  a.x = PACK(v[0], v[1]); a.y = PACK(v[2], v[3]); a.z = PACK(v[4], v[5]); a.w = PACK(v[6], v[7]);
  return a;
}
// Starts copying this thread's pieces of `row` (unless past the end or ignored) into buf; one group either way.
__device__ __forceinline__ void tpc_fetch(uint4* buf, const x_t* X, const t_t* T, i64 row) {
  if (row < ROWS && t_ld(T, row) != IGNORE) {
    const uint4* src = reinterpret_cast<const uint4*>(X + row * V);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int q = threadIdx.x + k * NT;
      if (k < KV || q < NV) tpc_cp_async16(buf + q, src + q, true);
    }
  }
  tpc_cp_async_commit();
}
extern "C" __global__ void __launch_bounds__(NT, 1) )",
          entry, "(const dl_t* DL, const x_t* X, const t_t* T, ", withLoss ? "l_t* L, " : "", R"(x_t* DX) {
  extern __shared__ float smem[];
  __shared__ float red[64];  // [0, 32): the warps' maxima, [32, 64): their sums (alternating: two barriers a row)
  uint4* bufs = reinterpret_cast<uint4*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  tpc_fetch(bufs, X, T, blockIdx.x);
  tpc_fetch(bufs + NV, X, T, (i64)blockIdx.x + gridDim.x);
  int b = 0;
  for (i64 row = blockIdx.x; row < ROWS; row += gridDim.x, b ^= 1) {
    uint4* buf = bufs + b * NV;
    uint4* d = reinterpret_cast<uint4*>(DX + row * V);
    const i64 t = t_ld(T, row);
    if (t == IGNORE) {
#if WITH_LOSS
      if (threadIdx.x == 0) l_st(L, row, 0.f);
#endif
      uint4 z;
      z.x = z.y = z.z = z.w = 0u;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = threadIdx.x + k * NT;
        if (k < KV || q < NV) d[q] = z;
      }
    } else {
      tpc_cp_async_wait_one();  // this row's pieces (the next row's may still be in flight)
      float m = -TPC_INF;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = threadIdx.x + k * NT;
        float v[8];
        if (k < KC) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e) m = fmaxf(m, v[e]);
        } else if (q * 8 < C) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (q * 8 + e < C) m = fmaxf(m, v[e]);
        }
      }
      m = tpc_warp_max(m);
      if (lane == 0) red[warp] = m;
      __syncthreads();
      m = tpc_warp_max(lane < NT / 32 ? red[lane] : -TPC_INF);
      const float mb = m * LOG2E;
      const bool valid = t >= 0 && t < C;
#if WITH_LOSS
      // Read before the next barrier: past it, the piece's owner may overwrite it with the row after next.
      const float xt = threadIdx.x == 0 && valid ? x_ld(reinterpret_cast<const x_t*>(buf), t) : 0.f;
#endif
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = threadIdx.x + k * NT;
        float v[8];
        if (k < KC) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e) s += tpc_ex2(fmaf(v[e], LOG2E, -mb));
        } else if (q * 8 < C) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (q * 8 + e < C) s += tpc_ex2(fmaf(v[e], LOG2E, -mb));
        }
      }
      s = tpc_warp_sum(s);
      if (lane == 0) red[32 + warp] = s;
      __syncthreads();
      s = tpc_warp_sum(lane < NT / 32 ? red[32 + lane] : 0.f);
      const float lse2 = mb + log2f(s);
#if WITH_LOSS
      if (threadIdx.x == 0) l_st(L, row, valid ? lse2 * LN2 - xt : __int_as_float(0x7fc00000));
#endif
      const float gr = valid ? dl_ld(DL, row) : __int_as_float(0x7fc00000);
      const int tl = valid ? (int)t : -8;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = threadIdx.x + k * NT;
        float v[8];
        if (k < KC) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = tpc_ex2(fmaf(v[e], LOG2E, -lse2));
          if ((unsigned)(tl - q * 8) < 8u) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (q * 8 + e == tl) v[e] -= 1.f;
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] *= gr;
          d[q] = tpc_pack8(v);
        } else if (k < KV || q < NV) {
          tpc_unpack8(buf[q], v);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            v[e] = q * 8 + e < C ? gr * (tpc_ex2(fmaf(v[e], LOG2E, -lse2)) - (q * 8 + e == tl ? 1.f : 0.f)) : 0.f;
          d[q] = tpc_pack8(v);
        }
      }
    }
    tpc_fetch(buf, X, T, row + 2 * (i64)gridDim.x);  // this thread's pieces of buf are read: reuse them
  }
  tpc_cp_async_wait_all();
}
)");
  KernelSpec k;
  k.entry = entry;
  k.source = std::move(src);
  k.block.x = g.nt;
  // Persistent: as many blocks as fit on the GPU at once (by threads and by shared memory), at most one a row.
  int64_t perSM = std::max<int64_t>(1, std::min<int64_t>(2048 / g.nt, ctx.sharedPerSM / (g.bufBytes + 256 + 1024)));
  k.grid.x = static_cast<uint32_t>(std::clamp<int64_t>(perSM * ctx.numSMs, 1, g.rows));
  k.sharedBytes = static_cast<uint32_t>(g.bufBytes);
  k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0)};
  if (withLoss) k.args.push_back(resultArg(1));
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

}  // namespace tpc::cuda
