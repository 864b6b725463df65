// CUDA lowerings of reduce_sum / reduce_mean / reduce_max over any axes, and of sum_squares and
// global_norm over several operands. Sums accumulate in double (the CPU kernels do too; sum_squares adds
// eight squares in f32 first) in a fixed order: results do not depend on scheduling. Shapes are static, so index arithmetic is baked into the source.
#include <algorithm>
#include <set>

#include "ir/shape_rules.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

// A function `name(i64 i)` mapping the row-major index over `sizes` to sum idx[k] * strides[k].
std::string offsetFn(const std::string& name, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::string s = cat("__device__ __forceinline__ i64 ", name, "(i64 i) {\n  i64 off = 0;\n");
  for (size_t k = sizes.size(); k-- > 0;) {
    if (k == 0) s += cat("  off += i * ", i64Lit(strides[k]), ";\n");
    else s += cat("  off += (i % ", i64Lit(sizes[k]), ") * ", i64Lit(strides[k]), "; i /= ", i64Lit(sizes[k]), ";\n");
  }
  return s + "  return off;\n}\n";
}

// x as [NRED, NOUT] (the leading dims reduced: bias gradients) at memory bandwidth. Kernel 1: a block of
// BX x BY threads owns BX column pieces of U adjacent columns (16-byte loads when NOUT % 8 == 0) and a chunk
// of rows; thread (tx, ty) sums rows ty, ty + BY, ... of the chunk in registers (f32; double for f32 x), then
// the BY lanes are added in order (double) and the block writes one partial row [NOUT] (f32). Kernel 2: per
// column the chunks' partials in order (32 lanes over chunks, the lanes then in order, double). Fixed order
// everywhere: deterministic.
// Grid (LoweringContext::columnReduceWave): one wave of two 256-thread blocks a SM, each thread loading ROWS
// rows before it adds them (8 x 16 bytes in flight), so that a [16384, 768] gradient (25 MB, a few
// microseconds of DRAM time) is not spent in block start-up and tails; without it, enough blocks to fill the
// GPU 16 times, at least 8 rows a thread, loaded one at a time (the kernel before).
Result<NodeLowering> lowerColumnReduce(const Node& n, const LoweringContext& ctx, DType dt, DType od, int64_t nred,
                                       int64_t nout, bool isMax, double divisor) {
  const int64_t U = nout % 8 == 0 ? 8 : 1, pieces = (nout + U - 1) / U;
  int64_t BX = 1;  // a power of two: BX x BY = 256 threads
  while (BX < 32 && BX < pieces) BX *= 2;
  const int64_t BY = 256 / BX;
  const int64_t colBlocks = (pieces + BX - 1) / BX;
  const bool wave = ctx.columnReduceWave;
  const int64_t blocks = wave ? 2 * std::max(ctx.numSMs, 1) : 132 * 16;
  int64_t chunks = std::clamp<int64_t>((blocks + colBlocks - 1) / colBlocks, 1, std::max<int64_t>(1, nred / (8 * BY)));
  chunks = std::min<int64_t>(chunks, 65535);
  const int64_t per = (nred + chunks - 1) / chunks;
  chunks = (nred + per - 1) / per;
  if (chunks < 2) return NodeLowering{};  // too few rows to split: the one-pass kernel (a thread per column)
  std::string head = devicePrelude() + accessors("x", dt) + vectorAccessors("x", dt) + accessors("o", od) +
                     cat("#define NOUT ", i64Lit(nout), "\n#define NRED ", i64Lit(nred), "\n#define U ", U, "\n#define BX ",
                         BX, "\n#define BY ", BY, "\n#define PER ", i64Lit(per), "\n#define CHUNKS ", i64Lit(chunks), "\n#define ROWS ",
                         wave ? 8 : 1, "\n#define MIN_BLOCKS ", wave ? 2 : 1, "\n#define ACC_T ", dt == DType::f32 ? "double" : "float",
                         "\n#define FINIT ", isMax ? "(-TPC_INF)" : "0.f", "\n#define INIT ",
                         isMax ? "(-(double)TPC_INF)" : "0.0", "\n#define COMBINE(a, b) ",
                         isMax ? "fmax(a, b)" : "((a) + (b))", "\n#define FINISH(v) ",
                         divisor != 1.0 ? cat("((v) / ", doubleLit(divisor), ")") : std::string("(v)"), "\n");
  NodeLowering out;
  out.workspaceBytes = chunks * nout * 4;
  {
    KernelSpec k;
    k.entry = "tpc_reduce_cols_chunk";
    k.source = head + R"(
// One row's U columns at r, as floats.
__device__ __forceinline__ void load_row(const x_t* X, i64 r, i64 col, float* v) {
#if U == 8
  x_ld8(X, r * NOUT + col, v);
#else
  v[0] = x_ld(X, r * NOUT + col);
#endif
}
extern "C" __global__ void __launch_bounds__(BX * BY, MIN_BLOCKS) tpc_reduce_cols_chunk(const x_t* X, float* part) {
  __shared__ ACC_T red[BY][BX * U + 1];
  const i64 piece = (i64)blockIdx.x * BX + threadIdx.x, c = blockIdx.y;
  const i64 col = piece * U;
  ACC_T acc[U];
#pragma unroll
  for (int k = 0; k < U; ++k) acc[k] = FINIT;
  if (col < NOUT) {
    const i64 end = min((c + 1) * PER, NRED);
    i64 r = c * PER + threadIdx.y;
#if ROWS > 1
    // ROWS rows loaded, then added in row order.
    for (; r + (ROWS - 1) * BY < end; r += ROWS * BY) {
      float v[ROWS][U];
#pragma unroll
      for (int j = 0; j < ROWS; ++j) load_row(X, r + j * BY, col, v[j]);
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int k = 0; k < U; ++k) acc[k] = COMBINE(acc[k], (ACC_T)v[j][k]);
    }
#endif
#pragma unroll 4
    for (; r < end; r += BY) {
      float v[U];
      load_row(X, r, col, v);
#pragma unroll
      for (int k = 0; k < U; ++k) acc[k] = COMBINE(acc[k], (ACC_T)v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < U; ++k) red[threadIdx.y][threadIdx.x * U + k] = acc[k];
  __syncthreads();
  // The block's BX * U columns, one per thread, its BY lanes in order.
  for (int j = threadIdx.y * BX + threadIdx.x; j < BX * U; j += BX * BY) {
    const i64 oc = (i64)blockIdx.x * BX * U + j;
    if (oc >= NOUT) continue;
    double v = INIT;
    for (int l = 0; l < BY; ++l) v = COMBINE(v, (double)red[l][j]);
    part[c * NOUT + oc] = (float)v;
  }
}
)";
    k.block = {static_cast<uint32_t>(BX), static_cast<uint32_t>(BY), 1};
    k.grid = {static_cast<uint32_t>(colBlocks), static_cast<uint32_t>(chunks), 1};
    k.args = {operandArg(0), workspaceArg(0)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_reduce_cols_chunks";
    k.source = head + R"(
extern "C" __global__ void tpc_reduce_cols_chunks(const float* part, o_t* O) {
  __shared__ double red[32 * 33];
  const i64 o = (i64)blockIdx.x * 32 + threadIdx.x;
  double v = INIT;
  if (o < NOUT)
    for (i64 c = threadIdx.y; c < CHUNKS; c += blockDim.y) v = COMBINE(v, (double)part[c * NOUT + o]);
  red[threadIdx.y * 33 + threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && o < NOUT) {
    for (unsigned l = 1; l < blockDim.y; ++l) v = COMBINE(v, red[l * 33 + threadIdx.x]);
    v = FINISH(v);
    o_st(O, o, (float)v);
  }
}
)";
    k.block = {32, 32, 1};
    k.grid.x = gridFor(nout, 32, 1 << 30);
    k.args = {workspaceArg(0), resultArg(0)};
    out.kernels.push_back(std::move(k));
  }
  return out;
}

}  // namespace

