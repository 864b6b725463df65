// CUDA lowerings of layer_norm (+grad) and softmax (+grad). layer_norm(_grad) with rows of up to 2048
// elements: a warp per row holding the row in registers (16-byte loads), f32 statistics; the grad's warps
// also sum dgamma/dbeta over their fixed rows, a block's warps in order, and a second kernel adds the blocks'
// partial sums in order (deterministic, no atomics). Longer rows (and softmax): a block per row, double statistics.
#include <algorithm>

#include "ir/shape_rules.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

NodeLowering single(KernelSpec k) {
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

// dx_round(v): v rounded to dx's dtype (after dx's accessors).
constexpr const char* kDxRound = "__device__ __forceinline__ float dx_round(float v) { dx_t t; dx_st(&t, 0, v); return dx_ld(&t, 0); }\n";

// layer_norm_grad with a residual operand (dx = round(dx) + residual, the bits of the add it replaces): the
// residual's accessors, RES, and dx_round; without one RES is 0.
std::string residualHead(const Node& n) {
  if (n.numOperands() != 4) return "#define RES 0\n";
  return accessors("r", n.operand(3)->dtype()) + vectorAccessors("r", n.operand(3)->dtype()) + "#define RES 1\n" + kDxRound;
}

// r_ldu for the warp-row kernels (after residualHead and warpRowHead).
std::string residualLoad() {
  return "__device__ __forceinline__ void r_ldu(const r_t* p, i64 i, float* v) {\n#if U == 8\n"
         "  r_ld8(p, i, v);\n#else\n  v[0] = r_ld(p, i);\n#endif\n}\n";
}

}  // namespace

namespace {

// Warp-per-row layout: lane l holds the U-element pieces (l + 32 i) U, i < NV, of its row.
struct WarpRows {
  int64_t D, rows, U, NV;
  bool fits() const { return NV * U <= 64; }
};
WarpRows warpRowsOf(int64_t D, int64_t rows) {
  int64_t U = D % 8 == 0 ? 8 : 1;
  return {D, rows, U, D ? (D + 32 * U - 1) / (32 * U) : 1};
}
constexpr int64_t kWarpsPerBlock = 4;

// Row helpers for the warp-per-row kernels: name_ldu loads a piece of each of `loads`, name_stu stores one of
// each of `stores`; the statistics of a row held as v[NV][U] (zeros past D).
std::string warpRowHead(const WarpRows& w, const std::vector<std::pair<std::string, DType>>& loads,
                        const std::vector<std::string>& stores, double eps) {
  std::string s = cat("#define D ", i64Lit(w.D), "\n#define ROWS ", i64Lit(w.rows), "\n#define U ", w.U, "\n#define NV ",
                      w.NV, "\n#define WPB ", kWarpsPerBlock, "\n#define EPS ", floatLit(eps), "\n");
  auto fn = [&](const std::string& name, bool store) {
    if (store)
      return cat("__device__ __forceinline__ void ", name, "_stu(", name, "_t* p, i64 i, const float* v) {\n#if U == 8\n  ",
                 name, "_st8(p, i, v);\n#else\n  ", name, "_st(p, i, v[0]);\n#endif\n}\n");
    return cat("__device__ __forceinline__ void ", name, "_ldu(const ", name, "_t* p, i64 i, float* v) {\n#if U == 8\n  ",
               name, "_ld8(p, i, v);\n#else\n  v[0] = ", name, "_ld(p, i);\n#endif\n}\n");
  };
  for (auto& [name, t] : loads) s += vectorAccessors(name, t) + fn(name, false);
  for (const std::string& name : stores) s += fn(name, true);
  return s + R"(
#define FOR_PIECES for (int i = 0; i < NV; ++i) if ((i64)(lane + 32 * i) * U < D)
#define PIECE ((i64)(lane + 32 * i) * U)
// Mean and 1/sqrt(biased variance + eps) of a row held by a warp (two passes over the registers).
__device__ __forceinline__ void tpc_row_stats(float (*v)[U], int lane, float& mean, float& rstd) {
  float s = 0.f;
#pragma unroll
  FOR_PIECES {
#pragma unroll
    for (int k = 0; k < U; ++k) s += v[i][k];
  }
  mean = tpc_warp_sum(s) / (float)D;
  float q = 0.f;
#pragma unroll
  FOR_PIECES {
#pragma unroll
    for (int k = 0; k < U; ++k) { float d = v[i][k] - mean; q += d * d; }
  }
  rstd = 1.f / sqrtf(tpc_warp_sum(q) / (float)D + EPS);
}
)";
}

}  // namespace

bool layerNormTakesResidual(const Node& n) {
  const int64_t D = n.operand(0)->shape().empty() ? 0 : n.operand(0)->shape().back();
  return D > 0 && warpRowsOf(D, n.operand(0)->type().numel() / D).fits();
}

