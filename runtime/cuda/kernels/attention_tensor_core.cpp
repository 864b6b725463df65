// Flash attention forward and backward on tensor cores for bf16/f16 q, k, v (head_dim a multiple of 16,
// at most 128): mma.sync m16n8k16 with f32 accumulators, an online softmax in registers, lse f32.
// A block of 4 warps owns BM = 64 RG rows (queries in the forward and dq, keys in dk/dv); each warp owns RG
// groups of 16 of them (RG 2 with TcAttnOptions::wideWarps, and wideBackward for dq and dk/dv, so that each fragment of the other side read from
// shared memory feeds two mma) and walks the other side in BN-row tiles staged in shared memory (rows padded
// by 8 halves, so the 32-bit fragment loads and ldmatrix row reads hit 32 distinct banks). Scores S = A B^T
// take A and B fragments from row-major tiles; P (or dS) goes from S's accumulator layout straight into A
// fragments (as a hi + lo pair with splitP), and the right-hand matrix of P V (V, dout, q or k) is read
// transposed with ldmatrix.trans. The tile walk (Walk, walk_top, walk_bottom), the products and the edge
// masks are shared by the three kernels.
// Backward (FA2, deterministic, no atomics): Di = rowsum(dout * out); one kernel per key block accumulates
// dk, dv over the query tiles; one per query block accumulates dq over the key tiles, both recomputing P
// from lse. Dropout multiplies P by the same Philox mask as attention.cpp (drop_factor, keyed by the
// unsharded [B, H, Tq, Tk] index), so results match the CPU backend. Global rows are read as 16-byte
// vectors: buffers are 256-byte aligned (memory_plan.h) and every row offset and stride (attention_qkv's packed
// layouts too) is a multiple of head_dim elements, head_dim * 2 bytes being a multiple of 32.
// TcAttnOptions (attention.h) picks the variants: asyncCopy stages the walked tiles with cp.async in two
// buffers, the next tile loading while the mma run on this one (one barrier a tile); ldmatrix reads S's
// fragments with ldmatrix.x4 (A fragments stay in registers where they fit: TcTiling). Only the tiles that
// cross the causal diagonal or the sequence end compute the mask; a warp whose rows are all masked in a tile
// skips it.
#include <cstdlib>

#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

// One kernel's tiling: RG groups of 16 rows per warp (a block of 4 warps owns BM = 64 RG rows), BN rows per
// walked tile, and whether each warp keeps its own rows' A fragments in registers for the whole walk.
struct TcTiling {
  int rg = 1, bn = 64;
  bool frags = false;
};

