// Flash attention forward and backward on tensor cores for bf16/f16 q, k, v (head_dim a multiple of 16,
// at most 128): mma.sync m16n8k16 with f32 accumulators, an online softmax in registers, lse f32.
// A block of 4 warps owns 64 rows (queries in the forward and dq, keys in dk/dv); each warp owns 16 of
// them and walks the other side in 64-row tiles staged in shared memory (rows padded by 8 halves, so the
// 32-bit fragment loads and ldmatrix row reads hit 32 distinct banks). Scores S = A B^T take A and B
// fragments from row-major tiles; P (or dS) goes from S's accumulator layout straight into A fragments
// (as a hi + lo pair, kSplitP), and the right-hand matrix of P V (V, dout, q or k) is read transposed with
// ldmatrix.trans.
// Backward (FA2, deterministic, no atomics): Di = rowsum(dout * out); one kernel per key tile accumulates
// dk, dv over the query tiles; one per query tile accumulates dq over the key tiles, both recomputing P
// from lse. Dropout multiplies P by the same Philox mask as attention.cpp (drop_factor, keyed by the
// unsharded [B, H, Tq, Tk] index), so results match the CPU backend. Global rows are read as 16-byte
// vectors: buffers are 256-byte aligned (memory_plan.h) and every row offset and stride (attention_qkv's packed
// layouts too) is a multiple of head_dim elements, head_dim * 2 bytes being a multiple of 32.
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

constexpr int64_t kRows = 64;  // rows per block (4 warps x 16) and rows per tile of the other side
// P (and dS) enter the P V style products as a 16-bit hi part plus a 16-bit residual, two mma each: the
// products then carry ~16 mantissa bits of P like the f32 kernels, not bf16's 8. Without the split
// (FlashAttention-2's numerics, fewer mma) the gradients of the 77-token D128 case are ~1.4e-2 off the
// CPU backend under the emulator (bf16 P rounding of the large early-row probabilities), over the 1e-2
// of the kernel tests.
// (tpc_gpu_tests "[.bench]" times both.)
constexpr bool kSplitP = true;