// Rows of at most 2048 elements: a warp per row held in registers (warpRowHead). With a residual operand
// (fold-layer-norm-residual) the warp first forms s = x + residual rounded to x's dtype, stores it (the second
// result) and normalizes s. Longer rows: one block per row: mean, then the biased variance around it (two passes,
// like the CPU kernel), then y = (x - mean) * rstd * gamma + beta.
Result<NodeLowering> lowerLayerNorm(const Node& n, const LoweringContext& ctx) {
  for (unsigned k = 0; k < n.numOperands(); ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "x, gamma, beta and residual"));
  const Shape& s = n.operand(0)->shape();
  int64_t D = s.back(), rows = D ? n.operand(0)->type().numel() / D : 0;
  WarpRows w = warpRowsOf(D, rows);
  const bool res = n.numOperands() == 4;
  if (res && !w.fits())
    return makeError("layer_norm: a residual operand is added by the warp-row kernel only (rows of at most 2048 elements, "
                     "got ", D, "); fold-layer-norm-residual asks layerNormTakesResidual first");
  if (w.fits()) {
    std::vector<std::pair<std::string, DType>> loads = {
        {"x", n.operand(0)->dtype()}, {"g", n.operand(1)->dtype()}, {"b", n.operand(2)->dtype()}};
    std::string resHead = "#define RES 0\n";
    if (res) {
      loads.push_back({"r", n.operand(3)->dtype()});
      resHead = "#define RES 1\n" + accessors("s", n.result(1)->dtype()) + vectorAccessors("s", n.result(1)->dtype()) +
                R"(__device__ __forceinline__ float s_round(float v) { s_t t; s_st(&t, 0, v); return s_ld(&t, 0); }
)";
    }
    KernelSpec k;
    k.entry = "tpc_layer_norm_warp";
    k.source = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("g", n.operand(1)->dtype()) +
               accessors("b", n.operand(2)->dtype()) + accessors("y", n.result(0)->dtype()) +
               (res ? accessors("r", n.operand(3)->dtype()) : std::string()) + vectorAccessors("y", n.result(0)->dtype()) +
               resHead + warpRowHead(w, loads, res ? std::vector<std::string>{"y", "s"} : std::vector<std::string>{"y"},
                                     n.getFloat("eps")) +
               R"(
extern "C" __global__ void __launch_bounds__(WPB * 32) tpc_layer_norm_warp(const x_t* X, const g_t* G, const b_t* Bt, )" +
               (res ? "const r_t* R, s_t* S, " : "") + R"(y_t* Y) {
  const int lane = threadIdx.x & 31;
  for (i64 row = (i64)blockIdx.x * WPB + (threadIdx.x >> 5); row < ROWS; row += (i64)gridDim.x * WPB) {
    float v[NV][U];
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < U; ++k) v[i][k] = 0.f;
#pragma unroll
    FOR_PIECES x_ldu(X + row * D, PIECE, v[i]);
#if RES
#pragma unroll
    FOR_PIECES {
      float rv[U];
      r_ldu(R + row * D, PIECE, rv);
#pragma unroll
      for (int k = 0; k < U; ++k) v[i][k] = s_round(v[i][k] + rv[k]);  // the add's bits
      s_stu(S + row * D, PIECE, v[i]);
    }
#endif
    float mean, rstd;
    tpc_row_stats(v, lane, mean, rstd);
#pragma unroll
    FOR_PIECES {
      float g[U], b[U];
      g_ldu(G, PIECE, g);
      b_ldu(Bt, PIECE, b);
#pragma unroll
      for (int k = 0; k < U; ++k) v[i][k] = (v[i][k] - mean) * rstd * g[k] + b[k];
      y_stu(Y + row * D, PIECE, v[i]);
    }
  }
}
)";
    k.block.x = static_cast<uint32_t>(32 * kWarpsPerBlock);
    k.grid.x = gridFor(rows, kWarpsPerBlock, 1 << 20);
    k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0)};
    if (res) k.args.insert(k.args.begin() + 3, {operandArg(3), resultArg(1)});
    return single(std::move(k));
  }
  KernelSpec k;
  k.entry = "tpc_layer_norm";
  k.source = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("g", n.operand(1)->dtype()) +
             accessors("b", n.operand(2)->dtype()) + accessors("y", n.result(0)->dtype()) +
             cat(R"(
extern "C" __global__ void tpc_layer_norm(const x_t* X, const g_t* G, const b_t* Bt, y_t* Y) {
  __shared__ double red[32];
  const i64 D = )", i64Lit(D), R"(;
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    const x_t* x = X + row * D;
    double s = 0;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) s += (double)x_ld(x, j);
    double mean = tpc_block_sum_d(s, red) / (double)D;
    double v = 0;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) { double d = (double)x_ld(x, j) - mean; v += d * d; }
    double var = tpc_block_sum_d(v, red) / (double)D;
    double rstd = 1.0 / sqrt(var + )", doubleLit(n.getFloat("eps")), R"();
    for (i64 j = threadIdx.x; j < D; j += blockDim.x)
      y_st(Y + row * D, j, (float)(((double)x_ld(x, j) - mean) * rstd) * g_ld(G, j) + b_ld(Bt, j));
  }
}
)");
  k.block.x = rowBlock(D, 512);
  k.grid.x = gridFor(rows, 1, 1 << 20);
  k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0)};
  return single(std::move(k));
}

namespace {

// The second kernel of both warp-row layer_norm_grad lowerings: dgamma and dbeta as the in-order column
// sums (tpc_column_sum, in double) of the `rows` f32 partial rows at workspace 0 (dy xhat) and partBytes (dy).
// With sumDx (the block kernel's sum_dx), also dx's column sums from the partial rows at 2 partBytes.
KernelSpec layerNormGradColumns(const std::string& src, const char* rows, int64_t D, int64_t partBytes, bool sumDx = false) {
  KernelSpec k;
  k.entry = "tpc_layer_norm_grad_columns";
  k.source = src + (sumDx ? "#define SUM_COLUMNS 1\n" : "#define SUM_COLUMNS 0\n") + R"(
extern "C" __global__ void tpc_layer_norm_grad_columns(const float* pg, const float* pb, dg_t* DG, db_t* DB)" +
             (sumDx ? ", const float* ps, ds_t* DS" : "") + R"() {
  __shared__ double red[32 * 33];
  const i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
#if SUM_COLUMNS
  const float* p = blockIdx.y == 2 ? ps : blockIdx.y ? pb : pg;
#else
  const float* p = blockIdx.y ? pb : pg;
#endif
  double v = tpc_column_sum(p, )" + rows + R"(, D, col, red);
  if (threadIdx.y == 0 && col < D) {
#if SUM_COLUMNS
    if (blockIdx.y == 2) { ds_st(DS, col, (float)v); return; }
#endif
    if (blockIdx.y) db_st(DB, col, (float)v);
    else dg_st(DG, col, (float)v);
  }
}
)";
  k.block = {32, 32, 1};
  k.grid = {static_cast<uint32_t>(std::max<int64_t>(1, (D + 31) / 32)), sumDx ? 3u : 2u, 1};
  k.args = {workspaceArg(0), workspaceArg(partBytes), resultArg(1), resultArg(2)};
  if (sumDx) {
    k.args.push_back(workspaceArg(2 * partBytes));
    k.args.push_back(resultArg(3));
  }
  return k;
}