std::string tcHead(const AttnShape& a, DType dt, const TcAttnOptions& o, const TcTiling& t) {
  const bool f16 = dt == DType::f16;
  return attnHead(a, dt) + tensorCorePrelude() +
         cat("#define MMA ", f16 ? "tpc_mma_f16" : "tpc_mma_bf16", "\n#define PACK ",
             f16 ? "tpc_pack_f16" : "tpc_pack_bf16", "\n#define LO16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) & 0xffffu))" : "__uint_as_float((w) << 16)", "\n#define HI16(w) ",
             f16 ? "tpc_f16_to_f32((f16_t)((w) >> 16))" : "__uint_as_float((w) & 0xffff0000u)",
             "\n#define SPLIT_P ", o.splitP ? 1 : 0, "\n#define ASYNC ", o.asyncCopy ? 1 : 0, "\n#define LDSM ",
             o.ldmatrix ? 1 : 0, "\n#define FUSED_SCALE ", o.fusedScale && a.scale > 0 ? 1 : 0, "\n#define LAZY_RESCALE ", o.lazyRescale ? 1 : 0, "\n#define RG ", t.rg,
             "\n#define BN ", t.bn, "\n#define A_FRAGS ", t.frags ? 1 : 0, "\n") +
         R"(
#define LOG2E 1.4426950408889634f
#define SCALE_LOG2 (SCALE * LOG2E)
#define BM (64 * RG)        // rows a block owns
#define NR (2 * RG)         // rows a thread owns: row[2 r + h] = warp's first + 16 r + g + 8 h
#define NJ (BN / 8)         // n8 column blocks of a score tile
#define NKS (HD / 16)       // k16 steps over head_dim
#define NDT (HD / 8)        // n8 column blocks of an accumulator
#define SD (HD + 8)         // shared row stride in elements
#define STAGES (ASYNC ? 2 : 1)
#define WALK (BN * SD)      // one walked tile
// Rows [r0, r0 + rows) of a matrix whose row g starts at src + g * st into dst[rows][SD]; rows >= nrows are
// zero. With ASYNC the copies are cp.async: the caller commits them and waits (tile_wait) before a barrier.
__device__ __forceinline__ void tc_load_tile(q_t* dst, const q_t* src, i64 st, i64 r0, i64 nrows, int rows) {
  for (int e = threadIdx.x; e < rows * (HD / 8); e += blockDim.x) {
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
// The walk over the other side in BN-row tiles of two matrices (K and V, or q and dout) with nrows rows,
// staged in [STAGES][BN][SD] buffers as and bs; tiles start below `end`.
struct Walk {
  q_t *as, *bs;
  const q_t *a, *b;
  i64 ast, bst, nrows, end;
};
__device__ __forceinline__ void walk_load(const Walk& w, int buf, i64 r0) {
  tc_load_tile(w.as + buf * WALK, w.a, w.ast, r0, w.nrows, BN);
  tc_load_tile(w.bs + buf * WALK, w.b, w.bst, r0, w.nrows, BN);
  tile_commit();
}
// Top of step `it` (tile r0): waits for the tile, then with ASYNC starts the next one into the other buffer.
// Returns the buffer holding tile r0.
__device__ __forceinline__ int walk_top(const Walk& w, i64 it, i64 r0) {
  const int cur = (int)(it % STAGES);
  tile_wait();
  __syncthreads();  // tile r0 landed; every warp is done with the tile before
#if ASYNC
  if (r0 + BN < w.end) walk_load(w, cur ^ 1, r0 + BN);
#endif
  return cur;
}
// Bottom of the step: without ASYNC the next tile goes into the one buffer once every warp is done with it.
__device__ __forceinline__ void walk_bottom(const Walk& w, i64 r0) {
#if !ASYNC
  if (r0 + BN < w.end) {
    __syncthreads();
    walk_load(w, 0, r0 + BN);
  }
#endif
}
__device__ __forceinline__ void own_rows(i64* row, i64 w0) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int i = 0; i < NR; ++i) row[i] = w0 + 16 * (i >> 1) + g + 8 * (i & 1);
}
__device__ __forceinline__ u32 ld32(const q_t* p) { return *(const u32*)p; }
// The A fragment of the 16 rows at `arows`, columns [16 ks, 16 ks + 16): a[0..3] = (rows 0-7, cols 0-7),
// (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); one ldmatrix.x4 or four 32-bit loads.
__device__ __forceinline__ void load_a(u32* a, const q_t* arows, int ks) {
  const int lane = threadIdx.x & 31;
#if LDSM
  tpc_ldsm_x4(a, arows + ((lane & 7) + (lane & 8)) * SD + ((lane >> 4) << 3) + 16 * ks);
#else
  const q_t* p = arows + (lane >> 2) * SD + 16 * ks + 2 * (lane & 3);
  a[0] = ld32(p), a[1] = ld32(p + 8 * SD), a[2] = ld32(p + 8), a[3] = ld32(p + 8 * SD + 8);
#endif
}
// The B fragments of rows [16 jp, 16 jp + 16) of `tile`, columns [16 ks, 16 ks + 16): b[0..1] for its rows
// 0-7, b[2..3] for rows 8-15.
__device__ __forceinline__ void load_b(u32* b, const q_t* tile, int jp, int ks) {
  const int lane = threadIdx.x & 31;
#if LDSM
  tpc_ldsm_x4(b, tile + (16 * jp + (lane & 7) + ((lane >> 4) << 3)) * SD + (lane & 8) + 16 * ks);
#else
  const q_t* p = tile + (16 * jp + (lane >> 2)) * SD + 16 * ks + 2 * (lane & 3);
  b[0] = ld32(p), b[1] = ld32(p + 8), b[2] = ld32(p + 8 * SD), b[3] = ld32(p + 8 * SD + 8);
#endif
}
// This warp's RG row groups (group r: the 16 rows at arows + 16 r SD) as A fragments.
__device__ __forceinline__ void load_afrags(u32 (*af)[NKS][4], const q_t* arows) {
#pragma unroll
  for (int r = 0; r < RG; ++r)
#pragma unroll
    for (int ks = 0; ks < NKS; ++ks) load_a(af[r][ks], arows + 16 * r * SD, ks);
}
// s[RG][NJ][4] = A B^T for this warp: A = its RG row groups (fragments `af`, or read from `arows` when af is
// null), B = the BN rows of `tile`. Each B fragment feeds RG x 2 mma. s[r][j][e] is row 16 r + g + 8 (e / 2),
// column 8 j + 2 t + e % 2 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_abt(float (*s)[NJ][4], const u32 (*af)[NKS][4], const q_t* arows,
                                        const q_t* tile) {
#pragma unroll
  for (int r = 0; r < RG; ++r)
#pragma unroll
    for (int j = 0; j < NJ; ++j) s[r][j][0] = s[r][j][1] = s[r][j][2] = s[r][j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < NKS; ++ks) {
    u32 a[RG][4];
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      if (af) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[r][i] = af[r][ks][i];
      } else {
        load_a(a[r], arows + 16 * r * SD, ks);
      }
    }
