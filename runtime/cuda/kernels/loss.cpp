// CUDA lowerings of cross_entropy (+grad) and the vocab-parallel loss pieces. A block reduces one row of
// logits (max, then sum of exp in double); the per-position pieces are a thread per row. A target outside
// the classes that is not ignore_index gives a NaN loss and NaN gradient row (the CPU backend reports it;
// a kernel cannot, and the trainer stops on a NaN loss).
#include <algorithm>

#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

const char* kRowStats = R"(
// log(sum exp(x)) over the first C entries of a row, in double (the CPU kernel's logSumExp).
__device__ double tpc_row_lse(const x_t* x, i64 C, float* red, double* redd) {
  float m = -TPC_INF;
  for (i64 j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, x_ld(x, j));
  m = tpc_block_max(m, red);
  double s = 0;
  for (i64 j = threadIdx.x; j < C; j += blockDim.x) s += exp((double)x_ld(x, j) - (double)m);
  s = tpc_block_sum_d(s, redd);
  return (double)m + log(s);
}
)";

NodeLowering single(KernelSpec k) {
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

struct Rows {
  int64_t V, rows;
};
Rows rowsOf(const Value* logits) {
  int64_t V = logits->shape().back();
  return {V, V ? logits->type().numel() / V : 0};
}

// A kernel of one block per row of logits.
KernelSpec rowKernel(const std::string& entry, std::string source, int64_t V, int64_t rows, std::vector<KernelArg> args) {
  KernelSpec k;
  k.entry = entry;
  k.source = std::move(source);
  k.block.x = rowBlock(V, 512);
  k.grid.x = gridFor(rows, 1, 1 << 20);
  k.args = std::move(args);
  return k;
}

}  // namespace

Result<NodeLowering> lowerCrossEntropy(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "logits"));
  TPC_TRY(checkIdDType(n, n.operand(1)->dtype(), "targets"));
  auto [V, rows] = rowsOf(n.operand(0));
  int64_t C = n.getInt("num_classes") > 0 ? std::min(n.getInt("num_classes"), V) : V;
  std::string src = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("t", n.operand(1)->dtype()) +
                    accessors("l", n.result(0)->dtype()) + kRowStats + cat(R"(
extern "C" __global__ void tpc_cross_entropy(const x_t* X, const t_t* T, l_t* L) {
  __shared__ float red[32];
  __shared__ double redd[32];
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    i64 t = t_ld(T, row);
    if (t == )", i64Lit(n.getInt("ignore_index")), R"() { if (threadIdx.x == 0) l_st(L, row, 0.f); continue; }
    const x_t* x = X + row * )", i64Lit(V), R"(;
    double lse = tpc_row_lse(x, )", i64Lit(C), R"(, red, redd);
    if (threadIdx.x == 0)
      l_st(L, row, t >= 0 && t < )", i64Lit(C), R"( ? (float)(lse - (double)x_ld(x, t)) : __int_as_float(0x7fc00000));
  }
}
)");
  return single(rowKernel("tpc_cross_entropy", std::move(src), V, rows, {operandArg(0), operandArg(1), resultArg(0)}));
}