// Kernel 1: a warp per run of RPW rows (about 1536 warps in all): per row mean, rstd and
// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma; the warp's dgamma/dbeta partial sums over
// its rows go to the workspace ([NW, D] each, f32). Kernel 2: those partials summed per column in order.
Result<NodeLowering> lowerLayerNormGradWarps(const Node& n, const WarpRows& w) {
  int64_t rpw = std::max<int64_t>(1, (w.rows + 1535) / 1536);
  int64_t nw = (w.rows + rpw - 1) / rpw;
  int64_t partBytes = nw * w.D * 4;
  std::string src = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                    accessors("g", n.operand(2)->dtype()) + accessors("dx", n.result(0)->dtype()) +
                    accessors("dg", n.result(1)->dtype()) + accessors("db", n.result(2)->dtype()) +
                    vectorAccessors("dx", n.result(0)->dtype()) + residualHead(n) +
                    warpRowHead(w, {{"dy", n.operand(0)->dtype()}, {"x", n.operand(1)->dtype()}, {"g", n.operand(2)->dtype()}},
                                {"dx"}, n.getFloat("eps")) +
                    (n.numOperands() == 4 ? residualLoad() : std::string()) +
                    cat("#define RPW ", i64Lit(rpw), "\n#define NW ", i64Lit(nw), "\n");
  NodeLowering out;
  out.workspaceBytes = 2 * partBytes;
  const std::string rParam = n.numOperands() == 4 ? "const r_t* R," : "";
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_warp";
    k.source = src + R"(
extern "C" __global__ void __launch_bounds__(WPB * 32) tpc_layer_norm_grad_warp(const dy_t* DY, const x_t* X, const g_t* G,
                                                                              )" + rParam + R"(                                                                              dx_t* DX, float* pg, float* pb) {
  const int lane = threadIdx.x & 31;
  const i64 wi = (i64)blockIdx.x * WPB + (threadIdx.x >> 5);
  if (wi >= NW) return;  // a whole warp: no block-wide barrier below
  float ag[NV][U], ab[NV][U];
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int k = 0; k < U; ++k) { ag[i][k] = 0.f; ab[i][k] = 0.f; }
  const i64 end = min((wi + 1) * RPW, ROWS);
  for (i64 row = wi * RPW; row < end; ++row) {
    float v[NV][U], e[NV][U];
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < U; ++k) { v[i][k] = 0.f; e[i][k] = 0.f; }
#pragma unroll
    FOR_PIECES { x_ldu(X + row * D, PIECE, v[i]); dy_ldu(DY + row * D, PIECE, e[i]); }
    float mean, rstd;
    tpc_row_stats(v, lane, mean, rstd);
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    FOR_PIECES {
      float g[U];
      g_ldu(G, PIECE, g);
#pragma unroll
      for (int k = 0; k < U; ++k) {
        v[i][k] = (v[i][k] - mean) * rstd;  // xhat from here on
        float gv = e[i][k] * g[k];
        sg += gv;
        sgx += gv * v[i][k];
        ag[i][k] += e[i][k] * v[i][k];
        ab[i][k] += e[i][k];
      }
    }
    sg = tpc_warp_sum(sg) / (float)D;
    sgx = tpc_warp_sum(sgx) / (float)D;
#pragma unroll
    FOR_PIECES {
      float g[U], d[U];
      g_ldu(G, PIECE, g);
#pragma unroll
      for (int k = 0; k < U; ++k) d[k] = rstd * (e[i][k] * g[k] - sg - v[i][k] * sgx);
#if RES
      float rv[U];
      r_ldu(R + row * D, PIECE, rv);
#pragma unroll
      for (int k = 0; k < U; ++k) d[k] = dx_round(d[k]) + rv[k];
#endif
      dx_stu(DX + row * D, PIECE, d);
    }
  }
#pragma unroll
  FOR_PIECES {
#pragma unroll
    for (int k = 0; k < U; ++k) { pg[wi * D + PIECE + k] = ag[i][k]; pb[wi * D + PIECE + k] = ab[i][k]; }
  }
}
)";
    k.block.x = static_cast<uint32_t>(32 * kWarpsPerBlock);
    k.grid.x = gridFor(nw, kWarpsPerBlock, 1 << 20);
    k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0), workspaceArg(0), workspaceArg(partBytes)};
    if (n.numOperands() == 4) k.args.insert(k.args.begin() + 3, operandArg(3));
    out.kernels.push_back(std::move(k));
  }
  out.kernels.push_back(layerNormGradColumns(src, "NW", w.D, partBytes));
  return out;
}


// The 16-byte pieces of a row kept in registers as loaded (name_raw), converted to floats when used, so that
// the next row's loads are in flight while this one is reduced: name_ldr loads a piece, name_cvt converts it.
std::string rawPieces(const std::string& name, DType t, int64_t U) {
  std::string s = U == 8 ? cat("struct ", name, "_raw { uint4 q[", t == DType::f32 ? 2 : 1, "]; };\n")
                         : cat("struct ", name, "_raw { ", name, "_t q; };\n");
  return s + cat("__device__ __forceinline__ void ", name, "_ldr(const ", name, "_t* p, i64 i, ", name,
                 "_raw& r) { r = *reinterpret_cast<const ", name, "_raw*>(p + i); }\n", "__device__ __forceinline__ void ",
                 name, "_cvt(const ", name, "_raw& r, float* v) { ", name, "_ldu(reinterpret_cast<const ", name,
                 "_t*>(&r), 0, v); }\n");
}