#pragma unroll
    for (int jp = 0; jp < NJ / 2; ++jp) {
      u32 b[4];
      load_b(b, tile, jp, ks);
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        MMA(s[r][2 * jp], a[r], b);
        MMA(s[r][2 * jp + 1], a[r], b + 2);
      }
    }
  }
}
// acc[RG][NDT][4] += P M for this warp: P in s's layout (RG x 16 rows, BN columns, f32), M = the BN rows of
// `tile` (HD wide), read transposed by ldmatrix. With SPLIT_P, P = hi + lo (both 16-bit) and both are
// multiplied.
__device__ __forceinline__ void mma_pv(float (*acc)[NDT][4], float (*p)[NJ][4], const q_t* tile) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    u32 a[RG][4];
#if SPLIT_P
    u32 lo[RG][4];
#endif
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      const float *p0 = p[r][2 * kk], *p1 = p[r][2 * kk + 1];
      a[r][0] = PACK(p0[0], p0[1]), a[r][1] = PACK(p0[2], p0[3]);
      a[r][2] = PACK(p1[0], p1[1]), a[r][3] = PACK(p1[2], p1[3]);
#if SPLIT_P
      lo[r][0] = PACK(p0[0] - LO16(a[r][0]), p0[1] - HI16(a[r][0]));
      lo[r][1] = PACK(p0[2] - LO16(a[r][1]), p0[3] - HI16(a[r][1]));
      lo[r][2] = PACK(p1[0] - LO16(a[r][2]), p1[1] - HI16(a[r][2]));
      lo[r][3] = PACK(p1[2] - LO16(a[r][3]), p1[3] - HI16(a[r][3]));
#endif
    }
    const q_t* row = tile + (16 * kk + (lane & 7) + (lane & 8)) * SD + ((lane >> 4) << 3);
#pragma unroll
    for (int dd = 0; dd < NKS; ++dd) {
      u32 b[4];
      tpc_ldsm_x4_trans(b, row + 16 * dd);
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        MMA(acc[r][2 * dd], a[r], b);
        MMA(acc[r][2 * dd + 1], a[r], b + 2);
#if SPLIT_P
        MMA(acc[r][2 * dd], lo[r], b);
        MMA(acc[r][2 * dd + 1], lo[r], b + 2);
#endif
      }
    }
  }
}
// -inf for the scores outside the sequences or above the causal diagonal. Rows are this thread's row[NR]
// (queries; keys with KEY_ROWS), columns c0 + 8 j + 2 t + e % 2 (keys; queries with KEY_ROWS).
template <bool KEY_ROWS>
__device__ __forceinline__ void mask_edges(float (*s)[NJ][4], const i64* row, i64 c0) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < RG; ++r)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 rr = row[2 * r + (e >> 1)], cc = c0 + 8 * j + 2 * t + (e & 1);
        const i64 qi = KEY_ROWS ? cc : rr, kj = KEY_ROWS ? rr : cc;
        if (!(qi < TQ && kj < TK && (!CAUSAL || kj <= qi))) s[r][j][e] = -TPC_INF;
      }
}
__device__ __forceinline__ void zero_acc(float (*acc)[NDT][4]) {
#pragma unroll
  for (int r = 0; r < RG; ++r)
#pragma unroll
    for (int jj = 0; jj < NDT; ++jj) acc[r][jj][0] = acc[r][jj][1] = acc[r][jj][2] = acc[r][jj][3] = 0.f;
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// Rows row[i] (row g at out + g * st) from acc in mma_pv's layout, times scale[i].
__device__ __forceinline__ void store_rows(q_t* out, i64 st, const i64* row, i64 nrows, float (*acc)[NDT][4],
                                           const float* scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    if (row[i] >= nrows) continue;
    u32* o = (u32*)(out + row[i] * st + 2 * t);
    const int r = i >> 1, h = i & 1;
#pragma unroll
    for (int jj = 0; jj < NDT; ++jj) o[4 * jj] = PACK(acc[r][jj][2 * h] * scale[i], acc[r][jj][2 * h + 1] * scale[i]);
  }
}
)";
}

