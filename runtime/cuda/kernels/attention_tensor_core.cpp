// Flash attention forward and backward on tensor cores for bf16/f16 q, k, v (head_dim a multiple of 16,
// at most 128): mma.sync m16n8k16 with f32 accumulators, an online softmax in registers, lse f32.
// A block of 4 warps owns 64 rows (queries in the forward and dq, keys in dk/dv); each warp owns 16 of
// them and walks the other side in 64-row tiles staged in shared memory (rows padded by 8 halves, so the
// 32-bit fragment loads and ldmatrix row reads hit 32 distinct banks). Scores S = A B^T take A and B
// fragments from row-major tiles; P (or dS) goes from S's accumulator layout straight into A fragments
// (as a hi + lo pair with splitP), and the right-hand matrix of P V (V, dout, q or k) is read transposed with
// ldmatrix.trans.
// Backward (FA2, deterministic, no atomics): Di = rowsum(dout * out); one kernel per key tile accumulates
// dk, dv over the query tiles; one per query tile accumulates dq over the key tiles, both recomputing P
// from lse. Dropout multiplies P by the same Philox mask as attention.cpp (drop_factor, keyed by the
// unsharded [B, H, Tq, Tk] index), so results match the CPU backend. Global rows are read as 16-byte
// vectors: buffers are 256-byte aligned (memory_plan.h) and every row offset and stride (attention_qkv's packed
// layouts too) is a multiple of head_dim elements, head_dim * 2 bytes being a multiple of 32.
// TcAttnOptions (attention.h) picks the variants: asyncCopy stages the walked tiles with cp.async in two
// buffers, the next tile loading while the mma run on this one (one barrier a tile); ldmatrix reads S's
// fragments with ldmatrix.x4 (the forward keeps its Q fragments in registers, dk/dv its K and V at
// head_dim 64). Only the tiles that cross the causal diagonal or the sequence end compute the mask.
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

constexpr int64_t kRows = 64;  // rows per block (4 warps x 16) and rows per tile of the other side

