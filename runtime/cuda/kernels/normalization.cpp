// CUDA lowerings of layer_norm (+grad) and softmax (+grad). A row (the normalized dim) is reduced by one
// block; statistics are f32 whatever the storage dtype. layer_norm_grad's dgamma/dbeta are column sums
// over rows done in two passes (fixed row chunks, then the chunks in order): deterministic, no atomics.
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

}  // namespace

// One block per row: mean, then the biased variance around it (two passes, like the CPU kernel), then
// y = (x - mean) * rstd * gamma + beta.
Result<NodeLowering> lowerLayerNorm(const Node& n, const LoweringContext& ctx) {
  for (unsigned k = 0; k < 3; ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "x, gamma and beta"));
  const Shape& s = n.operand(0)->shape();
  int64_t D = s.back(), rows = D ? n.operand(0)->type().numel() / D : 0;
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

// Kernel 1, a block per row: mean and rstd (kept in the workspace), dx = rstd (g - mean(g) - xhat mean(g xhat))
// with g = dy gamma. Kernel 2: per chunk of rows and column, partial sums of dy xhat and dy (32 columns x
// 8 row lanes per block, the lanes combined in order). Kernel 3: the chunks summed in order.
Result<NodeLowering> lowerLayerNormGrad(const Node& n, const LoweringContext& ctx) {
  for (unsigned k = 0; k < 3; ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "dy, x and gamma"));
  const Shape& s = n.operand(1)->shape();
  int64_t D = s.back(), rows = D ? n.operand(1)->type().numel() / D : 0;
  const int64_t kRowsPerChunk = 64;
  int64_t chunks = std::max<int64_t>(1, (rows + kRowsPerChunk - 1) / kRowsPerChunk);
  // Workspace: mean[rows], rstd[rows] (double), then dgamma/dbeta partials [chunks][D] (double).
  int64_t statBytes = 2 * rows * 8, partBytes = chunks * D * 8;
  std::string head = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                     accessors("g", n.operand(2)->dtype()) + accessors("dx", n.result(0)->dtype()) +
                     accessors("dg", n.result(1)->dtype()) + accessors("db", n.result(2)->dtype()) +
                     cat("#define D ", i64Lit(D), "\n#define ROWS ", i64Lit(rows), "\n#define CHUNKS ", i64Lit(chunks),
                         "\n#define RPC ", i64Lit(kRowsPerChunk), "\n");
  NodeLowering out;
  out.workspaceBytes = statBytes + 2 * partBytes;
  {
    KernelSpec k;
    k.entry = "tpc_layer_norm_grad_dx";
    k.source = head + R"(
extern "C" __global__ void tpc_layer_norm_grad_dx(const dy_t* DY, const x_t* X, const g_t* G, dx_t* DX, double* stats) {
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
      dx_st(DX + row * D, j, (float)(rstd * ((double)dy_ld(dy, j) * (double)g_ld(G, j) - sg - xhat * sgx)));
    }
    if (threadIdx.x == 0) { stats[row] = mean; stats[ROWS + row] = rstd; }
  }
}
)";
    k.block.x = rowBlock(D, 512);
    k.grid.x = gridFor(rows, 1, 1 << 20);
    k.args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0), workspaceArg(0)};
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
