// CUDA lowerings of cross_entropy (+grad) and the vocab-parallel loss pieces. cross_entropy(_grad): a block
// of 512 threads per row reads the row once with 16-byte loads, keeping an online (max, sum of exp) in f32
// (base 2: y = x log2(e), rescaled when the max grows), combined over the block; the grad keeps the row it
// read in shared memory (when it fits) and writes dlogits from there: one read and one write of the logits.
// cross_entropy_with_grad is the grad kernel that also writes the loss. Where it applies, both grads take
// loss_resident.cpp's pipelined kernel instead (LoweringContext::xentOnePass; TPC_MEMBW_OFF=xent1: this one). The vocab-parallel pieces are a block
// per row (double sums) or a thread per row. A target outside the classes that is not ignore_index gives a
// NaN loss and NaN gradient row (the CPU backend reports it; a kernel cannot, and the trainer stops on a NaN
// loss).
#include <algorithm>

#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

// Threads per row. The kernels ask for two blocks per SM (__launch_bounds__(NT, 2): at most 64 registers), so
// that two rows share an SM: with bf16 gpt2 logits the kept row is 100 KB of shared memory per block.
constexpr uint32_t kRowThreads = 512;

// The row pass shared by cross_entropy and its grad. Needs V (row length), C (classes), U (elements per
// load: 8, or 1 when V % 8 != 0), NT (threads), x_t accessors. tpc_row_lse2 returns log2(sum_j<C 2^(x_j log2 e)),
// the same in every thread; `keep` (or null) receives the row's raw elements for a second pass.
const char* kRowLse = R"(
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
__device__ __forceinline__ void tpc_ldu(const x_t* p, i64 i, float* v) {
#if U == 8
  x_ld8(p, i, v);
#else
  v[0] = x_ld(p, i);
#endif
}
__device__ __forceinline__ void tpc_copyu(x_t* dst, const x_t* src) {
#if U == 8
#pragma unroll
  for (int w = 0; w < (int)(8 * sizeof(x_t) / 16); ++w) reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
#else
  *dst = *src;
#endif
}
// (m, s) += (mo, so): two partial (max, sum of 2^(y - max)); an empty side has max -inf.
__device__ __forceinline__ void tpc_lse_merge(float& m, float& s, float mo, float so) {
  float mn = fmaxf(m, mo);
  if (mn == -TPC_INF) return;
  s = (m == -TPC_INF ? 0.f : s * exp2f(m - mn)) + (mo == -TPC_INF ? 0.f : so * exp2f(mo - mn));
  m = mn;
}
__device__ float tpc_row_lse2(const x_t* x, x_t* keep, float* red) {
  float m = -TPC_INF, s = 0.f;
#pragma unroll 4
  for (i64 j = (i64)threadIdx.x * U; j < V; j += (i64)NT * U) {
    float v[U];
    if (keep) {
      tpc_copyu(keep + j, x + j);
      tpc_ldu(keep, j, v);
    } else {
      tpc_ldu(x, j, v);
    }
    float vm = -TPC_INF;
#pragma unroll
    for (int k = 0; k < U; ++k) {
      v[k] = j + k < C ? v[k] * LOG2E : -TPC_INF;
      vm = fmaxf(vm, v[k]);
    }
    if (vm > m) {
      s = m == -TPC_INF ? 0.f : s * exp2f(m - vm);
      m = vm;
    }
    if (m != -TPC_INF) {
      float vs = 0.f;
#pragma unroll
      for (int k = 0; k < U; ++k) vs += exp2f(v[k] - m);
      s += vs;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
    tpc_lse_merge(m, s, mo, so);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) { red[warp] = m; red[32 + warp] = s; }
  __syncthreads();
  m = -TPC_INF;
  s = 0.f;
  for (int w = 0; w < NT / 32; ++w) tpc_lse_merge(m, s, red[w], red[32 + w]);  // same order in every thread
  return m + log2f(s);
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

// The row-pass constants and helpers for logits of dtype `xt` with V columns and C classes.
std::string rowPassHead(DType xt, int64_t V, int64_t C) {
  return vectorAccessors("x", xt) + cat("#define V ", i64Lit(V), "\n#define C ", i64Lit(C), "\n#define U ",
                                        V % 8 == 0 ? 8 : 1, "\n#define NT ", kRowThreads, "\n") +
         kRowLse;
}

}  // namespace

Result<NodeLowering> lowerCrossEntropy(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "logits"));
  TPC_TRY(checkIdDType(n, n.operand(1)->dtype(), "targets"));
  auto [V, rows] = rowsOf(n.operand(0));
  int64_t C = n.getInt("num_classes") > 0 ? std::min(n.getInt("num_classes"), V) : V;
  std::string src = devicePrelude() + accessors("x", n.operand(0)->dtype()) + accessors("t", n.operand(1)->dtype()) +
                    accessors("l", n.result(0)->dtype()) + rowPassHead(n.operand(0)->dtype(), V, C) + cat(R"(
extern "C" __global__ void __launch_bounds__(NT, 2) tpc_cross_entropy(const x_t* X, const t_t* T, l_t* L) {
  __shared__ float red[64];
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    i64 t = t_ld(T, row);
    if (t == )", i64Lit(n.getInt("ignore_index")), R"() { if (threadIdx.x == 0) l_st(L, row, 0.f); continue; }
    const x_t* x = X + row * V;
    float lse2 = tpc_row_lse2(x, (x_t*)0, red);
    if (threadIdx.x == 0) l_st(L, row, t >= 0 && t < C ? lse2 * LN2 - x_ld(x, t) : __int_as_float(0x7fc00000));
  }
}
)");
  KernelSpec k = rowKernel("tpc_cross_entropy", std::move(src), V, rows, {operandArg(0), operandArg(1), resultArg(0)});
  k.block.x = kRowThreads;
  return single(std::move(k));
}