std::string tcHead(const AttnShape& a, DType dt, const TcAttnOptions& o) {
  const bool f16 = dt == DType::f16;
  return attnHead(a, dt) + tensorCorePrelude() +
         cat("#define MMA ", f16 ? "tpc_mma_f16" : "tpc_mma_bf16", "\n#define PACK ",
             f16 ? "tpc_pack_f16" : "tpc_pack_bf16", "\n#define LO16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) & 0xffffu))" : "__uint_as_float((w) << 16)", "\n#define HI16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) >> 16))" : "__uint_as_float((w) & 0xffff0000u)",
             "\n#define SPLIT_P ", o.splitP ? 1 : 0, "\n#define ASYNC ", o.asyncCopy ? 1 : 0, "\n#define LDSM ",
             o.ldmatrix ? 1 : 0, "\n#define BR ", kRows, "\n#define SD (HD + 8)\n") +
         R"(
#define LOG2E 1.4426950408889634f
#define SCALE_LOG2 (SCALE * LOG2E)
#define NDT (HD / 8)
#define STAGES (ASYNC ? 2 : 1)
#define TILE (BR * SD)
// dk/dv keeps its K and V fragments in registers where they fit (HD 128 would spill: ptxas puts the kernel
// at ~250 registers without them).
#define KV_FRAGS (LDSM && HD <= 64)
// Rows [r0, r0 + BR) of a matrix whose row g starts at src + g * st into dst[BR][SD]; rows >= nrows are zero.
// With ASYNC the copies are cp.async: the caller commits them and waits (tile_wait) before a barrier.
__device__ __forceinline__ void tc_load_tile(q_t* dst, const q_t* src, i64 st, i64 r0, i64 nrows) {
  for (int e = threadIdx.x; e < BR * (HD / 8); e += blockDim.x) {
    const int r = e / (HD / 8), c = (e - r * (HD / 8)) * 8;
#if ASYNC
    const bool in = r0 + r < nrows;
    tpc_cp_async16(dst + r * SD + c, in ? src + (r0 + r) * st + c : src, in);
#else
    tpc_u32x4 v = {0u, 0u, 0u, 0u};
    if (r0 + r < nrows) v = *(const tpc_u32x4*)(src + (r0 + r) * st + c);
    *(tpc_u32x4*)(dst + r * SD + c) = v;
#endif
  }
}
__device__ __forceinline__ void tile_commit() {
#if ASYNC
  tpc_cp_async_commit();
#endif
}
__device__ __forceinline__ void tile_wait() {
#if ASYNC
  tpc_cp_async_wait_all();
#endif
}
__device__ __forceinline__ u32 ld32(const q_t* p) { return *(const u32*)p; }
#if LDSM
// The A fragments (one per 16 columns) of the 16 rows at `arows`, by ldmatrix.x4: tiles (rows 0-7, cols
// 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are mma's a[0..3].
__device__ __forceinline__ void load_afrag(u32 (*af)[4], const q_t* arows) {
  const int lane = threadIdx.x & 31;
  const q_t* p = arows + ((lane & 7) + (lane & 8)) * SD + ((lane >> 4) << 3);
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) tpc_ldsm_x4(af[ks], p + 16 * ks);
}
// s[8][4] = A B^T for this warp, A given as fragments (load_afrag), B = the BR rows of `tile`; one ldmatrix.x4
// gives the b fragments of two 8-row groups: tiles (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
__device__ __forceinline__ void mma_abt_frag(float (*s)[4], const u32 (*af)[4], const q_t* tile) {
  const int lane = threadIdx.x & 31;
  const q_t* pb = tile + ((lane & 7) + ((lane >> 4) << 3)) * SD + (lane & 8);
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks)
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
      u32 b[4];
      tpc_ldsm_x4(b, pb + 16 * jp * SD + 16 * ks);
      MMA(s[2 * jp], af[ks], b);
      MMA(s[2 * jp + 1], af[ks], b + 2);
    }
}
#endif
// s[8][4] = A B^T for this warp: A = the 16 rows at `arows`, B = the BR rows of `tile` (both HD wide).
// s[j][e] is row g + 8 (e / 2), column 8 j + 2 t + e % 2 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_abt(float (*s)[4], const q_t* arows, const q_t* tile) {
#if LDSM
  const int lane = threadIdx.x & 31;
  const q_t* pa = arows + ((lane & 7) + (lane & 8)) * SD + ((lane >> 4) << 3);
  const q_t* pb = tile + ((lane & 7) + ((lane >> 4) << 3)) * SD + (lane & 8);
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    u32 a[4];
    tpc_ldsm_x4(a, pa + 16 * ks);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
      u32 b[4];
      tpc_ldsm_x4(b, pb + 16 * jp * SD + 16 * ks);
      MMA(s[2 * jp], a, b);
      MMA(s[2 * jp + 1], a, b + 2);
    }
  }