int stages(const TcAttnOptions& o) { return o.asyncCopy ? 2 : 1; }
uint32_t blocksFor(const AttnShape& a, int64_t t, const TcTiling& tl) {
  const int64_t bm = 64 * tl.rg;
  return std::max<uint32_t>(1, static_cast<uint32_t>(a.B * a.H * ((t + bm - 1) / bm)));
}
// Bytes of `own` BM-row tiles, `walked` BN-row tiles (times the stages) and `floats` f32 per walked row.
uint32_t sharedBytes(const AttnShape& a, const TcAttnOptions& o, const TcTiling& t, int own, int walked, int floats) {
  const int64_t rows = own * 64 * t.rg + walked * stages(o) * t.bn;
  return static_cast<uint32_t>(rows * (a.D + 8) * 2 + floats * stages(o) * t.bn * 4);
}

// The tiling of each kernel for these options and head_dim: the largest walked tiles at which ptxas -v (sm_90)
// reports no spills with wide warps (two row groups of accumulators and scores per thread).
TcTiling fwdTiling(const AttnShape& a, const TcAttnOptions& o) {
  TcTiling t;
  t.rg = o.wideWarps ? 2 : 1;
  t.bn = o.walkRows ? o.walkRows : (t.rg == 2 && a.D > 64 ? 32 : 64);
  t.frags = o.ldmatrix && (t.rg == 1 || a.D <= 64);
  return t;
}
TcTiling dkdvTiling(const AttnShape& a, const TcAttnOptions& o) {
  TcTiling t;
  t.rg = o.wideWarps && o.wideBackward && a.D <= 64 ? 2 : 1;
  t.bn = o.walkRows ? o.walkRows : (t.rg == 2 ? 32 : 64);
  t.frags = o.ldmatrix && t.rg == 1 && a.D <= 64;
  return t;
}
TcTiling dqTiling(const AttnShape& a, const TcAttnOptions& o) {
  TcTiling t;
  t.rg = o.wideWarps && o.wideBackward ? 2 : 1;
  t.bn = o.walkRows ? o.walkRows : (t.rg == 1 ? 64 : a.D > 64 ? 16 : 32);
  t.frags = false;
  return t;
}

Status checkOptions(const char* op, const TcAttnOptions& o) {
  if (o.walkRows != 0 && o.walkRows != 16 && o.walkRows != 32 && o.walkRows != 64)
    return makeError(op, ": TcAttnOptions::walkRows must be 0, 16, 32 or 64, got ", o.walkRows);
  return {};
}

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

