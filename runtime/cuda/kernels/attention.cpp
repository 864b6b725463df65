// CUDA lowerings of attention and attention_grad: which kernel set takes an op (lowerAttention), and the
// f32 CUDA-core flash kernels: 64 x 64 tiles of queries and keys in shared memory (f32 whatever the storage dtype), an online softmax, never a T x T matrix in memory.
// Backward recomputes P from lse and is deterministic without atomics: one kernel per key tile
// accumulates dk and dv over the query tiles, another per query tile accumulates dq over the key tiles.
// Dropout draws Philox bits on the [B, H, Tq, Tk] index space of the unsharded op (global_shape/offsets
// place [B, H]), exactly as runtime/cpu/attention.cpp.
//
// Thread layout (256 threads, 16 x 16): thread (ty, tx) owns score rows ty + 16 i and columns tx + 16 j
// (i, j < 4) of a 64 x 64 tile, and output columns d = tx + 16 jj of its four rows. Rows are padded to an
// odd float stride (LD) so that both row and column walks through a tile avoid bank conflicts; a score
// row lives in one half-warp, so its max and sum are four xor shuffles.
#include <cmath>

#include "runtime/cuda/kernels/attention.h"

#include "ir/shape_rules.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

constexpr int64_t kTile = 64;

uint32_t tilesOf(int64_t t) { return static_cast<uint32_t>((t + kTile - 1) / kTile); }

}  // namespace

bool isAttentionBackward(const Node& n) {
  return n.op() == OpKind::AttentionGrad || n.op() == OpKind::AttentionQkvGrad;
}

Result<AttnShape> attnShape(const Node& n) {
  AttnShape a{};
  const bool bwd = isAttentionBackward(n);
  if (n.op() == OpKind::AttentionQkv || n.op() == OpKind::AttentionQkvGrad) {
    const Value* qkv = n.operand(bwd ? 1 : 0);
    auto p = packedQkv(qkv->shape(), n.getInts("perm"));
    if (!p) return makeError(n.opName(), ": ", p.error());
    a.B = p->B;
    a.H = p->H;
    a.Tq = a.Tk = p->T;
    a.D = p->D;
    a.dt = qkv->dtype();
    a.q = {operandArg(bwd ? 1 : 0), 0, p->sBatch, p->sHead, p->sToken};
    a.k = a.q;
    a.k.off = p->sWhich;
    a.v = a.q;
    a.v.off = 2 * p->sWhich;
    const AttnRows tokenMajor{operandArg(0), 0, a.Tq * a.H * a.D, a.D, a.H * a.D};  // [B, T, H, Dh]
    a.o = tokenMajor;
    if (bwd) {
      a.dout = tokenMajor;
      a.o.arg = operandArg(2);
      a.lse = operandArg(3);
      a.dq = a.q;
      a.dk = a.k;
      a.dv = a.v;
      a.dq.arg = a.dk.arg = a.dv.arg = resultArg(0);
    } else {
      a.o.arg = resultArg(0);
      a.lse = resultArg(1);
    }
  } else {
    const Value *q = n.operand(bwd ? 1 : 0), *k = n.operand(bwd ? 2 : 1);
    a.B = q->shape()[0];
    a.H = q->shape()[1];
    a.Tq = q->shape()[2];
    a.Tk = k->shape()[2];
    a.D = q->shape()[3];
    a.dt = q->dtype();
    auto rows = [&](KernelArg arg, int64_t t) { return AttnRows{arg, 0, a.H * t * a.D, t * a.D, a.D}; };
    if (bwd) {
      a.dout = rows(operandArg(0), a.Tq);
      a.q = rows(operandArg(1), a.Tq);
      a.k = rows(operandArg(2), a.Tk);
      a.v = rows(operandArg(3), a.Tk);
      a.o = rows(operandArg(4), a.Tq);
      a.lse = operandArg(5);
      a.dq = rows(resultArg(0), a.Tq);
      a.dk = rows(resultArg(1), a.Tk);
      a.dv = rows(resultArg(2), a.Tk);
    } else {
      a.q = rows(operandArg(0), a.Tq);
      a.k = rows(operandArg(1), a.Tk);
      a.v = rows(operandArg(2), a.Tk);
      a.o = rows(resultArg(0), a.Tq);
      a.lse = resultArg(1);
    }
  }
  if (a.D > 128) return makeError(n.opName(), ": the CUDA flash kernel takes head_dim <= 128, got ", a.D);
  a.Dp = (a.D + 15) / 16 * 16;
  a.LD = a.Dp + 1;
  a.causal = n.getBool("causal");
  a.scale = n.getFloat("scale") == 0.0 ? 1.0 / std::sqrt(static_cast<double>(a.D)) : n.getFloat("scale");
  a.dropout = n.getFloat("dropout");
  a.key = n.getInt("key");
  a.Hg = a.H;
  const std::vector<int64_t>& gs = n.getInts("global_shape");
  const std::vector<int64_t>& off = n.getInts("offsets");
  if (!gs.empty() || !off.empty()) {
    if (gs.size() != 2 || off.size() != 2)
      return makeError(n.opName(), ": global_shape ", shapeStr(gs), " and offsets ", shapeStr(off),
                       " must both have 2 entries ([batch, heads])");
    int64_t local[2] = {a.B, a.H};
    for (int d = 0; d < 2; ++d)
      if (off[d] < 0 || off[d] + local[d] > gs[d])
        return makeError(n.opName(), ": the shard ", shapeStr(local), " at offsets ", shapeStr(off),
                         " does not fit in global_shape ", shapeStr(gs), " ([batch, heads])");
    a.Hg = gs[1];
    a.offB = off[0];
    a.offH = off[1];
  }
  return a;
}