#else
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
#endif
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
int stages(const TcAttnOptions& o) { return o.asyncCopy ? 2 : 1; }

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
  return lowerAttentionTensorCore(n, ctx, TcAttnOptions{});
}
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx) {
  return lowerAttentionGradTensorCore(n, ctx, TcAttnOptions{});
}

Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& opt) {
  DType dt = n.operand(0)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  KernelSpec k;
  k.entry = "tpc_attention_fwd_tc";
  k.source = tcHead(a, dt, opt) + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_fwd_tc(const q_t* Q, const q_t* K, const q_t* V,
                                                                        q_t* O, float* LSE, u64 seed, const i64* stepp) {
  extern __shared__ float smem[];
  q_t* Qs = (q_t*)smem;         // [BR][SD] this block's queries
  q_t* Ks = Qs + TILE;          // [STAGES][BR][SD] key tiles
  q_t* Vs = Ks + STAGES * TILE;  // [STAGES][BR][SD] their values
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 ntiles = (TQ + BR - 1) / BR;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BR;  // the longest causal rows first
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BR) : (i64)TK;
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  tc_load_tile(Ks, K + K_BASE(bh), K_ST, 0, TK);
  tc_load_tile(Vs, V + V_BASE(bh), V_ST, 0, TK);
  tile_commit();
  tile_wait();
  __syncthreads();
  const q_t* Qw = Qs + 16 * warp * SD;
#if LDSM
  u32 qf[HD / 16][4];
  load_afrag(qf, Qw);
#endif
  float acc[NDT][4], m[2] = {-TPC_INF, -TPC_INF}, l[2] = {0.f, 0.f};  // m: running max of scale log2(e) s
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
  for (i64 k0 = 0, it = 0; k0 < kend; k0 += BR, ++it) {
    const int cur = (int)(it % STAGES);
    if (it > 0) {
      tile_wait();
      __syncthreads();  // tile k0 landed; every warp is done with tile k0 - BR
    }
#if ASYNC
    if (k0 + BR < kend) {
      tc_load_tile(Ks + (cur ^ 1) * TILE, K + K_BASE(bh), K_ST, k0 + BR, TK);
      tc_load_tile(Vs + (cur ^ 1) * TILE, V + V_BASE(bh), V_ST, k0 + BR, TK);
      tile_commit();
    }
#endif
    const q_t* Kc = Ks + cur * TILE;
    const q_t* Vc = Vs + cur * TILE;
    float s[8][4];
#if LDSM
    mma_abt_frag(s, qf, Kc);
#else
    mma_abt(s, Qw, Kc);
#endif
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= SCALE_LOG2;
    if (k0 + BR > TK || (CAUSAL && k0 + BR - 1 > q0))  // the tile crosses the sequence end or the diagonal
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const i64 kj = k0 + 8 * j + 2 * t + (e & 1);
          if (!(kj < TK && (!CAUSAL || kj <= row[e >> 1]))) s[j][e] = -TPC_INF;
        }
    float mx[2] = {-TPC_INF, -TPC_INF};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
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
    mma_pv(acc, s, Vc);
#if !ASYNC
    if (k0 + BR < kend) {
      __syncthreads();  // every warp is done with tile k0
      tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0 + BR, TK);
      tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0 + BR, TK);
    }
#endif
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
  k.sharedBytes = tileBytes(a, 1 + 2 * stages(opt));
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
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& opt) {
  DType dt = n.operand(1)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  const std::string head = tcHead(a, dt, opt);
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
  q_t* Ks = (q_t*)smem;                      // [BR][SD] this block's keys
  q_t* Vs = Ks + TILE;                       // [BR][SD] their values
  q_t* Qs = Vs + TILE;                       // [STAGES][BR][SD] query tiles
  q_t* Gs = Qs + STAGES * TILE;              // [STAGES][BR][SD] their dout rows
  float* Ls = (float*)(Gs + STAGES * TILE);  // [STAGES][BR] log2(e) lse of the query tile
  float* Ds = Ls + STAGES * BR;              // [STAGES][BR] Di of the query tile
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 nkt = (TK + BR - 1) / BR;
  const i64 bh = blockIdx.x / nkt;
  if (bh >= BH) return;
  const i64 k0 = (i64)(blockIdx.x % nkt) * BR;
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  const i64 qbegin = CAUSAL ? k0 / BR * BR : 0;
  tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK);
  tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK);
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, qbegin, TQ);
  tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, qbegin, TQ);
  tile_commit();
  float nl = 0.f, nd = 0.f;  // lse and Di of query row q0 + threadIdx.x (threads < BR), the tile to stage next
  if (threadIdx.x < BR && qbegin + threadIdx.x < TQ) {
    nl = LSE[bh * TQ + qbegin + threadIdx.x] * LOG2E;
    nd = Di[bh * TQ + qbegin + threadIdx.x];
  }
  if (threadIdx.x < BR) {
    Ls[threadIdx.x] = nl;
    Ds[threadIdx.x] = nd;
  }
  const q_t* Kw = Ks + 16 * warp * SD;
  const q_t* Vw = Vs + 16 * warp * SD;