// The shipped options; the environment's TPC_TC_ATTENTION=narrow picks TcAttnOptions::narrow() (the kernels
// before wideWarps), =split the shipped ones with splitP (P as a hi + lo pair), to compare whole steps on one build.
Result<TcAttnOptions> shippedTcOptions() {
  const char* v = std::getenv("TPC_TC_ATTENTION");
  if (!v || !*v || std::string(v) == "wide") return TcAttnOptions{};
  if (std::string(v) == "narrow") return TcAttnOptions::narrow();
  if (std::string(v) == "split") {
    TcAttnOptions o;
    o.splitP = true;
    return o;
  }
  return makeError("TPC_TC_ATTENTION must be 'wide', 'narrow' or 'split', got '", v, "'");
}

Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx) {
  TPC_ASSIGN(TcAttnOptions opt, shippedTcOptions());
  return lowerAttentionTensorCore(n, ctx, opt);
}
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx) {
  TPC_ASSIGN(TcAttnOptions opt, shippedTcOptions());
  return lowerAttentionGradTensorCore(n, ctx, opt);
}

Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& opt) {
  DType dt = n.operand(0)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  TPC_TRY(checkOptions("attention", opt));
  const TcTiling tl = fwdTiling(a, opt);
  KernelSpec k;
  k.entry = "tpc_attention_fwd_tc";
  k.source = tcHead(a, dt, opt, tl) + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_fwd_tc(const q_t* Q, const q_t* K, const q_t* V,
                                                                        q_t* O, float* LSE, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  q_t* Qs = (q_t*)smem;          // [BM][SD] this block's queries
  q_t* Ks = Qs + BM * SD;        // [STAGES][BN][SD] key tiles
  q_t* Vs = Ks + STAGES * WALK;  // [STAGES][BN][SD] their values
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
  const i64 ntiles = (TQ + BM - 1) / BM;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BM;  // the longest causal rows first
  const i64 w0 = q0 + 16 * RG * warp;                             // this warp's first row
  const i64 step = DROPOUT ? *stepp : 0;
  i64 row[NR];
  own_rows(row, w0);
  const Walk kv = {Ks, Vs, K + K_BASE(bh), V + V_BASE(bh), K_ST, V_ST, TK, CAUSAL ? min((i64)TK, q0 + BM) : (i64)TK};
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ, BM);
  walk_load(kv, 0, 0);
  const q_t* Qw = Qs + 16 * RG * warp * SD;
#if A_FRAGS
  tile_wait();
  __syncthreads();
  u32 qf[RG][NKS][4];
  load_afrags(qf, Qw);
#else
  const u32 (*qf)[NKS][4] = nullptr;
#endif
  // m: running max of scale log2(e) s per row; l: the running sum of exp2(scale log2(e) s - m)
  float acc[RG][NDT][4], m[NR], l[NR];
  zero_acc(acc);
#pragma unroll
  for (int i = 0; i < NR; ++i) m[i] = -TPC_INF, l[i] = 0.f;
  for (i64 k0 = 0, it = 0; k0 < kv.end; k0 += BN, ++it) {
    const int cur = walk_top(kv, it, k0);
    if (!CAUSAL || k0 < w0 + 16 * RG) {  // else every row of this warp is above the tile: nothing to add
      float s[RG][NJ][4];
      mma_abt(s, qf, Qw, Ks + cur * WALK);
#if !FUSED_SCALE
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[r][j][e] *= SCALE_LOG2;
#endif
      if (k0 + BN > TK || (CAUSAL && k0 + BN - 1 > q0)) mask_edges<false>(s, row, k0);
      float mx[NR], base[NR], rs[NR];
#pragma unroll
      for (int i = 0; i < NR; ++i) mx[i] = -TPC_INF, rs[i] = 0.f;
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[2 * r + (e >> 1)] = fmaxf(mx[2 * r + (e >> 1)], s[r][j][e]);
#pragma unroll
      float alpha[NR];
      bool moved = false;  // some row's running max changed: its accumulators shrink by alpha < 1
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        const float mn = fmaxf(m[i], FUSED_SCALE ? quad_max(mx[i]) * SCALE_LOG2 : quad_max(mx[i]));
        base[i] = mn == -TPC_INF ? 0.f : mn;  // a row with no key yet: exp2 of -inf gives 0, never NaN
        alpha[i] = exp2f(m[i] - base[i]);
        moved |= alpha[i] != 1.f;
        l[i] *= alpha[i];
        m[i] = mn;
      }
      // With LAZY_RESCALE the warp skips the rescale when no row's max moved (alpha 1: the same bits).
      if (!LAZY_RESCALE || __any_sync(0xffffffffu, moved))
#pragma unroll
        for (int i = 0; i < NR; ++i)
#pragma unroll
          for (int jj = 0; jj < NDT; ++jj) {
            acc[i >> 1][jj][2 * (i & 1)] *= alpha[i];
            acc[i >> 1][jj][2 * (i & 1) + 1] *= alpha[i];
          }
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 2 * r + (e >> 1);
            const float p = exp2f(FUSED_SCALE ? fmaf(s[r][j][e], SCALE_LOG2, -base[i]) : s[r][j][e] - base[i]);
            rs[i] += p;  // the softmax sums undropped probabilities
            s[r][j][e] = (DROPOUT && p != 0.f) ? p * drop_factor(seed, step, offb, offh, hg, bh, row[i], k0 + 8 * j + 2 * t + (e & 1)) : p;
          }
#pragma unroll
      for (int i = 0; i < NR; ++i) l[i] += quad_sum(rs[i]);
      mma_pv(acc, s, Vs + cur * WALK);
    }
    walk_bottom(kv, k0);
  }
  float inv[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
  store_rows(O + O_BASE(bh), O_ST, row, TQ, acc, inv);
#pragma unroll
  for (int i = 0; i < NR; ++i)
    if (t == 0 && row[i] < TQ) LSE[bh * TQ + row[i]] = l[i] > 0.f ? (m[i] + log2f(l[i])) * (1.f / LOG2E) : -TPC_INF;
}
)";
  k.block.x = 128;
  k.grid.x = blocksFor(a, a.Tq, tl);
  k.sharedBytes = sharedBytes(a, opt, tl, 1, 2, 0);
  k.args = {a.q.arg, a.k.arg, a.v.arg, a.o.arg, a.lse, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  TPC_TRY(checkShared("attention", out, ctx));
  return out;
}