// Kernel 1: block b owns rows [b RPB, (b + 1) RPB), its warp w rows b RPB + w, + WPB, ...; per row the same
// arithmetic as lowerLayerNormGradWarps (the same dx bits), the next row's x and dy loaded before this row is
// reduced. dgamma/dbeta: each warp sums its rows, the block adds its warps in order and writes one partial row
// per block ([NB, D] each, f32; the old kernel wrote one per warp, 3x the bytes). Kernel 2: the NB partials per
// column in order, in double. Deterministic: every sum's order is fixed by the shapes.
// Where a warp keeps its dgamma/dbeta (and dx) sums: in registers (NV U each) where a lane holds few enough
// columns (LoweringContext::layerNormGradRegColumns / RegSumColumns; f32 rows count twice: their raw rows take
// twice the registers; three blocks a SM at up to 168 registers, the grid one wave of them), else in shared
// memory (a block more a SM, 128 registers). On the H200 the shared-memory sums kept the L1/shared pipe 89% busy
// and DRAM at 25% of its bandwidth (ncu, gpt2's [16384, 768]); in registers a 1024-wide row spilled.
Result<NodeLowering> lowerLayerNormGradBlocks(const Node& n, const WarpRows& w, const LoweringContext& ctx) {
  const bool wide = n.operand(0)->dtype() == DType::f32 || n.operand(1)->dtype() == DType::f32;
  const int64_t cols = w.NV * w.U * (wide ? 2 : 1);  // a lane's columns, counted in 16-bit rows' registers
  // At 32 columns a lane of 16-bit rows (gpt2-medium's 1024): a ring of 2 rows and every sum in registers
  // (LoweringContext::layerNormGradWide). H200, [16384, 1024] with the residual: 0.0512 -> 0.0468 ms, with sum_dx
  // 0.0562 -> 0.0491; the ring's fewer registers leave room for the sums. At 768 the same is slower (0.0392 -> 0.0404).
  const bool wideRing = ctx.layerNormGradWide && !wide && w.U == 8 && cols == 32;
  const bool regAcc = wideRing || cols <= ctx.layerNormGradRegColumns;
  // sum_dx: dx's column sums as a third set, in registers or shared memory likewise.
  const bool sumDx = n.getBool("sum_dx");
  const bool sumReg = sumDx && (wideRing || (regAcc && cols <= ctx.layerNormGradRegSumColumns));
  const int64_t nacc = sumDx ? 3 : 2;
  const int64_t accBytes = kWarpsPerBlock * nacc * w.NV * w.U * 32 * 4;
  // gamma, read twice a row: from shared memory, where the block loads it once, unless the sums are in shared
  // memory with dx's third set (LoweringContext::layerNormGradGammaShared), else from global memory through L1.
  // H200, [16384, D] with the residual: 768 0.0442 -> 0.0400 ms, with sum_dx 0.0465 -> 0.0432; 1024 0.0586 ->
  // 0.0525, but with sum_dx (the sums in shared memory) 0.0643 -> 0.0652. The same bits either way.
  const bool gammaShared = ctx.layerNormGradGammaShared && (regAcc || !sumDx);
  const int64_t gammaBytes = gammaShared ? w.NV * w.U * 32 * 4 : 0;
  // With stages (rows of 16-byte pieces), x, dy and the residual come through a ring of that many rows a warp in
  // shared memory, filled by cp.async STAGES - 1 to STAGES rows ahead, instead of the next row's x and dy held in
  // registers: more bytes in flight a SM, fewer registers. A lane reads back only the pieces it copied, so its
  // own cp.async.wait_group is the only synchronisation.
  const bool res = n.numOperands() == 4;
  auto rawBytes = [](DType t) { return dtypeSize(t) * 8; };  // a lane's piece of U = 8 elements
  const int64_t stageBytes = w.NV * 32 * (rawBytes(n.operand(0)->dtype()) + rawBytes(n.operand(1)->dtype()) +
                                          (res ? rawBytes(n.operand(3)->dtype()) : 0));
  // As many of the stages asked for as fit a block's shared memory (fewer than 2: the register prefetch).
  int64_t stages = wideRing ? 2 : w.U == 8 && ctx.layerNormGradStages >= 2 ? ctx.layerNormGradStages : 0;
  while (stages >= 2 && accBytes + gammaBytes + kWarpsPerBlock * stages * stageBytes > ctx.maxSharedBytes) --stages;
  if (stages < 2) stages = 0;
  const int64_t sharedBytes = accBytes + gammaBytes + kWarpsPerBlock * stages * stageBytes;
  // Three blocks a SM (168 registers a thread) where the sums are in registers, and with sum_dx (its sums in
  // shared memory leave gamma in global memory): at 128 registers that kernel spilled 124 bytes a thread
  // (gpt2-medium's [16384, 1024]).
  const int64_t blocksPerSM =
      std::max<int64_t>(1, std::min<int64_t>(regAcc || sumDx ? 3 : 4, ctx.sharedPerSM / (sharedBytes + 1024)));
  const int64_t warps = std::max<int64_t>(1, ctx.numSMs) * blocksPerSM * kWarpsPerBlock;
  int64_t rpw = std::max<int64_t>(1, (w.rows + warps - 1) / warps);
  int64_t rpb = rpw * kWarpsPerBlock;
  int64_t nb = std::max<int64_t>(1, (w.rows + rpb - 1) / rpb);
  int64_t partBytes = nb * w.D * 4;
  std::string src = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                    accessors("g", n.operand(2)->dtype()) + accessors("dx", n.result(0)->dtype()) +
                    accessors("dg", n.result(1)->dtype()) + accessors("db", n.result(2)->dtype()) +
                    vectorAccessors("dx", n.result(0)->dtype()) + residualHead(n) +
                    (sumDx ? accessors("ds", n.result(3)->dtype()) + (res ? "" : kDxRound) : std::string());
  src += warpRowHead(w, {{"dy", n.operand(0)->dtype()}, {"x", n.operand(1)->dtype()}, {"g", n.operand(2)->dtype()}},
                     {"dx"}, n.getFloat("eps")) +
         (res ? residualLoad() : std::string());
  src += rawPieces("x", n.operand(1)->dtype(), w.U) + rawPieces("dy", n.operand(0)->dtype(), w.U) +
         (res ? rawPieces("r", n.operand(3)->dtype(), w.U) : std::string()) +
         cat("#define RPB ", i64Lit(rpb), "\n#define NB ", i64Lit(nb), "\n#define REG_ACC ", regAcc ? 1 : 0,
             "\n#define MIN_BLOCKS ", blocksPerSM, "\n#define SUM_DX ", sumDx ? 1 : 0, "\n#define SUM_REG ",
             sumReg ? 1 : 0, "\n#define NACC ", nacc, "\n#define GAMMA_SHARED ", gammaShared ? 1 : 0, "\n#define STAGES ",
             stages, "\n#define RING_AT ", accBytes + gammaBytes, "\n#define STAGE_BYTES ", stageBytes, "\n");
  // The ring's copies, for the first kernel only (the second reads the partial rows).
  std::string ring;
  if (stages) ring = tensorCorePrelude() + R"(
// One lane's piece (Raw: 16 or 32 bytes) global -> shared, 16 bytes a cp.async.
template <class Raw>
__device__ __forceinline__ void tpc_ring_piece(Raw* dst, const void* src) {
#pragma unroll
  for (int c = 0; c < (int)sizeof(Raw) / 16; ++c)
    tpc_cp_async16(reinterpret_cast<char*>(dst) + 16 * c, reinterpret_cast<const char*>(src) + 16 * c, true);
}
// Row `row`'s pieces of x, dy (and r) into ring stage st ([x pieces][dy pieces][r pieces], each [NV][32 lanes]).
__device__ __forceinline__ void tpc_ring_fill(char* st, const x_t* X, const dy_t* DY, const void* Rv, i64 row, int lane) {
  x_raw* xs = reinterpret_cast<x_raw*>(st);
  dy_raw* es = reinterpret_cast<dy_raw*>(xs + NV * 32);
#pragma unroll
  FOR_PIECES {
    tpc_ring_piece(xs + i * 32 + lane, X + row * D + PIECE);
    tpc_ring_piece(es + i * 32 + lane, DY + row * D + PIECE);
#if RES
    tpc_ring_piece(reinterpret_cast<r_raw*>(es + NV * 32) + i * 32 + lane, reinterpret_cast<const r_t*>(Rv) + row * D + PIECE);
#endif
  }
}
)";
  NodeLowering out;
  out.workspaceBytes = nacc * partBytes;
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_rows";
    k.source = src + ring + R"(