std::string tcHead(const AttnShape& a, DType dt, bool splitP) {
  const bool f16 = dt == DType::f16;
  return attnHead(a, dt) + tensorCorePrelude() +
         cat("#define MMA ", f16 ? "tpc_mma_f16" : "tpc_mma_bf16", "\n#define PACK ",
             f16 ? "tpc_pack_f16" : "tpc_pack_bf16", "\n#define LO16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) & 0xffffu))" : "__uint_as_float((w) << 16)", "\n#define HI16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) >> 16))" : "__uint_as_float((w) & 0xffff0000u)",
             "\n#define SPLIT_P ", splitP ? 1 : 0, "\n#define BR ", kRows, "\n#define SD (HD + 8)\n") +
         R"(
#define LOG2E 1.4426950408889634f
#define SCALE_LOG2 (SCALE * LOG2E)
#define NDT (HD / 8)
// Rows [r0, r0 + BR) of a matrix whose row g starts at src + g * st into dst[BR][SD]; rows >= nrows are zero.
__device__ __forceinline__ void tc_load_tile(q_t* dst, const q_t* src, i64 st, i64 r0, i64 nrows) {
  for (int e = threadIdx.x; e < BR * (HD / 8); e += blockDim.x) {
    const int r = e / (HD / 8), c = (e - r * (HD / 8)) * 8;
    tpc_u32x4 v = {0u, 0u, 0u, 0u};
    if (r0 + r < nrows) v = *(const tpc_u32x4*)(src + (r0 + r) * st + c);
    *(tpc_u32x4*)(dst + r * SD + c) = v;
  }
}
__device__ __forceinline__ u32 ld32(const q_t* p) { return *(const u32*)p; }
// s[8][4] = A B^T for this warp: A = the 16 rows at `arows`, B = the BR rows of `tile` (both HD wide).
// s[j][e] is row g + 8 (e / 2), column 8 j + 2 t + e % 2 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_abt(float (*s)[4], const q_t* arows, const q_t* tile) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    const q_t* pa = arows + g * SD + ks * 16 + 2 * t;
    const u32 a[4] = {ld32(pa), ld32(pa + 8 * SD), ld32(pa + 8), ld32(pa + 8 * SD + 8)};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const q_t* pb = tile + (8 * j + g) * SD + ks * 16 + 2 * t;
      const u32 b[2] = {ld32(pb), ld32(pb + 8)};
      MMA(s[j], a, b);
    }
  }
}
// acc[NDT][4] += P M for this warp: P given in s's layout (16 x BR, f32), M = the BR rows of `tile` (HD
// wide), read transposed by ldmatrix. With SPLIT_P, P = hi + lo (both 16-bit) and both are multiplied.
__device__ __forceinline__ void mma_pv(float (*acc)[4], float (*p)[4], const q_t* tile) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const u32 a[4] = {PACK(p[2 * kk][0], p[2 * kk][1]), PACK(p[2 * kk][2], p[2 * kk][3]),
                      PACK(p[2 * kk + 1][0], p[2 * kk + 1][1]), PACK(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#if SPLIT_P
    const u32 lo[4] = {PACK(p[2 * kk][0] - LO16(a[0]), p[2 * kk][1] - HI16(a[0])),
                       PACK(p[2 * kk][2] - LO16(a[1]), p[2 * kk][3] - HI16(a[1])),
                       PACK(p[2 * kk + 1][0] - LO16(a[2]), p[2 * kk + 1][1] - HI16(a[2])),
                       PACK(p[2 * kk + 1][2] - LO16(a[3]), p[2 * kk + 1][3] - HI16(a[3]))};
#endif
    const q_t* row = tile + (16 * kk + (lane & 7) + (lane & 8)) * SD + ((lane >> 4) << 3);
#pragma unroll
    for (int dd = 0; dd < HD / 16; ++dd) {
      u32 b[4];
      tpc_ldsm_x4_trans(b, row + 16 * dd);
      MMA(acc[2 * dd], a, b);
      MMA(acc[2 * dd + 1], a, b + 2);
#if SPLIT_P
      MMA(acc[2 * dd], lo, b);
      MMA(acc[2 * dd + 1], lo, b + 2);
#endif
    }
  }
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// Rows row[0], row[1] (row g at out + g * st) from acc in mma_pv's layout, times scale[h].
__device__ __forceinline__ void store_rows(q_t* out, i64 st, const i64* row, i64 nrows, float (*acc)[4],
                                           const float* scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= nrows) continue;
    u32* o = (u32*)(out + row[h] * st + 2 * t);
#pragma unroll
    for (int jj = 0; jj < NDT; ++jj) o[4 * jj] = PACK(acc[jj][2 * h] * scale[h], acc[jj][2 * h + 1] * scale[h]);
  }
}
)";
}

uint32_t blocksFor(const AttnShape& a, int64_t t) {
  return std::max<uint32_t>(1, static_cast<uint32_t>(a.B * a.H * ((t + kRows - 1) / kRows)));
}
uint32_t tileBytes(const AttnShape& a, int tiles) { return static_cast<uint32_t>(tiles * kRows * (a.D + 8) * 2); }

Status checkShared(const char* op, const NodeLowering& out, const LoweringContext& ctx) {
  for (const KernelSpec& k : out.kernels)
    if (k.sharedBytes > ctx.maxSharedBytes)
      return makeError(op, ": ", k.entry, " needs ", k.sharedBytes, " bytes of shared memory, the GPU has ",
                       ctx.maxSharedBytes);
  return {};
}

}  // namespace