// The input's dims split into kept (the output, row-major) and reduced ones. The innermost input dim
// decides the layout: reduced -> a block per output walks the reduced elements (contiguous runs);
// kept -> a thread per output (adjacent outputs adjacent in memory), the reduced range cut into chunks
// whose partial results a second kernel combines in chunk order (32 outputs x 32 chunk lanes a block).
Result<NodeLowering> lowerReduce(const Node& n, const LoweringContext& ctx) {
  const Value* x = n.operand(0);
  DType dt = x->dtype();
  if (isFloat(dt)) TPC_TRY(checkFloatDType(n, dt, "x"));
  else TPC_TRY(checkIdDType(n, dt, "x"));
  const Shape& s = x->shape();
  int64_t r = static_cast<int64_t>(s.size());
  std::set<int64_t> axes;
  for (int64_t a : n.getInts("axes")) axes.insert(*normalizeAxis(a, r));
  std::vector<int64_t> keptSize, keptStride, redSize, redStride;
  int64_t stride = 1;
  std::vector<int64_t> strides(s.size());
  for (int64_t k = r; k-- > 0;) {
    strides[k] = stride;
    stride *= s[k];
  }
  for (int64_t k = 0; k < r; ++k) {
    if (axes.count(k)) {
      redSize.push_back(s[k]);
      redStride.push_back(strides[k]);
    } else {
      keptSize.push_back(s[k]);
      keptStride.push_back(strides[k]);
    }
  }
  int64_t nout = 1, nred = 1;
  for (int64_t v : keptSize) nout *= v;
  for (int64_t v : redSize) nred *= v;
  int64_t total = nout * nred;
  bool isMax = n.op() == OpKind::ReduceMax, isMean = n.op() == OpKind::ReduceMean;
  bool rowStyle = r == 0 || axes.count(r - 1) || nout == 1;
  double count = nout ? static_cast<double>(total) / nout : 1.0;

  DType od = n.result(0)->dtype();
  std::string store = isFloat(od) ? "o_st(O, o, (float)v);" : "O[o] = (o_t)(i64)v;";
  std::string head = devicePrelude() + accessors("x", dt) + (isFloat(od) ? accessors("o", od) : accessors("o", od)) +
                     offsetFn("out_base", keptSize, keptStride) +
                     offsetFn("red_off", redSize, redStride) +
                     cat("#define NOUT ", i64Lit(nout), "\n#define NRED ", i64Lit(nred), "\n#define INIT ",
                         isMax ? "(-(double)TPC_INF)" : "0.0", "\n#define COMBINE(a, b) ",
                         isMax ? "fmax(a, b)" : "((a) + (b))", "\n#define FINISH(v) ",
                         isMean ? cat("((v) / ", doubleLit(count), ")") : std::string("(v)"), "\n");
  NodeLowering out;
  if (rowStyle) {
    KernelSpec k;
    k.entry = "tpc_reduce_rows";
    // Fewer outputs than a GPU has SMs (about; the mean loss: one output of 16384 values): 1024 threads a row,
    // not 256 (29 us for gpt2's loss, most of it each thread's 64 dependent loads).
    k.block.x = rowBlock(nred, nout < 128 ? 1024 : 256);
    k.source = head + cat(R"(
extern "C" __global__ void __launch_bounds__()", k.block.x, R"() tpc_reduce_rows(const x_t* X, o_t* O) {
  __shared__ double red[32];
  for (i64 o = blockIdx.x; o < NOUT; o += gridDim.x) {
    const i64 base = out_base(o);
    double v = INIT;
    for (i64 k = threadIdx.x; k < NRED; k += blockDim.x) v = COMBINE(v, (double)x_ld(X, base + red_off(k)));
    v = )", isMax ? "tpc_block_max_d(v, red)" : "tpc_block_sum_d(v, red)", R"(;
    v = FINISH(v);
    if (threadIdx.x == 0) { )", store, R"( }
  }
}
)");
    k.grid.x = gridFor(nout, 1, 1 << 20);
    k.args = {operandArg(0), resultArg(0)};
    out.kernels.push_back(std::move(k));
    return out;
  }
  if (ctx.columnReduce && isFloat(dt) && nred > 0 && nout > 0 && redSize.size() + keptSize.size() == s.size() && !redSize.empty()) {
    bool leading = true;  // the reduced dims are exactly the leading ones: x is [NRED, NOUT] row-major
    for (int64_t k = 0; k < static_cast<int64_t>(redSize.size()); ++k) leading &= axes.count(k) > 0;
    if (leading) {
      TPC_ASSIGN(NodeLowering l, lowerColumnReduce(n, ctx, dt, od, nred, nout, isMax, isMean ? count : 1.0));
      if (!l.kernels.empty()) return l;
    }
  }
  // Column style: chunks so that about 256k threads run, each chunk at least 16 reduced elements.
  int64_t chunks = std::clamp<int64_t>((262144 + nout - 1) / std::max<int64_t>(nout, 1), 1, std::max<int64_t>(1, nred / 16));
  chunks = std::min<int64_t>(chunks, 65535);
  int64_t per = (nred + chunks - 1) / std::max<int64_t>(chunks, 1);
  head += cat("#define CHUNKS ", i64Lit(chunks), "\n#define PER ", i64Lit(per), "\n");
  if (chunks == 1) {
    KernelSpec k;
    k.entry = "tpc_reduce_cols";
    k.source = head + cat(R"(
extern "C" __global__ void tpc_reduce_cols(const x_t* X, o_t* O) {
  for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < NOUT; o += (i64)gridDim.x * blockDim.x) {
    const i64 base = out_base(o);
    double v = INIT;
    for (i64 k = 0; k < NRED; ++k) v = COMBINE(v, (double)x_ld(X, base + red_off(k)));
    v = FINISH(v);
    )", store, R"(
  }
}
)");
    k.block.x = 256;
    k.grid.x = gridFor(nout, 256);
    k.args = {operandArg(0), resultArg(0)};
    out.kernels.push_back(std::move(k));
    return out;
  }
  out.workspaceBytes = chunks * nout * 8;
  {
    KernelSpec k;
    k.entry = "tpc_reduce_cols_partial";
    k.source = head + R"(
extern "C" __global__ void tpc_reduce_cols_partial(const x_t* X, double* part) {
  i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
  if (o >= NOUT) return;
  const i64 base = out_base(o);
  double v = INIT;
  i64 end = min((c + 1) * PER, NRED);
  for (i64 k = c * PER; k < end; ++k) v = COMBINE(v, (double)x_ld(X, base + red_off(k)));
  part[c * NOUT + o] = v;
}
)";
    k.block.x = 256;
    k.grid = {static_cast<uint32_t>((nout + 255) / 256), static_cast<uint32_t>(chunks), 1};
    k.args = {operandArg(0), workspaceArg(0)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_reduce_cols_final";
    k.source = head + cat(R"(
extern "C" __global__ void tpc_reduce_cols_final(const double* part, o_t* O) {
  __shared__ double red[32 * 33];
  const i64 o = (i64)blockIdx.x * 32 + threadIdx.x;
  double v = INIT;
  if (o < NOUT)
    for (i64 c = threadIdx.y; c < CHUNKS; c += blockDim.y) v = COMBINE(v, part[c * NOUT + o]);
  red[threadIdx.y * 33 + threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && o < NOUT) {
    for (unsigned l = 1; l < blockDim.y; ++l) v = COMBINE(v, red[l * 33 + threadIdx.x]);
    v = FINISH(v);
    )", store, R"(
  }
}
)");
    k.block = {32, 32, 1};
    k.grid.x = gridFor(nout, 32, 1 << 30);
    k.args = {workspaceArg(0), resultArg(0)};
    out.kernels.push_back(std::move(k));
  }
  return out;
}