extern "C" __global__ void __launch_bounds__(WPB * 32, MIN_BLOCKS) tpc_layer_norm_grad_rows(const dy_t* DY, const x_t* X, const g_t* G,
)" + std::string(res ? "    const r_t* R,\n" : "") + R"(    dx_t* DX, float* pg, float* pb)" +
                         (sumDx ? ", float* ps" : "") + R"() {
  // Each warp's dgamma, dbeta (and dx) sums (in registers with REG_ACC / SUM_REG, else here), then the block's
  // warps' sums: element (i, k) of a lane at [warp][0, 1 or 2][i U + k][lane], so that a warp's accesses hit
  // 32 banks.
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 end = min((i64)blockIdx.x * RPB + RPB, ROWS);
  float* ag = smem + warp * NACC * NV * U * 32 + lane;
  float* ab = ag + NV * U * 32;
#if REG_ACC
  float accg[NV * U], accb[NV * U];
#define AG(j) accg[j]
#define AB(j) accb[j]
#else
#define AG(j) ag[(j) * 32]
#define AB(j) ab[(j) * 32]
#endif
#pragma unroll
  for (int j = 0; j < NV * U; ++j) { AG(j) = 0.f; AB(j) = 0.f; }
#if SUM_DX
  float* as = ab + NV * U * 32;
#if SUM_REG
  float accs[NV * U];
#define AS(j) accs[j]
#else
#define AS(j) as[(j) * 32]
#endif
#pragma unroll
  for (int j = 0; j < NV * U; ++j) AS(j) = 0.f;
#endif
#if GAMMA_SHARED
  float* gs = smem + WPB * NACC * NV * U * 32;  // after the sums
  for (int c = threadIdx.x; c < D; c += WPB * 32) gs[c] = g_ld(G, c);
  __syncthreads();
#define GAMMA(i, g) _Pragma("unroll") for (int k_ = 0; k_ < U; ++k_) g[k_] = gs[PIECE + k_]
#else
#define GAMMA(i, g) g_ldu(G, PIECE, g)
#endif
  i64 row = (i64)blockIdx.x * RPB + warp;
#if STAGES
  char* ring = reinterpret_cast<char*>(smem) + RING_AT + warp * STAGES * STAGE_BYTES;
#if RES
  const void* Rv = R;
#else
  const void* Rv = nullptr;