namespace {
// X_BASE(bh): element offset of row 0 of head bh of tensor X; X_ST: its token stride.
std::string rowDefines(const char* x, const AttnRows& r) {
  return cat("#define ", x, "_BASE(bh) (", i64Lit(r.off), " + ((bh) / NH) * ", i64Lit(r.sb), " + ((bh) % NH) * ",
             i64Lit(r.sh), ")\n#define ", x, "_ST ", i64Lit(r.st), "\n");
}
}  // namespace

// Constants and helpers shared by the three kernels.
std::string attnHead(const AttnShape& a, DType dt) {
  return devicePrelude() + accessors("q", dt) +
         cat("#define BH ", i64Lit(a.B * a.H), "\n#define NH ", i64Lit(a.H), "\n#define TQ ", i64Lit(a.Tq),
             "\n#define TK ", i64Lit(a.Tk), "\n#define HD ", a.D, "\n#define DP ", a.Dp, "\n#define LD ", a.LD,
             "\n#define NJ ", a.Dp / 16, "\n#define BT ", kTile, "\n#define PLD ", kTile + 1, "\n#define CAUSAL ",
             a.causal ? 1 : 0, "\n#define SCALE ", floatLit(a.scale), "\n#define DROPOUT ", a.dropout > 0 ? 1 : 0,
             "\n#define DROP_P ", floatLit(a.dropout), "\n#define DROP_SCALE ",
             floatLit(a.dropout > 0 ? 1.0 / (1.0 - a.dropout) : 1.0), "\n#define KEY ", a.key, "u\n") +
         rowDefines("Q", a.q) + rowDefines("K", a.k) + rowDefines("V", a.v) + rowDefines("O", a.o) +
         rowDefines("DO", a.dout) + rowDefines("DQ", a.dq) + rowDefines("DK", a.dk) + rowDefines("DV", a.dv) +
         R"(
// rows [r0, r0 + BT) of a matrix whose row g starts at src + g * st into dst[BT][LD]; rows >= nrows and
// columns >= HD are zero.
__device__ __forceinline__ void load_tile(float* dst, const q_t* src, i64 st, i64 r0, i64 nrows) {
  for (int e = threadIdx.x; e < BT * DP; e += blockDim.x) {
    int r = e / DP, d = e - r * DP;
    i64 g = r0 + r;
    dst[r * LD + d] = (g < nrows && d < HD) ? q_ld(src, g * st + d) : 0.f;
  }
}
// Dropout multiplier of probability (bh, i, j): 0 or 1/(1-p).
// (offb, offh): where this node's [B, H] block sits in the [?, hg] index space of the mask (passes/random_space.h).
__device__ __forceinline__ float drop_factor(u64 seed, i64 step, i64 offb, i64 offh, i64 hg, i64 bh, i64 i, i64 j) {
#if DROPOUT
  i64 b = bh / NH, h = bh - b * NH;
  u64 idx = (u64)(((b + offb) * hg + (h + offh)) * TQ + i) * (u64)TK + (u64)j;
  return tpc_dropout_keep(seed, step, KEY, idx, DROP_P) ? DROP_SCALE : 0.f;
#else
  return 1.f;
#endif
}
__device__ __forceinline__ float half_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
}
__device__ __forceinline__ float half_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 1);
}
)";
}