// dlogits = dloss * (softmax - onehot(target)) on the classes, 0 on padding and on ignored rows.
Result<NodeLowering> lowerCrossEntropyGrad(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "dloss"));
  TPC_TRY(checkFloatDType(n, n.operand(1)->dtype(), "logits"));
  TPC_TRY(checkIdDType(n, n.operand(2)->dtype(), "targets"));
  auto [V, rows] = rowsOf(n.operand(1));
  int64_t C = n.getInt("num_classes") > 0 ? std::min(n.getInt("num_classes"), V) : V;
  std::string src = devicePrelude() + accessors("dl", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                    accessors("t", n.operand(2)->dtype()) + accessors("dx", n.result(0)->dtype()) + kRowStats +
                    cat("#define V ", i64Lit(V), "\n#define C ", i64Lit(C), R"(
extern "C" __global__ void tpc_cross_entropy_grad(const dl_t* DL, const x_t* X, const t_t* T, dx_t* DX) {
  __shared__ float red[32];
  __shared__ double redd[32];
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    i64 t = t_ld(T, row);
    dx_t* d = DX + row * V;
    if (t == )", i64Lit(n.getInt("ignore_index")), R"() {
      for (i64 j = threadIdx.x; j < V; j += blockDim.x) dx_st(d, j, 0.f);
      continue;
    }
    const x_t* x = X + row * V;
    double lse = tpc_row_lse(x, C, red, redd), g = (double)dl_ld(DL, row);
    if (t < 0 || t >= C) g = __longlong_as_double(0x7ff8000000000000ll);
    for (i64 j = threadIdx.x; j < V; j += blockDim.x)
      dx_st(d, j, j < C ? (float)(g * (exp((double)x_ld(x, j) - lse) - (j == t ? 1.0 : 0.0))) : 0.f);
  }
}
)");
  return single(rowKernel("tpc_cross_entropy_grad", std::move(src), V, rows,
                          {operandArg(0), operandArg(1), operandArg(2), resultArg(0)}));
}

// ---- vocab-parallel pieces: this rank holds classes [vocab_start, vocab_start + Vl) of the logits ----
namespace {
int64_t ownClasses(const Node& n, int64_t Vl) {
  return std::clamp<int64_t>(n.getInt("num_classes") - n.getInt("vocab_start"), 0, Vl);
}
}  // namespace

Result<NodeLowering> lowerVocabMax(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "logits"));
  auto [Vl, rows] = rowsOf(n.operand(0));
  std::string src = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("o", n.result(0)->dtype()) +
                    cat(R"(
extern "C" __global__ void tpc_vocab_max(const x_t* X, o_t* O) {
  __shared__ float red[32];
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    float m = -TPC_INF;
    for (i64 j = threadIdx.x; j < )", i64Lit(ownClasses(n, Vl)), R"(; j += blockDim.x) m = fmaxf(m, x_ld(X, row * )", i64Lit(Vl), R"( + j));
    m = tpc_block_max(m, red);
    if (threadIdx.x == 0) o_st(O, row, m);
  }
}
)");
  return single(rowKernel("tpc_vocab_max", std::move(src), Vl, rows, {operandArg(0), resultArg(0)}));
}

Result<NodeLowering> lowerVocabSumExp(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "logits"));
  TPC_TRY(checkFloatDType(n, n.operand(1)->dtype(), "gmax"));
  auto [Vl, rows] = rowsOf(n.operand(0));
  std::string src = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("m", n.operand(1)->dtype()) +
                    accessors("o", n.result(0)->dtype()) + kRowStats + cat(R"(
extern "C" __global__ void tpc_vocab_sum_exp(const x_t* X, const m_t* M, o_t* O) {
  __shared__ double redd[32];
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    double m = (double)m_ld(M, row), s = 0;
    for (i64 j = threadIdx.x; j < )", i64Lit(ownClasses(n, Vl)), R"(; j += blockDim.x) s += exp((double)x_ld(X, row * )",
                                                     i64Lit(Vl), R"( + j) - m);
    s = tpc_block_sum_d(s, redd);
    if (threadIdx.x == 0) o_st(O, row, (float)s);
  }
}
)");
  return single(rowKernel("tpc_vocab_sum_exp", std::move(src), Vl, rows, {operandArg(0), operandArg(1), resultArg(0)}));
}

Result<NodeLowering> lowerVocabPick(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "logits"));
  TPC_TRY(checkIdDType(n, n.operand(1)->dtype(), "targets"));
  auto [Vl, rows] = rowsOf(n.operand(0));
  KernelSpec k;
  k.entry = "tpc_vocab_pick";
  k.source = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("t", n.operand(1)->dtype()) +
             accessors("o", n.result(0)->dtype()) + cat(R"(
extern "C" __global__ void tpc_vocab_pick(const x_t* X, const t_t* T, o_t* O) {
  for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < )", i64Lit(rows), R"(; r += (i64)gridDim.x * blockDim.x) {
    i64 id = t_ld(T, r), t = id - )", i64Lit(n.getInt("vocab_start")), R"(;
    o_st(O, r, id != )", i64Lit(n.getInt("ignore_index")), R"( && t >= 0 && t < )", i64Lit(Vl), R"( ? x_ld(X, r * )", i64Lit(Vl), R"( + t) : 0.f);
  }
}
)");
  k.block.x = 256;
  k.grid.x = gridFor(rows, 256);
  k.args = {operandArg(0), operandArg(1), resultArg(0)};
  return single(std::move(k));
}