#endif
#pragma unroll
  for (int s_ = 0; s_ < STAGES; ++s_) {  // a group a row, empty past the block's rows
    if (row + s_ * WPB < end) tpc_ring_fill(ring + s_ * STAGE_BYTES, X, DY, Rv, row + s_ * WPB, lane);
    tpc_cp_async_commit();
  }
  int slot = 0;
#else
  x_raw xn[NV];
  dy_raw en[NV];
  if (row < end) {
#pragma unroll
    FOR_PIECES { x_ldr(X + row * D, PIECE, xn[i]); dy_ldr(DY + row * D, PIECE, en[i]); }
  }
#endif
  for (; row < end; row += WPB) {
    // The row stays as loaded (16-bit pieces: half the registers) and is converted where used.
    x_raw xc[NV];
    dy_raw ec[NV];
#if STAGES
    tpc_cp_async_wait_n<STAGES - 1>();  // this row's group (the later rows' may still be in flight)
    char* st = ring + slot * STAGE_BYTES;
#pragma unroll
    FOR_PIECES {
      xc[i] = reinterpret_cast<const x_raw*>(st)[i * 32 + lane];
      ec[i] = reinterpret_cast<const dy_raw*>(st + NV * 32 * sizeof(x_raw))[i * 32 + lane];
    }
#else
#pragma unroll
    for (int i = 0; i < NV; ++i) { xc[i] = xn[i]; ec[i] = en[i]; }
    if (row + WPB < end) {
#pragma unroll
      FOR_PIECES { x_ldr(X + (row + WPB) * D, PIECE, xn[i]); dy_ldr(DY + (row + WPB) * D, PIECE, en[i]); }
    }
#endif
#if RES
    r_raw rn[NV];
#if STAGES
#pragma unroll
    FOR_PIECES rn[i] = reinterpret_cast<const r_raw*>(st + NV * 32 * (sizeof(x_raw) + sizeof(dy_raw)))[i * 32 + lane];
#else
#pragma unroll
    FOR_PIECES r_ldr(R + row * D, PIECE, rn[i]);
#endif
#endif
    // tpc_row_stats's arithmetic.
    float s = 0.f;
#pragma unroll
    FOR_PIECES {
      float v[U];
      x_cvt(xc[i], v);
#pragma unroll
      for (int k = 0; k < U; ++k) s += v[k];
    }
    const float mean = tpc_warp_sum(s) / (float)D;
    float q = 0.f;
#pragma unroll
    FOR_PIECES {
      float v[U];
      x_cvt(xc[i], v);
#pragma unroll
      for (int k = 0; k < U; ++k) { float d = v[k] - mean; q += d * d; }
    }
    const float rstd = 1.f / sqrtf(tpc_warp_sum(q) / (float)D + EPS);
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    FOR_PIECES {
      float g[U], v[U], e[U];
      GAMMA(i, g);
      x_cvt(xc[i], v);
      dy_cvt(ec[i], e);
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const float xh = (v[k] - mean) * rstd;
        float gv = e[k] * g[k];
        sg += gv;
        sgx += gv * xh;
        AG(i * U + k) += e[k] * xh;
        AB(i * U + k) += e[k];
      }
    }
    sg = tpc_warp_sum(sg) / (float)D;
    sgx = tpc_warp_sum(sgx) / (float)D;
#pragma unroll
    FOR_PIECES {
      float g[U], v[U], e[U], d[U];
      GAMMA(i, g);
      x_cvt(xc[i], v);
      dy_cvt(ec[i], e);
#pragma unroll
      for (int k = 0; k < U; ++k) d[k] = rstd * (e[k] * g[k] - sg - (v[k] - mean) * rstd * sgx);
#if RES
      float rv[U];
      r_cvt(rn[i], rv);
#pragma unroll
      for (int k = 0; k < U; ++k) d[k] = dx_round(d[k]) + rv[k];
#endif
#if SUM_DX
#pragma unroll
      for (int k = 0; k < U; ++k) AS(i * U + k) += dx_round(d[k]);  // dx as stored
#endif
      dx_stu(DX + row * D, PIECE, d);
    }
#if STAGES
    // This slot's pieces are in registers and used: refill it STAGES rows on (same lane, same bytes).
    if (row + STAGES * WPB < end) tpc_ring_fill(st, X, DY, Rv, row + STAGES * WPB, lane);
    tpc_cp_async_commit();
    slot = slot + 1 == STAGES ? 0 : slot + 1;
#endif
  }
#if SUM_REG
#pragma unroll
  for (int j = 0; j < NV * U; ++j) as[j * 32] = accs[j];
#endif
#if REG_ACC
#pragma unroll
  for (int j = 0; j < NV * U; ++j) { ag[j * 32] = accg[j]; ab[j * 32] = accb[j]; }
#endif
  // The block's warps in order, ((w0 + w1) + w2) + w3, a thread per column: the block's partial row.
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += WPB * 32) {
    const int at = ((c % U) + (c / U) / 32 * U) * 32 + (c / U) % 32;  // (i U + k) * 32 + lane
    float a = smem[at], b = smem[NV * U * 32 + at];
    for (int w = 1; w < WPB; ++w) {
      a += smem[w * NACC * NV * U * 32 + at];
      b += smem[(w * NACC + 1) * NV * U * 32 + at];
    }
    pg[(i64)blockIdx.x * D + c] = a;
    pb[(i64)blockIdx.x * D + c] = b;
#if SUM_DX
    float t = smem[2 * NV * U * 32 + at];
    for (int w = 1; w < WPB; ++w) t += smem[(w * NACC + 2) * NV * U * 32 + at];
    ps[(i64)blockIdx.x * D + c] = t;
#endif
  }
}
)";
    k.block.x = static_cast<uint32_t>(32 * kWarpsPerBlock);
    k.grid.x = static_cast<uint32_t>(nb);
    k.sharedBytes = static_cast<uint32_t>(sharedBytes);
    k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0), workspaceArg(0), workspaceArg(partBytes)};
    if (res) k.args.insert(k.args.begin() + 3, operandArg(3));
    if (sumDx) k.args.push_back(workspaceArg(2 * partBytes));
    out.kernels.push_back(std::move(k));
  }
  out.kernels.push_back(layerNormGradColumns(src, "NB", w.D, partBytes, sumDx));
  return out;
}
}  // namespace