namespace {

// dlogits = dloss * (softmax - onehot(target)) on the classes, 0 on padding and on ignored rows; withLoss: the
// loss too (cross_entropy_with_grad, result 0), from the same read. The row read for the statistics stays in
// shared memory (raw, V elements) when it fits, else it is read again. dlogits may be the logits' own buffer
// (in place, OpInfo::inPlaceResult): every element is read before it is written, by the thread that writes
// it, and the target's logit for the loss is read before the row pass's barriers.
Result<NodeLowering> lowerXentGrad(const Node& n, const LoweringContext& ctx, bool withLoss) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "dloss"));
  TPC_TRY(checkFloatDType(n, n.operand(1)->dtype(), "logits"));
  TPC_TRY(checkIdDType(n, n.operand(2)->dtype(), "targets"));
  if (residentXentGrad(n, ctx, withLoss)) return lowerXentGradResident(n, ctx, withLoss);
  DType xt = n.operand(1)->dtype();
  const Value* dlogits = n.result(withLoss ? 1 : 0);
  auto [V, rows] = rowsOf(n.operand(1));
  int64_t C = n.getInt("num_classes") > 0 ? std::min(n.getInt("num_classes"), V) : V;
  int64_t rowBytes = (V * dtypeSize(xt) + 15) / 16 * 16;
  bool cache = rowBytes <= ctx.maxSharedBytes - 1024;
  std::string entry = withLoss ? "tpc_cross_entropy_with_grad" : "tpc_cross_entropy_grad";
  std::string src = devicePrelude() + accessors("dl", n.operand(0)->dtype()) + accessors("x", xt) +
                    accessors("t", n.operand(2)->dtype()) + (withLoss ? accessors("l", n.result(0)->dtype()) : "") +
                    accessors("dx", dlogits->dtype()) + vectorAccessors("dx", dlogits->dtype()) +
                    rowPassHead(xt, V, C) + cat("#define CACHE ", cache ? 1 : 0, "\n#define WITH_LOSS ", withLoss ? 1 : 0, R"(
__device__ __forceinline__ void tpc_stu(dx_t* p, i64 i, const float* v) {
#if U == 8
  dx_st8(p, i, v);
#else
  dx_st(p, i, v[0]);
#endif
}
extern "C" __global__ void __launch_bounds__(NT, 2) )", entry, "(const dl_t* DL, const x_t* X, const t_t* T, ",
                        withLoss ? "l_t* L, " : "", R"(dx_t* DX) {
  __shared__ float red[64];
#if CACHE
  extern __shared__ float smem[];
  x_t* keep = (x_t*)smem;  // each thread reads back only the elements it stored: no barrier needed
#else
  x_t* keep = (x_t*)0;
#endif
  for (i64 row = blockIdx.x; row < )", i64Lit(rows), R"(; row += gridDim.x) {
    i64 t = t_ld(T, row);
    dx_t* d = DX + row * V;
    if (t == )", i64Lit(n.getInt("ignore_index")), R"() {
#if WITH_LOSS
      if (threadIdx.x == 0) l_st(L, row, 0.f);
#endif
      float z[U];
#pragma unroll
      for (int k = 0; k < U; ++k) z[k] = 0.f;
      for (i64 j = (i64)threadIdx.x * U; j < V; j += (i64)NT * U) tpc_stu(d, j, z);
      continue;
    }
    const x_t* x = X + row * V;
#if WITH_LOSS
    const float xt = threadIdx.x == 0 && t >= 0 && t < C ? x_ld(x, t) : 0.f;
#endif
    const float lse2 = tpc_row_lse2(x, keep, red);
#if WITH_LOSS
    if (threadIdx.x == 0) l_st(L, row, t >= 0 && t < C ? lse2 * LN2 - xt : __int_as_float(0x7fc00000));
#endif
    float g = dl_ld(DL, row);
    if (t < 0 || t >= C) g = __int_as_float(0x7fc00000);
    const x_t* src = keep ? (const x_t*)keep : x;
#pragma unroll 4
    for (i64 j = (i64)threadIdx.x * U; j < V; j += (i64)NT * U) {
      float v[U];
      tpc_ldu(src, j, v);
#pragma unroll
      for (int k = 0; k < U; ++k)
        v[k] = j + k < C ? g * (exp2f(fmaf(v[k], LOG2E, -lse2)) - (j + k == t ? 1.f : 0.f)) : 0.f;
      tpc_stu(d, j, v);
    }
  }
}
)");
  std::vector<KernelArg> args = {operandArg(0), operandArg(1), operandArg(2), resultArg(0)};
  if (withLoss) args.push_back(resultArg(1));
  KernelSpec k = rowKernel(entry, std::move(src), V, rows, std::move(args));
  k.block.x = kRowThreads;
  if (cache) k.sharedBytes = static_cast<uint32_t>(rowBytes);
  return single(std::move(k));
}

}  // namespace

Result<NodeLowering> lowerCrossEntropyGrad(const Node& n, const LoweringContext& ctx) { return lowerXentGrad(n, ctx, false); }

Result<NodeLowering> lowerCrossEntropyWithGrad(const Node& n, const LoweringContext& ctx) { return lowerXentGrad(n, ctx, true); }

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
                    accessors("o", n.result(0)->dtype()) + cat(R"(
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