// Kernel 1: Di = rowsum(dout * out). Kernel 2 (a block per key tile, a warp per 16 RG keys): dv += (P * mask)^T
// dout and dk += dS^T q over the query tiles, with S^T = k q^T and dP^T = v dout^T computed transposed so
// that P^T and dS^T are already A fragments. Kernel 3 (a block per query tile): dq += dS k over the key
// tiles. dS = P * (dP * mask - Di) * scale, P = exp(scale q k^T - lse).
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& opt) {
  DType dt = n.operand(1)->dtype();
  TPC_ASSIGN(AttnShape a, attnShape(n));
  TPC_TRY(checkOptions("attention_grad", opt));
  NodeLowering out;
  out.workspaceBytes = std::max<int64_t>(a.B * a.H * a.Tq, 1) * 4;
  out.kernels.push_back(attnDiKernel(a, attnHead(a, dt)));
  {
    const TcTiling tl = dkdvTiling(a, opt);
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dkdv_tc";
    k.source = tcHead(a, dt, opt, tl) + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_bwd_dkdv_tc(const q_t* DO, const q_t* Q,
    const q_t* K, const q_t* V, const float* LSE, const float* Di, q_t* DK, q_t* DV, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  q_t* Ks = (q_t*)smem;                      // [BM][SD] this block's keys
  q_t* Vs = Ks + BM * SD;                    // [BM][SD] their values
  q_t* Qs = Vs + BM * SD;                    // [STAGES][BN][SD] query tiles
  q_t* Gs = Qs + STAGES * WALK;              // [STAGES][BN][SD] their dout rows
  float* Ls = (float*)(Gs + STAGES * WALK);  // [STAGES][BN] log2(e) lse of the query tile
  float* Ds = Ls + STAGES * BN;              // [STAGES][BN] Di of the query tile
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
  const i64 nkt = (TK + BM - 1) / BM;
  const i64 bh = blockIdx.x / nkt;
  if (bh >= BH) return;
  const i64 k0 = (i64)(blockIdx.x % nkt) * BM;
  const i64 w0 = k0 + 16 * RG * warp;  // this warp's first key
  const i64 step = DROPOUT ? *stepp : 0;
  i64 key[NR];
  own_rows(key, w0);
  const i64 qbegin = CAUSAL ? k0 : 0;  // k0 is a multiple of BN
  const Walk qg = {Qs, Gs, Q + Q_BASE(bh), DO + DO_BASE(bh), Q_ST, DO_ST, TQ, TQ};
  tc_load_tile(Ks, K + K_BASE(bh), K_ST, k0, TK, BM);
  tc_load_tile(Vs, V + V_BASE(bh), V_ST, k0, TK, BM);
  walk_load(qg, 0, qbegin);
  float nl = 0.f, nd = 0.f;  // lse and Di of query row q0 + threadIdx.x (threads < BN), the tile to stage next
  if (threadIdx.x < BN && qbegin + threadIdx.x < TQ) {
    nl = LSE[bh * TQ + qbegin + threadIdx.x] * LOG2E;
    nd = Di[bh * TQ + qbegin + threadIdx.x];
  }
  if (threadIdx.x < BN) {
    Ls[threadIdx.x] = nl;
    Ds[threadIdx.x] = nd;
  }
  const q_t* Kw = Ks + 16 * RG * warp * SD;
  const q_t* Vw = Vs + 16 * RG * warp * SD;
#if A_FRAGS
  tile_wait();
  __syncthreads();
  u32 kf[RG][NKS][4], vf[RG][NKS][4];  // this warp's keys and values as A fragments for the whole walk
  load_afrags(kf, Kw);
  load_afrags(vf, Vw);
#else
  const u32 (*kf)[NKS][4] = nullptr, (*vf)[NKS][4] = nullptr;
#endif
  float dk[RG][NDT][4], dv[RG][NDT][4];
  zero_acc(dk);
  zero_acc(dv);
  for (i64 q0 = qbegin, it = 0; q0 < TQ; q0 += BN, ++it) {
    const int cur = walk_top(qg, it, q0);
    const bool more = q0 + BN < TQ;
    const i64 qn = q0 + BN + threadIdx.x;  // loaded now, stored after this tile's mma
    if (more && threadIdx.x < BN) {
      nl = qn < TQ ? LSE[bh * TQ + qn] * LOG2E : 0.f;
      nd = qn < TQ ? Di[bh * TQ + qn] : 0.f;
    }
    if (!CAUSAL || q0 + BN > w0) {  // else every query of the tile is before this warp's keys
      const q_t* Qc = Qs + cur * WALK;
      const q_t* Gc = Gs + cur * WALK;
      const float* Lc = Ls + cur * BN;
      const float* Dc = Ds + cur * BN;
      float pt[RG][NJ][4], dst[RG][NJ][4];  // rows: this warp's keys; columns: the tile's queries
      mma_abt(pt, kf, Kw, Qc);
      mma_abt(dst, vf, Vw, Gc);
      if (q0 + BN > TQ || k0 + BM > TK || (CAUSAL && k0 + BM - 1 > q0))  // crosses a sequence end or the diagonal
        mask_edges<true>(pt, key, q0);
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qc = 8 * j + 2 * t + (e & 1);
            const float p = exp2f(pt[r][j][e] * SCALE_LOG2 - Lc[qc]);  // 0 where masked
            const float f = (DROPOUT && p != 0.f) ? drop_factor(seed, step, offb, offh, hg, bh, q0 + qc, key[2 * r + (e >> 1)]) : 1.f;
            pt[r][j][e] = p * f;
            dst[r][j][e] = p * (dst[r][j][e] * f - Dc[qc]) * SCALE;
          }
      mma_pv(dv, pt, Gc);
      mma_pv(dk, dst, Qc);
    }
    walk_bottom(qg, q0);
    if (more && threadIdx.x < BN) {
      Ls[(STAGES - 1 - cur) * BN + threadIdx.x] = nl;
      Ds[(STAGES - 1 - cur) * BN + threadIdx.x] = nd;
    }
  }
  float one[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) one[i] = 1.f;
  store_rows(DK + DK_BASE(bh), DK_ST, key, TK, dk, one);
  store_rows(DV + DV_BASE(bh), DV_ST, key, TK, dv, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tk, tl);
    k.sharedBytes = sharedBytes(a, opt, tl, 2, 2, 2);
    k.args = {a.dout.arg, a.q.arg,  a.k.arg,   a.v.arg,   a.lse,
              workspaceArg(0), a.dk.arg, a.dv.arg, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
    out.kernels.push_back(std::move(k));
  }
  {
    const TcTiling tl = dqTiling(a, opt);
    KernelSpec k;
    k.entry = "tpc_attention_bwd_dq_tc";
    k.source = tcHead(a, dt, opt, tl) + R"(
extern "C" __global__ void __launch_bounds__(128) tpc_attention_bwd_dq_tc(const q_t* DO, const q_t* Q,
    const q_t* K, const q_t* V, const float* LSE, const float* Di, q_t* DQ, u64 seed, const i64* stepp, i64 offb, i64 offh, i64 hg) {
  extern __shared__ float smem[];
  q_t* Qs = (q_t*)smem;          // [BM][SD] this block's queries
  q_t* Gs = Qs + BM * SD;        // [BM][SD] their dout rows
  q_t* Ks = Gs + BM * SD;        // [STAGES][BN][SD] key tiles
  q_t* Vs = Ks + STAGES * WALK;  // [STAGES][BN][SD] their values
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
  const i64 ntiles = (TQ + BM - 1) / BM;
  const i64 bh = blockIdx.x / ntiles;
  if (bh >= BH) return;
  const i64 q0 = (ntiles - 1 - (i64)(blockIdx.x % ntiles)) * BM;
  const i64 w0 = q0 + 16 * RG * warp;
  const i64 step = DROPOUT ? *stepp : 0;
  i64 row[NR];
  own_rows(row, w0);
  const Walk kv = {Ks, Vs, K + K_BASE(bh), V + V_BASE(bh), K_ST, V_ST, TK, CAUSAL ? min((i64)TK, q0 + BM) : (i64)TK};
  tc_load_tile(Qs, Q + Q_BASE(bh), Q_ST, q0, TQ, BM);
  tc_load_tile(Gs, DO + DO_BASE(bh), DO_ST, q0, TQ, BM);
  walk_load(kv, 0, 0);
  float lse[NR], dd[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    lse[i] = row[i] < TQ ? LSE[bh * TQ + row[i]] * LOG2E : 0.f;
    dd[i] = row[i] < TQ ? Di[bh * TQ + row[i]] : 0.f;
  }
  const q_t* Qw = Qs + 16 * RG * warp * SD;
  const q_t* Gw = Gs + 16 * RG * warp * SD;
#if A_FRAGS
  tile_wait();
  __syncthreads();
  u32 qf[RG][NKS][4], gf[RG][NKS][4];
  load_afrags(qf, Qw);
  load_afrags(gf, Gw);
#else
  const u32 (*qf)[NKS][4] = nullptr, (*gf)[NKS][4] = nullptr;
#endif
  float dq[RG][NDT][4];
  zero_acc(dq);
  for (i64 k0 = 0, it = 0; k0 < kv.end; k0 += BN, ++it) {
    const int cur = walk_top(kv, it, k0);
    if (!CAUSAL || k0 < w0 + 16 * RG) {  // else every row of this warp is above the tile
      const q_t* Kc = Ks + cur * WALK;
      float s[RG][NJ][4], dp[RG][NJ][4];
      mma_abt(s, qf, Qw, Kc);
      mma_abt(dp, gf, Gw, Vs + cur * WALK);
      if (q0 + BM > TQ || k0 + BN > TK || (CAUSAL && k0 + BN - 1 > q0))  // crosses a sequence end or the diagonal
        mask_edges<false>(s, row, k0);
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 2 * r + (e >> 1);
            const float p = exp2f(s[r][j][e] * SCALE_LOG2 - lse[i]);  // 0 where masked
            const float f = (DROPOUT && p != 0.f) ? drop_factor(seed, step, offb, offh, hg, bh, row[i], k0 + 8 * j + 2 * t + (e & 1)) : 1.f;
            s[r][j][e] = p * (dp[r][j][e] * f - dd[i]) * SCALE;
          }
      mma_pv(dq, s, Kc);
    }
    walk_bottom(kv, k0);
  }
  float one[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) one[i] = 1.f;
  store_rows(DQ + DQ_BASE(bh), DQ_ST, row, TQ, dq, one);
}
)";
    k.block.x = 128;
    k.grid.x = blocksFor(a, a.Tq, tl);
    k.sharedBytes = sharedBytes(a, opt, tl, 2, 2, 0);
    k.args = {a.dout.arg, a.q.arg, a.k.arg, a.v.arg, a.lse, workspaceArg(0), a.dq.arg, seedArg(), stepArg(), dropArg(a.offB), dropArg(a.offH), dropArg(a.Hg)};
    out.kernels.push_back(std::move(k));
  }
  TPC_TRY(checkShared("attention_grad", out, ctx));
  return out;
}

}  // namespace tpc::cuda