Result<NodeLowering> lowerVocabLoss(const Node& n, const LoweringContext& ctx) {
  for (unsigned k = 0; k < 3; ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "gmax, sumexp and picked"));
  TPC_TRY(checkIdDType(n, n.operand(3)->dtype(), "targets"));
  int64_t rows = n.operand(3)->type().numel();
  KernelSpec k;
  k.entry = "tpc_vocab_loss";
  k.source = devicePrelude() + accessors("m", n.operand(0)->dtype()) + accessors("s", n.operand(1)->dtype()) +
             accessors("p", n.operand(2)->dtype()) + accessors("t", n.operand(3)->dtype()) +
             accessors("o", n.result(0)->dtype()) + cat(R"(
extern "C" __global__ void tpc_vocab_loss(const m_t* M, const s_t* S, const p_t* P, const t_t* T, o_t* O) {
  for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < )", i64Lit(rows), R"(; r += (i64)gridDim.x * blockDim.x)
    o_st(O, r, t_ld(T, r) == )", i64Lit(n.getInt("ignore_index")), R"( ? 0.f
             : (float)(log((double)s_ld(S, r)) + (double)m_ld(M, r) - (double)p_ld(P, r)));
}
)");
  k.block.x = 256;
  k.grid.x = gridFor(rows, 256);
  k.args = {operandArg(0), operandArg(1), operandArg(2), operandArg(3), resultArg(0)};
  return single(std::move(k));
}

Result<NodeLowering> lowerVocabXentGrad(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(1)->dtype(), "logits"));
  for (unsigned k : {0u, 2u, 3u}) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "dloss, gmax and sumexp"));
  TPC_TRY(checkIdDType(n, n.operand(4)->dtype(), "targets"));
  auto [Vl, rows] = rowsOf(n.operand(1));
  std::string src = devicePrelude() + accessors("dl", n.operand(0)->dtype()) + accessors("x", n.operand(1)->dtype()) +
                    accessors("m", n.operand(2)->dtype()) + accessors("s", n.operand(3)->dtype()) +
                    accessors("t", n.operand(4)->dtype()) + accessors("dx", n.result(0)->dtype()) +
                    cat("#define VL ", i64Lit(Vl), "\n#define C ", i64Lit(ownClasses(n, Vl)), "\n#define START ",
                        i64Lit(n.getInt("vocab_start")), R"(
extern "C" __global__ void tpc_vocab_xent_grad(const dl_t* DL, const x_t* X, const m_t* M, const s_t* S, const t_t* T,
                                               dx_t* DX) {
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    i64 t = t_ld(T, row);
    dx_t* d = DX + row * VL;
    if (t == )", i64Lit(n.getInt("ignore_index")), R"() {
      for (i64 j = threadIdx.x; j < VL; j += blockDim.x) dx_st(d, j, 0.f);
      continue;
    }
    double g = (double)dl_ld(DL, row), lse = log((double)s_ld(S, row)) + (double)m_ld(M, row);
    for (i64 j = threadIdx.x; j < VL; j += blockDim.x)
      dx_st(d, j, j < C ? (float)(g * (exp((double)x_ld(X, row * VL + j) - lse) - (j + START == t ? 1.0 : 0.0))) : 0.f);
  }
}
)");
  return single(rowKernel("tpc_vocab_xent_grad", std::move(src), Vl, rows,
                          {operandArg(0), operandArg(1), operandArg(2), operandArg(3), operandArg(4), resultArg(0)}));
}

}  // namespace tpc::cuda