#if KV_FRAGS
  tile_wait();
  __syncthreads();
  u32 kf[HD / 16][4], vf[HD / 16][4];  // this warp's keys and values as A fragments for the whole walk
  load_afrag(kf, Kw);
  load_afrag(vf, Vw);
#endif
  float dk[NDT][4], dv[NDT][4];
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[jj][e] = dv[jj][e] = 0.f;
  for (i64 q0 = qbegin, it = 0; q0 < TQ; q0 += BR, ++it) {
    const int cur = (int)(it % STAGES);
    tile_wait();
    __syncthreads();  // tile q0 landed; every warp is done with tile q0 - BR
    const bool more = q0 + BR < TQ;
#if ASYNC
    if (more) {
      tc_load_tile(Qs + (cur ^ 1) * TILE, Q + Q_BASE(bh), Q_ST, q0 + BR, TQ);
      tc_load_tile(Gs + (cur ^ 1) * TILE, DO + DO_BASE(bh), DO_ST, q0 + BR, TQ);
      tile_commit();
    }
#endif
    const i64 qn = q0 + BR + threadIdx.x;  // loaded now, stored after this tile's mma
    if (more && threadIdx.x < BR) {
      nl = qn < TQ ? LSE[bh * TQ + qn] * LOG2E : 0.f;
      nd = qn < TQ ? Di[bh * TQ + qn] : 0.f;
    }
    const q_t* Qc = Qs + cur * TILE;
    const q_t* Gc = Gs + cur * TILE;
    const float* Lc = Ls + cur * BR;
    const float* Dc = Ds + cur * BR;
    float pt[8][4], dst[8][4];  // rows: this warp's keys; columns: the tile's queries
#if KV_FRAGS
    mma_abt_frag(pt, kf, Qc);
    mma_abt_frag(dst, vf, Gc);
#else
    mma_abt(pt, Kw, Qc);
    mma_abt(dst, Vw, Gc);
#endif
    if (q0 + BR > TQ || k0 + BR > TK || (CAUSAL && k0 + BR - 1 > q0))  // crosses a sequence end or the diagonal
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const i64 qg = q0 + 8 * j + 2 * t + (e & 1), kg = key[e >> 1];
          if (!(kg < TK && qg < TQ && (!CAUSAL || kg <= qg))) pt[j][e] = -TPC_INF;
        }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = 8 * j + 2 * t + (e & 1);
        const float p = exp2f(pt[j][e] * SCALE_LOG2 - Lc[qc]);  // 0 where masked
        const float f = (DROPOUT && p != 0.f) ? drop_factor(seed, step, bh, q0 + qc, key[e >> 1]) : 1.f;
        pt[j][e] = p * f;
        dst[j][e] = p * (dst[j][e] * f - Dc[qc]) * SCALE;
      }
    mma_pv(dv, pt, Gc);
    mma_pv(dk, dst, Qc);
#if !ASYNC
    if (more) {
      __syncthreads();  // every warp is done with tile q0
      tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0 + BR, TQ);
      tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0 + BR, TQ);
    }