bool tensorCoreAttention(DType dt, const AttnShape& a) {
  return (dt == DType::bf16 || dt == DType::f16) && a.D % 16 == 0 && a.D <= 128;
}

Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx) {
  return lowerAttentionTensorCore(n, ctx, kSplitP);
}
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx) {
  return lowerAttentionGradTensorCore(n, ctx, kSplitP);
}

Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx, bool splitP) {
  DType dt = n.operand(0)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  KernelSpec k;
  k.entry = "tpc_attention_fwd_tc";
  k.source = tcHead(a, dt, splitP) + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_fwd_tc(const q_t* Q, const q_t* K, const q_t* V,
                                                                        q_t* O, float* LSE, u64 seed, const i64* stepp) {
  extern __shared__ float smem[];
  q_t* Qs = (q_t*)smem;   // [BR][SD] this block's queries
  q_t* Ks = Qs + BR * SD;  // [BR][SD] a key tile
  q_t* Vs = Ks + BR * SD;  // [BR][SD] its values
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 ntiles = (TQ + BR - 1) / BR;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BR;  // the longest causal rows first
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  const q_t* Qw = Qs + 16 * warp * SD;
  float acc[NDT][4], m[2] = {-TPC_INF, -TPC_INF}, l[2] = {0.f, 0.f};  // m: running max of scale log2(e) s
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BR) : (i64)TK;
  for (i64 k0 = 0; k0 < kend; k0 += BR) {
    __syncthreads();
    tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
    tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
    __syncthreads();
    float s[8][4];
    mma_abt(s, Qw, Ks);
    float mx[2] = {-TPC_INF, -TPC_INF};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 kj = k0 + 8 * j + 2 * t + (e & 1);
        const bool ok = kj < TK && (!CAUSAL || kj <= row[e >> 1]);
        s[j][e] = ok ? s[j][e] * SCALE_LOG2 : -TPC_INF;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
      }
    float base[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mn = fmaxf(m[h], quad_max(mx[h]));
      base[h] = mn == -TPC_INF ? 0.f : mn;  // a row with no key yet: exp2 of -inf gives 0, never NaN
      const float alpha = exp2f(m[h] - base[h]);
      l[h] *= alpha;
      m[h] = mn;
#pragma unroll
      for (int jj = 0; jj < NDT; ++jj) {
        acc[jj][2 * h] *= alpha;
        acc[jj][2 * h + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[j][e] - base[e >> 1]);
        rs[e >> 1] += p;  // the softmax sums undropped probabilities
        s[j][e] = (DROPOUT && p != 0.f) ? p * drop_factor(seed, step, bh, row[e >> 1], k0 + 8 * j + 2 * t + (e & 1)) : p;
      }
    l[0] += quad_sum(rs[0]);
    l[1] += quad_sum(rs[1]);
    mma_pv(acc, s, Vs);
  }
  const float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
  store_rows(O + O_BASE(bh), O_ST, row, TQ, acc, inv);
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (t == 0 && row[h] < TQ) LSE[bh * TQ + row[h]] = l[h] > 0.f ? (m[h] + log2f(l[h])) * (1.f / LOG2E) : -TPC_INF;
}
)";
  k.block.x = 128;
  k.grid.x = blocksFor(a, a.Tq);
  k.sharedBytes = tileBytes(a, 3);
  k.args = {a.q.arg, a.k.arg, a.v.arg, a.o.arg, a.lse, seedArg(), stepArg()};
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  TPC_TRY(checkShared("attention", out, ctx));
  return out;
}