// Kernel 1, a block per row: mean and rstd (kept in the workspace), dx = rstd (g - mean(g) - xhat mean(g xhat))
// with g = dy gamma. Kernel 2: per chunk of rows and column, partial sums of dy xhat and dy (32 columns x
// 8 row lanes per block, the lanes combined in order). Kernel 3: the chunks summed in order.
bool layerNormGradSumsDx(const Node& n, const LoweringContext& ctx) {
  const int64_t D = n.operand(1)->shape().empty() ? 0 : n.operand(1)->shape().back();
  return ctx.layerNormGradBlocks && D > 0 && warpRowsOf(D, n.operand(1)->type().numel() / D).fits();
}

Result<NodeLowering> lowerLayerNormGrad(const Node& n, const LoweringContext& ctx) {
  for (unsigned k = 0; k < n.numOperands(); ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "dy, x, gamma and residual"));
  if (n.getBool("sum_dx") && !layerNormGradSumsDx(n, ctx))
    return makeError("layer_norm_grad: sum_dx is summed by the block kernel only (rows of at most 2048 elements, "
                     "layerNormGradBlocks on), got ", n.operand(1)->type().str());
  const Shape& s = n.operand(1)->shape();
  int64_t D = s.back(), rows = D ? n.operand(1)->type().numel() / D : 0;
  if (WarpRows w = warpRowsOf(D, rows); w.fits())
    return ctx.layerNormGradBlocks ? lowerLayerNormGradBlocks(n, w, ctx) : lowerLayerNormGradWarps(n, w);
  const int64_t kRowsPerChunk = 64;
  int64_t chunks = std::max<int64_t>(1, (rows + kRowsPerChunk - 1) / kRowsPerChunk);
  // Workspace: mean[rows], rstd[rows] (double), then dgamma/dbeta partials [chunks][D] (double).
  int64_t statBytes = 2 * rows * 8, partBytes = chunks * D * 8;
  std::string head = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                     accessors("g", n.operand(2)->dtype()) + accessors("dx", n.result(0)->dtype()) +
                     accessors("dg", n.result(1)->dtype()) + accessors("db", n.result(2)->dtype()) + residualHead(n) +
                     cat("#define D ", i64Lit(D), "\n#define ROWS ", i64Lit(rows), "\n#define CHUNKS ", i64Lit(chunks),
                         "\n#define RPC ", i64Lit(kRowsPerChunk), "\n");
  NodeLowering out;
  out.workspaceBytes = statBytes + 2 * partBytes;
  const std::string rParam = n.numOperands() == 4 ? "const r_t* R," : "";
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_dx";
    k.source = head + R"(
extern "C" __global__ void tpc_layer_norm_grad_dx(const dy_t* DY, const x_t* X, const g_t* G,
                                                   )" + rParam + R"(                                                   dx_t* DX, double* stats) {
  __shared__ double red[32];
  for (i64 row = blockIdx.x; row < ROWS; row += gridDim.x) {
    const x_t* x = X + row * D;
    const dy_t* dy = DY + row * D;
    double s = 0;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) s += (double)x_ld(x, j);
    double mean = tpc_block_sum_d(s, red) / (double)D;
    double v = 0;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) { double d = (double)x_ld(x, j) - mean; v += d * d; }
    double rstd = 1.0 / sqrt(tpc_block_sum_d(v, red) / (double)D + )" +
               doubleLit(n.getFloat("eps")) + R"();
    double sg = 0, sgx = 0;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
      double gv = (double)dy_ld(dy, j) * (double)g_ld(G, j);
      sg += gv;
      sgx += gv * ((double)x_ld(x, j) - mean) * rstd;
    }
    sg = tpc_block_sum_d(sg, red) / (double)D;
    sgx = tpc_block_sum_d(sgx, red) / (double)D;
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
      double xhat = ((double)x_ld(x, j) - mean) * rstd;
      float d = (float)(rstd * ((double)dy_ld(dy, j) * (double)g_ld(G, j) - sg - xhat * sgx));
#if RES
      d = dx_round(d) + r_ld(R, row * D + j);
#endif
      dx_st(DX + row * D, j, d);
    }
    if (threadIdx.x == 0) { stats[row] = mean; stats[ROWS + row] = rstd; }
  }
}
)";
    k.block.x = rowBlock(D, 512);
    k.grid.x = gridFor(rows, 1, 1 << 20);
    k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0), workspaceArg(0)};
    if (n.numOperands() == 4) k.args.insert(k.args.begin() + 3, operandArg(3));
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_partial";
    k.source = head + R"(