// Which kernels take which attention: bf16/f16 with head_dim a multiple of 16 (64 and 128 in the GPT
// presets) run on tensor cores (attention_tensor_core.cpp), causal or not, with or without dropout, any T;
// f32 inputs and other head dims (<= 128) run the f32 CUDA-core kernels below.
Result<NodeLowering> lowerAttention(const Node& n, const LoweringContext& ctx) {
  DType dt = n.operand(0)->dtype();
  TPC_TRY(checkFloatDType(n, dt, "q, k and v"));
  TPC_ASSIGN(AttnShape a, attnShape(n));
  return tensorCoreAttention(dt, a) ? lowerAttentionTensorCore(n, ctx) : lowerAttentionSimt(n, ctx);
}

Result<NodeLowering> lowerAttentionGrad(const Node& n, const LoweringContext& ctx) {
  DType dt = n.operand(1)->dtype();
  TPC_TRY(checkFloatDType(n, dt, "dout, q, k, v and out"));
  TPC_ASSIGN(AttnShape a, attnShape(n));
  return tensorCoreAttention(dt, a) ? lowerAttentionGradTensorCore(n, ctx) : lowerAttentionGradSimt(n, ctx);
}

Result<NodeLowering> lowerAttentionSimt(const Node& n, const LoweringContext& ctx) {
  DType dt = n.operand(0)->dtype();
  TPC_TRY(checkFloatDType(n, dt, "q, k and v"));
  TPC_ASSIGN(AttnShape a, attnShape(n));
  KernelSpec k;
  k.entry = "tpc_attention_fwd";
  k.source = attnHead(a, dt) + R"(
extern "C" __global__ void __launch_bounds__(256) tpc_attention_fwd(const q_t* Q, const q_t* K, const q_t* V, q_t* O,
                                                                     float* LSE, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  float* Qs = smem;          // [BT][LD] queries
  float* Ks = Qs + BT * LD;  // [BT][LD] keys
  float* Vs = Ks + BT * LD;  // [BT][LD] values
  float* Ps = Vs + BT * LD;  // [BT][PLD] dropped probabilities (unnormalized)
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const i64 ntiles = (TQ + BT - 1) / BT;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BT;  // the longest causal rows first
  const i64 step = DROPOUT ? *stepp : 0;
  load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  float m[4], l[4], acc[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -TPC_INF;
    l[i] = 0.f;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) acc[i][jj] = 0.f;
  }
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BT) : (i64)TK;
  for (i64 k0 = 0; k0 < kend; k0 += BT) {
    __syncthreads();
    load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
    load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
    __syncthreads();
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
    for (int d = 0; d < DP; ++d) {
      float qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = Qs[(ty + 16 * i) * LD + d];
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = Ks[(tx + 16 * j) * LD + d];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const i64 qi = q0 + ty + 16 * i;
      float mx = -TPC_INF;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const i64 kj = k0 + tx + 16 * j;
        bool ok = kj < TK && (!CAUSAL || kj <= qi);
        s[i][j] = ok ? s[i][j] * SCALE : -TPC_INF;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = half_max(mx);
      const float mn = fmaxf(m[i], mx);
      const float alpha = mn == -TPC_INF ? 1.f : expf(m[i] - mn);
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float p = s[i][j] == -TPC_INF ? 0.f : expf(s[i][j] - mn);
        rs += p;
        Ps[(ty + 16 * i) * PLD + tx + 16 * j] = p * drop_factor(seed, step, offb, offh, hg, bh, qi, k0 + tx + 16 * j);
      }
      rs = half_sum(rs);
      l[i] = l[i] * alpha + rs;
      m[i] = mn;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) acc[i][jj] *= alpha;
    }
    __syncthreads();
    const int cend = (int)min((i64)BT, kend - k0);
    for (int c = 0; c < cend; ++c) {
      float pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = Ps[(ty + 16 * i) * PLD + c];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float vv = Vs[c * LD + tx + 16 * jj];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][jj] += pv[i] * vv;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const i64 qi = q0 + ty + 16 * i;
    if (qi >= TQ) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      int d = tx + 16 * jj;
      if (d < HD) q_st(O, O_BASE(bh) + qi * O_ST + d, acc[i][jj] * inv);
    }
    if (tx == 0) LSE[bh * TQ + qi] = l[i] > 0.f ? m[i] + logf(l[i]) : -TPC_INF;
  }
}
)";
  k.block.x = 256;
  k.grid.x = std::max<uint32_t>(1, static_cast<uint32_t>(a.B * a.H) * tilesOf(a.Tq));
  k.sharedBytes = static_cast<uint32_t>((3 * kTile * a.LD + kTile * (kTile + 1)) * 4);
  if (k.sharedBytes > ctx.maxSharedBytes)
    return makeError("attention: the flash kernel needs ", k.sharedBytes, " bytes of shared memory, the GPU has ",
                     ctx.maxSharedBytes);
  k.args = {a.q.arg, a.k.arg, a.v.arg, a.o.arg, a.lse, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

KernelSpec attnDiKernel(const AttnShape& a, const std::string& head) {
  KernelSpec k;
  k.entry = "tpc_attention_bwd_di";
  k.source = head + R"(
extern "C" __global__ void tpc_attention_bwd_di(const q_t* DO, const q_t* O, float* Di) {
  const int lane = threadIdx.x & 31;
  for (i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < BH * TQ;
       row += ((i64)gridDim.x * blockDim.x) >> 5) {
    float s = 0.f;
    const i64 bh = row / TQ, i = row - bh * TQ;
    const q_t *g = DO + DO_BASE(bh) + i * DO_ST, *o = O + O_BASE(bh) + i * O_ST;
    for (int d = lane; d < HD; d += 32) s += q_ld(g, d) * q_ld(o, d);
    s = tpc_warp_sum(s);
    if (lane == 0) Di[row] = s;
  }
}
)";
  k.block.x = 256;
  k.grid.x = gridFor(a.B * a.H * a.Tq * 32, 256);
  k.args = {a.dout.arg, a.o.arg, workspaceArg(0)};
  return k;
}