// Kernel 1: Di = rowsum(dout * out). Kernel 2 (a block per key tile, a warp per 16 keys): dv += (P * mask)^T
// dout and dk += dS^T q over the query tiles, with S^T = k q^T and dP^T = v dout^T computed transposed so
// that P^T and dS^T are already A fragments. Kernel 3 (a block per query tile): dq += dS k over the key
// tiles. dS = P * (dP * mask - Di) * scale, P = exp(scale q k^T - lse).
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx, bool splitP) {
  DType dt = n.operand(1)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  const std::string head = tcHead(a, dt, splitP);
  NodeLowering out;
  out.workspaceBytes = std::max<int64_t>(a.B * a.H * a.Tq, 1) * 4;
  out.kernels.push_back(attnDiKernel(a, head));
  {
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dkdv_tc";
    k.source = head + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_bwd_dkdv_tc(const q_t* DO, const q_t* Q,
    const q_t* K, const q_t* V, const float* LSE, const float* Di, q_t* DK, q_t* DV, u64 seed, const i64* stepp) {
  extern __shared__ float smem[];
  q_t* Ks = (q_t*)smem;             // [BR][SD] this block's keys
  q_t* Vs = Ks + BR * SD;           // [BR][SD] their values
  q_t* Qs = Vs + BR * SD;           // [BR][SD] a query tile
  q_t* Gs = Qs + BR * SD;           // [BR][SD] its dout rows
  float* Ls = (float*)(Gs + BR * SD);  // [BR] log2(e) lse of the query tile
  float* Ds = Ls + BR;                 // [BR] Di of the query tile
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 nkt = (TK + BR - 1) / BR;
  const i64 bh = blockIdx.x / nkt;
  if (bh >= BH) return;
  const i64 k0 = (i64)(blockIdx.x % nkt) * BR;
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
  tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
  const q_t* Kw = Ks + 16 * warp * SD;
  const q_t* Vw = Vs + 16 * warp * SD;
  float dk[NDT][4], dv[NDT][4];
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[jj][e] = dv[jj][e] = 0.f;
  for (i64 q0 = CAUSAL ? k0 / BR * BR : 0; q0 < TQ; q0 += BR) {
    __syncthreads();
    tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
    tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ);
    if (threadIdx.x < BR) {
      const i64 qg = q0 + threadIdx.x;
      Ls[threadIdx.x] = qg < TQ ? LSE[bh * TQ + qg] * LOG2E : 0.f;
      Ds[threadIdx.x] = qg < TQ ? Di[bh * TQ + qg] : 0.f;
    }
    __syncthreads();
    float pt[8][4], dst[8][4];  // rows: this warp's keys; columns: the tile's queries
    mma_abt(pt, Kw, Qs);
    mma_abt(dst, Vw, Gs);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = 8 * j + 2 * t + (e & 1);
        const i64 qg = q0 + qc, kg = key[e >> 1];
        const bool ok = kg < TK && qg < TQ && (!CAUSAL || kg <= qg);
        const float p = ok ? exp2f(pt[j][e] * SCALE_LOG2 - Ls[qc]) : 0.f;
        const float f = (DROPOUT && ok) ? drop_factor(seed, step, bh, qg, kg) : 1.f;
        pt[j][e] = p * f;
        dst[j][e] = p * (dst[j][e] * f - Ds[qc]) * SCALE;
      }
    mma_pv(dv, pt, Gs);
    mma_pv(dk, dst, Qs);
  }
  const float one[2] = {1.f, 1.f};
  store_rows(DK + DK_BASE(bh), DK_ST, key, TK, dk, one);
  store_rows(DV + DV_BASE(bh), DV_ST, key, TK, dv, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tk);
    k.sharedBytes = tileBytes(a, 4) + 2 * kRows * 4;
    k.args = {a.dout.arg, a.q.arg,  a.k.arg,   a.v.arg,   a.lse,
              workspaceArg(0), a.dk.arg, a.dv.arg, seedArg(), stepArg()};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dq_tc";
    k.source = head + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_bwd_dq_tc(const q_t* DO, const q_t* Q,
    const q_t* K, const q_t* V, const float* LSE, const float* Di, q_t* DQ, u64 seed, const i64* stepp) {
  extern __shared__ float smem[];
  q_t* Qs = (q_t*)smem;   // [BR][SD] this block's queries
  q_t* Gs = Qs + BR * SD;  // [BR][SD] their dout rows
  q_t* Ks = Gs + BR * SD;  // [BR][SD] a key tile
  q_t* Vs = Ks + BR * SD;  // [BR][SD] its values
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 ntiles = (TQ + BR - 1) / BR;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BR;
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  float lse[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lse[h] = row[h] < TQ ? LSE[bh * TQ + row[h]] * LOG2E : 0.f;
    dd[h] = row[h] < TQ ? Di[bh * TQ + row[h]] : 0.f;
  }
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ);
  const q_t* Qw = Qs + 16 * warp * SD;
  const q_t* Gw = Gs + 16 * warp * SD;
  float dq[NDT][4];
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj) dq[jj][0] = dq[jj][1] = dq[jj][2] = dq[jj][3] = 0.f;
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BR) : (i64)TK;
  for (i64 k0 = 0; k0 < kend; k0 += BR) {
    __syncthreads();
    tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
    tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
    __syncthreads();
    float s[8][4], dp[8][4];
    mma_abt(s, Qw, Ks);
    mma_abt(dp, Gw, Vs);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 kj = k0 + 8 * j + 2 * t + (e & 1), qi = row[e >> 1];
        const bool ok = kj < TK && qi < TQ && (!CAUSAL || kj <= qi);
        const float p = ok ? exp2f(s[j][e] * SCALE_LOG2 - lse[e >> 1]) : 0.f;
        const float f = (DROPOUT && ok) ? drop_factor(seed, step, bh, qi, kj) : 1.f;
        s[j][e] = p * (dp[j][e] * f - dd[e >> 1]) * SCALE;
      }
    mma_pv(dq, s, Ks);
  }
  const float one[2] = {1.f, 1.f};
  store_rows(DQ + DQ_BASE(bh), DQ_ST, row, TQ, dq, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tq);
    k.sharedBytes = tileBytes(a, 4);
    k.args = {a.dout.arg, a.q.arg, a.k.arg, a.v.arg, a.lse, workspaceArg(0), a.dq.arg, seedArg(), stepArg()};
    out.kernels.push_back(std::move(k));
  }
  TPC_TRY(checkShared("attention_grad", out, ctx));
  return out;
}

}  // namespace tpc::cuda