extern "C" __global__ void tpc_layer_norm_grad_partial(const dy_t* DY, const x_t* X, const double* stats,
                                                       double* pg, double* pb) {
  __shared__ double sg[8][33], sb[8][33];
  i64 col = (i64)blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
  double ag = 0, ab = 0;
  if (col < D) {
    i64 end = min((chunk + 1) * RPC, ROWS);
    for (i64 r = chunk * RPC + threadIdx.y; r < end; r += 8) {
      double dy = (double)dy_ld(DY, r * D + col);
      ag += dy * ((double)x_ld(X, r * D + col) - stats[r]) * stats[ROWS + r];
      ab += dy;
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < D) {
    for (int l = 1; l < 8; ++l) { ag += sg[l][threadIdx.x]; ab += sb[l][threadIdx.x]; }
    pg[chunk * D + col] = ag;
    pb[chunk * D + col] = ab;
  }
}
)";
    k.block = {32, 8, 1};
    k.grid = {static_cast<uint32_t>((D + 31) / 32), static_cast<uint32_t>(chunks), 1};
    k.args = {operandArg(0), operandArg(1), workspaceArg(0), workspaceArg(statBytes), workspaceArg(statBytes + partBytes)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_final";
    k.source = head + R"(
extern "C" __global__ void tpc_layer_norm_grad_final(const double* pg, const double* pb, dg_t* DG, db_t* DB) {
  for (i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x; col < D; col += (i64)gridDim.x * blockDim.x) {
    double ag = 0, ab = 0;
    for (i64 c = 0; c < CHUNKS; ++c) { ag += pg[c * D + col]; ab += pb[c * D + col]; }
    dg_st(DG, col, (float)ag);
    db_st(DB, col, (float)ab);
  }
}
)";
    k.block.x = 256;
    k.grid.x = gridFor(D, 256);
    k.args = {workspaceArg(statBytes), workspaceArg(statBytes + partBytes), resultArg(1), resultArg(2)};
    out.kernels.push_back(std::move(k));
  }
  return out;
}

namespace {

// softmax and softmax_grad share their layout: outer x n x inner around the axis. With inner == 1 a block
// reduces a row; otherwise a thread walks one strided column (threads over inner, coalesced).
struct AxisLayout {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisLayout layoutOf(const Node& n, const Shape& s) {
  int64_t axis = *normalizeAxis(n.getInt("axis"), static_cast<int64_t>(s.size()));
  return {prodDims(s, 0, axis), s[axis], prodDims(s, axis + 1, s.size())};
}

// `body` sees: base (offset of element 0 of the line), stride, and per-line helpers; it is the same text
// for both layouts, written against LINE_REDUCE_MAX / LINE_REDUCE_SUM macros defined per layout.
KernelSpec lineKernel(const std::string& entry, const std::string& head, const std::string& params,
                      const std::string& body, const AxisLayout& L, std::vector<KernelArg> args) {
  KernelSpec k;
  k.entry = entry;
  std::string dims = cat("#define NLINE ", i64Lit(L.n), "\n#define INNER ", i64Lit(L.inner), "\n#define LINES ",
                         i64Lit(L.outer * L.inner), "\n");
  if (L.inner == 1) {
    k.source = head + dims + R"(
#define RMAX(v) tpc_block_max(v, red)
#define RSUM(v) tpc_block_sum_d(v, redd)
#define FOR_J for (i64 j = threadIdx.x; j < NLINE; j += blockDim.x)
extern "C" __global__ void )" + entry + "(" + params + R"() {
  __shared__ float red[32];
  __shared__ double redd[32];
  (void)red;
  (void)redd;
  for (i64 line = blockIdx.x; line < LINES; line += gridDim.x) {
    const i64 base = line * NLINE, stride = 1;
)" + body + R"(
  }
}
)";
    k.block.x = rowBlock(L.n, 512);
    k.grid.x = gridFor(L.outer, 1, 1 << 20);
  } else {
    k.source = head + dims + R"(
#define RMAX(v) (v)
#define RSUM(v) (v)
#define FOR_J for (i64 j = 0; j < NLINE; ++j)
extern "C" __global__ void )" + entry + "(" + params + R"() {
  for (i64 line = (i64)blockIdx.x * blockDim.x + threadIdx.x; line < LINES; line += (i64)gridDim.x * blockDim.x) {
    const i64 base = (line / INNER) * NLINE * INNER + line % INNER, stride = INNER;
)" + body + R"(
  }
}
)";
    k.block.x = 256;
    k.grid.x = gridFor(L.outer * L.inner, 256);
  }
  k.args = std::move(args);
  return k;
}

}  // namespace

// max, sum of exp(x - max) in double, y = exp(x - max) / sum (the CPU kernel's order).
Result<NodeLowering> lowerSoftmax(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "x"));
  AxisLayout L = layoutOf(n, n.operand(0)->shape());
  std::string head = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("y", n.result(0)->dtype());
  std::string body = R"(
    float m = -TPC_INF;
    FOR_J m = fmaxf(m, x_ld(X, base + j * stride));
    m = RMAX(m);
    double s = 0;
    FOR_J s += exp((double)(x_ld(X, base + j * stride) - m));
    s = RSUM(s);
    FOR_J y_st(Y, base + j * stride, (float)(exp((double)(x_ld(X, base + j * stride) - m)) / s));
)";
  return single(lineKernel("tpc_softmax", head, "const x_t* X, y_t* Y", body, L, {operandArg(0), resultArg(0)}));
}

// dx = y (dy - sum(dy y)).
Result<NodeLowering> lowerSoftmaxGrad(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "dy and y"));
  AxisLayout L = layoutOf(n, n.operand(1)->shape());
  std::string head = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("y", n.operand(1)->dtype()) +
                     accessors("dx", n.result(0)->dtype());
  std::string body = R"(
    double dot = 0;
    FOR_J dot += (double)dy_ld(DY, base + j * stride) * (double)y_ld(Y, base + j * stride);
    dot = RSUM(dot);
    FOR_J {
      i64 o = base + j * stride;
      dx_st(DX, o, (float)((double)y_ld(Y, o) * ((double)dy_ld(DY, o) - dot)));
    }
)";
  return single(lineKernel("tpc_softmax_grad", head, "const dy_t* DY, const y_t* Y, dx_t* DX", body, L,
                           {operandArg(0), operandArg(1), resultArg(0)}));
}

}  // namespace tpc::cuda