// Kernel 1: Di = rowsum(dout * out) (a warp per row) into the workspace. Kernel 2 (a block per key tile):
// dv = sum over queries of (P * mask)^T dout, dk = scale dS^T q. Kernel 3 (a block per query tile):
// dq = scale dS k. dS = P * (dP * mask - Di), dP = dout v^T, P = exp(scale q k^T - lse).
Result<NodeLowering> lowerAttentionGradSimt(const Node& n, const LoweringContext& ctx) {
  DType dt = n.operand(1)->dtype();
  TPC_TRY(checkFloatDType(n, dt, "dout, q, k, v and out"));
  TPC_ASSIGN(AttnShape a, attnShape(n));
  std::string head = attnHead(a, dt);
  NodeLowering out;
  int64_t rows = a.B * a.H * a.Tq;
  out.workspaceBytes = std::max<int64_t>(rows, 1) * 4;
  out.kernels.push_back(attnDiKernel(a, head));
  {
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dkdv";
    k.source = head + R"(
extern "C" __global__ void __launch_bounds__(256) tpc_attention_bwd_dkdv(const q_t* DO, const q_t* Q, const q_t* K,
    const q_t* V, const float* LSE, const float* Di, q_t* DK, q_t* DV, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  float* Ks = smem;           // [BT][LD] this block's keys
  float* Vs = Ks + BT * LD;   // [BT][LD] their values
  float* Qs = Vs + BT * LD;   // [BT][LD] a query tile
  float* Gs = Qs + BT * LD;   // [BT][LD] its dout rows
  float* Pt = Gs + BT * LD;   // [BT keys][PLD] dropped P, transposed
  float* St = Pt + BT * PLD;  // [BT keys][PLD] dS (scaled), transposed
  float* Ls = St + BT * PLD;  // [BT] lse of the query tile
  float* Ds = Ls + BT;        // [BT] Di of the query tile
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const i64 nkt = (TK + BT - 1) / BT;
  const i64 bh = blockIdx.x / nkt;
  if (bh >= BH) return;
  const i64 k0 = (i64)(blockIdx.x % nkt) * BT;
  const i64 step = DROPOUT ? *stepp : 0;
  load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
  load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
  float dk[4][NJ], dv[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) dk[i][jj] = dv[i][jj] = 0.f;
  for (i64 q0 = CAUSAL ? k0 : 0; q0 < TQ; q0 += BT) {
    __syncthreads();
    load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
    load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ);
    if (threadIdx.x < BT) {
      i64 g = q0 + threadIdx.x;
      Ls[threadIdx.x] = g < TQ ? LSE[bh * TQ + g] : 0.f;
      Ds[threadIdx.x] = g < TQ ? Di[bh * TQ + g] : 0.f;
    }
    __syncthreads();
    float s[4][4], dp[4][4];  // rows: keys ty + 16 i; columns: queries tx + 16 j
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = dp[i][j] = 0.f;
    for (int d = 0; d < DP; ++d) {
      float kv[4], vv[4], qv[4], gv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { kv[i] = Ks[(ty + 16 * i) * LD + d]; vv[i] = Vs[(ty + 16 * i) * LD + d]; }
#pragma unroll
      for (int j = 0; j < 4; ++j) { qv[j] = Qs[(tx + 16 * j) * LD + d]; gv[j] = Gs[(tx + 16 * j) * LD + d]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) { s[i][j] += qv[j] * kv[i]; dp[i][j] += gv[j] * vv[i]; }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const i64 kg = k0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int qc = tx + 16 * j;
        const i64 qg = q0 + qc;
        bool ok = kg < TK && qg < TQ && (!CAUSAL || kg <= qg);
        float p = ok ? expf(s[i][j] * SCALE - Ls[qc]) : 0.f;
        float f = ok ? drop_factor(seed, step, offb, offh, hg, bh, qg, kg) : 0.f;
        Pt[(ty + 16 * i) * PLD + qc] = p * f;
        St[(ty + 16 * i) * PLD + qc] = p * (dp[i][j] * f - Ds[qc]) * SCALE;
      }
    }
    __syncthreads();
    for (int c = 0; c < BT; ++c) {
      float pv[4], sv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { pv[i] = Pt[(ty + 16 * i) * PLD + c]; sv[i] = St[(ty + 16 * i) * PLD + c]; }
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float gv = Gs[c * LD + tx + 16 * jj], qv = Qs[c * LD + tx + 16 * jj];
#pragma unroll
        for (int i = 0; i < 4; ++i) { dv[i][jj] += pv[i] * gv; dk[i][jj] += sv[i] * qv; }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const i64 kg = k0 + ty + 16 * i;
    if (kg >= TK) continue;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      int d = tx + 16 * jj;
      if (d < HD) {
        q_st(DK, DK_BASE(bh) + kg * DK_ST + d, dk[i][jj]);
        q_st(DV, DV_BASE(bh) + kg * DV_ST + d, dv[i][jj]);
      }
    }
  }
}
)";
    k.block.x = 256;
    k.grid.x = std::max<uint32_t>(1, static_cast<uint32_t>(a.B * a.H) * tilesOf(a.Tk));
    k.sharedBytes = static_cast<uint32_t>((4 * kTile * a.LD + 2 * kTile * (kTile + 1) + 2 * kTile) * 4);
    k.args = {a.dout.arg, a.q.arg,  a.k.arg,   a.v.arg,   a.lse,
              workspaceArg(0), a.dk.arg, a.dv.arg, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dq";
    k.source = head + R"(
extern "C" __global__ void __launch_bounds__(256) tpc_attention_bwd_dq(const q_t* DO, const q_t* Q, const q_t* K,
    const q_t* V, const float* LSE, const float* Di, q_t* DQ, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  float* Qs = smem;           // [BT][LD] this block's queries
  float* Gs = Qs + BT * LD;   // [BT][LD] their dout rows
  float* Ks = Gs + BT * LD;   // [BT][LD] a key tile
  float* Vs = Ks + BT * LD;   // [BT][LD] its values
  float* Ss = Vs + BT * LD;   // [BT queries][PLD] dS (scaled)
  float* Ls = Ss + BT * PLD;  // [BT]
  float* Ds = Ls + BT;        // [BT]
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const i64 ntiles = (TQ + BT - 1) / BT;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BT;
  const i64 step = DROPOUT ? *stepp : 0;
  load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ);
  if (threadIdx.x < BT) {
    i64 g = q0 + threadIdx.x;
    Ls[threadIdx.x] = g < TQ ? LSE[bh * TQ + g] : 0.f;
    Ds[threadIdx.x] = g < TQ ? Di[bh * TQ + g] : 0.f;
  }
  float dq[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) dq[i][jj] = 0.f;
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BT) : (i64)TK;
  for (i64 k0 = 0; k0 < kend; k0 += BT) {
    __syncthreads();
    load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
    load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
    __syncthreads();
    float s[4][4], dp[4][4];  // rows: queries ty + 16 i; columns: keys tx + 16 j
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = dp[i][j] = 0.f;
    for (int d = 0; d < DP; ++d) {
      float qv[4], gv[4], kv[4], vv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { qv[i] = Qs[(ty + 16 * i) * LD + d]; gv[i] = Gs[(ty + 16 * i) * LD + d]; }
#pragma unroll
      for (int j = 0; j < 4; ++j) { kv[j] = Ks[(tx + 16 * j) * LD + d]; vv[j] = Vs[(tx + 16 * j) * LD + d]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) { s[i][j] += qv[i] * kv[j]; dp[i][j] += gv[i] * vv[j]; }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qr = ty + 16 * i;
      const i64 qg = q0 + qr;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const i64 kg = k0 + tx + 16 * j;
        bool ok = kg < TK && qg < TQ && (!CAUSAL || kg <= qg);
        float p = ok ? expf(s[i][j] * SCALE - Ls[qr]) : 0.f;
        float f = ok ? drop_factor(seed, step, offb, offh, hg, bh, qg, kg) : 0.f;
        Ss[qr * PLD + tx + 16 * j] = p * (dp[i][j] * f - Ds[qr]) * SCALE;
      }
    }
    __syncthreads();
    for (int c = 0; c < BT; ++c) {
      float sv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) sv[i] = Ss[(ty + 16 * i) * PLD + c];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float kv = Ks[c * LD + tx + 16 * jj];
#pragma unroll
        for (int i = 0; i < 4; ++i) dq[i][jj] += sv[i] * kv;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const i64 qg = q0 + ty + 16 * i;
    if (qg >= TQ) continue;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      int d = tx + 16 * jj;
      if (d < HD) q_st(DQ, DQ_BASE(bh) + qg * DQ_ST + d, dq[i][jj]);
    }
  }
}
)";
    k.block.x = 256;
    k.grid.x = std::max<uint32_t>(1, static_cast<uint32_t>(a.B * a.H) * tilesOf(a.Tq));
    k.sharedBytes = static_cast<uint32_t>((4 * kTile * a.LD + kTile * (kTile + 1) + 2 * kTile) * 4);
    k.args = {a.dout.arg, a.q.arg, a.k.arg, a.v.arg, a.lse, workspaceArg(0), a.dq.arg, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
    out.kernels.push_back(std::move(k));
  }
  for (const KernelSpec& k : out.kernels)
    if (k.sharedBytes > ctx.maxSharedBytes)
      return makeError("attention_grad: ", k.entry, " needs ", k.sharedBytes, " bytes of shared memory, the GPU has ",
                       ctx.maxSharedBytes);
  return out;
}

}  // namespace tpc::cuda