#endif
    if (more && threadIdx.x < BR) {
      Ls[(STAGES - 1 - cur) * BR + threadIdx.x] = nl;
      Ds[(STAGES - 1 - cur) * BR + threadIdx.x] = nd;
    }
  }
  const float one[2] = {1.f, 1.f};
  store_rows(DK + DK_BASE(bh), DK_ST, key, TK, dk, one);
  store_rows(DV + DV_BASE(bh), DV_ST, key, TK, dv, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tk);
    k.sharedBytes = tileBytes(a, 2 + 2 * stages(opt)) + 2 * stages(opt) * kRows * 4;
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
  q_t* Qs = (q_t*)smem;         // [BR][SD] this block's queries
  q_t* Gs = Qs + TILE;          // [BR][SD] their dout rows
  q_t* Ks = Gs + TILE;          // [STAGES][BR][SD] key tiles
  q_t* Vs = Ks + STAGES * TILE;  // [STAGES][BR][SD] their values
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 ntiles = (TQ + BR - 1) / BR;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BR;
  const i64 step = DROPOUT ? *stepp : 0;
  const i64 row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  const i64 kend = CAUSAL ? min((i64)TK, q0 + BR) : (i64)TK;
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ);
  tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ);
  tc_load_tile(Ks, K + K_BASE(bh), K_ST, 0, TK);
  tc_load_tile(Vs, V + V_BASE(bh), V_ST, 0, TK);
  tile_commit();
  float lse[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lse[h] = row[h] < TQ ? LSE[bh * TQ + row[h]] * LOG2E : 0.f;
    dd[h] = row[h] < TQ ? Di[bh * TQ + row[h]] : 0.f;
  }
  const q_t* Qw = Qs + 16 * warp * SD;
  const q_t* Gw = Gs + 16 * warp * SD;
  float dq[NDT][4];
#pragma unroll
  for (int jj = 0; jj < NDT; ++jj) dq[jj][0] = dq[jj][1] = dq[jj][2] = dq[jj][3] = 0.f;
  for (i64 k0 = 0, it = 0; k0 < kend; k0 += BR, ++it) {
    const int cur = (int)(it % STAGES);
    tile_wait();
    __syncthreads();  // tile k0 landed; every warp is done with tile k0 - BR
#if ASYNC
    if (k0 + BR < kend) {
      tc_load_tile(Ks + (cur ^ 1) * TILE, K + K_BASE(bh), K_ST, k0 + BR, TK);
      tc_load_tile(Vs + (cur ^ 1) * TILE, V + V_BASE(bh), V_ST, k0 + BR, TK);
      tile_commit();
    }
#endif
    const q_t* Kc = Ks + cur * TILE;
    const q_t* Vc = Vs + cur * TILE;
    float s[8][4], dp[8][4];
    mma_abt(s, Qw, Kc);
    mma_abt(dp, Gw, Vc);
    if (q0 + BR > TQ || k0 + BR > TK || (CAUSAL && k0 + BR - 1 > q0))  // crosses a sequence end or the diagonal
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const i64 kj = k0 + 8 * j + 2 * t + (e & 1), qi = row[e >> 1];
          if (!(kj < TK && qi < TQ && (!CAUSAL || kj <= qi))) s[j][e] = -TPC_INF;
        }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[j][e] * SCALE_LOG2 - lse[e >> 1]);  // 0 where masked
        const float f = (DROPOUT && p != 0.f) ? drop_factor(seed, step, bh, row[e >> 1], k0 + 8 * j + 2 * t + (e & 1)) : 1.f;
        s[j][e] = p * (dp[j][e] * f - dd[e >> 1]) * SCALE;
      }
    mma_pv(dq, s, Kc);
#if !ASYNC
    if (k0 + BR < kend) {
      __syncthreads();  // every warp is done with tile k0
      tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0 + BR, TK);
      tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0 + BR, TK);
    }
#endif
  }
  const float one[2] = {1.f, 1.f};
  store_rows(DQ + DQ_BASE(bh), DQ_ST, row, TQ, dq, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tq);
    k.sharedBytes = tileBytes(a, 2 + 2 * stages(opt));
    k.args = {a.dout.arg, a.q.arg, a.k.arg, a.v.arg, a.lse, workspaceArg(0), a.dq.arg, seedArg(), stepArg()};
    out.kernels.push_back(std::move(k));
  }
  TPC_TRY(checkShared("attention_grad", out, ctx));
  return out;
}

}  // namespace tpc::cuda