// Kernel 1: the operands' elements cut into tiles of 16384 (a tile in one operand), tile t summed by block
// t % B (B <= 1024 blocks, 16-byte loads, f32 within a vector then a double per thread), the block's sum
// written as one double partial; an operand's tiles are found by a binary search over their first tile
// numbers, so the work per block does not depend on how the elements are spread over the operands.
// Kernel 2: one block sums the partials (fixed order) and writes the sum (sum_squares) or its square root
// (global_norm).
Result<NodeLowering> lowerSumSquares(const Node& n, const LoweringContext& ctx) {
  const int64_t kTile = 16384, kThreads = 256;
  unsigned K = n.numOperands();
  std::string src = devicePrelude();
  std::string params, fill, bases = "0ll", counts, kinds, cases;
  std::vector<KernelArg> args;
  std::set<DType> dtypes;
  int64_t tiles = 0;
  for (unsigned k = 0; k < K; ++k) {
    DType dt = n.operand(k)->dtype();
    TPC_TRY(checkFloatDType(n, dt, "every operand"));
    dtypes.insert(dt);
    int64_t count = n.operand(k)->type().numel();
    tiles += (count + kTile - 1) / kTile;
    params += cat("const void* P", k, ", ");
    fill += cat("    ptr[", k, "] = P", k, ";\n");
    bases += cat(", ", i64Lit(tiles));
    counts += cat(k ? ", " : "", i64Lit(count));
    kinds += cat(k ? ", " : "", static_cast<int>(dt));
    args.push_back(operandArg(k));
  }
  for (DType dt : dtypes) {
    std::string name = cat("s", dtypeName(dt));
    src += accessors(name, dt) + vectorAccessors(name, dt) + cat(R"(
__device__ __forceinline__ void tpc_sq_)", name, "(const void* p, i64 b, i64 e, double& acc) {\n  const ", name,
                                                                 R"(_t* q = (const )", name, R"(_t*)p;
  const i64 e8 = b + (e - b) / 8 * 8;
#pragma unroll 4
  for (i64 j = b + (i64)threadIdx.x * 8; j < e8; j += NT * 8) {
    float v[8];
    )", name, R"(_ld8(q, j, v);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += v[k] * v[k];
    acc += (double)s;
  }
  for (i64 j = e8 + threadIdx.x; j < e; j += NT) { double v = (double))", name, R"(_ld(q, j); acc += v * v; }
}
)");
    cases += cat("      case ", static_cast<int>(dt), ": tpc_sq_", name, "(ptr[lo], b, e, acc); break;\n");
  }
  int64_t blocks = std::clamp<int64_t>(tiles, 1, 1024);
  NodeLowering out;
  out.workspaceBytes = blocks * 8;
  {
    KernelSpec k;
    k.entry = "tpc_sum_squares_partial";
    k.source = cat("#define NT ", kThreads, "\n#define TILE ", i64Lit(kTile), "\n#define NOPS ", K, "\n#define TILES ",
                   i64Lit(tiles), "\n") +
               src + cat("__constant__ i64 tpc_tile_base[NOPS + 1] = {", bases, "};\n__constant__ i64 tpc_count[NOPS] = {", counts,
                         "};\n__constant__ int tpc_kind[NOPS] = {", kinds, "};\n") +
               "extern \"C\" __global__ void __launch_bounds__(NT) tpc_sum_squares_partial(" + params + R"(double* part) {
  __shared__ const void* ptr[NOPS];
  __shared__ double red[32];
  if (threadIdx.x == 0) {
)" + fill + R"(  }
  __syncthreads();
  double acc = 0;
  for (i64 t = blockIdx.x; t < TILES; t += gridDim.x) {
    int lo = 0, hi = NOPS - 1;  // the last operand whose first tile is <= t
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (tpc_tile_base[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    const i64 b = (t - tpc_tile_base[lo]) * TILE, e = min(b + TILE, tpc_count[lo]);
    switch (tpc_kind[lo]) {
)" + cases + R"(    }
  }
  acc = tpc_block_sum_d(acc, red);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
)";
    k.block.x = kThreads;
    k.grid.x = static_cast<uint32_t>(blocks);
    k.args = args;
    k.args.push_back(workspaceArg(0));
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_sum_squares_final";
    k.source = devicePrelude() + cat(R"(
extern "C" __global__ void tpc_sum_squares_final(const double* part, float* out) {
  __shared__ double red[32];
  double acc = 0;
  for (i64 i = threadIdx.x; i < )", i64Lit(blocks), R"(; i += blockDim.x) acc += part[i];
  acc = tpc_block_sum_d(acc, red);
  if (threadIdx.x == 0) out[0] = (float))", n.op() == OpKind::GlobalNorm ? "sqrt(acc)" : "acc", R"(;
}
)");
    k.block.x = 256;
    k.args = {workspaceArg(0), resultArg(0)};
    out.kernels.push_back(std::move(k));
  }
  return out;
}

}  // namespace tpc::cuda
